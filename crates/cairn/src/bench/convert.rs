//! `cairn bench convert`: replica→EC conversion under the background bandwidth threshold,
//! with the foreground 4 KiB depth-1 append latency measured before and while it runs, and
//! the network bytes per user byte of the whole path (replicated write + conversion) next to
//! Pangu's (seeds/000 §4.1.2: 6.375× before, 2.94× after).
//!
//! Against a local cluster (`cairn up --chunkservers 6` for `ec:4+2`): sets the conversion age
//! to a day, writes `--data` bytes in sealed `replicas:3,then:ec:K+M` files, measures the
//! foreground, sets the threshold and the age to 0, and measures the conversion and the
//! foreground until every chunk is a group. The old settings are restored after. The same run
//! measures the disk floor: raw O_DIRECT 1 MiB writes + fdatasync on the chunkservers'
//! filesystem; and the conversion's floor (`floor::run_convert`): the replicated 4 KiB append
//! floor alone and beside a raw converter paced to the rate the cluster converted at, which
//! is the least that converting at that rate costs the foreground's tail on this machine.

use super::repair::{foreground, status, write_sealed_files};
use super::{Latency, floor, loadavg, parse_size};
use crate::cluster::ClusterArgs;
use cairn_client::CreateOptions;
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
    /// User bytes written (three copies each) and then converted.
    #[arg(long, default_value = "1g", value_parser = parse_size)]
    data: u64,
    /// The policy the files are converted to.
    #[arg(long, default_value = "ec:4+2")]
    ec: String,
    /// Compress while converting (`lz4` in the policy).
    #[arg(long)]
    lz4: bool,
    /// Background bandwidth per chunkserver during the conversion (bytes/s).
    #[arg(long, default_value = "200m", value_parser = parse_size)]
    threshold: u64,
    /// Seconds of foreground appends before the conversion (the baseline).
    #[arg(long, default_value_t = 10.0)]
    baseline_seconds: f64,
    /// A directory on the chunkservers' filesystem, for the disk floor's file.
    #[arg(long, default_value = "./cairn-data")]
    floor_dir: PathBuf,
    /// Give up if the conversion has not finished after this many seconds.
    #[arg(long, default_value_t = 1200.0)]
    timeout: f64,
    /// Print one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    op: &'static str,
    policy: String,
    written_bytes: u64,
    converted_bytes: u64,
    convert_seconds: f64,
    convert_mib_per_s: f64,
    threshold_mib_per_s: f64,
    /// Conversion rate ÷ one server's threshold (target ≥ 0.8).
    ratio_threshold: f64,
    /// Servers that converted (each under its own threshold).
    workers: usize,
    /// Raw O_DIRECT 1 MiB write + fdatasync on the same filesystem.
    floor_mib_per_s: f64,
    /// Bytes the conversion writes per user byte (1.5 for 4+2 on whole stripes, less with
    /// LZ4): the floor's bound on the conversion is floor ÷ this.
    convert_device_per_user_byte: f64,
    /// Network bytes per user byte: the replicated write, the conversion, both (target
    /// ≤ 4.6 without compression; Pangu 6.375 before, 2.94 after).
    write_network_per_user_byte: f64,
    convert_network_per_user_byte: f64,
    network_per_user_byte: f64,
    pangu_before: f64,
    pangu_after: f64,
    fg_before: Latency,
    fg_during: Latency,
    fg_during_ops: u64,
    fg_errors: u64,
    /// Foreground p99 during the conversion ÷ before (target ≤ 1.2).
    ratio_fg_p99: f64,
    /// The same with nothing but the hardware: the replicated 4 KiB append floor alone and
    /// beside a raw converter (read, encode, CRC, unsynced member writes, a flush per 64 MiB)
    /// paced to `convert_mib_per_s`.
    floor_fg_alone: Latency,
    floor_fg_during: Latency,
    floor_convert_mib_per_s: f64,
    /// floor_fg_during p99 ÷ floor_fg_alone p99: what no conversion at this rate can beat here.
    floor_ratio_fg_p99: f64,
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

async fn set(m: &Masters, req: pb::ConfigRequest) -> anyhow::Result<()> {
    m.send(req, |mut c, r| async move { c.set_config(r).await })
        .await?;
    Ok(())
}

fn sum(s: &pb::StatusReply, f: fn(&pb::ServerStatus) -> u64) -> u64 {
    s.servers.iter().map(f).sum()
}

async fn bench(a: Args, masters: Vec<String>, floor_mib: f64) -> anyhow::Result<()> {
    let m = crate::cluster::masters_client(&masters)?.retry_for(Duration::from_secs(30));
    let text = format!(
        "replicas:3,then:{}{}",
        a.ec,
        if a.lz4 { ",lz4" } else { "" }
    );
    let policy: cairn_client::Policy = text
        .parse()
        .map_err(|e| anyhow::anyhow!("bad policy {text:?}: {e}"))?;
    let s = status(&m).await?;
    let old = (s.convert_after_secs, s.background_bytes_per_sec);
    set(
        &m,
        pb::ConfigRequest {
            convert_after_secs: Some(86_400),
            ..Default::default()
        },
    )
    .await?;
    let r = run_bench(&a, &m, &masters, policy, &text, floor_mib).await;
    set(
        &m,
        pb::ConfigRequest {
            convert_after_secs: Some(old.0),
            background_bytes_per_sec: Some(old.1),
            ..Default::default()
        },
    )
    .await?;
    r
}

async fn run_bench(
    a: &Args,
    m: &Masters,
    masters: &[String],
    policy: cairn_client::Policy,
    text: &str,
    floor_mib: f64,
) -> anyhow::Result<()> {
    let c = crate::cluster::client(masters).await?;
    let prefix = format!("/bench-convert-{}", std::process::id());
    // The data: 64 MiB files written 1 MiB at a time, four at once, sealed. Log-like text
    // (compresses ~4×) with --lz4, else bytes LZ4 cannot shrink.
    let sent0 = c.traffic().sent;
    let lz4 = a.lz4;
    let opts = CreateOptions {
        policy: Some(policy),
        parents: true,
        ..CreateOptions::default()
    };
    let (files, written) = write_sealed_files(
        &c,
        &prefix,
        a.data,
        opts,
        Arc::new(move |f| payload(1 << 20, lz4, f)),
    )
    .await?;
    let write_network = c.traffic().sent - sent0;
    eprintln!("bench convert: wrote {written} bytes in {files} files ({text})");

    // The foreground before.
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Arc::new(AtomicUsize::new(0));
    let fg = tokio::spawn(foreground(
        c.clone(),
        format!("{prefix}/fg0"),
        stop.clone(),
        phase.clone(),
    ));
    tokio::time::sleep(Duration::from_secs_f64(a.baseline_seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let ([before, ..], _) = fg.await??;

    // The conversion.
    let s0 = status(m).await?;
    set(
        m,
        pb::ConfigRequest {
            background_bytes_per_sec: Some(a.threshold),
            convert_after_secs: Some(0),
            ..Default::default()
        },
    )
    .await?;
    let stop = Arc::new(AtomicBool::new(false));
    let fg = tokio::spawn(foreground(
        c.clone(),
        format!("{prefix}/fg1"),
        stop.clone(),
        phase,
    ));
    let deadline = Instant::now() + Duration::from_secs_f64(a.timeout);
    let mut started = None;
    let mut workers = std::collections::BTreeSet::new();
    let end = loop {
        let s = status(m).await?;
        let user = sum(&s, |x| x.convert_user_bytes) - sum(&s0, |x| x.convert_user_bytes);
        for (x, y) in s.servers.iter().zip(&s0.servers) {
            if x.convert_user_bytes > y.convert_user_bytes {
                workers.insert(x.id);
            }
        }
        if started.is_none() && (s.conversions_running > 0 || user > 0) {
            started = Some(Instant::now());
        }
        if user >= written && s.conversions_running == 0 {
            break s;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "conversion not finished: {user} of {written} bytes; {} waiting, {} running, {} failed",
            s.conversions_waiting,
            s.conversions_running,
            s.conversions_failed
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop.store(true, Ordering::Relaxed);
    let ([during, ..], fg_errors) = fg.await??;
    let seconds = started.map_or(0.0, |t| t.elapsed().as_secs_f64());
    let converted = sum(&end, |x| x.convert_user_bytes) - sum(&s0, |x| x.convert_user_bytes);
    let convert_network =
        sum(&end, |x| x.convert_network_bytes) - sum(&s0, |x| x.convert_network_bytes);
    let convert_device =
        sum(&end, |x| x.convert_device_bytes) - sum(&s0, |x| x.convert_device_bytes);
    for f in 0..files {
        let _ = c.delete(&format!("{prefix}/data{f}")).await;
    }
    for f in ["fg0", "fg1"] {
        let _ = c.delete(&format!("{prefix}/{f}")).await;
    }
    let _ = c.delete(&prefix).await;

    let rate = converted as f64 / seconds / f64::from(1 << 20);
    let threshold = a.threshold as f64 / f64::from(1 << 20);
    let (b, d) = (Latency::of(&before), Latency::of(&during));
    let per_user = |x: u64| x as f64 / written as f64;
    let (k, m) = match policy.at_rest() {
        cairn_client::Redundancy::Ec { k, m } => (usize::from(k), usize::from(m)),
        cairn_client::Redundancy::Replicas(_) => anyhow::bail!("{text} converts to no EC"),
    };
    let fl = {
        let (dir, rate) = (a.floor_dir.clone(), (rate * f64::from(1 << 20)) as u64);
        tokio::task::spawn_blocking(move || floor::run_convert(&dir, rate, k, m, 10.0)).await??
    };
    let r = Report {
        op: "convert",
        policy: text.into(),
        written_bytes: written,
        converted_bytes: converted,
        convert_seconds: seconds,
        convert_mib_per_s: rate,
        threshold_mib_per_s: threshold,
        ratio_threshold: rate / threshold,
        workers: workers.len(),
        floor_mib_per_s: floor_mib,
        convert_device_per_user_byte: per_user(convert_device),
        write_network_per_user_byte: per_user(write_network),
        convert_network_per_user_byte: per_user(convert_network),
        network_per_user_byte: per_user(write_network + convert_network),
        pangu_before: 6.375,
        pangu_after: 2.94,
        fg_before: b,
        fg_during: d,
        fg_during_ops: during.len(),
        fg_errors,
        ratio_fg_p99: d.p99_us / b.p99_us,
        floor_ratio_fg_p99: fl.fg_during.p99_us / fl.fg_alone.p99_us,
        floor_fg_alone: fl.fg_alone,
        floor_fg_during: fl.fg_during,
        floor_convert_mib_per_s: fl.convert_mib_per_s,
        loadavg: loadavg(),
    };
    println!("{}", serde_json::to_string(&r)?);
    if !a.json {
        eprintln!(
            "converted {:.0} MiB in {:.1} s: {:.1} MiB/s against a {:.0} MiB/s threshold per server \
             ({:.2}; {} workers); disk floor {:.0} MiB/s, {:.2} device bytes per user byte; network \
             per user byte {:.2} write + {:.2} conversion = {:.2} (Pangu 6.375 → 2.94); foreground \
             4k p99 {:.0} → {:.0} µs ({:.2}×); floor: replicated 4k p99 {:.0} → {:.0} µs \
             ({:.2}×) beside a raw converter at {:.1} MiB/s",
            converted as f64 / f64::from(1 << 20),
            seconds,
            rate,
            threshold,
            rate / threshold,
            workers.len(),
            floor_mib,
            per_user(convert_device),
            per_user(write_network),
            per_user(convert_network),
            per_user(write_network + convert_network),
            b.p99_us,
            d.p99_us,
            d.p99_us / b.p99_us,
            fl.fg_alone.p99_us,
            fl.fg_during.p99_us,
            fl.fg_during.p99_us / fl.fg_alone.p99_us,
            fl.convert_mib_per_s
        );
    }
    Ok(())
}

/// `n` bytes for file `seed`: log lines (LZ4 shrinks them ~4×) when `text`, else random bytes
/// (which it cannot shrink).
fn payload(n: usize, text: bool, seed: u64) -> Vec<u8> {
    use rand::{Rng, RngCore, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n + 200);
    if !text {
        out.resize(n, 0);
        rng.fill_bytes(&mut out);
        return out;
    }
    let levels = ["INFO", "WARN", "DEBUG"];
    while out.len() < n {
        let line = format!(
            "2026-11-25T16:{:02}:{:02}.{:03}Z {} cairn_chunkserver::repair: chunk={} offset={} len={} elapsed={}us\n",
            rng.random_range(0..60),
            rng.random_range(0..60),
            rng.random_range(0..1000),
            levels[rng.random_range(0..3)],
            rng.random_range(1000..1100),
            rng.random_range(0..64) * 65536,
            rng.random_range(1..5) * 4096,
            rng.random_range(10..999),
        );
        out.extend_from_slice(line.as_bytes());
    }
    out.truncate(n);
    out
}
