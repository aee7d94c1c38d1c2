//! A power cut while the last append's write is in flight, torn at every byte offset.
//!
//! Each case: some acknowledged appends, then an append whose flush fails (so it is never
//! acknowledged) and whose write reached the device only up to byte `k`, for every `k`.
//! After recovery the chunk must hold exactly its acknowledged bytes — or, when the whole
//! write landed, the new append too — never anything torn; and appending must work again.

mod common;
use cairn_chunkstore::{
    ChunkStore, CrashPolicy, Disk, Error, FaultConfig, FaultDisk, FormatOptions, OpenOptions,
};
use common::*;
use std::sync::Arc;

// 256 KiB extents (64 units each) keep the device image small: 12 extents = 3 MiB.
const EXTENT: u64 = 256 * 1024;
const CAPACITY: u64 = 12 * EXTENT;

fn small_store() -> (Arc<FaultDisk>, ChunkStore) {
    let disk = Arc::new(FaultDisk::new(CAPACITY, 512, 1));
    let opts = FormatOptions {
        log_bytes: Some(EXTENT),
        extent_bytes: EXTENT as u32,
        max_chunk_bytes: MIB,
        ..Default::default()
    };
    ChunkStore::format(&*disk, &opts).unwrap();
    let (store, _) =
        ChunkStore::open(disk.clone() as Arc<dyn Disk>, OpenOptions::default()).unwrap();
    (disk, store)
}

/// Chunk 1 with the acknowledged `prefix` appends, then an append of `torn` bytes whose flush
/// fails: its writes are on the disk, unsynced. Returns the disk, the still open store and the
/// acknowledged length.
fn failed_append(prefix: &[usize], torn: usize) -> (Arc<FaultDisk>, ChunkStore, u64) {
    let (disk, store) = small_store();
    store.create(1, 1).unwrap();
    let mut acked = 0u64;
    for &n in prefix {
        acked = store.append(1, acked, &pattern(1, acked, n)).unwrap();
    }
    disk.set_faults(FaultConfig {
        sync_error_rate: 1.0,
        ..Default::default()
    });
    let r = store.append(1, acked, &pattern(1, acked, torn));
    assert!(matches!(r, Err(Error::Io { .. })), "{r:?}");
    (disk, store, acked)
}

/// After a crash, chunk 1 is at its acknowledged length `acked` or holds the whole failed
/// append (`full`), and serves exactly its bytes. Returns whether it is whole.
fn old_or_whole(store: &ChunkStore, acked: u64, full: u64, what: &str) -> bool {
    let stat = store.stat(1).unwrap();
    assert!(
        stat.length == acked || stat.length == full,
        "{what}: length {} not {acked} or {full}",
        stat.length
    );
    assert!(
        store.read(1, 0, stat.length as usize).unwrap() == pattern(1, 0, stat.length as usize),
        "{what}: wrong bytes"
    );
    stat.length == full
}

/// Runs the acknowledged `prefix` appends, then tears an append of `torn` bytes at every byte
/// of its last write.
fn tear_case(prefix: &[usize], torn: usize) {
    let (disk, store, acked) = failed_append(prefix, torn);
    drop(store);
    let writes = disk.unsynced_writes();
    assert!(!writes.is_empty(), "the failed append wrote nothing");
    let last_write_len = writes.last().unwrap().1;
    let mut outcomes = [0usize; 2];
    for k in 0..=last_write_len {
        let image = disk.crash(CrashPolicy::TearLast { byte: k });
        let (_d, store, _report) = reopen(image, k as u64);
        let whole = old_or_whole(&store, acked, acked + torn as u64, &format!("tear at {k}"));
        outcomes[whole as usize] += 1;
        let stat = store.stat(1).unwrap();
        // Appending continues from the recovered length, and survives another reopen.
        let len2 = store
            .append(1, stat.length, &pattern(1, stat.length, 777))
            .unwrap();
        assert_eq!(
            store.read(1, 0, len2 as usize).unwrap(),
            pattern(1, 0, len2 as usize),
            "tear at {k}"
        );
        if k % 997 == 0 {
            store.close().unwrap();
            let (_d, store, _) = reopen(_d.crash(CrashPolicy::DropAll), 0);
            assert_eq!(store.stat(1).unwrap().length, len2);
        }
    }
    // Both outcomes must occur: torn early = old length, torn past the end = new length.
    assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
}

#[test]
fn torn_append_inside_the_tail_unit() {
    // Unit 0 holds 3000 acknowledged bytes; the torn append adds 100 in the same unit.
    tear_case(&[3000], 100);
}

#[test]
fn torn_append_filling_the_tail_unit_and_spilling_into_the_next() {
    tear_case(&[3000], 5000);
}

#[test]
fn torn_append_starting_on_a_unit_boundary() {
    // 4016 bytes fill unit 0 exactly; the torn 4 KiB append starts unit 1.
    tear_case(&[4016], 4096);
}

#[test]
fn torn_append_after_several_rewrites_of_the_tail_unit() {
    // Five small appends rewrite unit 0 five times (slots alternate); tear the sixth.
    tear_case(&[100, 200, 300, 400, 500], 600);
}

#[test]
fn torn_append_into_a_new_extent() {
    // 64 units of 4016 bytes fill the first extent exactly; the torn append needs a new one.
    let per_extent = 64 * 4016;
    tear_case(&[per_extent - 1000, 1000], 4096);
}

#[test]
fn torn_append_split_across_two_extents() {
    // The append's first part fills the first extent (one write, landed); its second part is
    // the first unit of a new extent (the last write, torn). All or nothing.
    let per_extent = 64 * 4016;
    tear_case(&[per_extent - 1000], 4096);
}

#[test]
fn torn_large_append_last_unit() {
    // A large append (docs/formats/chunk-store.md §3.2) crossing two extent boundaries: its
    // last write is its last unit, which carries the append's end.
    tear_case(&[3000], 700_000);
}

/// A large append is several writes (first unit, segment headers, data, last unit). A power
/// cut may keep any of them, drop any, tear any, or keep any subset of their sectors: the
/// chunk recovers to its acknowledged bytes or to the whole append, never to a part.
#[test]
fn large_append_writes_lost_torn_or_reordered_at_random() {
    for (prefix, torn) in [(3000usize, 700_000usize), (4016 * 64 - 1000, 724_288)] {
        let (disk, store, acked) = failed_append(&[prefix], torn);
        assert_eq!(
            store
                .stats()
                .large_appends
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        drop(store);
        assert!(
            disk.unsynced_writes().len() >= 4,
            "not laid out as a large append"
        );
        // With every write kept, the append is whole.
        let (_d, store, _) = reopen(disk.crash(CrashPolicy::KeepAll), 0);
        assert_eq!(store.stat(1).unwrap().length, acked + torn as u64);
        drop(store);
        let mut outcomes = [0usize; 2];
        for seed in 0..300 {
            let (_d, store, _) = reopen(disk.crash(CrashPolicy::Random { seed }), seed);
            let whole = old_or_whole(&store, acked, acked + torn as u64, &format!("seed {seed}"));
            outcomes[whole as usize] += 1;
        }
        // Eight or more writes each kept whole only now and then: mostly the old length.
        assert!(outcomes[0] > 250, "{outcomes:?}");
    }
}
