//! `cairn bench master-state`: what S3 object records cost a master's state machine alone
//! (`cairn_master::bench`): N PutObjects applied as Raft applies them, with RSS, data bytes
//! and CPU per object, next to the floor of the same run — the same rows' bytes inserted into
//! one redb table in the same transactions. Runs in a scratch directory under `--dir`
//! (deleted afterwards).

use serde::Serialize;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Objects to apply.
    #[arg(long, default_value_t = 1_000_000)]
    objects: u64,
    /// MiB of decoded records each table caches (`cairn master --state-cache-mib`).
    #[arg(long, default_value_t = cairn_master::kv::DEFAULT_CACHE_BYTES >> 20)]
    state_cache_mib: usize,
    /// MiB of redb pages cached (`cairn master --store-cache-mib`).
    #[arg(long, default_value_t = cairn_master::store::DEFAULT_STORE_CACHE >> 20)]
    store_cache_mib: usize,
    /// Where the scratch directories go (the disk a master's data directory would be on).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Skip the floor.
    #[arg(long)]
    no_floor: bool,
    /// Instead of S3 objects: this many small files made (a make and a write each, in a
    /// tree of 20-entry directories) then removed, as a mount's untar and `rm -rf` send
    /// them; prints each tenth's cost, to show whether a file costs more as the state grows.
    #[arg(long)]
    files: Option<u64>,
    /// Commands applied at a time with --files (1: one Raft write at a time, as a serial
    /// workload such as tar hands them to the state machine).
    #[arg(long, default_value_t = 1)]
    batch: u64,
    /// With --files: commit the store once this many commands wait (a master's:
    /// cairn_master::store::COMMIT_EVERY; 1: after every batch, as masters before session
    /// 55 did).
    #[arg(long, default_value_t = cairn_master::store::COMMIT_EVERY)]
    commit_every: u64,
}

#[derive(Serialize)]
struct Report {
    objects: u64,
    state_cache_mib: usize,
    store_cache_mib: usize,
    seconds: f64,
    cpu_us_per_object: f64,
    /// RSS growth over the run, per million objects (the process started near its floor).
    rss_growth_mib: f64,
    rss_mib_per_million: f64,
    cached_mib: f64,
    data_bytes_per_object: f64,
    floor: &'static str,
    floor_cpu_us_per_object: f64,
    floor_data_bytes_per_object: f64,
    cpu_ratio: f64,
    data_ratio: f64,
    loadavg: f64,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(a.objects > 0, "--objects must be at least 1");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if let Some(n) = a.files {
        anyhow::ensure!(n > 0, "--files must be at least 1");
        let scratch = Scratch::new(&a.dir, "files")?;
        let mut last: Option<cairn_master::bench::FileStep> = None;
        rt.block_on(cairn_master::bench::files(
            scratch.path(),
            n,
            a.state_cache_mib << 20,
            a.store_cache_mib << 20,
            a.batch,
            a.commit_every.max(1),
            |s| {
                // Each tenth's own cost: the step's work less the step before's.
                let (ops0, cpu0, t0) = match &last {
                    Some(l) if l.phase == s.phase => (l.ops, l.cpu_seconds, l.seconds),
                    _ => (0, 0.0, 0.0),
                };
                let ops = (s.ops - ops0).max(1) as f64;
                println!(
                    "{}",
                    serde_json::json!({
                        "step": s,
                        "us_per_op": (s.seconds - t0) * 1e6 / ops,
                        "cpu_us_per_op": (s.cpu_seconds - cpu0) * 1e6 / ops,
                    })
                );
                last = Some(s.clone());
            },
        ))?;
        return Ok(());
    }
    let scratch = Scratch::new(&a.dir, "state")?;
    let rss0 = cairn_master::bench::rss_bytes();
    let last = rt.block_on(cairn_master::bench::objects(
        scratch.path(),
        a.objects,
        a.state_cache_mib << 20,
        a.store_cache_mib << 20,
        |s| println!("{}", serde_json::json!({ "step": s })),
    ))?;
    drop(scratch);
    let (floor_cpu, floor_bytes) = if a.no_floor {
        (f64::NAN, f64::NAN)
    } else {
        let floor = Scratch::new(&a.dir, "floor")?;
        let (_, cpu, bytes) =
            cairn_master::bench::objects_floor(floor.path(), a.objects, a.store_cache_mib << 20)?;
        (cpu, bytes as f64)
    };
    let n = a.objects as f64;
    let growth = last.rss_bytes.saturating_sub(rss0) as f64 / f64::from(1 << 20);
    let r = Report {
        objects: a.objects,
        state_cache_mib: a.state_cache_mib,
        store_cache_mib: a.store_cache_mib,
        seconds: last.seconds,
        cpu_us_per_object: last.cpu_seconds * 1e6 / n,
        rss_growth_mib: growth,
        rss_mib_per_million: growth * 1e6 / n,
        cached_mib: last.cached_bytes as f64 / f64::from(1 << 20),
        data_bytes_per_object: last.data_bytes as f64 / n,
        floor: "the same keys and records inserted into one redb table, same transactions",
        floor_cpu_us_per_object: floor_cpu * 1e6 / n,
        floor_data_bytes_per_object: floor_bytes / n,
        cpu_ratio: last.cpu_seconds / floor_cpu,
        data_ratio: last.data_bytes as f64 / floor_bytes,
        loadavg: super::loadavg(),
    };
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}

/// A directory of this run's, removed when dropped (also after an error).
struct Scratch(PathBuf);

impl Scratch {
    fn new(under: &std::path::Path, what: &str) -> std::io::Result<Self> {
        let p = under.join(format!(".cairn-bench-master-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&p)?;
        Ok(Self(p))
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
