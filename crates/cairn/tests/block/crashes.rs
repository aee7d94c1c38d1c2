//! Crashes of the block server: writes flushed after the journal's last record, fio's
//! verified writes through a SIGKILL, and a random workload against a model across kills.

use super::common::nbd::{FLUSH, FUA, READ, Raw, WRITE, block_of};
use super::common::{self, Cluster, Proc};
use super::{SERIAL, create_volume, opened, tool, volume_info};
use std::time::{Duration, Instant};

/// Writes answered and flushed after the journal's last record survive a SIGKILL: the
/// reopening server maps them from the batch headers in the segments. Records are made rare
/// (one a minute) and nothing else writes one (no trims, no collection, one segment), so
/// nothing else could bring them back; four lanes put overwrites of a block into different
/// segments, where only the batches' order tells the later write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_writes_after_the_last_journal_record_survive_a_crash() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    create_volume(&masters, "t", "1m");
    let args = [
        "--record-every-ms",
        "60000",
        "--gc-every-ms",
        "0",
        "--lanes",
        "4",
    ];
    let mut server = common::nbd::server(&masters, &args);
    let mut c = Raw::connect(&server.addr);
    c.flags(3);
    assert_eq!(c.go("t"), 1);
    let mut want = vec![0u64; 64];
    let mut cookie = 0;
    for round in 1..=6u64 {
        for b in 0..64u64 {
            // Every block in round 1; then a third of them, again and again.
            if round > 1 && (b * 7 + round) % 3 != 0 {
                continue;
            }
            cookie += 1;
            let v = round * 1000 + b;
            c.request(WRITE, 0, cookie, b * 4096, 4096, &block_of(v));
            assert_eq!(c.reply(0).0, 0);
            want[b as usize] = v;
        }
    }
    c.request(FLUSH, 0, cookie + 1, 0, 0, &[]);
    assert_eq!(c.reply(0).0, 0);
    server.kill();
    drop(c);
    server = common::nbd::server(&masters, &args);
    let mut c = opened(&server.addr, "t");
    c.request(READ, 0, 1, 0, 64 * 4096, &[]);
    let (e, _, data) = c.reply(64 * 4096);
    assert_eq!(e, 0);
    for b in 0..64 {
        let got = &data[b * 4096..(b + 1) * 4096];
        assert!(
            got == block_of(want[b]).as_slice(),
            "block {b}: want {}, read {}",
            want[b],
            u64::from_le_bytes(got[..8].try_into().unwrap())
        );
    }
    drop(server);
}

/// fio's random writes with verification (depth 16, a FLUSH every 16) through a SIGKILL of
/// the server: fio saves how far it got (`verify_state_save`) and logs each write it saw
/// complete; after a new server opens the volume, fio reads back every write it issued and
/// checks its CRC. Every write that completed must read back, flushed or not (a write is
/// durable once answered here, stronger than NBD asks); only writes in flight at the kill
/// (fio counts those too, failed as they are) may fail it. Canary: a completed block trimmed
/// afterwards fails the same check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fio_verified_writes_survive_a_sigkill_of_the_server() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    create_volume(&masters, "k", "64m");
    let mut server = common::nbd::server(&masters, &[]);
    let fio = |addr: &str, verify: bool| {
        let mut c = tool("fio");
        c.current_dir(dir.path()).args([
            "--name=k",
            "--ioengine=nbd",
            &format!("--uri=nbd://{addr}/k"),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            "--size=64m",
            "--fsync=16",
            "--verify=crc32c",
            "--output-format=json",
        ]);
        if verify {
            c.args([
                "--do_verify=1",
                "--verify_only",
                "--verify_state_load=1",
                "--continue_on_error=verify",
            ]);
        } else {
            // Each completed write's offset in k_clat.1.log.
            c.args([
                "--do_verify=0",
                "--verify_state_save=1",
                "--write_lat_log=k",
                "--log_offset=1",
            ]);
        }
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c
    };
    let mut w = fio(&server.addr, false);
    // fio prints its running totals every second; the server is killed once it has seen
    // enough writes complete (a fixed sleep killed it before fio's first write on a busy
    // machine), well before the 16,384 writes of 64 MiB are done.
    w.arg("--status-interval=1");
    let mut writer = w.spawn().unwrap();
    let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let said = said.clone();
        let mut out = writer.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while let Ok(n @ 1..) = std::io::Read::read(&mut out, &mut buf) {
                said.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    let written = |text: &str| -> u64 {
        let Some(at) = text.rfind("\"write\" : {") else {
            return 0;
        };
        let rest = &text[at..];
        let Some(t) = rest.find("\"total_ios\" : ") else {
            return 0;
        };
        rest[t + 14..]
            .split(',')
            .next()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while written(&said.lock().unwrap()) < 2000 {
        assert!(
            Instant::now() < deadline,
            "fio completed too few writes in 120 s: {}",
            said.lock().unwrap()
        );
        if writer.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    server.kill();
    let w = writer.wait_with_output().unwrap();
    reader.join().unwrap();
    let said = said.lock().unwrap().clone() + &String::from_utf8_lossy(&w.stderr);
    assert!(
        dir.path().join("local-k-0-verify.state").exists(),
        "fio saved no verify state: {said}"
    );
    let completed: std::collections::HashSet<u64> =
        std::fs::read_to_string(dir.path().join("k_clat.1.log"))
            .unwrap()
            .lines()
            .filter_map(|l| l.split(',').nth(4)?.trim().parse().ok())
            .collect();
    assert!(
        completed.len() >= 1000,
        "only {} writes completed before the kill: {said}",
        completed.len()
    );
    server = common::nbd::server(&masters, &[]);
    drop(opened(&server.addr, "k"));
    // (bytes verified, offsets that failed verification)
    let verify = || -> (u64, Vec<u64>) {
        let out = fio(&server.addr, true).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let all = text.clone() + &String::from_utf8_lossy(&out.stderr);
        let bad: Vec<u64> = all
            .lines()
            .filter(|l| l.starts_with("verify:"))
            .filter_map(|l| {
                let at = l.find(" offset ")? + 8;
                l[at..].split([',', ' ']).next()?.parse().ok()
            })
            .collect();
        let j: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
        (j["jobs"][0]["read"]["io_bytes"].as_u64().unwrap(), bad)
    };
    let (read, bad) = verify();
    // Every completed write was checked (and a few failed ones besides).
    assert!(
        read >= completed.len() as u64 * 4096,
        "fio verified {read} B of {} completed writes",
        completed.len()
    );
    let lost: Vec<_> = bad.iter().filter(|o| completed.contains(o)).collect();
    assert!(
        lost.is_empty(),
        "completed writes read back wrong at {lost:?} (all failing: {bad:?})"
    );
    assert!(
        bad.len() <= 16,
        "more failures than writes in flight: {bad:?}"
    );
    // Canary: a completed write, trimmed, fails the same check and is caught.
    let victim = *completed.iter().next().unwrap();
    let mut c = Raw::connect(&server.addr);
    c.flags(3);
    assert_eq!(c.go("k"), 1);
    c.request(4, 0, 1, victim, 4096, &[]);
    assert_eq!(c.reply(0).0, 0);
    drop(c);
    let (_, bad) = verify();
    assert!(bad.contains(&victim), "a trimmed block passed: {bad:?}");
    drop(server);
}

/// A random workload of writes, trims, FUA writes and flushes against a naive model, with
/// garbage collection compacting tiny segments all the time and the server SIGKILLed at
/// random moments (some with a write in flight): while it runs the volume reads exactly as
/// the model says; after each restart every block reads as what the last completed FLUSH (or
/// FUA) left there or as something written after it — never anything else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_volume_matches_a_model_across_server_crashes() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    const BLOCKS: u64 = 64;
    create_volume(&masters, "m", "256k");
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // Per block: what the last completed flush made durable, and what was written since.
    let mut durable = vec![0u64; BLOCKS as usize];
    let mut since: Vec<Vec<u64>> = vec![Vec::new(); BLOCKS as usize];
    let mut current = vec![0u64; BLOCKS as usize];
    let mut v = 0u64;
    let mut cookie = 0u64;
    let connect = |p: &Proc| opened(&p.addr, "m");
    // 64 KiB segments, a pass every 100 ms compacting any under 70 % live.
    let gc = [
        "--segment-bytes",
        "64k",
        "--gc-every-ms",
        "100",
        "--gc-live-pct",
        "70",
        "--lanes",
        "2",
    ];
    let mut server = common::nbd::server(&masters, &gc);
    let mut c = connect(&server);
    let mut checked = 0;
    let mut written = 0u64;
    for round in 0..4 {
        for op in 0..120 {
            cookie += 1;
            if op % 30 == 29 {
                // The whole volume, while the collector moves blocks under it.
                c.request(READ, 0, cookie, 0, (BLOCKS * 4096) as u32, &[]);
                let (e, _, data) = c.reply((BLOCKS * 4096) as usize);
                assert_eq!(e, 0);
                for b in 0..BLOCKS as usize {
                    let got = &data[b * 4096..(b + 1) * 4096];
                    assert!(
                        got == block_of(current[b]).as_slice(),
                        "round {round}, op {op}, block {b}: want {}, read {}",
                        current[b],
                        u64::from_le_bytes(got[..8].try_into().unwrap())
                    );
                }
                continue;
            }
            let lba = next() % BLOCKS;
            let n = (1 + next() % 4).min(BLOCKS - lba);
            match next() % 10 {
                0..=5 => {
                    v += 1;
                    let fua = next() % 5 == 0;
                    let data: Vec<u8> = (0..n).flat_map(|i| block_of(v * 100 + i)).collect();
                    c.request(
                        WRITE,
                        if fua { FUA } else { 0 },
                        cookie,
                        lba * 4096,
                        data.len() as u32,
                        &data,
                    );
                    assert_eq!(c.reply(0).0, 0);
                    written += n * 4096;
                    for i in 0..n {
                        let b = (lba + i) as usize;
                        current[b] = v * 100 + i;
                        since[b].push(v * 100 + i);
                    }
                    if fua {
                        // FUA makes this write durable (and, with it, the journal record
                        // carries every change before it).
                        durable.clone_from(&current);
                        since.iter_mut().for_each(Vec::clear);
                    }
                }
                6..=7 => {
                    c.request(4, 0, cookie, lba * 4096, (n * 4096) as u32, &[]);
                    assert_eq!(c.reply(0).0, 0);
                    for i in 0..n {
                        let b = (lba + i) as usize;
                        current[b] = 0;
                        since[b].push(0);
                    }
                }
                _ => {
                    c.request(FLUSH, 0, cookie, 0, 0, &[]);
                    assert_eq!(c.reply(0).0, 0);
                    durable.clone_from(&current);
                    since.iter_mut().for_each(Vec::clear);
                }
            }
        }
        // Sometimes a write is in flight when the server dies: it may or may not land.
        if round % 2 == 1 {
            v += 1;
            let b = next() % BLOCKS;
            c.request(WRITE, 0, 0, b * 4096, 4096, &block_of(v * 100));
            since[b as usize].push(v * 100);
        }
        server.kill();
        drop(c);
        server = common::nbd::server(&masters, &gc);
        c = connect(&server);
        c.request(READ, 0, 1, 0, (BLOCKS * 4096) as u32, &[]);
        let (e, _, data) = c.reply((BLOCKS * 4096) as usize);
        assert_eq!(e, 0);
        for b in 0..BLOCKS as usize {
            let got = &data[b * 4096..(b + 1) * 4096];
            let id = u64::from_le_bytes(got[..8].try_into().unwrap());
            let ok = std::iter::once(durable[b])
                .chain(since[b].iter().copied())
                .any(|want| want == id && got == block_of(want).as_slice());
            assert!(
                ok,
                "round {round}, block {b}: read {id}, durable {}, written since {:?}",
                durable[b], since[b]
            );
            current[b] = id;
            checked += 1;
        }
        // Canary: the check compared written data, not a volume of zeros.
        assert!(
            current.iter().any(|&id| id != 0),
            "round {round}: nothing survived"
        );
        // What survived is the new durable state.
        durable.clone_from(&current);
        since.iter_mut().for_each(Vec::clear);
    }
    assert_eq!(checked, 4 * BLOCKS);
    // The collector ran: the volume's files hold far less than was written to it.
    std::thread::sleep(Duration::from_secs(2));
    let info = volume_info(&masters, "m");
    let stored = info["stored_bytes"].as_u64().unwrap();
    assert!(
        stored < written / 2,
        "{stored} B stored for {written} B written: {info}"
    );
}
