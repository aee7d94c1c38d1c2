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

#[test]
fn concurrent_writers_overlap_batches_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let (disk, store) = file_store(&dir);
    let store = Arc::new(store);
    let threads = 8u64;
    // Each thread appends to its own chunk: batches of different chunks overlap on the
    // device, and their flushes are shared or overlap with later writes.
    let lens: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let store = store.clone();
                s.spawn(move || {
                    let id = 100 + t;
                    store.create(id, 1).unwrap();
                    let mut len = 0u64;
                    for i in 0..60usize {
                        let size = if i % 3 == 0 { 5_000 + i } else { 64 << 10 };
                        len = store.append(id, len, &pattern(id, len, size)).unwrap();
                    }
                    len
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Probe: batches really overlapped (eight writers cannot all go one batch at a time).
    let overlapped = store
        .stats()
        .overlapped_batches
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        overlapped > 0,
        "no batch started while another was in flight"
    );
    for (t, &len) in lens.iter().enumerate() {
        let id = 100 + t as u64;
        let whole = pattern(id, 0, len as usize);
        assert!(
            store.read(id, 0, len as usize).unwrap() == whole,
            "chunk {id}"
        );
        assert_eq!(store.seal(id).unwrap().crc32c, crc32c::crc32c(&whole));
    }
    Arc::into_inner(store).unwrap().close().unwrap();
    let (store, _) = ChunkStore::open(disk as Arc<dyn Disk>, OpenOptions::default()).unwrap();
    for (t, &len) in lens.iter().enumerate() {
        let id = 100 + t as u64;
        assert!(store.read(id, 0, len as usize).unwrap() == pattern(id, 0, len as usize));
    }
}
