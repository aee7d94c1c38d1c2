//! The chunk operations and their errors, on the fault-injecting disk with no faults.

mod common;
use cairn_chunkstore::{Error, OpenOptions};
use common::*;

#[test]
fn create_append_read_seal_delete() {
    let (_disk, store) = fault_store(1);
    store.create(7, 1).unwrap();
    assert_eq!(store.append(7, 0, &pattern(7, 0, 3000)).unwrap(), 3000);
    assert_eq!(
        store.append(7, 3000, &pattern(7, 3000, 2000)).unwrap(),
        5000
    );
    assert_eq!(store.append(7, 5000, &pattern(7, 5000, 100)).unwrap(), 5100);
    assert_eq!(store.read(7, 0, 5100).unwrap(), pattern(7, 0, 5100));
    assert_eq!(store.read(7, 2990, 30).unwrap(), pattern(7, 2990, 30));
    let stat = store.seal(7).unwrap();
    assert!(stat.sealed);
    assert_eq!(stat.length, 5100);
    assert_eq!(stat.crc32c, crc32c::crc32c(&pattern(7, 0, 5100)));
    assert_eq!(store.seal(7).unwrap(), stat, "seal is idempotent");
    assert!(matches!(
        store.append(7, 5100, &[1]),
        Err(Error::Sealed { length: 5100, .. })
    ));
    assert_eq!(store.list(), vec![7]);
    store.delete(7).unwrap();
    assert!(matches!(
        store.stat(7),
        Err(Error::NotFound { chunk_id: 7 })
    ));
    assert!(store.list().is_empty());
}

#[test]
fn wrong_offset_is_refused_with_the_current_length() {
    let (_disk, store) = fault_store(2);
    store.create(1, 1).unwrap();
    store.append(1, 0, &[5; 10]).unwrap();
    match store.append(1, 4, &[6; 10]) {
        Err(Error::OffsetMismatch {
            chunk_id: 1,
            offset: 4,
            length: 10,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(store.read(1, 0, 10).unwrap(), vec![5; 10]);
}

#[test]
fn bad_requests_get_typed_errors() {
    let (_disk, store) = fault_store(3);
    assert!(matches!(
        store.append(9, 0, &[1]),
        Err(Error::NotFound { chunk_id: 9 })
    ));
    assert!(matches!(store.read(9, 0, 1), Err(Error::NotFound { .. })));
    store.create(9, 1).unwrap();
    assert!(matches!(
        store.create(9, 1),
        Err(Error::AlreadyExists { chunk_id: 9 })
    ));
    assert!(matches!(
        store.append(9, 0, &[]),
        Err(Error::BadAppendSize {
            append_bytes: 0,
            ..
        })
    ));
    store.append(9, 0, &[1; 100]).unwrap();
    assert!(matches!(
        store.read(9, 50, 51),
        Err(Error::OutOfRange { length: 100, .. })
    ));
    assert!(matches!(
        store.read(9, u64::MAX, 1),
        Err(Error::OutOfRange { .. })
    ));
    assert_eq!(store.read(9, 100, 0).unwrap(), Vec::<u8>::new());
    assert!(matches!(store.delete(10), Err(Error::NotFound { .. })));
    assert!(matches!(store.seal(10), Err(Error::NotFound { .. })));
}

#[test]
fn chunk_size_is_bounded() {
    let (_disk, store) = fault_store_sized(80 * MIB, 4);
    store.create(1, 1).unwrap();
    let max = store.max_chunk_bytes();
    // Fill to the maximum in 4 MiB appends (the default largest append).
    let mut off = 0;
    while off < max {
        let n = (max - off).min(4 * MIB) as usize;
        off = store.append(1, off, &pattern(1, off, n)).unwrap();
    }
    assert!(matches!(
        store.append(1, off, &[0]),
        Err(Error::ChunkFull { .. })
    ));
    assert_eq!(
        store.read(1, max - 10, 10).unwrap(),
        pattern(1, max - 10, 10)
    );
}

#[test]
fn delete_reuses_space() {
    let (_disk, store) = fault_store(5);
    let total = store.space().extents_free;
    for round in 0..3u64 {
        for id in 0..4 {
            store.create(id, round).unwrap();
            store
                .append(id, 0, &pattern(id, 0, 4 * MIB as usize))
                .unwrap();
        }
        assert!(store.space().extents_free < total);
        for id in 0..4 {
            assert_eq!(
                store.read(id, 0, 4 * MIB as usize).unwrap(),
                pattern(id, 0, 4 * MIB as usize)
            );
            store.delete(id).unwrap();
        }
        assert_eq!(store.space().extents_free, total, "round {round}");
    }
}

#[test]
fn no_space_is_an_error_not_a_panic() {
    let (_disk, store) = fault_store(6);
    let mut id = 0;
    let err = loop {
        store.create(id, 1).unwrap();
        let mut off = 0;
        let r = loop {
            match store.append(id, off, &vec![1; 4 * MIB as usize]) {
                Ok(n) => off = n,
                Err(e) => break e,
            }
        };
        if !matches!(r, Error::ChunkFull { .. }) {
            break r;
        }
        id += 1;
    };
    assert!(matches!(err, Error::NoSpace), "{err:?}");
    // Deleting frees space for new appends.
    store.delete(0).unwrap();
    store.create(1000, 1).unwrap();
    store.append(1000, 0, &vec![2; 1000]).unwrap();
}

#[test]
fn reopen_after_clean_close_keeps_everything() {
    let (disk, store) = fault_store(7);
    for id in 0..5u64 {
        store.create(id, id).unwrap();
        let mut off = 0;
        for k in 0..(id + 1) * 3 {
            let n = 1000 + (k as usize * 777) % 9000;
            off = store.append(id, off, &pattern(id, off, n)).unwrap();
        }
        if id % 2 == 0 {
            store.seal(id).unwrap();
        }
    }
    let before: Vec<_> = store
        .list()
        .iter()
        .map(|&id| store.stat(id).unwrap())
        .collect();
    store.close().unwrap();
    let (_d, store, report) = reopen(disk.crash(cairn_chunkstore::CrashPolicy::DropAll), 8);
    assert_eq!(
        report.log_blocks_replayed, 0,
        "a clean close leaves nothing to replay"
    );
    let after: Vec<_> = store
        .list()
        .iter()
        .map(|&id| store.stat(id).unwrap())
        .collect();
    assert_eq!(before, after);
    for s in after {
        assert_eq!(
            store.read(s.chunk_id, 0, s.length as usize).unwrap(),
            pattern(s.chunk_id, 0, s.length as usize)
        );
    }
    let _ = OpenOptions::default();
}

/// A replicated writer seals every replica at the length a quorum holds: a replica with more
/// drops the bytes past it, across a crash (log replay) and a clean close (checkpoint).
#[test]
fn seal_at_a_shorter_length_drops_the_tail() {
    for clean in [false, true] {
        let (disk, store) = fault_store(11);
        store.create(3, 1).unwrap();
        let mut off = 0;
        for n in [5000, 70_000, 300] {
            off = store.append(3, off, &pattern(3, off, n)).unwrap();
        }
        assert!(matches!(
            store.seal_at(3, off + 1),
            Err(Error::OutOfRange { length, .. }) if length == off
        ));
        let keep = 5000 + 70_000;
        let st = store.seal_at(3, keep).unwrap();
        assert!(st.sealed);
        assert_eq!(st.length, keep);
        assert_eq!(st.crc32c, crc32c::crc32c(&pattern(3, 0, keep as usize)));
        assert_eq!(store.seal_at(3, keep).unwrap(), st, "idempotent");
        assert!(matches!(
            store.seal_at(3, 10),
            Err(Error::Sealed { length, .. }) if length == keep
        ));
        assert!(matches!(
            store.read(3, keep, 1),
            Err(Error::OutOfRange { .. })
        ));
        let image = if clean {
            store.close().unwrap();
            disk.crash(cairn_chunkstore::CrashPolicy::DropAll)
        } else {
            disk.crash(cairn_chunkstore::CrashPolicy::DropAll)
        };
        let (_d, store, _) = reopen(image, 12);
        assert_eq!(store.stat(3).unwrap(), st, "clean close: {clean}");
        assert_eq!(
            store.read(3, 0, keep as usize).unwrap(),
            pattern(3, 0, keep as usize)
        );
        assert!(store.read(3, keep, 1).is_err());
    }
}

/// Sequential reads of large appends take each segment header from the cache after the read
/// that held it; a chunk deleted and created again (a new epoch) with other appends over the
/// same slots is read from its own headers, never the cached ones.
#[test]
fn large_append_headers_are_cached_per_incarnation() {
    use std::sync::atomic::Ordering::Relaxed;
    let (_disk, store) = fault_store(21);
    let mib = 1 << 20;
    store.create(4, 1).unwrap();
    let a = pattern(4, 0, 3 * mib);
    for i in 0..3 {
        store
            .append(4, (i * mib) as u64, &a[i * mib..][..mib])
            .unwrap();
    }
    assert_eq!(store.stats().large_appends.load(Relaxed), 3);
    let hits = |s: &cairn_chunkstore::ChunkStore| s.stats().header_cache_hits.load(Relaxed);
    let piece = 300_000;
    for at in (0..a.len()).step_by(piece) {
        let n = piece.min(a.len() - at);
        let r = store.read_buf(4, at as u64, n).unwrap();
        assert_eq!(r.to_vec(), a[at..at + n], "read at {at}");
        assert_eq!(r.crc32c(), crc32c::crc32c(&a[at..at + n]));
    }
    assert!(
        hits(&store) > 0,
        "a sequential reader never hit the header cache"
    );
    store.delete(4).unwrap();
    store.create(4, 1).unwrap();
    // Other lengths: the new appends' headers sit in slots the old ones' headers or data took.
    let b = pattern(40, 0, 3 * mib);
    let mut len = 0;
    for n in [700_000, 1_300_000, 1_000_000] {
        len = store.append(4, len, &b[len as usize..][..n]).unwrap();
    }
    assert_eq!(store.stats().large_appends.load(Relaxed), 6);
    // Last piece first: each read's segment header lies before it, so it comes from the
    // cache if the cache has one for that slot.
    for _ in 0..2 {
        for at in (0..len as usize).step_by(piece).rev() {
            let n = piece.min(len as usize - at);
            assert_eq!(
                store.read(4, at as u64, n).unwrap(),
                b[at..at + n],
                "read at {at}"
            );
        }
    }
}

#[test]
fn append_phases_add_up_to_the_device_time() {
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Duration;
    let (disk, store) = fault_store(9);
    store.create(3, 1).unwrap();
    let latency = Duration::from_millis(3);
    disk.set_faults(cairn_chunkstore::FaultConfig {
        latency,
        ..Default::default()
    });
    let s = store.stats();
    let before =
        [&s.append_queue_ns, &s.append_write_ns, &s.append_flush_ns].map(|c| c.load(Relaxed));
    let appends0 = s.appends.load(Relaxed);
    let mut len = 0;
    for i in 0..4u64 {
        let data = pattern(3, len, 1000 + 700 * i as usize);
        len = store.append(3, len, &data).unwrap();
    }
    assert_eq!(s.appends.load(Relaxed) - appends0, 4);
    let [queue, write, flush] = [&s.append_queue_ns, &s.append_write_ns, &s.append_flush_ns]
        .map(|c| c.load(Relaxed))
        .into_iter()
        .zip(before)
        .map(|(now, was)| Duration::from_nanos(now - was))
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    // Each append's batch wrote once and flushed once, each costing the injected latency.
    assert!(write >= 4 * latency, "write {write:?}");
    assert!(flush >= 4 * latency, "flush {flush:?}");
    // Nothing else was queued: an append waits for no one's batch but its own.
    assert!(queue < 4 * latency, "queue {queue:?}");
}

#[test]
fn a_lone_blocking_call_runs_on_the_callers_thread() {
    use std::sync::atomic::Ordering::Relaxed;
    let (_disk, store) = fault_store(10);
    let s = store.stats();
    // With the device thread idle and nothing queued, each of nine calls runs itself: one
    // batch of its own, the device thread's code on the caller's thread. The device thread
    // may hold its lock for a moment on its own (waking between batches), and a call that
    // finds it so queues instead: so the nine calls are tried up to five times, and one try
    // must have run every call alone.
    let mut alone_all = false;
    for attempt in 0..5u64 {
        let (a, b) = (4 + 10 * attempt, 5 + 10 * attempt);
        let alone0 = s.alone_batches.load(Relaxed);
        let batches0 = s.batches.load(Relaxed);
        store.create(a, 1).unwrap();
        let mut len = 0;
        for i in 0..5usize {
            len = store.append(a, len, &pattern(a, len, 3000 + i)).unwrap();
        }
        let sealed = store.seal(a).unwrap();
        store.create(b, 1).unwrap();
        store.delete(b).unwrap();
        let alone = s.alone_batches.load(Relaxed) - alone0;
        // Every call is a batch of its own either way: nothing else was queued.
        assert_eq!(s.batches.load(Relaxed) - batches0, 9);
        assert_eq!(sealed.length, len);
        assert_eq!(
            store.read(a, 0, len as usize).unwrap(),
            pattern(a, 0, len as usize)
        );
        if alone == 9 {
            alone_all = true;
            break;
        }
        eprintln!("attempt {attempt}: {alone} of 9 calls ran alone");
    }
    assert!(
        alone_all,
        "no attempt ran all nine calls on the caller's thread"
    );
    // A pipelined append goes through the device thread.
    store.create(6, 1).unwrap();
    let alone1 = s.alone_batches.load(Relaxed);
    store
        .append_pipelined(6, 0, &[1; 100])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(s.alone_batches.load(Relaxed), alone1);
}

#[test]
fn a_blocking_call_never_overtakes_requests_queued_before_it() {
    // Two pipelined appends are queued to the device thread, then the same thread appends
    // after them with a blocking call. Were the blocking call to run itself before the
    // device thread took the queued two, it would find the chunk short of its offset.
    let (_disk, store) = fault_store(11);
    store.create(8, 1).unwrap();
    let mut len = 0u64;
    for i in 0..300usize {
        let a = pattern(8, len, 1000 + i);
        let b = pattern(8, len + a.len() as u64, 700);
        let pa = store.append_pipelined(8, len, &a).unwrap();
        let pb = store.append_pipelined(8, len + a.len() as u64, &b).unwrap();
        let at = len + (a.len() + b.len()) as u64;
        len = store.append(8, at, &pattern(8, at, 300)).unwrap();
        assert_eq!(pa.wait().unwrap(), at - b.len() as u64);
        assert_eq!(pb.wait().unwrap(), at);
    }
    assert_eq!(
        store.read(8, 0, len as usize).unwrap(),
        pattern(8, 0, len as usize)
    );
}

#[test]
fn blocking_and_pipelined_callers_share_a_full_queue() {
    // A queue of one request, four threads mixing pipelined and blocking appends: a caller
    // that finds the queue busy must queue without holding the device thread's lock, or the
    // thread could never take the next request off the full queue. A hang fails the test.
    let disk = std::sync::Arc::new(cairn_chunkstore::FaultDisk::new(48 * MIB, 512, 12));
    let opts = cairn_chunkstore::FormatOptions {
        log_bytes: Some(2 * MIB),
        ..Default::default()
    };
    cairn_chunkstore::ChunkStore::format(&*disk, &opts).unwrap();
    let open = OpenOptions {
        queue_depth: 1,
        ..Default::default()
    };
    let (store, _) = cairn_chunkstore::ChunkStore::open(disk, open).unwrap();
    let store = std::sync::Arc::new(store);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for t in 0..4u64 {
        let store = store.clone();
        let done_tx = done_tx.clone();
        std::thread::spawn(move || {
            let id = 20 + t;
            store.create(id, 1).unwrap();
            let mut len = 0u64;
            for _ in 0..150 {
                let p = store
                    .append_pipelined(id, len, &pattern(id, len, 500))
                    .unwrap();
                len = store
                    .append(id, len + 500, &pattern(id, len + 500, 300))
                    .unwrap();
                p.wait().unwrap();
            }
            done_tx.send((id, len)).unwrap();
        });
    }
    for _ in 0..4 {
        let (id, len) = done_rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("a writer hung");
        assert_eq!(
            store.read(id, 0, len as usize).unwrap(),
            pattern(id, 0, len as usize)
        );
    }
}
