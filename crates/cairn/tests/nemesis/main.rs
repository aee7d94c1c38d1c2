//! The nemesis: randomized fault scenarios against a real cluster of processes on loopback
//! (3 masters, 4 chunkservers, an S3 gateway, an NBD server), while writers append
//! verification data (a file of three replicas, one `replicas:3,then:ec:2+1,lz4` whose sealed
//! chunks the chunkservers convert to compressed chunk groups at once, one erasure-coded
//! `ec:2+1`) and a reader reads, S3 clients PUT, DELETE and GET objects through the gateway,
//! an NBD client writes, trims, flushes and reads a volume whose collector compacts 64 KiB
//! segments all the time, and a file writer creates, writes, fsyncs, closes, renames,
//! truncates, deletes and reads files through a `cairn mount` (mount.rs).
//!
//! Each scenario, chosen by its seed, injects one to three faults at random times — SIGKILL and
//! restart of a chunkserver, a master or the services (gateway, NBD server and mount), a slow
//! server, an erroring server, a
//! frozen server, a full disk — heals them, and checks:
//! - every acknowledged append reads back with the right bytes (a loss otherwise);
//! - every byte any reader saw is the right byte for its position and lies inside what the
//!   writers finally had acknowledged (never unacknowledged or corrupt data);
//! - every chunk returns to full redundancy;
//! - every S3 key reads back as its last acknowledged PUT or DELETE left it (or as a later
//!   request that failed, whose outcome the client cannot know), and every GET during the run
//!   returned a whole version of its key no older than the last one acknowledged before it;
//! - every block of the volume read (during the run, after each reconnection, and at the end)
//!   is what the client last wrote there, or — after a lost connection or a failed request —
//!   its last answered write (durable once answered) or what the last completed FLUSH left, or
//!   something written or trimmed since;
//! - every file read through the mount (during the run, after the mount was killed, and at
//!   the end — every fourth scenario after a SIGKILL of the mount with files open, mount.rs
//!   `FS_KILL_EVERY`) holds what its last fsync, close,
//!   create, truncate or rename left, or a later state its writes reached (any of them once the
//!   mount was killed); while the mount lives, exactly what it last answered.
//!
//! `cargo test --test nemesis` runs 10 scenarios (seed 1). More:
//! `CAIRN_NEMESIS_SCENARIOS=200 CAIRN_NEMESIS_SEED=7 cargo test --release --test nemesis -- --nocapture`
//! (RELIABILITY.md holds the long runs). `CAIRN_NEMESIS_STARVE=N` spins N threads while each
//! scenario's faults run; `CAIRN_NEMESIS_MASTER_FAULTS=1` makes every scenario's first fault a
//! master's. `CAIRN_NEMESIS_FIRST=146` starts at that scenario
//! index: with the run's seed it replays a failed scenario's plan (on a fresh cluster).

#[path = "../common/mod.rs"]
mod common;
#[path = "../../src/s3client.rs"]
#[allow(dead_code)]
mod s3client;

mod files;
mod metadata;
mod mount;
mod nbd;
mod plan;
mod renames;
mod report;
mod s3;
mod watchdog;

use files::*;
use metadata::{check_metadata, compare_copies};
use mount::*;
use nbd::*;
use plan::*;
use report::*;
use s3::*;

use bytes::Bytes;
use cairn_client::{Client, ClientOptions, CreateOptions, FaultSpec};
use common::nbd::{FLUSH, FUA, READ, Raw, TRIM, WRITE, block_of};
use common::{Cluster, Proc, bytes, chunks};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use s3client::S3Bucket;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const WRITERS: usize = 3;

/// A subtree split into a partition of its own (docs/partitions.md) at the start: the files
/// of every writer but the first are in it, so its Raft group, ids, repair and conversion run
/// under the faults.
const PARTITIONED: &str = "/nemesis-p";
/// Every `MOVE_EVERY`-th scenario (from the `MOVE_AT`-th) moves its directory of the root
/// partition, populated and being written, into a new partition while the faults run
/// (state/moves.rs): a master killed mid-move leaves the driving to the next leader. From the
/// `MOVE_OUT_AT`-th, every `MOVE_EVERY`-th moves its directory of the split partition
/// (`PARTITIONED`) out of it into a new one the same way (its two writers write there). From
/// the `HASH_AT`-th, every `MOVE_EVERY`-th hashes its directory of the root over
/// `HASH_SHARDS` new partitions (state/hashed.rs): its rows, the first writer's file among
/// them, move to their shards by name the same way.
const MOVE_EVERY: u64 = 25;
const MOVE_AT: u64 = 3;
const MOVE_OUT_AT: u64 = 8;
const HASH_AT: u64 = 13;
const HASH_SHARDS: &str = "2";
/// Empty files made in a moving scenario's directory first: rows for the move to copy.
const MOVE_FILES: usize = 50;
/// How long the workload runs in each scenario; faults start and end inside it.
const ACTIVE: Duration = Duration::from_millis(3000);

async fn scenario(
    cl: &mut Cluster,
    gw: &mut Gateway,
    nbd: &mut Nbd,
    mnt: &mut MountSvc,
    index: u64,
    seed: u64,
    t: &mut Totals,
) {
    let faults = plan(seed);
    eprintln!("scenario {index} seed {seed}: {faults:?}");
    let opts = ClientOptions {
        chunk_size: 1 << 20,
        request_timeout: Duration::from_secs(2),
        ..ClientOptions::default()
    };
    watchdog::step(index, "the start");
    let c = cl.client_with(opts.clone()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let files: Vec<(String, u64)> = (0..WRITERS)
        .map(|w| {
            let top = if w == 0 { "/nemesis" } else { PARTITIONED };
            (format!("{top}/s{index}/w{w}"), seed * 16 + w as u64)
        })
        .collect();
    let moving = match index % MOVE_EVERY {
        MOVE_AT | HASH_AT => Some(format!("/nemesis/s{index}")),
        MOVE_OUT_AT => Some(format!("{PARTITIONED}/s{index}")),
        _ => None,
    };
    let hashing = index % MOVE_EVERY == HASH_AT;
    if let Some(dir) = &moving {
        for i in 0..MOVE_FILES {
            let path = format!("{dir}/m/f{i}");
            let create = CreateOptions {
                parents: true,
                ..CreateOptions::default()
            };
            let w = c.create(&path, create).await;
            w.unwrap_or_else(|e| panic!("{path}: {e}"))
                .close()
                .await
                .unwrap_or_else(|e| panic!("{path}: {e}"));
        }
    }
    let split = |dir: String, addrs: String| {
        tokio::task::spawn_blocking(move || {
            let mut cmd = common::cairn();
            cmd.args(["admin", "--cluster", &addrs, "partition", "split", &dir]);
            if hashing {
                cmd.args(["--shards", HASH_SHARDS]);
            }
            cmd.output().expect("cairn runs")
        })
    };
    let writers: Vec<_> = files
        .iter()
        .enumerate()
        .map(|(i, (p, s))| {
            let run = writer(c.clone(), p.clone(), *s, policy_of(i), stop.clone());
            tokio::spawn(run)
        })
        .collect();
    let renamer = tokio::spawn(renames::renamer(
        c.clone(),
        format!("/nemesis/s{index}/renamed"),
        format!("{PARTITIONED}/s{index}/renamed"),
        seed * 16 + 12,
        stop.clone(),
    ));
    let reader_client = cl.client_with(opts).await;
    let rd = tokio::spawn(reader(reader_client, files.clone(), stop.clone(), seed));
    let s3_log = S3Log::default();
    let s3_keys: Vec<Vec<String>> = (0..S3_WRITERS)
        .map(|w| {
            (0..S3_KEYS)
                .map(|k| format!("s{index}/w{w}/k{k}"))
                .collect()
        })
        .collect();
    let s3_writers: Vec<_> = s3_keys
        .iter()
        .enumerate()
        .map(|(w, keys)| {
            let s3 = gw.s3.clone();
            let run = s3_writer(
                s3,
                keys.clone(),
                s3_log.clone(),
                seed * 16 + 8 + w as u64,
                stop.clone(),
            );
            tokio::spawn(run)
        })
        .collect();
    let s3_rd = tokio::spawn(s3_reader(
        gw.s3.clone(),
        s3_keys.concat(),
        s3_log.clone(),
        seed,
        stop.clone(),
    ));

    let nbd_rd = {
        let (addr, model, stop) = (
            nbd.proc.addr.clone(),
            nbd.model.take().expect("model"),
            stop.clone(),
        );
        tokio::task::spawn_blocking(move || nbd_client(addr, model, seed, stop))
    };

    // The file service: a writer through the kernel in a directory of its own.
    let fs_dir = mnt.dir.join(format!("fs/s{index}"));
    let made = Instant::now();
    while let Err(e) = std::fs::create_dir_all(&fs_dir) {
        assert!(
            made.elapsed() < Duration::from_secs(60),
            "{}: {e}",
            fs_dir.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let fs_rd = {
        let g = mnt.generation.load(Ordering::SeqCst);
        let (dir, gen_, stop) = (fs_dir.clone(), mnt.generation.clone(), stop.clone());
        tokio::task::spawn_blocking(move || fs_writer(dir, fs_names(g), gen_, seed, stop))
    };

    // CAIRN_NEMESIS_STARVE=N: N threads spin on the CPU while the faults run (to the last
    // one's end), so the cluster's processes are starved as they fail over (the runs that
    // lost metadata had other work starving the machine: RELIABILITY.md, session 40).
    let starve: usize = std::env::var("CAIRN_NEMESIS_STARVE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let spinning = Arc::new(AtomicBool::new(true));
    let spinners: Vec<_> = (0..starve)
        .map(|i| {
            let spinning = spinning.clone();
            std::thread::spawn(move || {
                let mut x = i as u64;
                while spinning.load(Ordering::Relaxed) {
                    for _ in 0..1024 {
                        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    }
                }
                std::hint::black_box(x);
            })
        })
        .collect();
    // The faults, in time order: (when, fault index, begin?).
    let mut events: Vec<(Duration, usize, bool)> = faults
        .iter()
        .enumerate()
        .flat_map(|(i, f)| [(f.start, i, true), (f.end, i, false)])
        .collect();
    events.sort();
    let mover = moving
        .clone()
        .map(|dir| split(dir, cl.master_addrs().join(",")));
    watchdog::step(index, "the faults");
    let t0 = Instant::now();
    for (at, i, begin) in events {
        tokio::time::sleep(at.saturating_sub(t0.elapsed())).await;
        let f = &faults[i];
        match (f.kind, begin) {
            (Kind::KillChunkserver, true) => cl.chunkservers[f.target].kill(),
            (Kind::KillChunkserver, false) => cl.chunkservers[f.target].start(),
            (Kind::KillMaster, true) => cl.masters[f.target].kill(),
            (Kind::KillMaster, false) => cl.masters[f.target].start(),
            (Kind::PauseMaster, begin) => {
                let sig = if begin { libc::SIGSTOP } else { libc::SIGCONT };
                // Pid 0 (no child) would signal this whole process group.
                let pid = cl.masters[f.target].pid();
                assert_ne!(pid, 0, "master {} is not running", f.target);
                // SAFETY: signalling our own child.
                unsafe { libc::kill(pid as i32, sig) };
            }
            (Kind::KillService, true) => {
                gw.proc.kill();
                nbd.proc.kill();
                mnt.kill();
            }
            (Kind::KillService, false) => {
                gw.proc.start();
                nbd.proc.start();
                tokio::task::block_in_place(|| mnt.start_proc());
            }
            (_, true) => cl.fault(f.target, f.spec).await,
            (_, false) => cl.fault(f.target, FaultSpec::default()).await,
        }
        if begin {
            *t.faults.entry(format!("{:?}", f.kind)).or_default() += 1;
        }
    }
    spinning.store(false, Ordering::Relaxed);
    for s in spinners {
        s.join().expect("spinner");
    }
    tokio::time::sleep(ACTIVE.saturating_sub(t0.elapsed())).await;
    stop.store(true, Ordering::Relaxed);
    watchdog::step(index, "the append writers");
    let mut written = Vec::new();
    for w in writers {
        written.push(w.await.expect("writer task"));
    }
    watchdog::step(index, "the reader");
    let seen = rd.await.expect("reader task");
    watchdog::step(index, "the renamer");
    let renamed = renamer.await.expect("renamer task");
    t.renames += renamed.renames;
    t.rename_errors += renamed.errors;
    t.renames_lost += renamed.lost;
    watchdog::step(index, "the S3 writers");
    let mut s3_seen = Vec::new();
    for w in s3_writers {
        s3_seen.push(w.await.expect("s3 writer task"));
    }
    watchdog::step(index, "the S3 reader");
    s3_seen.push(s3_rd.await.expect("s3 reader task"));
    watchdog::step(index, "the NBD client");
    let (model, nbd_seen) = nbd_rd.await.expect("nbd client");
    nbd.model = Some(model);
    t.nbd_writes += nbd_seen.writes;
    t.nbd_errors += nbd_seen.errors;
    t.nbd_blocks_checked += nbd_seen.checked;
    t.nbd_bad_blocks += nbd_seen.bad;
    t.nbd_unreadable += u64::from(nbd_seen.unreadable);
    watchdog::step(index, "the file writer");
    let (mut fs_model, fs_open, mut fs_seen) = fs_rd.await.expect("file writer");
    watchdog::step(index, "the files' check at the end");
    tokio::task::block_in_place(|| {
        let kill = index.is_multiple_of(FS_KILL_EVERY);
        fs_check_at_end(mnt, kill, &fs_dir, &mut fs_model, fs_open, &mut fs_seen);
        let _ = std::fs::remove_dir_all(&fs_dir);
    });
    t.fs_ops += fs_seen.ops;
    t.fs_errors += fs_seen.errors;
    t.fs_synced += fs_seen.synced;
    t.fs_checked += fs_seen.checked;
    t.fs_bad += fs_seen.bad;
    t.fs_linked += fs_seen.linked;
    watchdog::step(index, "the S3 check at the end");
    let s3_lost = s3_verify_and_delete(&gw.s3, &s3_log).await;
    t.s3_losses += s3_lost;
    for s in &s3_seen {
        t.s3_puts += s.puts;
        t.s3_deletes += s.deletes;
        t.s3_gets += s.gets;
        t.s3_errors += s.errors + s.get_errors;
        t.s3_bad_gets += s.bad_gets;
    }

    // The move ends: its driver, or the next leader's, or the split asked again.
    watchdog::step(index, "the move's end");
    let mut moved_to = None;
    if let (Some(dir), Some(m)) = (&moving, mover) {
        let out = m.await.expect("split task");
        if !out.status.success() {
            eprintln!(
                "  split {dir} under the faults: {} (asked again)",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            let out = split(dir.clone(), cl.master_addrs().join(","))
                .await
                .expect("split task");
            if !out.status.success() {
                eprintln!(
                    "  split {dir} again: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(s) = cl.status().await
                && let Some(p) = s.partitions.iter().find(|p| p.subtree == *dir)
            {
                moved_to = Some(u64::from(p.id));
                break;
            }
            if Instant::now() > deadline {
                eprintln!("  MOVE of {dir} not finished 60 s after the faults");
                t.moves_unfinished += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if moved_to.is_some() {
            t.moves += 1;
            t.hashed += u64::from(hashing);
            let listed = c.list(&format!("{dir}/m")).await.map_or(0, |l| l.len());
            if listed != MOVE_FILES {
                eprintln!("  MOVED {dir}/m lists {listed} files of {MOVE_FILES}");
                t.moves_lost_rows += 1;
            }
        }
    }

    watchdog::step(index, "the appends' verification");
    let mut lost = 0;
    for ((path, fseed), w) in files.iter().zip(&written) {
        let l = verify(&c, path, *fseed, w.acked).await;
        lost += l;
        t.bytes_verified += w.acked - l;
        t.appends += w.appends;
        t.append_errors += w.errors;
        t.misplaced += w.misplaced;
        if let Some(&f) = seen.furthest.get(path)
            && f > w.acked
        {
            eprintln!(
                "  UNACKED read of {path}: up to {f}, {} acknowledged",
                w.acked
            );
            t.unacked_reads += 1;
        }
    }
    t.losses += lost;
    t.corrupt_reads += seen.corrupt;
    t.reads += seen.reads;
    t.read_errors += seen.errors;
    t.scenarios += 1;
    // Every chunk written returns to all its copies (the masters' locations), and the
    // leader counts nothing short or being repaired.
    watchdog::step(index, "the copies' return");
    let deadline = Instant::now() + Duration::from_secs(90);
    let s = loop {
        let mut short = Vec::new();
        let mut converted = 0;
        for (path, _) in &files {
            for ch in chunks(&c, path).await.iter().filter(|ch| ch.length > 0) {
                if ch.lz4_stream > 0 {
                    converted += 1;
                }
                // Ids carry the partition that allocated them: a moved file's, the root's
                // (before its move) or its new partition's.
                let want = u64::from(path.starts_with(PARTITIONED));
                assert!(
                    ch.id >> 48 == want || moved_to == Some(ch.id >> 48),
                    "{path}: chunk {} from another partition",
                    ch.id
                );
                // A group has all its members; an EC file's tail M+1 copies; else 3.
                let width = match (ch.ec_data, policy_of_path(path)) {
                    (k, _) if k > 0 => (k + ch.ec_parity) as usize,
                    (_, Some(m)) => m + 1,
                    (_, None) => 3,
                };
                if ch.servers.len() < width || !ch.sealed {
                    short.push((path.clone(), ch.id, ch.servers.clone()));
                }
            }
        }
        let s = cl.status().await.expect("status");
        let clean = s.under_replicated == 0 && s.repairs_running == 0 && s.lost_chunks == 0;
        if short.is_empty() && clean {
            t.converted += converted;
            for (path, _) in files.iter().filter(|(p, _)| p.starts_with(PARTITIONED)) {
                t.partition_chunks += chunks(&c, path).await.len() as u64;
            }
            break s;
        }
        if Instant::now() > deadline {
            eprintln!(
                "  UNDER-REPLICATED after 90 s: {short:?}; leader: {} short, {} running, {} failed, {} lost",
                s.under_replicated, s.repairs_running, s.repairs_failed, s.lost_chunks
            );
            t.under_replicated += short.len().max(1) as u64;
            break s;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    watchdog::step(index, "the metadata check");
    check_metadata(cl, t).await;
    watchdog::step(index, "the copies' comparison");
    compare_copies(cl, t).await;
    eprintln!("  renames {renamed:?}");
    eprintln!(
        "  appends {} (errors {}), reads {} (errors {}), lost {lost}, corrupt reads {}, chunks {}; \
         s3 puts {}, deletes {}, gets {} (errors {}, bad {}), keys lost {s3_lost}; \
         nbd writes {}, blocks checked {} (errors {}, bad {}); \
         files: calls {}, errors {}, synced {}, closed behind {}, checked {}, bad {}, linked {}",
        written.iter().map(|w| w.appends).sum::<u64>(),
        written.iter().map(|w| w.errors).sum::<u64>(),
        seen.reads,
        seen.errors,
        seen.corrupt,
        s.chunks,
        s3_seen.iter().map(|s| s.puts).sum::<u64>(),
        s3_seen.iter().map(|s| s.deletes).sum::<u64>(),
        s3_seen.iter().map(|s| s.gets).sum::<u64>(),
        s3_seen.iter().map(|s| s.errors + s.get_errors).sum::<u64>(),
        s3_seen.iter().map(|s| s.bad_gets).sum::<u64>(),
        nbd_seen.writes,
        nbd_seen.checked,
        nbd_seen.errors,
        nbd_seen.bad,
        fs_seen.ops,
        fs_seen.errors,
        fs_seen.synced,
        fs_seen.behind,
        fs_seen.checked,
        fs_seen.bad,
        fs_seen.linked,
    );
    watchdog::step(index, "the deletes");
    for (path, _) in &files {
        c.delete(path).await.expect("delete");
    }
}

/// M of the EC file at `path`, if it is one.
fn policy_of_path(path: &str) -> Option<usize> {
    let w: usize = path.rsplit_once("/w")?.1.parse().ok()?;
    match policy_of(w).policy?.write {
        cairn_client::Redundancy::Ec { m, .. } => Some(usize::from(m)),
        cairn_client::Redundancy::Replicas(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nemesis() {
    let env = |k: &str, d: u64| {
        std::env::var(k).ok().map_or(d, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{k}={v}: not a number"))
        })
    };
    let scenarios = env("CAIRN_NEMESIS_SCENARIOS", 10);
    let seed = env("CAIRN_NEMESIS_SEED", 1);
    // Replays scenarios from this index on (a failure's index, with its seed).
    let first = env("CAIRN_NEMESIS_FIRST", 0);
    let dir = tempfile::tempdir().unwrap();
    // CAIRN_NEMESIS_TLS=1: the control plane and the data plane over TLS (run the test alone,
    // `--exact nemesis`: every process this test binary starts then serves TLS).
    let tls = env("CAIRN_NEMESIS_TLS", 0) == 1;
    let tls_dir = dir.path().join("tls");
    let tls_dir_arg = tls_dir.display().to_string();
    let (mut master_extra, mut cs_extra): (Vec<&str>, Vec<&str>) = if tls {
        common::run_ok(common::cairn().args(["tls", "init"]).arg(&tls_dir));
        common::TLS_DIR.set(tls_dir.clone()).unwrap();
        (vec!["--tls-dir", &tls_dir_arg], vec!["--data-tls"])
    } else {
        (vec![], vec![])
    };
    // Snapshots often and short logs behind them: a master killed for a while catches up by
    // receiving the leader's tables (streamed as a snapshot file), under the faults too.
    master_extra.extend(["--snapshot-every", "200", "--log-keep", "50"]);
    // Segments collected every second once unwritten for 6 s (leases last 5 s here): the
    // segments of the mounts killed at each scenario's end go during the run, and a mount
    // frozen past its lease meets a condemned segment (docs/files.md "Segment collection").
    master_extra.extend(["--segment-collect-secs", "1", "--segment-grace-secs", "6"]);
    // Room for what 200 scenarios leave (the writers' files, the mount's segments) on three
    // servers while the fourth is down or came back empty: with 256 MiB the cluster filled
    // (RELIABILITY.md, seed 62). The disks are sparse files (--no-zero-fill).
    // CAIRN_NEMESIS_DISK gives another size (e.g. 256m, to run a full cluster).
    let disk = std::env::var("CAIRN_NEMESIS_DISK").unwrap_or_else(|_| "1g".into());
    cs_extra.extend(["--disk-size", &disk]);
    eprintln!("nemesis with TLS: {tls}");
    let mut cl = Cluster::start_full(dir.path(), 3, 4, &master_extra, &cs_extra).await;
    let masters = cl.master_addrs();
    // Sealed chunks of `then:ec` files convert as soon as they are sealed.
    cl.masters()
        .send(
            cairn_rpc::pb::ConfigRequest {
                convert_after_secs: Some(0),
                ..Default::default()
            },
            |mut c, r| async move { c.set_config(r).await },
        )
        .await
        .unwrap();
    common::run_ok(common::cairn().args([
        "admin",
        "--cluster",
        &masters.join(","),
        "partition",
        "split",
        PARTITIONED,
    ]));
    // The gateway and the NBD server run with their service keys, as `cairn up` runs them.
    let mut gw = Gateway::start(dir.path(), &masters).await;
    let nbd_key = common::service_key(dir.path(), &masters, "block");
    // A volume served by a `cairn nbd` whose collector compacts small segments all the time.
    common::run_ok(common::cairn().args([
        "volume",
        "create",
        "nemesis",
        "--size",
        "1m",
        "--cluster",
        &masters.join(","),
    ]));
    let mut nbd = Nbd {
        proc: common::nbd::server(
            &masters,
            &[
                "--service-key-file",
                nbd_key.to_str().unwrap(),
                "--segment-bytes",
                "64k",
                "--gc-every-ms",
                "500",
            ],
        ),
        model: Some(NbdModel::new()),
    };
    // The file service: a `cairn mount` the scenarios' file writers use.
    let mut mnt = MountSvc::start(&dir.path().join("mnt"), &masters);
    let mut t = Totals::default();
    watchdog::start();
    let started = Instant::now();
    for i in first..first + scenarios {
        scenario(
            &mut cl,
            &mut gw,
            &mut nbd,
            &mut mnt,
            i,
            seed.wrapping_mul(1_000_003).wrapping_add(i),
            &mut t,
        )
        .await;
    }
    report(&t, seed, scenarios, started.elapsed());
}

/// Canary for the checker: a file one byte shorter than "acknowledged", or with a wrong byte,
/// is counted as a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_counts_a_missing_or_wrong_byte() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let c = cl.client().await;
    let mut w = c.create("/v/f", CreateOptions::default()).await.unwrap();
    w.append(&bytes(5, 0, 1000)).await.unwrap();
    w.close().await.unwrap();
    assert_eq!(verify(&c, "/v/f", 5, 1000).await, 0);
    assert_eq!(verify(&c, "/v/f", 5, 1001).await, 1);
    assert!(verify(&c, "/v/f", 6, 1000).await > 900);
}

#[test]
fn plans_are_reproducible_and_varied() {
    let a: Vec<String> = (0..50).map(|s| format!("{:?}", plan(s))).collect();
    let b: Vec<String> = (0..50).map(|s| format!("{:?}", plan(s))).collect();
    assert_eq!(a, b);
    let kinds: std::collections::BTreeSet<Kind> = (0..50)
        .flat_map(|s| plan(s).into_iter().map(|f| f.kind))
        .collect();
    assert_eq!(kinds.len(), 8, "{kinds:?}");
    for s in 0..200 {
        let p = plan(s);
        let kills = p.iter().filter(|f| f.kind.kills()).count();
        assert!(kills <= 1);
    }
}

/// Canary for the S3 checker: stale, foreign, truncated and missing objects are refused; the
/// outcome of a failed request is allowed either way.
#[test]
fn the_s3_checker_refuses_stale_or_wrong_objects() {
    let k = KeyLog {
        ops: vec![Some(1), Some(2), None, Some(3), Some(4)],
        acked: Some(3),
        failed: vec![1, 4],
    };
    let body = |v| s3_body(v).to_vec();
    // The last acknowledged PUT, and failed ones (before or after it).
    assert!(k.allows(Some(3), Some(&body(3))));
    assert!(k.allows(Some(3), Some(&body(4))));
    assert!(k.allows(Some(3), Some(&body(2))));
    // Older acknowledged requests: stale.
    assert!(!k.allows(Some(3), Some(&body(1))));
    assert!(!k.allows(Some(3), None));
    // A GET sent before the delete was acknowledged may see it, or the PUTs after.
    assert!(k.allows(Some(2), None));
    // Bytes no request wrote, or a version cut short.
    assert!(!k.allows(Some(3), Some(&body(9))));
    let mut short = body(3);
    short.pop();
    assert!(!k.allows(Some(3), Some(&short)));
    // Nothing acknowledged yet: absent, or any version written.
    let fresh = KeyLog {
        ops: vec![Some(7)],
        acked: None,
        failed: vec![],
    };
    assert!(fresh.allows(None, None));
    assert!(fresh.allows(None, Some(&body(7))));
    assert!(!fresh.allows(None, Some(&body(8))));
}
