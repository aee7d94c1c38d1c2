//! `cairn bench append|read|create`: the SDK against a running cluster, next to the same-run
//! floor — a raw O_DIRECT write + fdatasync (or read) loop of the same size on the chunkservers'
//! filesystem, plus a loopback TCP round trip carrying the same bytes.

use super::{Latency, floor, histogram, loadavg, parse_size};
use crate::cluster::ClusterArgs;
use cairn_chunkstore::Disk;
use cairn_client::{Client, ClientOptions, CreateOptions};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Bytes per operation (create: bytes of the first append).
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    size: u64,
    /// Operations in flight: one writer (its own file) or reader each.
    #[arg(long, default_value_t = 1)]
    depth: usize,
    /// Seconds each run measures.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Runs (each with its floor); the median is reported.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Replicas of the files written (replicas:N).
    #[arg(long, default_value_t = 3)]
    replicas: u32,
    /// The files' policy (replicas:N, ec:K+M, ...,lz4); overrides --replicas.
    #[arg(long)]
    policy: Option<cairn_client::Policy>,
    /// A directory on the chunkservers' filesystem, for the disk floor's file.
    #[arg(long, default_value = "./cairn-data")]
    floor_dir: PathBuf,
    /// Print only JSON lines.
    #[arg(long)]
    json: bool,
    /// After each healthy run, slow one chunkserver down this many times (an injected delay
    /// of (N-1) x the healthy p50 per request) and run again; needs a cluster started with
    /// --fault-injection. The second line's `vs_healthy_p999` is the SLA ratio.
    #[arg(long)]
    slow_one: Option<f64>,
    /// SIGKILL one (local) chunkserver this many seconds into each run (`cairn up` restarts
    /// it): `errors` and `max_us` show what the writers saw.
    #[arg(long)]
    kill_one_after: Option<f64>,
    /// After each healthy run, make this many chunkservers fail every disk request (injected
    /// errors; needs --fault-injection) and run again: degraded reads of EC files. The second
    /// line's `vs_healthy_mib` is the ratio.
    #[arg(long)]
    fail_servers: Option<usize>,
    /// Directories to work under, writer or reader d in the (d mod N)-th, e.g. the subtrees
    /// of different partitions (`cairn admin partition split`); default: `/`.
    #[arg(long, value_delimiter = ',')]
    under: Vec<String>,
    /// The client's metadata batching (`ClientOptions::meta_batch_in_flight`; 0 = off).
    #[arg(long, default_value_t = ClientOptions::default().meta_batch_in_flight)]
    meta_batch_in_flight: usize,
}

#[derive(Serialize, Clone)]
struct Report {
    op: &'static str,
    size: u64,
    depth: usize,
    replicas: u32,
    policy: String,
    /// Bytes stored per user byte by the policy (full stripes), which the append ratio's
    /// floor divides by.
    stored_per_user_byte: f64,
    /// Data-plane payload bytes the client sent (appends) or received (reads) per user byte.
    network_per_user_byte: f64,
    /// Reads of chunk groups that decoded.
    degraded_reads: u64,
    /// Appends: the device floor of this policy's writes — every replica or member write of
    /// every writer at once (`depth × copies` writers of size/K bytes for EC) — in user MiB/s
    /// (its bytes divided by the stored bytes per user byte), and MiB/s over it.
    #[serde(skip_serializing_if = "Option::is_none")]
    floor_policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    floor_policy_user_mib_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio_policy: Option<f64>,
    seconds: f64,
    ops: u64,
    errors: u64,
    ops_per_s: f64,
    mib_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
    floor: &'static str,
    floor_p50_us: f64,
    floor_p999_us: f64,
    floor_ops_per_s: f64,
    floor_mib_per_s: f64,
    /// The loopback round trip alone (size bytes out, a 64-byte reply back).
    rtt_p50_us: f64,
    rtt_p999_us: f64,
    /// p50 / (disk floor p50 + rtt p50); likewise p99.9.
    ratio_p50: f64,
    ratio_p999: f64,
    /// Appends: MiB/s ÷ (floor MiB/s ÷ stored bytes per user byte), all replicas (members)
    /// share one disk here.
    /// Reads and creates: ops/s ÷ floor ops/s.
    ratio_ops: f64,
    /// Appends at depth 1 with replicas: the replicated floor — one O_DIRECT write +
    /// fdatasync per replica, on files of their own, all at once, until a majority is done
    /// (`floor::run_replicated`) — and p50 / (it + rtt p50); likewise p99.9.
    #[serde(skip_serializing_if = "Option::is_none")]
    floor_replicated_p50_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    floor_replicated_p999_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio_p50_replicated: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio_p999_replicated: Option<f64>,
    loadavg: f64,
    /// The fault during this run, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    fault: Option<String>,
    /// This run's p99.9 over the healthy run's just before it.
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_healthy_p999: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_healthy_p99: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_healthy_mib: Option<f64>,
    /// Backup reads sent and won during the run; servers the client blacklisted during it.
    backup_reads_sent: u64,
    backup_reads_won: u64,
    blacklistings: u64,
    /// Metadata batching during the run: `Batch` calls, and the operations they carried.
    meta_batch_calls: u64,
    meta_batch_ops: u64,
}

#[derive(Clone, Copy, PartialEq)]
pub enum Op {
    Append,
    Read,
    Create,
}

pub fn run(op: Op, a: Args) -> anyhow::Result<()> {
    let masters = a.cluster.masters()?;
    anyhow::ensure!(a.depth >= 1, "--depth must be at least 1");
    let size = a.size as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let client = rt.block_on(Client::with_options(
        &masters,
        ClientOptions {
            meta_batch_in_flight: a.meta_batch_in_flight,
            ..crate::cluster::client_options()?
        },
    ))?;
    std::fs::create_dir_all(&a.floor_dir)?;
    let fdisk = floor::floor_file(
        &a.floor_dir,
        (a.depth as u64 * size as u64 * 64).max(256 << 20),
    )?;
    // The replicated floor's files, one per replica (depth-1 appends only).
    let replica_files = if op == Op::Append && a.depth == 1 && a.replicas > 1 {
        (0..a.replicas)
            .map(|i| {
                floor::floor_file_named(&a.floor_dir, &format!("floor-replica{i}.dat"), 64 << 20)
            })
            .collect::<anyhow::Result<Vec<_>>>()?
    } else {
        Vec::new()
    };
    let name = format!(
        "/bench-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    );
    let prefixes: Vec<String> = if a.under.is_empty() {
        vec![name]
    } else {
        a.under
            .iter()
            .map(|u| format!("{}{name}", u.trim_end_matches('/')))
            .collect()
    };
    let prefix_of = |d: usize| prefixes[d % prefixes.len()].as_str();
    // Reads need data: one file per reader, 64 operations long, sealed.
    if op == Op::Read {
        rt.block_on(async {
            for d in 0..a.depth {
                let mut w = client
                    .create(&format!("{}/r{d}", prefix_of(d)), create_opts(&a))
                    .await?;
                let buf = vec![0x5Au8; size];
                for _ in 0..64 {
                    w.append(&buf).await?;
                }
                w.seal().await?;
            }
            anyhow::Ok(())
        })?;
    }
    for run in 0..a.runs {
        let write = op != Op::Read;
        let fl = floor::Floor {
            disk: fdisk.clone(),
            range: (0, fdisk.capacity()),
            write,
            size,
            depth: a.depth,
            durable: true,
        }
        .run(a.seconds)?;
        let rtt = rt.block_on(loopback_rtt(size, a.seconds.min(3.0)))?;
        // What the device is asked to do by this policy's appends: every replica or member
        // write of every writer at once (members are size/K each).
        let (psize, pdepth) = match policy(&a).write {
            cairn_client::Redundancy::Ec { k, m } => (
                (size / usize::from(k)).next_multiple_of(4096),
                a.depth * usize::from(k + m),
            ),
            cairn_client::Redundancy::Replicas(n) => (size, a.depth * usize::from(n)),
        };
        let policy_floor = if op == Op::Append {
            Some(
                floor::Floor {
                    disk: fdisk.clone(),
                    range: (0, fdisk.capacity()),
                    write: true,
                    size: psize,
                    depth: pdepth,
                    durable: true,
                }
                .run(a.seconds.min(5.0))?,
            )
        } else {
            None
        };
        let replicated = if replica_files.is_empty() {
            None
        } else {
            let quorum = replica_files.len() / 2 + 1;
            Some(floor::run_replicated(&replica_files, size, quorum, a.seconds.min(3.0))?.latency)
        };
        let overhead = policy(&a).write.overhead();
        let policy_floor_user = policy_floor
            .as_ref()
            .map(|f| f.ops as f64 * psize as f64 / f.seconds / f64::from(1 << 20) / overhead);
        // Whether the run can fill the cluster: at the disk floor's rate it writes at most
        // `floor × seconds` user bytes; say so before it starts (the cluster, not the bench,
        // would otherwise tell, with `no-space` errors mid-run).
        if let Some(f) = policy_floor_user {
            let most = (f * a.seconds * f64::from(1 << 20)) as u64;
            // The masters' client makes its channels on the runtime: inside it.
            let fits = rt.block_on(async {
                let m = crate::cluster::masters_client(&masters)?;
                crate::fs::check_fits(&m, most, &policy(&a)).await
            });
            if let Err(e) = fits {
                eprintln!(
                    "warning: this run may not fit ({e}); at most {most} bytes at the disk \
                     floor's rate: shorten --seconds or give the chunkservers more space"
                );
            }
        }
        let killer = a
            .kill_one_after
            .map(|after| rt.spawn(kill_one(masters.clone(), after)));
        let (h0, b0, t0) = (
            client.health_stats(),
            client.meta_batch_stats(),
            client.traffic(),
        );
        let (ops, errors, secs, lat) = rt.block_on(measure(op, &client, &prefixes, run, &a))?;
        let (h1, b1, t1) = (
            client.health_stats(),
            client.meta_batch_stats(),
            client.traffic(),
        );
        let network = |t0: cairn_client::Traffic, t1: cairn_client::Traffic, ops: u64| {
            let moved = match op {
                Op::Read => t1.received - t0.received,
                _ => t1.sent - t0.sent,
            };
            moved as f64 / (ops as f64 * size as f64).max(1.0)
        };
        let fault = match killer {
            Some(k) => Some(rt.block_on(k)??),
            None => None,
        };
        let mib = |ops: u64, s: f64| ops as f64 * size as f64 / s / f64::from(1 << 20);
        let floor_ops_per_s = fl.ops as f64 / fl.seconds;
        let ops_per_s = ops as f64 / secs;
        let r = Report {
            op: match op {
                Op::Append => "append",
                Op::Read => "read",
                Op::Create => "create",
            },
            size: a.size,
            depth: a.depth,
            replicas: a.replicas,
            policy: policy(&a).to_string(),
            stored_per_user_byte: overhead,
            network_per_user_byte: network(t0, t1, ops),
            degraded_reads: h1.degraded_reads - h0.degraded_reads,
            floor_policy: policy_floor
                .as_ref()
                .map(|_| format!("{pdepth} O_DIRECT writers of {psize} B + fdatasync")),
            floor_policy_user_mib_per_s: policy_floor_user,
            ratio_policy: policy_floor_user.map(|f| mib(ops, secs) / f),
            seconds: secs,
            ops,
            errors,
            ops_per_s,
            mib_per_s: mib(ops, secs),
            p50_us: lat.p50_us,
            p99_us: lat.p99_us,
            p999_us: lat.p999_us,
            max_us: lat.max_us,
            floor: if write {
                "raw O_DIRECT pwrite+fdatasync loop + loopback TCP round trip"
            } else {
                "raw O_DIRECT pread loop + loopback TCP round trip"
            },
            floor_p50_us: fl.latency.p50_us,
            floor_p999_us: fl.latency.p999_us,
            floor_ops_per_s,
            floor_mib_per_s: mib(fl.ops, fl.seconds),
            rtt_p50_us: rtt.p50_us,
            rtt_p999_us: rtt.p999_us,
            ratio_p50: lat.p50_us / (fl.latency.p50_us + rtt.p50_us),
            ratio_p999: lat.p999_us / (fl.latency.p999_us + rtt.p999_us),
            ratio_ops: if op == Op::Append {
                mib(ops, secs) / (mib(fl.ops, fl.seconds) / overhead)
            } else {
                ops_per_s / floor_ops_per_s
            },
            floor_replicated_p50_us: replicated.map(|f| f.p50_us),
            floor_replicated_p999_us: replicated.map(|f| f.p999_us),
            ratio_p50_replicated: replicated.map(|f| lat.p50_us / (f.p50_us + rtt.p50_us)),
            ratio_p999_replicated: replicated.map(|f| lat.p999_us / (f.p999_us + rtt.p999_us)),
            loadavg: loadavg(),
            fault,
            vs_healthy_p999: None,
            vs_healthy_p99: None,
            vs_healthy_mib: None,
            backup_reads_sent: h1.backups_sent - h0.backups_sent,
            backup_reads_won: h1.backups_won - h0.backups_won,
            blacklistings: h1.listed_failed + h1.listed_slow - h0.listed_failed - h0.listed_slow,
            meta_batch_calls: b1.calls - b0.calls,
            meta_batch_ops: b1.ops - b0.ops,
        };
        println!("{}", serde_json::to_string(&r)?);
        if let Some(factor) = a.slow_one {
            let delay_ms = ((factor - 1.0) * lat.p50_us / 1000.0).ceil().max(1.0) as u32;
            let (server, how) = rt.block_on(slow_one(&masters, delay_ms))?;
            let (h0, b0) = (client.health_stats(), client.meta_batch_stats());
            let slow = rt.block_on(measure(op, &client, &prefixes, run + 1000, &a));
            let (h1, b1) = (client.health_stats(), client.meta_batch_stats());
            rt.block_on(async {
                let m = crate::cluster::masters_client(&masters)?;
                crate::admin::inject(&m, server, &cairn_client::FaultSpec::default()).await
            })?;
            let (ops, errors, secs, sl) = slow?;
            let s = Report {
                seconds: secs,
                ops,
                errors,
                ops_per_s: ops as f64 / secs,
                mib_per_s: mib(ops, secs),
                p50_us: sl.p50_us,
                p99_us: sl.p99_us,
                p999_us: sl.p999_us,
                max_us: sl.max_us,
                ratio_p50: sl.p50_us / (fl.latency.p50_us + rtt.p50_us),
                ratio_p999: sl.p999_us / (fl.latency.p999_us + rtt.p999_us),
                ratio_p50_replicated: replicated.map(|f| sl.p50_us / (f.p50_us + rtt.p50_us)),
                ratio_p999_replicated: replicated.map(|f| sl.p999_us / (f.p999_us + rtt.p999_us)),
                loadavg: loadavg(),
                fault: Some(how),
                vs_healthy_p999: Some(sl.p999_us / lat.p999_us),
                vs_healthy_p99: Some(sl.p99_us / lat.p99_us),
                backup_reads_sent: h1.backups_sent - h0.backups_sent,
                backup_reads_won: h1.backups_won - h0.backups_won,
                blacklistings: h1.listed_failed + h1.listed_slow
                    - h0.listed_failed
                    - h0.listed_slow,
                meta_batch_calls: b1.calls - b0.calls,
                meta_batch_ops: b1.ops - b0.ops,
                ..r.clone()
            };
            println!("{}", serde_json::to_string(&s)?);
        }
        if let Some(n) = a.fail_servers {
            let (servers, how) = rt.block_on(fail_some(&masters, n))?;
            let (h0, t0) = (client.health_stats(), client.traffic());
            let failed = rt.block_on(measure(op, &client, &prefixes, run + 2000, &a));
            let (h1, t1) = (client.health_stats(), client.traffic());
            rt.block_on(async {
                let m = crate::cluster::masters_client(&masters)?;
                for s in servers {
                    crate::admin::inject(&m, s, &cairn_client::FaultSpec::default()).await?;
                }
                anyhow::Ok(())
            })?;
            let (ops, errors, secs, fl_lat) = failed?;
            let f = Report {
                seconds: secs,
                ops,
                errors,
                ops_per_s: ops as f64 / secs,
                mib_per_s: mib(ops, secs),
                p50_us: fl_lat.p50_us,
                p99_us: fl_lat.p99_us,
                p999_us: fl_lat.p999_us,
                max_us: fl_lat.max_us,
                network_per_user_byte: network(t0, t1, ops),
                degraded_reads: h1.degraded_reads - h0.degraded_reads,
                loadavg: loadavg(),
                fault: Some(how),
                vs_healthy_mib: Some(mib(ops, secs) / r.mib_per_s),
                vs_healthy_p999: Some(fl_lat.p999_us / r.p999_us),
                vs_healthy_p99: Some(fl_lat.p99_us / r.p99_us),
                ..r
            };
            println!("{}", serde_json::to_string(&f)?);
        }
        // What this run appended goes before the next run (runs of 1 MiB appends would
        // otherwise fill small stores); readers' files stay for the next run.
        rt.block_on(async {
            for prefix in &prefixes {
                clean(&client, prefix, |name| !name.starts_with('r')).await;
            }
        });
    }
    rt.block_on(async {
        for prefix in &prefixes {
            clean(&client, prefix, |_| true).await;
            let _ = client.delete(prefix).await;
        }
    });
    Ok(())
}

/// Slows the first chunkserver by `delay_ms` per request; returns its id and a description.
async fn slow_one(masters: &[String], delay_ms: u32) -> anyhow::Result<(u64, String)> {
    let m = crate::cluster::masters_client(masters)?;
    let s = m
        .call(|mut c| async move { c.status(cairn_rpc::pb::Empty {}).await })
        .await?;
    let server = s
        .servers
        .first()
        .ok_or_else(|| anyhow::anyhow!("no chunkserver"))?
        .id;
    let spec = cairn_client::FaultSpec {
        delay_ms,
        ..cairn_client::FaultSpec::default()
    };
    crate::admin::inject(&m, server, &spec).await?;
    Ok((
        server,
        format!("chunkserver {server} +{delay_ms} ms per request"),
    ))
}

/// SIGKILLs the first local chunkserver after `after` seconds.
async fn kill_one(masters: Vec<String>, after: f64) -> anyhow::Result<String> {
    tokio::time::sleep(Duration::from_secs_f64(after)).await;
    let m = crate::cluster::masters_client(&masters)?;
    let s = m
        .call(|mut c| async move { c.status(cairn_rpc::pb::Empty {}).await })
        .await?;
    let v = s
        .servers
        .iter()
        .find(|x| x.pid != 0 && x.state == "up")
        .ok_or_else(|| anyhow::anyhow!("no local chunkserver up to kill"))?;
    // SAFETY: sending a signal to a pid the masters report; no memory is touched.
    let rc = unsafe { libc::kill(v.pid as i32, libc::SIGKILL) };
    anyhow::ensure!(
        rc == 0,
        "kill {}: {}",
        v.pid,
        std::io::Error::last_os_error()
    );
    Ok(format!(
        "chunkserver {} (pid {}) SIGKILLed after {after} s",
        v.id, v.pid
    ))
}

fn policy(a: &Args) -> cairn_client::Policy {
    a.policy.unwrap_or_else(|| {
        CreateOptions::replicas(a.replicas as u8)
            .policy
            .expect("a replicas policy")
    })
}

fn create_opts(a: &Args) -> CreateOptions {
    CreateOptions {
        policy: Some(policy(a)),
        ..CreateOptions::default()
    }
}

/// Makes the first `n` chunkservers fail every disk request; returns their ids and a
/// description.
async fn fail_some(masters: &[String], n: usize) -> anyhow::Result<(Vec<u64>, String)> {
    let m = crate::cluster::masters_client(masters)?;
    let s = m
        .call(|mut c| async move { c.status(cairn_rpc::pb::Empty {}).await })
        .await?;
    anyhow::ensure!(s.servers.len() > n, "only {} chunkservers", s.servers.len());
    let spec = cairn_client::FaultSpec {
        error_ppm: 1_000_000,
        disk_only: true,
        ..cairn_client::FaultSpec::default()
    };
    let ids: Vec<u64> = s.servers.iter().take(n).map(|x| x.id).collect();
    for &id in &ids {
        crate::admin::inject(&m, id, &spec).await?;
    }
    Ok((
        ids.clone(),
        format!("chunkservers {ids:?} fail every disk request"),
    ))
}

/// Deletes the files under `prefix` whose names `which` picks.
async fn clean(client: &Client, prefix: &str, which: impl Fn(&str) -> bool) {
    if let Ok(entries) = client.list(prefix).await {
        for e in entries.iter().filter(|e| which(&e.name)) {
            let _ = client.delete(&format!("{prefix}/{}", e.name)).await;
        }
    }
}

async fn measure(
    op: Op,
    client: &Client,
    prefixes: &[String],
    run: usize,
    a: &Args,
) -> anyhow::Result<(u64, u64, f64, Latency)> {
    let size = a.size as usize;
    let deadline = Instant::now() + Duration::from_secs_f64(a.seconds);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for d in 0..a.depth {
        let client = client.clone();
        let path = format!(
            "{}/{}{run}-{d}",
            prefixes[d % prefixes.len()],
            if op == Op::Create { "c" } else { "w" }
        );
        let opts = create_opts(a);
        tasks.push(tokio::spawn(async move {
            let mut h = histogram();
            let mut errors = 0u64;
            // Appends hand the SDK this owned buffer (no copy per append, as for a caller that
            // owns its bytes); creates use the borrowed form.
            let buf = cairn_client::Bytes::from(vec![0xA5u8; size]);
            match op {
                Op::Append => {
                    let mut w = client.create(&path, opts.clone()).await?;
                    while Instant::now() < deadline {
                        let s = Instant::now();
                        match w.append_bytes(buf.clone()).await {
                            Ok(_) => h.record(s.elapsed().as_nanos() as u64)?,
                            Err(_) => {
                                errors += 1;
                                w = client.open_append(&path).await?;
                            }
                        }
                    }
                    let _ = w.close().await;
                }
                Op::Read => {
                    let path = format!("{}/r{d}", path.rsplit_once('/').map_or("", |p| p.0));
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        let s = Instant::now();
                        match client.read(&path, (i % 64) * size as u64, size).await {
                            Ok(_) => h.record(s.elapsed().as_nanos() as u64)?,
                            Err(_) => errors += 1,
                        }
                        i += 1;
                    }
                }
                Op::Create => {
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        let s = Instant::now();
                        let r = async {
                            let mut w = client.create(&format!("{path}-{i}"), opts.clone()).await?;
                            w.append(&buf).await?;
                            w.close().await
                        }
                        .await;
                        match r {
                            Ok(_) => {
                                h.record(s.elapsed().as_nanos() as u64)?;
                                // Untimed: keep the disks from filling with small chunks.
                                let _ = client.delete(&format!("{path}-{i}")).await;
                            }
                            Err(e) => {
                                if errors == 0 {
                                    eprintln!("bench: first create error: {e}");
                                }
                                errors += 1;
                            }
                        }
                        i += 1;
                    }
                }
            }
            anyhow::Ok((h, errors))
        }));
    }
    let mut all = histogram();
    let mut errors = 0;
    for t in tasks {
        let (h, e) = t.await??;
        all.add(h)?;
        errors += e;
    }
    Ok((
        all.len(),
        errors,
        t0.elapsed().as_secs_f64(),
        Latency::of(&all),
    ))
}

/// A loopback TCP echo: `size` bytes to a server task, 64 bytes back, one at a time.
async fn loopback_rtt(size: usize, seconds: f64) -> anyhow::Result<Latency> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; size];
        loop {
            if s.read_exact(&mut buf).await.is_err() {
                return anyhow::Ok(());
            }
            s.write_all(&[0u8; 64]).await?;
        }
    });
    let mut c = tokio::net::TcpStream::connect(addr).await?;
    c.set_nodelay(true)?;
    let out = Arc::new(vec![1u8; size]);
    let mut back = [0u8; 64];
    let mut h = histogram();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < deadline {
        let s = Instant::now();
        c.write_all(&out).await?;
        c.read_exact(&mut back).await?;
        h.record(s.elapsed().as_nanos() as u64)?;
    }
    drop(c);
    let _ = server.await;
    Ok(Latency::of(&h))
}
