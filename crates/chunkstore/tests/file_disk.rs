//! The store on a real O_DIRECT file (io_uring write and read batches), not the in-memory disk.

mod common;
use cairn_chunkstore::{ChunkStore, Disk, FileDisk, FormatOptions, OpenOptions};
use common::pattern;
use std::sync::Arc;

fn file_store(dir: &tempfile::TempDir) -> (Arc<FileDisk>, ChunkStore) {
    let disk = Arc::new(FileDisk::create(&dir.path().join("disk"), 64 << 20, true).unwrap());
    ChunkStore::format(&*disk, &FormatOptions::default()).unwrap();
    let (store, _) =
        ChunkStore::open(disk.clone() as Arc<dyn Disk>, OpenOptions::default()).unwrap();
    (disk, store)
}

#[test]
fn large_and_pipelined_appends_read_back_across_extents() {
    let dir = tempfile::tempdir().unwrap();
    let (disk, store) = file_store(&dir);
    store.create(1, 1).unwrap();
    // Large appends at unaligned offsets: CRCs combined from unit CRCs, extent crossings.
    let mut len = 0u64;
    for size in [5usize, 1 << 20, 777_777, (1 << 20) + 3, 4016 * 20] {
        len = store.append(1, len, &pattern(1, len, size)).unwrap();
    }
    // Pipelined small appends to one chunk land in shared batches and chain inside units.
    let mut pending = Vec::new();
    for i in 0..200usize {
        let size = 100 + (i * 37) % 5000;
        pending.push(
            store
                .append_pipelined(1, len, &pattern(1, len, size))
                .unwrap(),
        );
        len += size as u64;
    }
    for p in pending {
        p.wait().unwrap();
    }
    // Probe: the chaining path ran (200 queued appends cannot all go one per batch).
    let chained = store
        .stats()
        .chained_appends
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(chained > 0, "no append chained inside a batch");
    let stat = store.seal(1).unwrap();
    assert_eq!(stat.length, len);
    let whole = pattern(1, 0, len as usize);
    assert_eq!(stat.crc32c, crc32c::crc32c(&whole));
    // Reads of every size at offsets around every extent boundary (1 MiB extents hold
    // 256 × 4016 logical bytes).
    let per_extent = 256 * 4016u64;
    for e in 1..=(len / per_extent) {
        for (back, size) in [
            (1u64, 2usize),
            (4016, 8032),
            (500_000, 1 << 20),
            (3, 1_100_000),
        ] {
            let off = e * per_extent - back.min(e * per_extent);
            let size = size.min((len - off) as usize);
            let got = store.read(1, off, size).unwrap();
            assert!(
                got == whole[off as usize..off as usize + size],
                "read {off}+{size}"
            );
        }
    }
    store.close().unwrap();
    // And after a reopen (recovery from the checkpoint written at close).
    let (store, _) = ChunkStore::open(disk as Arc<dyn Disk>, OpenOptions::default()).unwrap();
    assert_eq!(store.read(1, 0, len as usize).unwrap(), whole);
}
