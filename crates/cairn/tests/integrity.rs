//! Integrity at rest (issue 38 §5): bits that rot in a store file are found — by a read that
//! meets them at once, by the scrubber within its period — and the bad copy is repaired from a
//! good one. The scrubber's pace follows the disk's used bytes and its period.

mod common;

use cairn_client::CreateOptions;
use std::time::{Duration, Instant};

/// Bits flipped inside a store file behind the chunkserver's back: the scrubber finds the bad
/// copy without any client read, the masters stop counting it, and repair replaces it (in
/// place: with three servers and three copies no other server can take one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrubber_finds_a_flipped_bit_and_repair_replaces_the_copy() {
    let dir = tempfile::tempdir().unwrap();
    let scrub = ["--scrub-bytes-per-sec", "64m", "--scrub-period-secs", "1"];
    let cl = common::Cluster::start_with(dir.path(), 1, 3, &scrub).await;
    let c = cl.client().await;
    // A recognisable pattern, to find the bytes in the store file.
    let pattern: Vec<u8> = (0..300_000u32)
        .flat_map(|i| format!("scrub-canary-{i:08}|").into_bytes())
        .take(1 << 20)
        .collect();
    let mut w = c.create("/s", CreateOptions::default()).await.unwrap();
    w.append(&pattern).await.unwrap();
    w.seal().await.unwrap();
    let chunk = common::chunks(&c, "/s").await[0].clone();
    assert_eq!(chunk.servers.len(), 3);

    // Flip one bit of server 0's copy, in the middle of the chunk.
    let needle = b"scrub-canary-00020000|";
    let store = cl.dir.join("cs-1/disk0.cairn");
    let at = find(&store, needle).expect("the copy's bytes in the store file") + 5;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&store)
        .unwrap();
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x10], at).unwrap();
    f.sync_data().unwrap();
    drop(f);
    let bad_server = cl.server_id(0).await;

    // The scrubber finds it; repair replaces it; nobody read the file meanwhile.
    let t0 = Instant::now();
    let mut found = false;
    loop {
        let s = cl.status().await.unwrap();
        let me = s.servers.iter().find(|x| x.id == bad_server).unwrap();
        found |= me.scrub_corrupt >= 1;
        if found && me.corrupt_now == 0 && s.under_replicated == 0 && s.repairs_running == 0 {
            eprintln!(
                "found and replaced in {:?}: {} scrubbed, {} passes, {} repairs",
                t0.elapsed(),
                me.scrub_bytes,
                me.scrub_passes,
                s.repairs_done
            );
            assert!(s.repairs_done >= 1, "no repair ran");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "after 60 s: found {found} ({} scrubbed in {} passes), corrupt now {}, \
             under-replicated {}, running {}",
            me.scrub_bytes,
            me.scrub_passes,
            me.corrupt_now,
            s.under_replicated,
            s.repairs_running
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Server 0's copy reads back whole and right; so does the file.
    let conn = cl.replica_conn(0, &[chunk.id]).await;
    let got = conn.read(chunk.id, 0, pattern.len()).await.unwrap();
    assert!(got == pattern, "the replaced copy differs");
    assert!(c.read("/s", 0, pattern.len()).await.unwrap() == pattern);
}

/// Issue 38 §5: a read that meets a flipped bit in one copy marks that copy bad at once (no
/// scrubber: its passes are an hour apart here), the masters repair it from a good copy, and
/// the repaired copy reads right alone. The file reads right all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_meets_a_flipped_bit_gets_the_copy_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let cl = common::Cluster::start(dir.path(), 1, 3).await;
    let c = cl.client().await;
    let pattern: Vec<u8> = (0..300_000u32)
        .flat_map(|i| format!("rot-canary-{i:08}|").into_bytes())
        .take(1 << 20)
        .collect();
    let mut w = c.create("/r", CreateOptions::default()).await.unwrap();
    w.append(&pattern).await.unwrap();
    w.seal().await.unwrap();
    let chunk = common::chunks(&c, "/r").await[0].clone();
    assert_eq!(chunk.servers.len(), 3);
    let store = cl.dir.join("cs-1/disk0.cairn");
    let at = find(&store, b"rot-canary-00020000|").expect("the copy's bytes in the store file") + 4;
    {
        // Behind the server's back, past its page cache: O_DIRECT, a whole aligned block.
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&store)
            .unwrap();
        let base = at & !4095;
        let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
        // SAFETY: a fresh 4096-byte allocation aligned to 4096, freed below.
        let p = unsafe { std::alloc::alloc(layout) };
        let block = unsafe { std::slice::from_raw_parts_mut(p, 4096) };
        f.read_exact_at(block, base).unwrap();
        block[(at - base) as usize] ^= 0x10;
        f.write_all_at(block, base).unwrap();
        f.sync_data().unwrap();
        unsafe { std::alloc::dealloc(p, layout) };
    }
    let bad_server = cl.server_id(0).await;
    let before = cl.status().await.unwrap().repairs_done;

    // The bad copy refuses to serve the bytes; the file reads right.
    let conn = cl.replica_conn(0, &[chunk.id]).await;
    let err = conn.read(chunk.id, 0, pattern.len()).await;
    assert!(err.is_err(), "the flipped copy served its bytes");
    for _ in 0..3 {
        assert!(c.read("/r", 0, pattern.len()).await.unwrap() == pattern);
    }
    // Marked at once, repaired.
    let t0 = Instant::now();
    let mut marked = false;
    loop {
        let s = cl.status().await.unwrap();
        let me = s.servers.iter().find(|x| x.id == bad_server).unwrap();
        marked |= me.corrupt_now >= 1;
        if s.repairs_done > before
            && me.corrupt_now == 0
            && s.under_replicated == 0
            && s.repairs_running == 0
        {
            eprintln!("marked {marked}, repaired in {:?}", t0.elapsed());
            assert!(me.scrub_passes <= 1, "the scrubber ran meanwhile");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "after 30 s: marked {marked}, corrupt now {}, under-replicated {}, repairs {} running {}",
            me.corrupt_now,
            s.under_replicated,
            s.repairs_done,
            s.repairs_running
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let conn = cl.replica_conn(0, &[chunk.id]).await;
    let got = conn.read(chunk.id, 0, pattern.len()).await.unwrap();
    assert!(got == pattern, "the repaired copy differs");
}

/// Where `needle` first occurs in the file at `path`.
fn find(path: &std::path::Path, needle: &[u8]) -> Option<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; 8 << 20];
    let mut base = 0u64;
    let mut carry: Vec<u8> = Vec::new();
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            return None;
        }
        let mut hay = std::mem::take(&mut carry);
        let start = base - hay.len() as u64;
        hay.extend_from_slice(&buf[..n]);
        if let Some(i) = hay.windows(needle.len()).position(|w| w == needle) {
            return Some(start + i as u64);
        }
        carry = hay[hay.len().saturating_sub(needle.len())..].to_vec();
        base += n as u64;
    }
}

/// The scrubber's pace comes from its period and the used bytes: with a period of 8 s, a pass
/// over a server holding one 4 MiB copy reads at about 4 MiB / 8 s (not at the background
/// bandwidth's 200 MiB/s), shows its progress in `cairn status` while it runs, and ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrubber_reads_every_copy_within_its_period_at_the_pace_that_needs() {
    const PERIOD: u64 = 8;
    let dir = tempfile::tempdir().unwrap();
    let period = PERIOD.to_string();
    let cl = common::Cluster::start_with(dir.path(), 1, 3, &["--scrub-period-secs", &period]).await;
    let c = cl.client().await;
    const SIZE: usize = 4 << 20;
    let mut w = c.create("/paced", CreateOptions::default()).await.unwrap();
    w.append(&common::bytes(7, 0, SIZE)).await.unwrap();
    w.seal().await.unwrap();
    let id = cl.server_id(0).await;

    // Wait for a pass that set out to read the copy, and follow it to its end.
    let began = Instant::now();
    let mut seen: Option<(Instant, u64)> = None;
    let mut rates = Vec::new();
    let mut printed = false;
    loop {
        let s = cl.status().await.unwrap();
        let me = s.servers.iter().find(|x| x.id == id).unwrap().clone();
        if seen.is_none()
            && me.scrub_pass_total >= SIZE as u64
            && me.scrub_pass_done < me.scrub_pass_total
        {
            seen = Some((Instant::now(), me.scrub_passes));
        }
        if let Some((t0, passes)) = seen {
            if me.scrub_passes > passes {
                let took = t0.elapsed();
                rates.sort_unstable();
                let median = rates[rates.len() / 2];
                eprintln!(
                    "pass of {} read in about {took:?} (seen running from then); median rate \
                     {median} B/s over {} readings",
                    me.scrub_pass_total,
                    rates.len()
                );
                // At the background bandwidth the pass would take milliseconds; paced, it
                // spreads over its period (at least a few seconds of it are seen running).
                assert!(took >= Duration::from_secs(2), "the pass ran at full speed");
                assert!(
                    median <= 4 * me.scrub_pass_total / PERIOD,
                    "median rate {median} B/s for {} bytes over {PERIOD} s",
                    me.scrub_pass_total
                );
                return;
            }
            rates.push(me.scrub_rate);
            assert!(!me.scrub_behind, "a 4 MiB pass over {PERIOD} s is behind");
            if !printed {
                // The operator's view, while the pass runs.
                let out = common::run_ok(common::cairn().args([
                    "status",
                    "--cluster",
                    &cl.master_addrs().join(","),
                ]));
                let out = String::from_utf8_lossy(&out.stdout);
                assert!(out.contains("scrub pass"), "no scrub progress in:\n{out}");
                printed = true;
            }
        }
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "no paced pass over the copy ended in 60 s (seen {seen:?}; last {me:?})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
