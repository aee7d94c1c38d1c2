//! `cairn bench repair`: re-replication after a chunkserver loss, against the repair bandwidth
//! cap, with the foreground 4 KiB append latency measured healthy and while the repair runs.
//!
//! Against a local cluster (`cairn up --chunkservers 4` or more): writes `--data` bytes in
//! sealed 3-copy files, sets the cap, measures foreground appends, then freezes one local
//! chunkserver with SIGSTOP (no heartbeats, no data plane: lost, as far as anyone can tell)
//! until the masters declare it down and repair everything it held; SIGCONT brings it back
//! (its stale copies are then deleted as orphans). The same run measures the disk floor: raw
//! O_DIRECT 1 MiB writes + fdatasync on the chunkservers' filesystem.

use super::{Latency, floor, histogram, loadavg, parse_size};
use crate::cluster::ClusterArgs;
use cairn_client::{Client, CreateOptions};
use cairn_rpc::{Masters, pb};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Logical bytes written before the loss (three copies of each).
    #[arg(long, default_value = "512m", value_parser = parse_size)]
    data: u64,
    /// Repair bandwidth cap during the run (the old cap is restored after).
    #[arg(long, default_value = "32m", value_parser = parse_size)]
    cap: u64,
    /// Seconds of healthy foreground appends (the baseline).
    #[arg(long, default_value_t = 10.0)]
    baseline_seconds: f64,
    /// A directory on the chunkservers' filesystem, for the disk floor's file.
    #[arg(long, default_value = "./cairn-data")]
    floor_dir: PathBuf,
    /// Give up if the repair has not finished after this many seconds.
    #[arg(long, default_value_t = 600.0)]
    timeout: f64,
    /// Alternate windows of this many seconds with the repair at the cap and held at the
    /// least cap (1 MiB/s) while it runs, and compare the foreground in the two kinds of
    /// window: an A/B in the same minutes, which the shared machine's drift does not
    /// reach. 0 = off (compare with the healthy baseline only).
    #[arg(long, default_value_t = 0.0)]
    interleave: f64,
    /// Print one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    op: &'static str,
    victim: u64,
    written_bytes: u64,
    /// From SIGSTOP to the masters calling the server down.
    detect_seconds: f64,
    /// From the first repair handed out to no chunk short of copies.
    repair_seconds: f64,
    repaired_bytes: u64,
    repair_mib_per_s: f64,
    cap_mib_per_s: f64,
    /// repair rate ÷ cap (target ≥ 0.5).
    ratio_cap: f64,
    /// Raw O_DIRECT 1 MiB write + fdatasync on the same filesystem.
    floor_mib_per_s: f64,
    fg_healthy: Latency,
    fg_during_repair: Latency,
    fg_during_ops: u64,
    fg_errors: u64,
    /// Foreground p99 during the repair ÷ healthy (target ≤ 1.2).
    ratio_fg_p99: f64,
    /// With `--interleave`: the windows' length, the foreground in windows at the cap and
    /// in windows held at the least cap, and the p99 ratio of the two.
    interleave_seconds: f64,
    fg_windows_at_cap: Option<Latency>,
    fg_windows_held: Option<Latency>,
    ratio_fg_p99_windows: Option<f64>,
    loadavg: f64,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let masters = a.cluster.masters()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let floor_mib = floor::write_floor_mib(&a.floor_dir)?;
    rt.block_on(bench(a, masters, floor_mib))
}

pub(super) async fn status(m: &Masters) -> anyhow::Result<pb::StatusReply> {
    Ok(m.call(|mut c| async move { c.status(pb::Empty {}).await })
        .await?)
}

async fn set_cap(m: &Masters, cap: u64) -> anyhow::Result<()> {
    let req = pb::ConfigRequest {
        repair_bytes_per_sec: cap,
        ..Default::default()
    };
    m.send(req, |mut c, r| async move { c.set_config(r).await })
        .await?;
    Ok(())
}

/// Writes `data` bytes in sealed files of at most 64 MiB, `{prefix}/data0`, `data1`, …, 1 MiB
/// appends, four files at once; `fill(f)` is file f's 1 MiB of bytes. Returns the number of
/// files and the bytes written.
pub(super) async fn write_sealed_files(
    c: &Client,
    prefix: &str,
    data: u64,
    opts: CreateOptions,
    fill: Arc<dyn Fn(u64) -> Vec<u8> + Send + Sync>,
) -> anyhow::Result<(u64, u64)> {
    let files = data.div_ceil(64 << 20);
    let per_file = data / files;
    let mut tasks = Vec::new();
    for f in 0..files {
        let (c, path, opts, fill) = (
            c.clone(),
            format!("{prefix}/data{f}"),
            opts.clone(),
            fill.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut w = c.create(&path, opts).await?;
            let buf = fill(f);
            let mut left = per_file;
            while left > 0 {
                let n = left.min(1 << 20) as usize;
                w.append(&buf[..n]).await?;
                left -= n as u64;
            }
            w.seal().await?;
            anyhow::Ok(())
        }));
        if tasks.len() == 4 {
            for t in tasks.drain(..) {
                t.await??;
            }
        }
    }
    for t in tasks {
        t.await??;
    }
    Ok((files, per_file * files))
}

/// Which histogram of [`foreground`] an append's latency goes to.
const ALL: usize = 0;
const AT_CAP: usize = 1;
const HELD: usize = 2;
/// Settling after a cap change: not recorded in a window.
const SETTLING: usize = 3;

/// Appends 4 KiB at depth 1 until `stop`; returns the latencies (every append, and by the
/// window `phase` named when it started) and the errors.
pub(super) async fn foreground(
    c: Client,
    path: String,
    stop: Arc<AtomicBool>,
    phase: Arc<AtomicUsize>,
) -> anyhow::Result<([hdrhistogram::Histogram<u64>; 3], u64)> {
    let mut h = [histogram(), histogram(), histogram()];
    let mut errors = 0;
    let buf = vec![0x3Cu8; 4096];
    let mut w = c.create(&path, CreateOptions::default()).await?;
    // The file starts over every 64 MiB (untimed), so that a slow repair does not fill the
    // disks with foreground bytes.
    const ROTATE: u64 = 64 << 20;
    while !stop.load(Ordering::Relaxed) {
        if w.len() >= ROTATE {
            w.close().await?;
            c.delete(&path).await?;
            w = c.create(&path, CreateOptions::default()).await?;
        }
        let s = Instant::now();
        let p = phase.load(Ordering::Relaxed);
        match w.append(&buf).await {
            Ok(_) => {
                let ns = s.elapsed().as_nanos() as u64;
                h[ALL].record(ns)?;
                if (p == AT_CAP || p == HELD) && phase.load(Ordering::Relaxed) == p {
                    h[p].record(ns)?;
                }
            }
            Err(_) => {
                errors += 1;
                w = c.open_append(&path).await?;
            }
        }
    }
    w.close().await?;
    Ok((h, errors))
}

async fn bench(a: Args, masters: Vec<String>, floor_mib: f64) -> anyhow::Result<()> {
    let m = crate::cluster::masters_client(&masters)?.retry_for(Duration::from_secs(30));
    let s = status(&m).await?;
    let up: Vec<&pb::ServerStatus> = s.servers.iter().filter(|x| x.state == "up").collect();
    anyhow::ensure!(
        up.len() >= 4,
        "needs at least 4 chunkservers up (3 copies plus a target), {} are",
        up.len()
    );
    let victim = up
        .iter()
        .find(|x| x.pid != 0)
        .ok_or_else(|| anyhow::anyhow!("no local chunkserver (pid) to stop; use cairn up"))?;
    let (victim_id, victim_pid) = (victim.id, victim.pid);
    let old_cap = s.repair_bytes_per_sec;
    let c = crate::cluster::client(&masters).await?;
    let prefix = format!("/bench-repair-{}", std::process::id());

    // The data: 64 MiB files written 1 MiB at a time, four at once, sealed.
    let (files, written) = write_sealed_files(
        &c,
        &prefix,
        a.data,
        CreateOptions::default(),
        Arc::new(|f| vec![f as u8; 1 << 20]),
    )
    .await?;
    eprintln!("bench repair: wrote {written} bytes in {files} files");
    set_cap(&m, a.cap).await?;

    // Healthy foreground.
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Arc::new(AtomicUsize::new(SETTLING));
    let fg = tokio::spawn(foreground(
        c.clone(),
        format!("{prefix}/fg0"),
        stop.clone(),
        phase,
    ));
    tokio::time::sleep(Duration::from_secs_f64(a.baseline_seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let ([healthy, ..], _) = fg.await??;

    // The loss.
    // SAFETY: signalling a local chunkserver pid the masters report; no memory is touched.
    let rc = unsafe { libc::kill(victim_pid as i32, libc::SIGSTOP) };
    anyhow::ensure!(
        rc == 0,
        "SIGSTOP {victim_pid}: {}",
        std::io::Error::last_os_error()
    );
    let result = watch(&a, &m, &c, &prefix, victim_id).await;
    // SAFETY: as above.
    unsafe { libc::kill(victim_pid as i32, libc::SIGCONT) };
    set_cap(&m, old_cap).await?;
    let w = result?;
    let (during, fg_errors) = (&w.fg[ALL], w.errors);
    for f in 0..files {
        let _ = c.delete(&format!("{prefix}/data{f}")).await;
    }
    for f in ["fg0", "fg1"] {
        let _ = c.delete(&format!("{prefix}/{f}")).await;
    }
    let _ = c.delete(&prefix).await;

    let (repaired, repair_seconds) = (w.repaired, w.seconds);
    let rate = repaired as f64 / repair_seconds / f64::from(1 << 20);
    // The cap in force on average (the interleaved windows hold it lower half the time).
    let cap_mib = w.cap_byte_seconds / repair_seconds / f64::from(1 << 20);
    let (h, d) = (Latency::of(&healthy), Latency::of(during));
    let windows = (a.interleave > 0.0).then(|| {
        (
            Latency::of(&w.fg[AT_CAP]),
            Latency::of(&w.fg[HELD]),
            w.fg[AT_CAP].len(),
            w.fg[HELD].len(),
        )
    });
    let r = Report {
        op: "repair",
        victim: victim_id,
        written_bytes: written,
        detect_seconds: w.detect,
        repair_seconds,
        repaired_bytes: repaired,
        repair_mib_per_s: rate,
        cap_mib_per_s: cap_mib,
        ratio_cap: rate / cap_mib,
        floor_mib_per_s: floor_mib,
        fg_healthy: h,
        fg_during_repair: d,
        fg_during_ops: during.len(),
        fg_errors,
        ratio_fg_p99: d.p99_us / h.p99_us,
        interleave_seconds: a.interleave,
        fg_windows_at_cap: windows.as_ref().map(|w| w.0),
        fg_windows_held: windows.as_ref().map(|w| w.1),
        ratio_fg_p99_windows: windows.as_ref().map(|w| w.0.p99_us / w.1.p99_us),
        loadavg: loadavg(),
    };
    println!("{}", serde_json::to_string(&r)?);
    if !a.json {
        eprintln!(
            "repaired {:.0} MiB in {:.1} s: {:.1} MiB/s of a {:.0} MiB/s cap ({:.2}); disk floor {:.0} MiB/s; \
             foreground 4k p99 {:.0} → {:.0} µs ({:.2}×)",
            repaired as f64 / f64::from(1 << 20),
            repair_seconds,
            rate,
            cap_mib,
            rate / cap_mib,
            floor_mib,
            h.p99_us,
            d.p99_us,
            d.p99_us / h.p99_us
        );
        if let Some((at_cap, held, n_cap, n_held)) = windows {
            eprintln!(
                "interleaved {:.0} s windows: foreground 4k p99 at the cap {:.0} µs ({n_cap} appends) \
                 vs held {:.0} µs ({n_held} appends): {:.2}×",
                a.interleave,
                at_cap.p99_us,
                held.p99_us,
                at_cap.p99_us / held.p99_us
            );
        }
    }
    Ok(())
}

/// What [`watch`] measured.
struct Watched {
    /// From SIGSTOP to the masters calling the server down.
    detect: f64,
    /// From the first repair to nothing short.
    seconds: f64,
    repaired: u64,
    /// The cap integrated over `seconds` (byte-seconds per second = bytes).
    cap_byte_seconds: f64,
    /// Foreground latencies: every append, windows at the cap, windows held.
    fg: [hdrhistogram::Histogram<u64>; 3],
    errors: u64,
}

/// Waits for the masters to call `victim` down, then measures the repair and the foreground
/// appends while it runs (alternating the cap in windows with `--interleave`).
async fn watch(
    a: &Args,
    m: &Masters,
    c: &Client,
    prefix: &str,
    victim: u64,
) -> anyhow::Result<Watched> {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(a.timeout);
    let before = loop {
        let s = status(m).await?;
        if s.servers
            .iter()
            .any(|x| x.id == victim && x.state == "down")
        {
            break s.repaired_bytes;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "server {victim} never declared down"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let detect = t0.elapsed().as_secs_f64();
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Arc::new(AtomicUsize::new(SETTLING));
    let fg = tokio::spawn(foreground(
        c.clone(),
        format!("{prefix}/fg1"),
        stop.clone(),
        phase.clone(),
    ));
    // The leader counts the victim's chunks short `--repair-after-ms` after calling it down
    // and starts repairing them; the repair is over when nothing is short or running.
    let started = loop {
        let s = status(m).await?;
        if s.repairs_running > 0 || s.repaired_bytes > before {
            break Instant::now();
        }
        anyhow::ensure!(Instant::now() < deadline, "no repair started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // A cap change reaches the target with its next heartbeat (1 s), and a piece already
    // granted is still copied: the first SETTLE of a window is not recorded.
    const SETTLE: Duration = Duration::from_millis(1500);
    const HELD_CAP: u64 = 1 << 20;
    let window = Duration::from_secs_f64(a.interleave);
    let (mut at_cap, mut window_start, mut cap_since) = (true, Instant::now(), Instant::now());
    let mut cap_byte_seconds = 0.0;
    let mut seen_short = false;
    let end = loop {
        let s = status(m).await?;
        seen_short |= s.under_replicated > 0;
        if seen_short && s.under_replicated == 0 && s.repairs_running == 0 {
            break s;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "repair not finished: {} chunks short",
            s.under_replicated
        );
        if a.interleave > 0.0 {
            let now = Instant::now();
            if now - window_start >= SETTLE + window {
                let cap = if at_cap { a.cap } else { HELD_CAP };
                cap_byte_seconds += cap as f64 * (now - cap_since).as_secs_f64();
                at_cap = !at_cap;
                phase.store(SETTLING, Ordering::Relaxed);
                set_cap(m, if at_cap { a.cap } else { HELD_CAP }).await?;
                (window_start, cap_since) = (Instant::now(), now);
            } else if now - window_start >= SETTLE {
                phase.store(if at_cap { AT_CAP } else { HELD }, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop.store(true, Ordering::Relaxed);
    let (fg, errors) = fg.await??;
    let seconds = started.elapsed().as_secs_f64();
    if a.interleave == 0.0 {
        cap_byte_seconds = a.cap as f64 * seconds;
    } else {
        let cap = if at_cap { a.cap } else { HELD_CAP };
        cap_byte_seconds += cap as f64 * cap_since.elapsed().as_secs_f64();
    }
    Ok(Watched {
        detect,
        seconds,
        repaired: end.repaired_bytes - before,
        cap_byte_seconds,
        fg,
        errors,
    })
}
