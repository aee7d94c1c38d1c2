//! `cairn fs …` and `cairn status`: the cluster through the client SDK.

use crate::cluster::ClusterArgs;
use cairn_client::{Client, CreateOptions};
use cairn_rpc::object::{ObjectQuery, QueryReply};
use cairn_rpc::pb;
use std::io::{Read, Write};
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum FsCommand {
    /// Copy a local file into the cluster (a new file, sealed when complete).
    Put {
        local: PathBuf,
        path: String,
        #[command(flatten)]
        new: NewFile,
    },
    /// Copy a file out of the cluster.
    Get {
        path: String,
        local: PathBuf,
    },
    /// Print a file.
    Cat {
        path: String,
    },
    /// Append standard input to a file (created if missing); prints the acknowledged offset.
    Append {
        path: String,
        /// How the file is made if it is missing.
        #[command(flatten)]
        new: NewFile,
    },
    /// Create an empty file (open for appends).
    Create {
        path: String,
        #[command(flatten)]
        new: NewFile,
    },
    /// List a directory.
    Ls {
        #[arg(default_value = "/")]
        path: String,
        #[arg(short = 'l')]
        long: bool,
    },
    Stat {
        path: String,
    },
    /// Delete a file or an empty directory.
    Rm {
        path: String,
    },
    /// Seal a file: no more appends.
    Seal {
        path: String,
    },
    /// Make a directory; `--policy` sets the default policy of files created below it (with
    /// `-p` also on a directory that exists).
    Mkdir {
        path: String,
        #[arg(short = 'p')]
        parents: bool,
        #[arg(long)]
        policy: Option<cairn_client::Policy>,
    },
    /// Rename a file or directory.
    Mv {
        from: String,
        to: String,
    },
}

/// How a new file is made.
#[derive(clap::Args)]
pub struct NewFile {
    /// Redundancy policy: replicas:N, ec:K+M or replicas:N,then:ec:K+M, optionally ,lz4
    /// (default: the directory's, else replicas:3).
    #[arg(long, conflicts_with = "replicas")]
    policy: Option<cairn_client::Policy>,
    /// Shorthand for --policy replicas:N.
    #[arg(long)]
    replicas: Option<u8>,
    /// Copies durable before a write is acknowledged (default: a majority of the replicas).
    #[arg(long)]
    min_copy: Option<u32>,
}

impl NewFile {
    fn options(&self) -> CreateOptions {
        let policy = self.policy.or_else(|| {
            self.replicas
                .and_then(|n| CreateOptions::replicas(n).policy)
        });
        CreateOptions {
            policy,
            min_copy: self.min_copy,
            ..CreateOptions::default()
        }
    }
}

#[derive(clap::Args)]
pub struct FsArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Print JSON (ls, stat, append, put).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: FsCommand,
}

/// Pieces a transfer moves at a time.
const PIECE: usize = 4 << 20;

fn progress(total: u64, what: &str) -> indicatif::ProgressBar {
    if total < (64 << 20) || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template"),
    );
    pb.set_message(what.to_owned());
    pb
}

pub fn run(a: FsArgs) -> anyhow::Result<()> {
    let masters = a.cluster.masters()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(fs(masters, a.json, a.command))
}

async fn fs(masters: Vec<String>, json: bool, cmd: FsCommand) -> anyhow::Result<()> {
    let c = crate::cluster::client(&masters).await?;
    match cmd {
        FsCommand::Put { local, path, new } => {
            let mut f = std::fs::File::open(&local)?;
            let total = f.metadata()?.len();
            let policy = match new.options().policy {
                Some(p) => p,
                None => inherited(&c, &path).await,
            };
            check_fits(c.masters(), total, &policy).await?;
            let bar = progress(total, "put");
            let mut w = c.create(&path, new.options()).await?;
            let mut buf = vec![0u8; PIECE];
            loop {
                let n = read_full(&mut f, &mut buf)?;
                if n == 0 {
                    break;
                }
                w.append(&buf[..n]).await?;
                bar.inc(n as u64);
            }
            let len = w.seal().await?;
            bar.finish_and_clear();
            if json {
                println!("{}", serde_json::json!({"path": path, "length": len}));
            } else {
                println!("{path}: {len} bytes");
            }
        }
        FsCommand::Get { path, local } => {
            let st = c.stat(&path).await?;
            anyhow::ensure!(!st.is_dir, "{path}: is a directory");
            let bar = progress(st.length, "get");
            let tmp = local.with_extension("cairn-partial");
            let mut out = std::fs::File::create(&tmp)?;
            copy_out(&c, &path, st.length, &mut out, &bar).await?;
            out.sync_all()?;
            std::fs::rename(&tmp, &local)?;
            bar.finish_and_clear();
        }
        FsCommand::Cat { path } => {
            let st = c.stat(&path).await?;
            anyhow::ensure!(!st.is_dir, "{path}: is a directory");
            let mut out = std::io::stdout().lock();
            copy_out(
                &c,
                &path,
                st.length,
                &mut out,
                &indicatif::ProgressBar::hidden(),
            )
            .await?;
            out.flush()?;
        }
        FsCommand::Append { path, new } => {
            let mut data = Vec::new();
            std::io::stdin().read_to_end(&mut data)?;
            let mut w = match c.open_append(&path).await {
                Ok(w) => w,
                Err(cairn_client::Error::Meta(e)) if e.kind == cairn_rpc::ErrorKind::NotFound => {
                    c.create(&path, new.options()).await?
                }
                Err(e) => return Err(e.into()),
            };
            let at = w.append(&data).await?;
            w.close().await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"path": path, "offset": at, "length": data.len()})
                );
            } else {
                println!("{at}");
            }
        }
        FsCommand::Ls { path, long } => {
            let entries = c.list(&path).await?;
            if json {
                println!("{}", serde_json::to_string(&entries)?);
            } else {
                for e in entries {
                    let name = if e.is_dir {
                        format!("{}/", e.name)
                    } else {
                        e.name
                    };
                    if long {
                        println!(
                            "{:>14} {:>6} {} {}",
                            e.length,
                            e.chunks,
                            if e.is_dir {
                                "dir   "
                            } else if e.sealed {
                                "sealed"
                            } else {
                                "open  "
                            },
                            name
                        );
                    } else {
                        println!("{name}");
                    }
                }
            }
        }
        FsCommand::Stat { path } => {
            let st = c.stat(&path).await?;
            if json {
                println!("{}", serde_json::to_string(&st)?);
            } else if st.is_dir {
                match &st.policy {
                    Some(p) => println!("{}: directory, new files {p}", st.path),
                    None => println!("{}: directory", st.path),
                }
            } else {
                println!(
                    "{}: {} bytes, {} chunk(s), {} (writes acknowledged at {} copies), {}{}",
                    st.path,
                    st.length,
                    st.chunks,
                    st.policy.as_deref().unwrap_or("replicas:3"),
                    st.min_copy,
                    if st.sealed { "sealed" } else { "open" },
                    st.writer
                        .map(|w| format!(", written by {w}"))
                        .unwrap_or_default()
                );
            }
        }
        FsCommand::Rm { path } => c.delete(&path).await?,
        FsCommand::Seal { path } => {
            let w = c.open_append(&path).await?;
            let len = w.seal().await?;
            println!("{path}: sealed at {len} bytes");
        }
        FsCommand::Create { path, new } => {
            let w = c.create(&path, new.options()).await?;
            w.close().await?;
        }
        FsCommand::Mkdir {
            path,
            parents,
            policy,
        } => c.mkdir_with_policy(&path, parents, policy.as_ref()).await?,
        FsCommand::Mv { from, to } => c.rename(&from, &to).await?,
    }
    Ok(())
}

/// The policy a new file at `path` would get: its nearest existing directory's default.
async fn inherited(c: &Client, path: &str) -> cairn_client::Policy {
    let mut dir = path;
    while let Some((parent, _)) = dir.rsplit_once('/') {
        let parent = if parent.is_empty() { "/" } else { parent };
        if let Ok(st) = c.stat(parent).await {
            return st.policy.and_then(|p| p.parse().ok()).unwrap_or_default();
        }
        if parent == "/" {
            break;
        }
        dir = parent;
    }
    cairn_client::Policy::default()
}

/// Refuses, before anything is written, `user_bytes` that would not fit: their stored size
/// under `policy` (full stripes, every copy) against the free space of the chunkservers up,
/// less each one's reserve (the masters' rule: min(64 MiB, capacity / 16)).
pub(crate) async fn check_fits(
    masters: &cairn_rpc::Masters,
    user_bytes: u64,
    policy: &cairn_client::Policy,
) -> anyhow::Result<()> {
    let s = masters
        .send(pb::Empty {}, |mut c, r| async move { c.status(r).await })
        .await?;
    let free: u64 = s
        .servers
        .iter()
        .filter(|c| c.state == "up")
        .map(|c| {
            let reserve = (64u64 << 20).min(c.capacity_bytes / 16);
            c.capacity_bytes.saturating_sub(c.used_bytes + reserve)
        })
        .sum();
    let stored = (user_bytes as f64 * policy.write.overhead()).ceil() as u64;
    anyhow::ensure!(
        stored <= free,
        "would not fit: {} at {policy} is {} stored, and the chunkservers up have {} free \
         (past their reserves); delete data, add chunkservers or use a leaner policy",
        human(user_bytes),
        human(stored),
        human(free)
    );
    Ok(())
}

fn read_full(f: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

async fn copy_out(
    c: &Client,
    path: &str,
    length: u64,
    out: &mut impl Write,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<()> {
    let mut off = 0;
    while off < length {
        let n = (length - off).min(PIECE as u64) as usize;
        let data = c.read(path, off, n).await?;
        out.write_all(&data)?;
        off += n as u64;
        bar.inc(n as u64);
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    #[arg(long)]
    json: bool,
}

pub fn status(a: StatusArgs) -> anyhow::Result<()> {
    let masters = a.cluster.masters()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (s, objects) = rt.block_on(async {
        let m =
            crate::cluster::masters_client(&masters)?.retry_for(std::time::Duration::from_secs(5));
        let s: pb::StatusReply = m
            .call(|mut c| async move { c.status(pb::Empty {}).await })
            .await?;
        // Masters from before the object service answer without gateways.
        let objects = match m.object_query(&ObjectQuery::Gateways).await {
            Ok(Ok(QueryReply::Gateways {
                gateways,
                buckets,
                objects,
                uploads,
            })) => Some((gateways, buckets, objects, uploads)),
            _ => None,
        };
        Ok::<_, anyhow::Error>((s, objects))
    })?;
    // Processes of this machine's `cairn up` show their pids (the masters do not know them).
    let local = crate::cluster::ClusterFile::load(std::path::Path::new("./cairn-data"))
        .ok()
        .flatten()
        .unwrap_or_default();
    let master_pid = |addr: &str| {
        local
            .master_procs
            .iter()
            .find(|p| p.addr == addr && p.pid != 0)
            .map(|p| p.pid)
    };
    let this_host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let now = cairn_s3::now_ms();
    // S3 gateways and NBD servers share the masters' table; the endpoint's scheme tells them
    // apart.
    let all: &[cairn_rpc::object::Gateway] = objects
        .as_ref()
        .map(|(g, ..)| g.as_slice())
        .unwrap_or_default();
    // One entry per service: its address under `key` (S3's "endpoint", NBD's "uri").
    let listed = |nbd: bool, key: &str| -> Vec<serde_json::Value> {
        all.iter()
            .filter(|g| g.endpoint.starts_with("nbd://") == nbd)
            .map(|g| {
                let up = now.saturating_sub(g.seen_ms) < cairn_rpc::object::GATEWAY_DOWN_MS;
                let mut v = serde_json::json!({
                    "host": g.host,
                    "pid": (g.host == this_host).then_some(g.pid),
                    "state": if up { "up" } else { "down" },
                    "last_seen_ms_ago": now.saturating_sub(g.seen_ms),
                });
                v[key] = g.endpoint.clone().into();
                v
            })
            .collect()
    };
    let nbd = listed(true, "uri");
    let gateways = listed(false, "endpoint");
    let t = Traffic::of(&s);
    if a.json {
        let v = serde_json::json!({
            "leader": s.leader_id,
            "term": s.term,
            "last_applied": s.last_applied,
            "masters": s.masters.iter().map(|m| serde_json::json!({"id": m.id, "addr": m.addr, "voter": m.voter, "leader": m.id == s.leader_id, "pid": master_pid(&m.addr)})).collect::<Vec<_>>(),
            "s3": gateways,
            "nbd": nbd,
            "objects": objects.as_ref().map(|(_, b, o, u)| serde_json::json!({"buckets": b, "objects": o, "uploads": u})),
            "chunkservers": s.servers.iter().map(|c| serde_json::json!({
                "id": c.id, "addr": c.addr, "host": c.host, "rack": c.rack, "state": c.state,
                "pid": c.pid, "capacity_bytes": c.capacity_bytes, "used_bytes": c.used_bytes,
                "chunks": c.chunk_count, "load": c.load,
                "reported_by_clients": c.reported_by, "avoided": c.avoided,
                "scrub": {"bytes": c.scrub_bytes, "passes": c.scrub_passes, "corrupt_found": c.scrub_corrupt, "corrupt_now": c.corrupt_now},
                "last_heartbeat_ms_ago": if c.last_heartbeat_ms_ago == u64::MAX { None } else { Some(c.last_heartbeat_ms_ago) },
            })).collect::<Vec<_>>(),
            "files": s.files, "dirs": s.dirs, "chunks": s.chunks, "logical_bytes": s.logical_bytes,
            "missing_replicas": s.missing_replicas, "pending_deletes": s.pending_deletes,
            "reporting_clients": s.reporting_clients,
            "repair": {
                "under_replicated_chunks": s.under_replicated,
                "under_replicated_bytes": s.under_replicated_bytes,
                "lost_chunks": s.lost_chunks,
                "running": s.repairs_running, "done": s.repairs_done, "failed": s.repairs_failed,
                "repaired_bytes": s.repaired_bytes,
                "rate_bytes_per_sec": s.repair_rate,
                "bandwidth_cap_bytes_per_sec": s.repair_bytes_per_sec,
            },
            "conversion": {
                "waiting_chunks": s.conversions_waiting,
                "running": s.conversions_running, "done": s.conversions_done,
                "failed": s.conversions_failed, "converted_bytes": s.converted_bytes,
                "convert_after_secs": s.convert_after_secs,
            },
            "background_bytes_per_sec_per_server": s.background_bytes_per_sec,
            "background_traffic": {
                "conversion": {
                    "user_bytes": t.convert_user, "network_bytes": t.convert_network,
                    "device_bytes": t.convert_device,
                    "network_per_user_byte": ratio(t.convert_network, t.convert_user),
                    "device_per_user_byte": ratio(t.convert_device, t.convert_user),
                },
                "repair": {"network_bytes": t.repair_network, "device_bytes": t.repair_device},
                "scrub": {"device_read_bytes": t.scrub_read},
            },
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "masters (term {}, last applied {}):",
        s.term, s.last_applied
    );
    for m in &s.masters {
        println!(
            "  {:>3}  {:<22} {}{}",
            m.id,
            m.addr,
            if m.id == s.leader_id {
                "leader"
            } else {
                "follower"
            },
            if m.voter { "" } else { " (learner)" }
        );
    }
    if let Some((_, buckets, objects, uploads)) = &objects {
        println!(
            "s3 gateways ({buckets} buckets, {objects} objects, {uploads} uploads in progress):"
        );
        for g in &gateways {
            println!(
                "  {:<28} {:<5} {}{}",
                g["endpoint"].as_str().unwrap_or_default(),
                g["state"].as_str().unwrap_or_default(),
                g["host"].as_str().unwrap_or_default(),
                g["pid"]
                    .as_u64()
                    .map(|p| format!("  pid {p}"))
                    .unwrap_or_default(),
            );
        }
    }
    if !nbd.is_empty() {
        println!("nbd servers:");
        for g in &nbd {
            println!(
                "  {:<28} {:<5} {}{}",
                g["uri"].as_str().unwrap_or_default(),
                g["state"].as_str().unwrap_or_default(),
                g["host"].as_str().unwrap_or_default(),
                g["pid"]
                    .as_u64()
                    .map(|p| format!("  pid {p}"))
                    .unwrap_or_default(),
            );
        }
    }
    println!("chunkservers:");
    println!(
        "  {:>16}  {:<22} {:>7} {:<9} {:>10} {:>10} {:>7}  blacklisted by",
        "id", "addr", "pid", "state", "capacity", "used", "chunks"
    );
    for c in &s.servers {
        println!(
            "  {:>16}  {:<22} {:>7} {:<9} {:>10} {:>10} {:>7}  {}",
            c.id,
            c.addr,
            c.pid,
            c.state,
            human(c.capacity_bytes),
            human(c.used_bytes),
            c.chunk_count,
            match (c.reported_by, c.avoided) {
                (0, _) => String::from("-"),
                (n, false) => format!("{n}/{}", s.reporting_clients),
                (n, true) => format!("{n}/{} (no new chunks)", s.reporting_clients),
            }
        );
    }
    println!(
        "totals: {} files, {} dirs, {} chunks, {} logical; {} missing replicas, {} chunks pending delete",
        s.files,
        s.dirs,
        s.chunks,
        human(s.logical_bytes),
        s.missing_replicas,
        s.pending_deletes
    );
    println!(
        "scrub: {} read, {} passes, {} bad copies found, {} waiting for repair (all servers)",
        human(s.servers.iter().map(|c| c.scrub_bytes).sum()),
        s.servers.iter().map(|c| c.scrub_passes).sum::<u64>(),
        s.servers.iter().map(|c| c.scrub_corrupt).sum::<u64>(),
        s.servers.iter().map(|c| c.corrupt_now).sum::<u64>(),
    );
    println!(
        "repair: {} chunks ({}) under-replicated, {} lost; {} running, {} done, {} failed, \
         {} copied; rate {}/s of a {}/s cap",
        s.under_replicated,
        human(s.under_replicated_bytes),
        s.lost_chunks,
        s.repairs_running,
        s.repairs_done,
        s.repairs_failed,
        human(s.repaired_bytes),
        human(s.repair_rate),
        human(s.repair_bytes_per_sec)
    );
    println!(
        "background traffic: conversion {} of user bytes sent {} to other servers ({:.2}×) and \
         wrote {} ({:.2}×); repair read {} over the network and wrote {}; scrub read {}",
        human(t.convert_user),
        human(t.convert_network),
        ratio(t.convert_network, t.convert_user),
        human(t.convert_device),
        ratio(t.convert_device, t.convert_user),
        human(t.repair_network),
        human(t.repair_device),
        human(t.scrub_read),
    );
    println!(
        "conversion to EC: {} chunks waiting (sealed, unchanged for {} s), {} running, {} done, \
         {} failed, {} converted; background bandwidth {}/s per chunkserver",
        s.conversions_waiting,
        s.convert_after_secs,
        s.conversions_running,
        s.conversions_done,
        s.conversions_failed,
        human(s.converted_bytes),
        human(s.background_bytes_per_sec)
    );
    Ok(())
}

/// The chunkservers' background traffic, summed (docs/efficiency.md).
struct Traffic {
    convert_user: u64,
    convert_network: u64,
    convert_device: u64,
    repair_network: u64,
    repair_device: u64,
    scrub_read: u64,
}

impl Traffic {
    fn of(s: &pb::StatusReply) -> Self {
        let sum = |f: fn(&pb::ServerStatus) -> u64| s.servers.iter().map(f).sum();
        Self {
            convert_user: sum(|c| c.convert_user_bytes),
            convert_network: sum(|c| c.convert_network_bytes),
            convert_device: sum(|c| c.convert_device_bytes),
            repair_network: sum(|c| c.repair_network_bytes),
            repair_device: sum(|c| c.repair_device_bytes),
            scrub_read: sum(|c| c.scrub_bytes),
        }
    }
}

/// `a / b`, 0 when nothing was counted.
fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}
