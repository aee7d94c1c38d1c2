//! `cairn bench …`: benchmarks. Each runs the physical floor of what it measures in the same
//! run (the machine is shared and noisy, so only same-run ratios mean much) and prints one
//! JSON object per run.

mod caps;
mod chunkstore;
mod cluster;
mod codec;
mod convert;
mod files;
mod flood;
mod floor;
mod master_state;
mod recovery;
mod repair;
mod s3;
mod split;
mod tls;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// What checking capabilities costs a chunkserver's appends: A/B in one process, the
    /// checks switched on and off between short slices.
    Caps(caps::Args),
    /// The chunk store against a raw O_DIRECT loop on the same filesystem.
    Chunkstore(chunkstore::Args),
    /// Recovery time of a store with data written after its last checkpoint.
    Recovery(recovery::Args),
    /// What S3 object records cost a master's state machine alone (RSS, data bytes and CPU
    /// per object), next to plain redb inserts of the same rows.
    MasterState(master_state::Args),
    /// Appends through the SDK against a running cluster (one file per writer).
    Append(cluster::Args),
    /// Reads through the SDK against a running cluster.
    Read(cluster::Args),
    /// File create + first append + close through the SDK against a running cluster.
    Create(cluster::Args),
    /// Re-replication after a chunkserver loss against the bandwidth cap, with foreground
    /// appends measured before and during (a local cluster of 4+ chunkservers).
    Repair(repair::Args),
    /// S3 PUT, GET or ListObjectsV2 through a running gateway, next to SDK appends or reads
    /// of the same size (`cairn up` in this directory supplies the endpoint and keys).
    S3(s3::Args),
    /// The erasure codec (encode, degraded decode) and LZ4 blocks on one core, next to a
    /// memcpy of the same bytes.
    Codec(codec::Args),
    /// Replica→EC conversion under the background bandwidth threshold, with foreground
    /// appends measured before and during, and the network bytes per user byte (a local
    /// cluster of K+M+ chunkservers).
    Convert(convert::Args),
    /// What TLS costs the data plane: one chunkserver served on a TLS and a plain listener,
    /// 1 MiB appends and reads alternating between them.
    Tls(tls::Args),
    /// A user's 4 KiB appends, reads and S3 GETs while strangers flood every server of a
    /// local cluster with connections: flooded p99 over quiet p99, same run.
    Flood(flood::Args),
    /// Moving a populated directory into a partition (rows/s, the longest write pause) and a
    /// rename across partitions, next to creating the same rows and renaming inside one.
    Split(split::Args),
    /// What files cost the masters (RSS and data bytes per file, serving again after a
    /// SIGKILL, CPU per create against a stat) beside issue 39's targets, against this
    /// directory's `cairn up`.
    Files(files::Args),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Caps(a) => caps::run(a),
        BenchCommand::Chunkstore(a) => chunkstore::run(a),
        BenchCommand::Recovery(a) => recovery::run(a),
        BenchCommand::MasterState(a) => master_state::run(a),
        BenchCommand::Append(a) => cluster::run(cluster::Op::Append, a),
        BenchCommand::Read(a) => cluster::run(cluster::Op::Read, a),
        BenchCommand::Create(a) => cluster::run(cluster::Op::Create, a),
        BenchCommand::Repair(a) => repair::run(a),
        BenchCommand::S3(a) => s3::run(a),
        BenchCommand::Codec(a) => codec::run(a),
        BenchCommand::Convert(a) => convert::run(a),
        BenchCommand::Tls(a) => tls::run(a),
        BenchCommand::Flood(a) => flood::run(a),
        BenchCommand::Split(a) => split::run(a),
        BenchCommand::Files(a) => files::run(a),
    }
}

/// Parses `4k`, `64k`, `1m`, `1g` or a plain byte count.
/// The median of `v` (the upper one of an even count; 0 for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mult) = match s.chars().last() {
        Some('k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m') => (&s[..s.len() - 1], 1 << 20),
        Some('g') => (&s[..s.len() - 1], 1 << 30),
        _ => (&s[..], 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("not a size: {s} (use e.g. 4k, 64k, 1m)"))?;
    n.checked_mul(mult)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("size out of range: {s}"))
}

/// Latency summary in microseconds.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl Latency {
    pub fn of(h: &hdrhistogram::Histogram<u64>) -> Self {
        let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
        Self {
            p50_us: q(0.5),
            p99_us: q(0.99),
            p999_us: q(0.999),
            max_us: h.max() as f64 / 1000.0,
        }
    }
}

/// A histogram of nanoseconds from 100 ns to 100 s at 3 significant digits.
pub fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(100, 100_000_000_000, 3).expect("histogram bounds")
}

/// Runs `op` on every path, `depth` at a time; the seconds it took.
pub async fn each<F, Fut>(
    paths: &std::sync::Arc<Vec<String>>,
    depth: usize,
    op: F,
) -> anyhow::Result<f64>
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let t = std::time::Instant::now();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..depth {
        let (next, paths, op) = (next.clone(), paths.clone(), op.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(p) = paths.get(i) else {
                    return Ok::<(), anyhow::Error>(());
                };
                op(p.clone()).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// The 1-minute load average, recorded with every result (the machine is shared).
/// CPU seconds (user + system) this process has used so far.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return f64::NAN;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("0").is_err());
        assert!(parse_size("x").is_err());
    }
}
