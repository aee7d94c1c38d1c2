//! `cairn bench files`: what files cost the masters, beside issue 39's targets — a master's
//! RSS ≤ 64 MiB per million files, its data directory ≤ 300 bytes per file, serving again
//! within 5 s of a restart — and the CPU per create summed over the cluster's processes.
//!
//! Runs against this directory's `cairn up` (`./cairn-data/cluster.toml` names the processes'
//! pids and data directories). Creates `--files` empty files (metadata only: a create and its
//! close, `--per-dir` to a directory, `--depth` in flight) under a new directory; the same
//! run's floor is a `stat` of every file (a metadata call through the same client, TLS and
//! service, without a Raft write), whose CPU per call is the create's reference. Then it
//! measures the masters' RSS and data directories, SIGKILLs the leader (`cairn up` restarts
//! it) and times until a stat of the last file answers, and deletes every file and directory
//! it made (timed too). Leaves the cluster as it found it.
//!
//! With `--s3`, the same for S3 objects through the gateway of this `cairn up`: PUTs of
//! 16-byte objects into a new bucket, a GET of each as the floor, a GET of the last one to
//! time the restart, then DELETEs and the bucket's deletion.

use super::{cpu_seconds, each, loadavg};
use crate::cluster::ClusterFile;
use cairn_client::{Client, ClientOptions, CreateOptions};
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    cluster: crate::cluster::ClusterArgs,
    /// Files to create.
    #[arg(long, default_value_t = 1_000_000)]
    files: usize,
    /// Files in each directory.
    #[arg(long, default_value_t = 1000)]
    per_dir: usize,
    /// Calls in flight.
    #[arg(long, default_value_t = 32)]
    depth: usize,
    /// Do not kill the leader (the restart figure is left out).
    #[arg(long)]
    no_restart: bool,
    /// S3 objects through this `cairn up`'s gateway instead of files (`--files` of them).
    #[arg(long)]
    s3: bool,
    /// Leave what the run wrote (to read the masters' stores afterwards: `cargo run -p
    /// cairn-master --example store_stats`); the deletes' figure is left out.
    #[arg(long)]
    keep: bool,
}

/// What the run creates, reads and deletes: files through the SDK, or objects through S3.
#[derive(Clone)]
enum Target {
    Files(Client),
    S3(Arc<crate::s3client::S3Bucket>),
}

impl Target {
    async fn create(&self, p: &str) -> anyhow::Result<()> {
        match self {
            Self::Files(c) => {
                let w = c.create(p, CreateOptions::default()).await?;
                w.close().await?;
            }
            Self::S3(b) => {
                b.put(p, bytes::Bytes::from_static(b"sixteen bytes!!!"))
                    .await?
            }
        }
        Ok(())
    }

    async fn read(&self, p: &str) -> anyhow::Result<()> {
        match self {
            Self::Files(c) => {
                c.stat(p).await?;
            }
            Self::S3(b) => {
                b.get(p).await?;
            }
        }
        Ok(())
    }

    async fn delete(&self, p: &str) -> anyhow::Result<()> {
        match self {
            Self::Files(c) => c.delete(p).await?,
            Self::S3(b) => b.delete(p).await?,
        }
        Ok(())
    }
}

/// `op` of `target` on each path (`each` with the path in its errors).
async fn each_of<F, Fut>(
    paths: &Arc<Vec<String>>,
    depth: usize,
    target: &Target,
    op: F,
) -> anyhow::Result<f64>
where
    F: Fn(Target, String) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let t = target.clone();
    each(paths, depth, move |p| {
        let (t, op) = (t.clone(), op.clone());
        async move {
            op(t, p.clone())
                .await
                .map_err(|e| anyhow::anyhow!("{p}: {e}"))
        }
    })
    .await
}

#[derive(Serialize)]
struct Report {
    /// `files`, or `objects` (`--s3`: the per-file figures are then per object).
    kind: &'static str,
    files: usize,
    creates_per_sec: f64,
    /// CPU of every cluster process and this client over the creates, per create.
    cpu_us_per_create: f64,
    /// The masters' share of it.
    master_cpu_us_per_create: f64,
    /// Floor: the same over a stat of every file.
    cpu_us_per_stat: f64,
    stats_per_sec: f64,
    create_over_stat_cpu: f64,
    /// The leader's RSS before and after the creates, and the growth per million files.
    rss_before_mib: f64,
    rss_after_mib: f64,
    rss_mib_per_million: f64,
    rss_ratio_to_target: f64,
    /// The leader's data directory's allocated bytes, growth per file.
    data_bytes_per_file: f64,
    data_ratio_to_target: f64,
    /// From the SIGKILL to a stat of the last file answering (none with --no-restart).
    serving_after_restart_secs: Option<f64>,
    restart_ratio_to_target: Option<f64>,
    rss_after_restart_mib: Option<f64>,
    /// None with `--keep`.
    deletes_per_sec: Option<f64>,
    loadavg: f64,
}

/// utime + stime of `pid` in seconds (0 when it is gone).
fn proc_cpu(pid: u32) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / hz
}

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// Bytes allocated to the files under `dir` (their blocks, as `du` counts).
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.blocks() * 512;
            }
        }
    }
    total
}

/// The cluster's processes as `cairn up` last wrote them.
fn procs() -> anyhow::Result<ClusterFile> {
    ClusterFile::load(Path::new("./cairn-data"))?.ok_or_else(|| {
        anyhow::anyhow!("no ./cairn-data/cluster.toml: run this beside a `cairn up`")
    })
}

fn cluster_cpu(f: &ClusterFile) -> (f64, f64) {
    let masters: f64 = f.master_procs.iter().map(|p| proc_cpu(p.pid)).sum();
    let others: f64 = f
        .chunkserver_procs
        .iter()
        .chain(&f.s3_procs)
        .chain(&f.nbd_procs)
        .map(|p| proc_cpu(p.pid))
        .sum();
    (masters + others + cpu_seconds(), masters)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.files >= 1 && a.depth >= 1 && a.per_dir >= 1,
        "--files, --depth and --per-dir must be at least 1"
    );
    let masters = a.cluster.masters()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Waits out the restart (the CLI's default gives up on masters that do not answer).
    let opts = ClientOptions {
        retry_for: Duration::from_secs(60),
        unreachable_for: None,
        ..crate::cluster::client_options()?
    };
    let client = rt.block_on(Client::with_options(&masters, opts))?;
    let top = format!("/bench-files-{}", std::process::id());
    let dirs = a.files.div_ceil(a.per_dir);
    let target = if a.s3 {
        let (endpoint, key, secret) = super::s3::local_gateway()?;
        let name = format!("bench-objects-{}", std::process::id());
        let b = crate::s3client::S3Bucket::new(&endpoint, &name, &key, &secret, a.depth * 2)?;
        rt.block_on(b.create_bucket())?;
        Target::S3(Arc::new(b))
    } else {
        Target::Files(client.clone())
    };
    let paths: Arc<Vec<String>> = Arc::new(
        (0..a.files)
            .map(|i| match target {
                Target::Files(_) => format!("{top}/d{}/f{i}", i / a.per_dir),
                Target::S3(_) => format!("d{}/o{i}", i / a.per_dir),
            })
            .collect(),
    );
    let leader = rt.block_on(leader_proc(&client))?;
    let f = procs()?;
    let rss_before = rss_mib(leader.pid);
    let data_before = allocated(&leader.data_dir);
    // The directories first (not timed), then the creates.
    if let Target::Files(c) = &target {
        rt.block_on(async {
            for d in 0..dirs {
                c.mkdir(&format!("{top}/d{d}"), true).await?;
            }
            anyhow::Ok(())
        })?;
    }
    let (cpu0, m0) = cluster_cpu(&f);
    let create_secs = rt.block_on(each_of(&paths, a.depth, &target, |t, p| async move {
        t.create(&p).await
    }))?;
    let (cpu1, m1) = cluster_cpu(&f);
    let stat_secs = rt.block_on(each_of(&paths, a.depth, &target, |t, p| async move {
        t.read(&p).await
    }))?;
    let (cpu2, _) = cluster_cpu(&f);
    let n = a.files as f64;
    let rss_after = rss_mib(leader.pid);
    let data_after = allocated(&leader.data_dir);
    let mut restart = None;
    let mut rss_restarted = None;
    if !a.no_restart {
        // SAFETY: kill has no memory preconditions; the pid is the leader's, from cluster.toml.
        let r = unsafe { libc::kill(leader.pid as i32, libc::SIGKILL) };
        anyhow::ensure!(
            r == 0,
            "kill {}: {}",
            leader.pid,
            std::io::Error::last_os_error()
        );
        let t = Instant::now();
        let last = paths.last().expect("at least one file").clone();
        rt.block_on(async {
            loop {
                let served = match &target {
                    // A fresh client: no cached file lists.
                    Target::Files(_) => match Client::with_options(
                        &masters,
                        ClientOptions {
                            retry_for: Duration::from_millis(200),
                            unreachable_for: None,
                            ..crate::cluster::client_options()?
                        },
                    )
                    .await
                    {
                        Ok(c) => c.stat(&last).await.is_ok(),
                        Err(_) => false,
                    },
                    Target::S3(_) => target.read(&last).await.is_ok(),
                };
                if served {
                    return anyhow::Ok(());
                }
                anyhow::ensure!(
                    t.elapsed() < Duration::from_secs(120),
                    "the masters did not serve {last} within 120 s of the SIGKILL"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })?;
        restart = Some(t.elapsed().as_secs_f64());
        let f = procs()?;
        rss_restarted = f
            .master_procs
            .iter()
            .find(|p| p.id == leader.id)
            .map(|p| rss_mib(p.pid));
    }
    if a.keep {
        eprintln!(
            "kept what the run wrote: {} {}",
            a.files,
            if a.s3 { "objects" } else { "files" }
        );
    }
    // Clean up: every file, then the directories (or the bucket).
    let delete_secs = if a.keep {
        f64::NAN
    } else {
        rt.block_on(each_of(&paths, a.depth, &target, |t, p| async move {
            t.delete(&p).await
        }))?
    };
    if !a.keep {
        rt.block_on(async {
            match &target {
                Target::Files(c) => {
                    for d in 0..dirs {
                        c.delete(&format!("{top}/d{d}")).await?;
                    }
                    c.delete(&top).await?;
                }
                Target::S3(b) => b.delete_bucket().await?,
            }
            anyhow::Ok(())
        })?;
    }
    let per_million = (rss_after - rss_before) / n * 1e6;
    let data_per_file = data_after.saturating_sub(data_before) as f64 / n;
    let cpu_create = (cpu1 - cpu0) / n * 1e6;
    let cpu_stat = (cpu2 - cpu1) / n * 1e6;
    let r = Report {
        kind: if a.s3 { "objects" } else { "files" },
        files: a.files,
        creates_per_sec: n / create_secs,
        cpu_us_per_create: cpu_create,
        master_cpu_us_per_create: (m1 - m0) / n * 1e6,
        cpu_us_per_stat: cpu_stat,
        stats_per_sec: n / stat_secs,
        create_over_stat_cpu: cpu_create / cpu_stat,
        rss_before_mib: rss_before,
        rss_after_mib: rss_after,
        rss_mib_per_million: per_million,
        rss_ratio_to_target: per_million / 64.0,
        data_bytes_per_file: data_per_file,
        data_ratio_to_target: data_per_file / 300.0,
        serving_after_restart_secs: restart,
        restart_ratio_to_target: restart.map(|s| s / 5.0),
        rss_after_restart_mib: rss_restarted,
        deletes_per_sec: (!a.keep).then(|| n / delete_secs),
        loadavg: loadavg(),
    };
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}

/// The `cairn up` process of the masters' current leader.
async fn leader_proc(c: &Client) -> anyhow::Result<crate::cluster::Proc> {
    let s = c
        .masters()
        .send(cairn_rpc::pb::Empty {}, |mut m, r| async move {
            m.status(r).await
        })
        .await?;
    let f = procs()?;
    f.master_procs
        .into_iter()
        .find(|p| p.id == s.leader_id && p.pid != 0)
        .ok_or_else(|| anyhow::anyhow!("master {} is not a process of ./cairn-data", s.leader_id))
}
