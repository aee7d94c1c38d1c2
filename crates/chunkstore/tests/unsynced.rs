//! Unsynced appends (re-replication's copies): acknowledged before a flush, never a cause
//! of damage after a power cut, and durable once a seal, checkpoint or synced append follows.

mod common;
use cairn_chunkstore::{ChunkStore, CrashPolicy, FaultConfig, FaultDisk};
use common::*;
use std::sync::atomic::Ordering;

const SEEDS: u64 = 40;
/// A synced first append, then unsynced ones of these sizes (units of 4016 data bytes: some
/// end inside a unit, some span many).
const SYNCED: usize = 5_000;
const UNSYNCED: [usize; 4] = [30_000, 700, 64 * 1024, 9_000];

fn flushes(s: &ChunkStore) -> u64 {
    s.stats().flushes.load(Ordering::Relaxed)
}

/// Recovers from `image` and checks that no chunk came back damaged.
fn reopen_undamaged(image: Vec<u8>, seed: u64) -> ChunkStore {
    let (_d, store, report) = reopen(image, seed);
    assert!(report.damaged_chunks.is_empty(), "seed {seed}: {report:?}");
    store
}

/// Cuts power under `store` and recovers from what `policy` leaves.
fn power_cut(disk: &FaultDisk, store: ChunkStore, policy: CrashPolicy, seed: u64) -> ChunkStore {
    disk.power_off();
    drop(store);
    reopen_undamaged(disk.crash(policy), seed)
}

/// Chunk 1 reads back as its first `len` bytes.
fn assert_prefix(store: &ChunkStore, len: u64, seed: u64) {
    let n = len as usize;
    assert_eq!(
        store.read(1, 0, n).unwrap(),
        pattern(1, 0, n),
        "seed {seed}"
    );
}

/// Writes chunk 1: one synced append, then the unsynced ones. Returns the append ends.
fn write(store: &ChunkStore) -> Vec<u64> {
    store.create(1, 1).unwrap();
    store.append(1, 0, &pattern(1, 0, SYNCED)).unwrap();
    let mut ends = vec![SYNCED as u64];
    for n in UNSYNCED {
        let off = *ends.last().unwrap();
        let end = store.append_unsynced(1, off, &pattern(1, off, n)).unwrap();
        assert_eq!(end, off + n as u64);
        ends.push(end);
    }
    // Reads see the bytes at once.
    let len = *ends.last().unwrap();
    assert_eq!(
        store.read(1, 0, len as usize).unwrap(),
        pattern(1, 0, len as usize)
    );
    ends
}

#[test]
fn unsynced_appends_flush_only_to_continue_a_unit_another_one_left_open() {
    let (_disk, store) = fault_store(3);
    let d = store.unit_data_bytes();
    store.create(1, 1).unwrap();
    let before = flushes(&store);
    let mut end = 0;
    for units in [1, 7, 65, 2] {
        let n = (units * d) as usize;
        end = store.append_unsynced(1, end, &pattern(1, end, n)).unwrap();
    }
    assert_eq!(
        flushes(&store),
        before,
        "unit-aligned unsynced appends flushed"
    );
    // One ending inside a unit, and one continuing there: the second flushes first.
    end = store
        .append_unsynced(1, end, &pattern(1, end, 100))
        .unwrap();
    assert_eq!(flushes(&store), before);
    end = store
        .append_unsynced(1, end, &pattern(1, end, 100))
        .unwrap();
    assert_eq!(flushes(&store), before + 1);
    assert_prefix(&store, end, 3);
}

#[test]
fn a_power_cut_leaves_a_prefix_of_unsynced_appends_and_no_damage() {
    let (mut lost, mut kept) = (0, 0);
    for seed in 0..SEEDS {
        let (disk, store) = fault_store(seed);
        let ends = write(&store);
        let store = power_cut(&disk, store, CrashPolicy::Random { seed }, seed);
        let st = store.stat(1).unwrap();
        assert!(
            ends.contains(&st.length),
            "seed {seed}: length {} is not an acknowledged end {ends:?}",
            st.length
        );
        assert_prefix(&store, st.length, seed);
        // The chunk takes appends again at its recovered length.
        store
            .append(1, st.length, &pattern(1, st.length, 100))
            .unwrap();
        if st.length > SYNCED as u64 {
            kept += 1;
        }
        if st.length < *ends.last().unwrap() {
            lost += 1;
        }
    }
    // Canary: the cuts both lost and kept unsynced appends, so both paths were checked.
    assert!(lost > 0 && kept > 0, "lost {lost}, kept {kept}");
}

#[test]
fn a_seal_after_unsynced_appends_is_durable_with_every_byte() {
    for seed in 0..SEEDS {
        let (disk, store) = fault_store(seed);
        let ends = write(&store);
        let len = *ends.last().unwrap();
        let before = flushes(&store);
        let sealed = store.seal(1).unwrap();
        // The flush before the seal's log write, and the seal's own.
        assert_eq!(flushes(&store) - before, 2);
        let store = power_cut(&disk, store, CrashPolicy::Random { seed }, seed);
        let st = store.stat(1).unwrap();
        assert!(st.sealed, "seed {seed}");
        assert_eq!((st.length, st.crc32c), (len, sealed.crc32c), "seed {seed}");
        assert_prefix(&store, len, seed);
    }
}

#[test]
fn a_power_cut_inside_a_seal_of_unsynced_bytes_never_damages_the_chunk() {
    // The cut lands after 0, 1 or 2 more device operations: before the seal's first flush,
    // between it and the log write, or between the log write and its flush. Without the
    // first flush the last case can keep the log block and lose the bytes it names.
    let mut sealed_seen = 0;
    for seed in 0..SEEDS {
        let (disk, store) = fault_store(seed);
        let ends = write(&store);
        let len = *ends.last().unwrap();
        disk.set_faults(FaultConfig {
            power_cut_after_ops: Some(seed % 3),
            ..Default::default()
        });
        assert!(
            store.seal(1).is_err(),
            "seed {seed}: the seal was acknowledged"
        );
        drop(store);
        let store = reopen_undamaged(disk.crash(CrashPolicy::Random { seed }), seed);
        let st = store.stat(1).unwrap();
        if st.sealed {
            sealed_seen += 1;
            assert_eq!(st.length, len, "seed {seed}");
        } else {
            assert!(ends.contains(&st.length), "seed {seed}: {}", st.length);
        }
        assert_prefix(&store, st.length, seed);
    }
    // Canary: some cuts kept the unacknowledged seal's log block.
    assert!(sealed_seen > 0);
}

#[test]
fn a_seal_of_a_chunk_whose_bytes_are_flushed_does_not_flush_twice() {
    let (_disk, store) = fault_store(1);
    let ends = write(&store);
    // A synced append makes the chunk's earlier unsynced bytes durable with it.
    let off = *ends.last().unwrap();
    store.append(1, off, &pattern(1, off, 10)).unwrap();
    let before = flushes(&store);
    store.seal(1).unwrap();
    assert_eq!(flushes(&store) - before, 1);
}

#[test]
fn a_checkpoint_after_unsynced_appends_names_only_durable_bytes() {
    for seed in 0..SEEDS {
        let (disk, store) = fault_store(seed);
        let ends = write(&store);
        store.checkpoint().unwrap();
        let store = power_cut(&disk, store, CrashPolicy::Random { seed }, seed);
        let len = *ends.last().unwrap();
        assert_eq!(store.stat(1).unwrap().length, len, "seed {seed}");
        assert_prefix(&store, len, seed);
    }
}

#[test]
fn a_synced_append_after_unsynced_ones_makes_them_all_durable() {
    for seed in 0..8 {
        let (disk, store) = fault_store(seed);
        let ends = write(&store);
        let off = *ends.last().unwrap();
        store.append(1, off, &pattern(1, off, 3_000)).unwrap();
        let len = off + 3_000;
        let store = power_cut(&disk, store, CrashPolicy::DropAll, seed);
        assert_eq!(store.stat(1).unwrap().length, len, "seed {seed}");
        assert_prefix(&store, len, seed);
    }
}

#[test]
fn unsynced_appends_inside_a_synced_tail_unit_never_lose_its_synced_bytes() {
    // A synced append leaves unit 0 partly filled; unsynced appends continue in it. They must
    // never overwrite the footer that makes the synced bytes durable, so every power cut
    // leaves at least the synced prefix.
    let mut lost_unsynced = 0;
    for seed in 0..200 {
        let (disk, store) = fault_store(seed);
        store.create(1, 1).unwrap();
        store.append(1, 0, &pattern(1, 0, 1_000)).unwrap();
        let mut end = 1_000u64;
        for n in [300, 200, 500, 100] {
            end = store.append_unsynced(1, end, &pattern(1, end, n)).unwrap();
        }
        let store = power_cut(&disk, store, CrashPolicy::Random { seed }, seed);
        let len = store.stat(1).unwrap().length;
        assert!(
            len >= 1_000,
            "seed {seed}: synced bytes lost (length {len})"
        );
        assert_prefix(&store, len, seed);
        lost_unsynced += u64::from(len < end);
    }
    assert!(lost_unsynced > 0);
}
