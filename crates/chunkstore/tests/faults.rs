//! Media corruption, I/O errors and slow devices.

mod common;
use cairn_chunkstore::{CorruptionKind, CrashPolicy, Error, FaultConfig};
use common::*;
use std::sync::Arc;
use std::time::Duration;

/// Finds where `needle` sits in the device image.
fn find(image: &[u8], needle: &[u8]) -> usize {
    image
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("bytes are on the device")
}

#[test]
fn a_flipped_bit_in_the_middle_of_a_chunk_is_a_typed_corruption_error() {
    let (disk, store) = fault_store(11);
    store.create(5, 1).unwrap();
    let n = 64 * 1024;
    store.append(5, 0, &pattern(5, 0, n)).unwrap();
    store.seal(5).unwrap();
    // Byte 30 000 lives in unit 7 (4016 data bytes per unit): logical offset 7 × 4016 = 28 112.
    let at = find(&disk.snapshot(), &pattern(5, 30_000, 64));
    disk.flip_bit(at as u64, 5);
    match store.read(5, 29_000, 2000) {
        Err(Error::Corruption {
            chunk_id: 5,
            offset: 28_112,
            kind: CorruptionKind::NoValidFooter,
        }) => {}
        other => panic!("{other:?}"),
    }
    match store.read(5, 0, n) {
        Err(Error::Corruption {
            chunk_id: 5,
            offset: 28_112,
            ..
        }) => {}
        other => panic!("{:?}", other.map(|b| b.len())),
    }
    // Everything outside the damaged unit still reads.
    assert_eq!(store.read(5, 0, 28_112).unwrap(), pattern(5, 0, 28_112));
    assert_eq!(
        store.read(5, 32_128, n - 32_128).unwrap(),
        pattern(5, 32_128, n - 32_128)
    );
    // And after a restart the error is the same (the sealed chunk is not rescanned).
    store.close().unwrap();
    let (_d, store, report) = reopen(disk.crash(CrashPolicy::DropAll), 1);
    assert!(report.damaged_chunks.is_empty());
    assert!(matches!(
        store.read(5, 30_000, 1),
        Err(Error::Corruption { offset: 28_112, .. })
    ));
}

#[test]
fn recovery_never_serves_a_flipped_bit_in_an_open_chunk() {
    let (disk, store) = fault_store(12);
    store.create(6, 1).unwrap();
    store.append(6, 0, &pattern(6, 0, 10_000)).unwrap();
    let at = find(&disk.snapshot(), &pattern(6, 5_000, 64));
    disk.flip_bit(at as u64, 0);
    // Power is cut before any checkpoint records the append, so recovery must walk the units.
    disk.power_off();
    drop(store);
    let (_d, store, report) = reopen(disk.crash(CrashPolicy::DropAll), 2);
    // Unit 1 no longer verifies. A unit that did not verify looks exactly like a write that
    // never landed, so the chunk is cut back to its last verified append end (0 here: the
    // one append ended in unit 2) — it never serves the damaged bytes.
    assert_eq!(store.stat(6).unwrap().length, 0);
    assert!(report.units_read >= 2);
}

#[test]
fn a_write_error_fails_the_append_and_the_chunk_but_not_the_store() {
    let (disk, store) = fault_store(13);
    store.create(1, 1).unwrap();
    store.create(2, 1).unwrap();
    store.append(1, 0, &pattern(1, 0, 1000)).unwrap();
    disk.set_faults(FaultConfig {
        write_error_rate: 1.0,
        ..Default::default()
    });
    assert!(matches!(
        store.append(1, 1000, &pattern(1, 1000, 1000)),
        Err(Error::Io { .. })
    ));
    disk.set_faults(FaultConfig::default());
    // The chunk refuses appends (its bytes past 1000 are unknown) but reads and seals.
    assert!(matches!(
        store.append(1, 1000, &[1]),
        Err(Error::ChunkFailed { chunk_id: 1 })
    ));
    assert_eq!(store.read(1, 0, 1000).unwrap(), pattern(1, 0, 1000));
    assert_eq!(store.seal(1).unwrap().length, 1000);
    // Other chunks carry on.
    assert_eq!(store.append(2, 0, &pattern(2, 0, 500)).unwrap(), 500);
    assert!(!store.is_failed());
}

#[test]
fn a_flush_error_fails_the_store_and_keeps_acknowledged_data() {
    let (disk, store) = fault_store(14);
    store.create(1, 1).unwrap();
    store.append(1, 0, &pattern(1, 0, 3000)).unwrap();
    disk.set_faults(FaultConfig {
        sync_error_rate: 1.0,
        ..Default::default()
    });
    assert!(matches!(
        store.append(1, 3000, &[1; 10]),
        Err(Error::Io { .. })
    ));
    assert!(store.is_failed());
    disk.set_faults(FaultConfig::default());
    assert!(matches!(
        store.append(1, 3000, &[1; 10]),
        Err(Error::StoreFailed)
    ));
    assert!(matches!(store.create(9, 1), Err(Error::StoreFailed)));
    assert_eq!(
        store.read(1, 0, 3000).unwrap(),
        pattern(1, 0, 3000),
        "reads still work"
    );
    drop(store);
    let (_d, store, _) = reopen(disk.crash(CrashPolicy::DropAll), 3);
    assert_eq!(store.stat(1).unwrap().length, 3000);
    assert_eq!(
        store.append(1, 3000, &pattern(1, 3000, 10)).unwrap(),
        3010,
        "writable again after reopen"
    );
}

#[test]
fn a_read_error_is_an_error_not_data() {
    let (disk, store) = fault_store(15);
    store.create(1, 1).unwrap();
    store.append(1, 0, &[7; 100]).unwrap();
    disk.set_faults(FaultConfig {
        read_error_rate: 1.0,
        ..Default::default()
    });
    assert!(matches!(store.read(1, 0, 100), Err(Error::Io { .. })));
    disk.set_faults(FaultConfig::default());
    assert_eq!(store.read(1, 0, 100).unwrap(), vec![7; 100]);
}

#[test]
fn concurrent_appends_share_flushes() {
    // A slow device (1 ms per operation) makes appends queue up behind each flush: the next
    // batch then carries all of them, so there are far fewer flushes than appends.
    let (disk, store) = fault_store(16);
    let store = Arc::new(store);
    for id in 0..32 {
        store.create(id, 1).unwrap();
    }
    disk.set_faults(FaultConfig {
        latency: Duration::from_millis(1),
        ..Default::default()
    });
    let before = store
        .stats()
        .flushes
        .load(std::sync::atomic::Ordering::Relaxed);
    let threads: Vec<_> = (0..32u64)
        .map(|id| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut off = 0;
                for _ in 0..10 {
                    off = store.append(id, off, &pattern(id, off, 4096)).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let flushes = store
        .stats()
        .flushes
        .load(std::sync::atomic::Ordering::Relaxed)
        - before;
    assert!(
        flushes * 4 <= 320,
        "{flushes} flushes for 320 appends: no group commit"
    );
    for id in 0..32 {
        assert_eq!(store.read(id, 0, 40_960).unwrap(), pattern(id, 0, 40_960));
    }
}
