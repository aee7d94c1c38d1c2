//! The nemesis: randomized fault scenarios against a real cluster of processes on loopback
//! (3 masters, 4 chunkservers), while writers append verification data and a reader reads.
//!
//! Each scenario, chosen by its seed, injects one to three faults at random times — SIGKILL and
//! restart of a chunkserver or a master, a slow server, an erroring server, a frozen server, a
//! full disk — heals them, and checks:
//! - every acknowledged append reads back with the right bytes (a loss otherwise);
//! - every byte any reader saw is the right byte for its position and lies inside what the
//!   writers finally had acknowledged (never unacknowledged or corrupt data);
//! - every chunk returns to full redundancy.
//!
//! `cargo test --test nemesis` runs 10 scenarios (seed 1). More:
//! `CAIRN_NEMESIS_SCENARIOS=200 CAIRN_NEMESIS_SEED=7 cargo test --release --test nemesis -- --nocapture`
//! (RELIABILITY.md holds the long runs).

mod common;

use cairn_client::{Client, ClientOptions, CreateOptions, FaultSpec};
use common::{Cluster, bytes, chunks};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const WRITERS: usize = 3;
/// How long the workload runs in each scenario; faults start and end inside it.
const ACTIVE: Duration = Duration::from_millis(3000);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    KillChunkserver,
    KillMaster,
    Slow,
    Errors,
    Frozen,
    DiskFull,
}

#[derive(Debug, Clone)]
struct Fault {
    kind: Kind,
    /// Chunkserver or master index.
    target: usize,
    start: Duration,
    end: Duration,
    spec: FaultSpec,
}

/// The faults of scenario `seed`: one to three, at most one process killed at a time, each on
/// its own chunkserver.
fn plan(seed: u64) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = rng.random_range(1..=3);
    let mut servers: Vec<usize> = (0..4).collect();
    let mut faults: Vec<Fault> = Vec::new();
    let mut killed = false;
    for _ in 0..n {
        let kind = match rng.random_range(0..6) {
            0 if !killed => Kind::KillChunkserver,
            1 if !killed => Kind::KillMaster,
            0..=2 => Kind::Slow,
            3 => Kind::Errors,
            4 => Kind::Frozen,
            _ => Kind::DiskFull,
        };
        killed |= matches!(kind, Kind::KillChunkserver | Kind::KillMaster);
        let target = if kind == Kind::KillMaster {
            rng.random_range(0..3)
        } else {
            servers.remove(rng.random_range(0..servers.len()))
        };
        let start = Duration::from_millis(rng.random_range(200..1500));
        let end = start + Duration::from_millis(rng.random_range(300..1500));
        let spec = match kind {
            Kind::Slow => FaultSpec {
                delay_ms: rng.random_range(5..60),
                jitter_ms: rng.random_range(0..20),
                ..FaultSpec::default()
            },
            Kind::Errors => FaultSpec {
                error_ppm: rng.random_range(10_000..200_000),
                ..FaultSpec::default()
            },
            Kind::Frozen => FaultSpec {
                stall: true,
                ..FaultSpec::default()
            },
            Kind::DiskFull => FaultSpec {
                disk_full: true,
                ..FaultSpec::default()
            },
            Kind::KillChunkserver | Kind::KillMaster => FaultSpec::default(),
        };
        faults.push(Fault {
            kind,
            target,
            start,
            end,
            spec,
        });
    }
    faults
}

/// What a writer had acknowledged and what it went through.
#[derive(Debug, Default)]
struct Written {
    acked: u64,
    appends: u64,
    errors: u64,
    /// Appends acknowledged at an offset other than the one expected.
    misplaced: u64,
}

async fn writer(c: Client, path: String, seed: u64, stop: Arc<AtomicBool>) -> Written {
    let mut out = Written::default();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut w = loop {
        match c.create(&path, CreateOptions::default()).await {
            Ok(w) => break w,
            Err(e) => {
                eprintln!("  {path}: create failed: {e}");
                out.errors += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    while !stop.load(Ordering::Relaxed) {
        let len = rng.random_range(1..=16 << 10);
        let data = bytes(seed, out.acked, len);
        match w.append(&data).await {
            Ok(at) => {
                if at != out.acked {
                    out.misplaced += 1;
                }
                out.acked += len as u64;
                out.appends += 1;
            }
            Err(e) => {
                // Not a loss (nothing was acknowledged), but the writer noticed: count it and
                // go on with the file, as an application would.
                eprintln!("  {path}: append failed: {e}");
                out.errors += 1;
                drop(w);
                w = loop {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    match c.open_append(&path).await {
                        Ok(w) => break w,
                        Err(e) => eprintln!("  {path}: reopen failed: {e}"),
                    }
                };
                // Recovery keeps what MinCopy replicas hold: at least everything acknowledged,
                // perhaps the failed append's bytes too (the same bytes it would write).
                assert!(
                    w.len() >= out.acked,
                    "{path}: reopened at {} < acked {}",
                    w.len(),
                    out.acked
                );
                out.acked = w.len();
            }
        }
    }
    let mut closed = w.close().await.map(|_| ());
    let mut tries = 0;
    while let Err(e) = closed {
        tries += 1;
        assert!(tries < 50, "{path}: close keeps failing: {e}");
        eprintln!("  {path}: close failed: {e}");
        out.errors += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
        closed = match c.open_append(&path).await {
            Ok(w) => {
                assert!(w.len() >= out.acked, "{path}: reopened short");
                out.acked = w.len();
                w.close().await.map(|_| ())
            }
            Err(e) => Err(e),
        };
    }
    out
}

/// What the reader saw.
#[derive(Debug, Default)]
struct Seen {
    reads: u64,
    bytes: u64,
    /// Reads that returned bytes other than the ones written at that position.
    corrupt: u64,
    /// Furthest byte read, per file.
    furthest: BTreeMap<String, u64>,
    errors: u64,
}

async fn reader(c: Client, files: Vec<(String, u64)>, stop: Arc<AtomicBool>, seed: u64) -> Seen {
    let mut out = Seen::default();
    let mut rng = StdRng::seed_from_u64(seed ^ 0xEEAD);
    while !stop.load(Ordering::Relaxed) {
        let (path, fseed) = &files[rng.random_range(0..files.len())];
        let Ok(st) = c.stat(path).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        if st.length == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let off = rng.random_range(0..st.length);
        let len = rng.random_range(1..=(64 << 10).min(st.length - off)) as usize;
        match c.read(path, off, len).await {
            Ok(got) => {
                out.reads += 1;
                out.bytes += got.len() as u64;
                if got != bytes(*fseed, off, len) {
                    eprintln!("  CORRUPT read of {path} [{off}, +{len})");
                    out.corrupt += 1;
                }
                let f = out.furthest.entry(path.clone()).or_default();
                *f = (*f).max(off + len as u64);
            }
            Err(cairn_client::Error::OutOfRange { .. }) => {}
            Err(_) => out.errors += 1,
        }
    }
    out
}

#[derive(Debug, Default)]
struct Totals {
    scenarios: u64,
    faults: BTreeMap<String, u64>,
    appends: u64,
    append_errors: u64,
    bytes_verified: u64,
    reads: u64,
    read_errors: u64,
    losses: u64,
    corrupt_reads: u64,
    unacked_reads: u64,
    misplaced: u64,
    under_replicated: u64,
}

/// Reads `path` back and counts the acknowledged bytes that are missing or wrong.
async fn verify(c: &Client, path: &str, seed: u64, acked: u64) -> u64 {
    let st = match c.stat(path).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("  LOSS {path}: stat failed: {e}");
            return acked;
        }
    };
    if st.length < acked {
        eprintln!(
            "  LOSS {path}: {} bytes readable, {acked} acknowledged",
            st.length
        );
        return acked - st.length;
    }
    let mut lost = 0;
    let mut off = 0u64;
    while off < acked {
        let len = (acked - off).min(4 << 20) as usize;
        match c.read(path, off, len).await {
            Ok(got) => {
                let want = bytes(seed, off, len);
                let bad = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                if bad > 0 {
                    eprintln!("  LOSS {path}: {bad} wrong bytes in [{off}, +{len})");
                }
                lost += bad as u64;
            }
            Err(e) => {
                eprintln!("  LOSS {path}: read [{off}, +{len}) failed: {e}");
                lost += len as u64;
            }
        }
        off += len as u64;
    }
    lost
}

async fn scenario(cl: &mut Cluster, index: u64, seed: u64, t: &mut Totals) {
    let faults = plan(seed);
    eprintln!("scenario {index} seed {seed}: {faults:?}");
    let opts = ClientOptions {
        chunk_size: 1 << 20,
        request_timeout: Duration::from_secs(2),
        ..ClientOptions::default()
    };
    let c = cl.client_with(opts.clone()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let files: Vec<(String, u64)> = (0..WRITERS)
        .map(|w| (format!("/nemesis/s{index}/w{w}"), seed * 16 + w as u64))
        .collect();
    let writers: Vec<_> = files
        .iter()
        .map(|(p, s)| tokio::spawn(writer(c.clone(), p.clone(), *s, stop.clone())))
        .collect();
    let reader_client = cl.client_with(opts).await;
    let rd = tokio::spawn(reader(reader_client, files.clone(), stop.clone(), seed));

    // The faults, in time order: (when, fault index, begin?).
    let mut events: Vec<(Duration, usize, bool)> = faults
        .iter()
        .enumerate()
        .flat_map(|(i, f)| [(f.start, i, true), (f.end, i, false)])
        .collect();
    events.sort();
    let t0 = Instant::now();
    for (at, i, begin) in events {
        tokio::time::sleep(at.saturating_sub(t0.elapsed())).await;
        let f = &faults[i];
        match (f.kind, begin) {
            (Kind::KillChunkserver, true) => cl.chunkservers[f.target].kill(),
            (Kind::KillChunkserver, false) => cl.chunkservers[f.target].start(),
            (Kind::KillMaster, true) => cl.masters[f.target].kill(),
            (Kind::KillMaster, false) => cl.masters[f.target].start(),
            (_, true) => cl.fault(f.target, f.spec).await,
            (_, false) => cl.fault(f.target, FaultSpec::default()).await,
        }
        if begin {
            *t.faults.entry(format!("{:?}", f.kind)).or_default() += 1;
        }
    }
    tokio::time::sleep(ACTIVE.saturating_sub(t0.elapsed())).await;
    stop.store(true, Ordering::Relaxed);
    let mut written = Vec::new();
    for w in writers {
        written.push(w.await.expect("writer task"));
    }
    let seen = rd.await.expect("reader task");

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
    let deadline = Instant::now() + Duration::from_secs(90);
    let s = loop {
        let mut short = Vec::new();
        for (path, _) in &files {
            for ch in chunks(&c, path).await.iter().filter(|ch| ch.length > 0) {
                if ch.servers.len() < 3 || !ch.sealed {
                    short.push((path.clone(), ch.id, ch.servers.clone()));
                }
            }
        }
        let s = cl.status().await.expect("status");
        let clean = s.under_replicated == 0 && s.repairs_running == 0 && s.lost_chunks == 0;
        if short.is_empty() && clean {
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
    eprintln!(
        "  appends {} (errors {}), reads {} (errors {}), lost {lost}, corrupt reads {}, chunks {}",
        written.iter().map(|w| w.appends).sum::<u64>(),
        written.iter().map(|w| w.errors).sum::<u64>(),
        seen.reads,
        seen.errors,
        seen.corrupt,
        s.chunks,
    );
    for (path, _) in &files {
        c.delete(path).await.expect("delete");
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
    let dir = tempfile::tempdir().unwrap();
    let mut cl = Cluster::start(dir.path(), 3, 4).await;
    let mut t = Totals::default();
    let started = Instant::now();
    for i in 0..scenarios {
        scenario(
            &mut cl,
            i,
            seed.wrapping_mul(1_000_003).wrapping_add(i),
            &mut t,
        )
        .await;
    }
    let faults: u64 = t.faults.values().sum();
    println!();
    println!(
        "nemesis: seed {seed}, {scenarios} scenarios in {:.0?}",
        started.elapsed()
    );
    println!(
        "| scenarios | faults injected | appends acked | bytes verified | reads checked | append errors | read errors | losses | corrupt reads | unacked reads | chunks short of copies |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {faults} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        t.scenarios,
        t.appends,
        t.bytes_verified,
        t.reads,
        t.append_errors,
        t.read_errors,
        t.losses,
        t.corrupt_reads,
        t.unacked_reads,
        t.under_replicated
    );
    println!("faults by kind: {:?}", t.faults);
    // Canary: a run that acknowledged and verified nothing proves nothing.
    assert!(
        t.appends > 0 && t.bytes_verified > 0 && t.reads > 0,
        "{t:?}"
    );
    assert_eq!(t.losses, 0, "acknowledged bytes lost: {t:?}");
    assert_eq!(t.corrupt_reads, 0, "readers saw wrong bytes: {t:?}");
    assert_eq!(
        t.unacked_reads, 0,
        "readers saw unacknowledged bytes: {t:?}"
    );
    assert_eq!(
        t.misplaced, 0,
        "appends acknowledged at the wrong offset: {t:?}"
    );
    assert_eq!(t.under_replicated, 0, "chunks left short of copies: {t:?}");
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
    assert_eq!(kinds.len(), 6, "{kinds:?}");
    for s in 0..200 {
        let p = plan(s);
        let kills = p
            .iter()
            .filter(|f| matches!(f.kind, Kind::KillChunkserver | Kind::KillMaster))
            .count();
        assert!(kills <= 1);
    }
}
