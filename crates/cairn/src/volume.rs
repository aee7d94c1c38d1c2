//! `cairn volume …`: the block service's volumes (docs/block.md), and `cairn nbd`, the server
//! that exports them over NBD.

use crate::cluster::ClusterArgs;
use cairn_rpc::object::{
    ObjectError, ObjectOp, ObjectQuery, OpReply, Parent, QueryReply, Snapshot, Volume,
};

#[derive(clap::Subcommand)]
pub enum VolumeCommand {
    /// Create a volume: its record with the masters (its files are made when it is first
    /// served).
    Create {
        /// The new volume's name.
        name: String,
        /// Bytes (`100g`, `512m`, …); a multiple of the block size.
        #[arg(long, value_parser = crate::bench::parse_size)]
        size: u64,
        /// The unit of the index and of NBD requests (a power of two, 512..=64k).
        #[arg(long, default_value = "4k", value_parser = crate::bench::parse_size)]
        block_size: u64,
        /// The redundancy of its data (`replicas:3`, `ec:4+2`, …); default: the cluster's.
        #[arg(long, default_value = "")]
        policy: String,
        /// The user it belongs to (default: the cluster's — admins only).
        #[arg(long, default_value = "")]
        owner: String,
        /// Its mode bits in octal, as files' (`r`: open it read-only, `rw`: read-write).
        #[arg(long, default_value = "600", value_parser = parse_mode)]
        mode: u16,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Change a volume's mode bits (its owner's and everyone else's `rw`; admins only).
    Chmod {
        /// The new bits, in octal (`600`, `640`, `644`).
        #[arg(value_parser = parse_mode)]
        mode: u16,
        /// The volume.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Give a volume to a user (admins only).
    Chown {
        /// The new owner (a user's name).
        owner: String,
        /// The volume.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List the volumes.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// A volume's record and what its files hold.
    Info {
        /// The volume.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Grow a volume (served volumes see the new size when next opened).
    Resize {
        /// The volume.
        name: String,
        /// Its new size in bytes (`200g`); at least the current size.
        #[arg(long, value_parser = crate::bench::parse_size)]
        size: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Delete a volume and its files (refused while it has snapshots), or a snapshot
    /// `VOLUME@SNAP` (refused while a clone was made from it).
    Delete {
        /// The volume, or `VOLUME@SNAP`.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Snapshot a volume: its contents now, kept with no data copied (taken by the server
    /// serving it, or here if none does).
    Snapshot {
        /// The volume.
        volume: String,
        /// The snapshot's name.
        snapshot: String,
        /// Seconds to wait for the serving server to take it.
        #[arg(long, default_value_t = 60)]
        timeout_secs: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// A new volume with a snapshot's contents (`VOLUME@SNAP`), sharing its data: only what
    /// the clone writes is stored again.
    Clone {
        /// The snapshot, `VOLUME@SNAP`.
        snapshot: String,
        /// The new volume's name.
        name: String,
        /// Bytes; default the snapshot's size (at least that).
        #[arg(long, value_parser = crate::bench::parse_size)]
        size: Option<u64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

/// Octal mode bits of a volume.
fn parse_mode(s: &str) -> Result<u16, String> {
    u16::from_str_radix(s, 8)
        .ok()
        .filter(|b| *b <= 0o777)
        .ok_or_else(|| format!("{s}: not an octal mode (as 600 or 0640)"))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn fresh_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// `VOLUME@SNAP`.
fn split_snapshot(s: &str) -> anyhow::Result<(&str, &str)> {
    s.split_once('@')
        .filter(|(v, n)| !v.is_empty() && !n.is_empty())
        .ok_or_else(|| anyhow::anyhow!("{s:?}: expected VOLUME@SNAPSHOT"))
}

/// Waits until snapshot `snap` of `volume` is ready: the server serving the volume takes
/// it within a second; if none does, this process opens the volume and takes it.
async fn await_snapshot(
    client: &cairn_client::Client,
    volume: &str,
    snap: &str,
    timeout: std::time::Duration,
) -> anyhow::Result<Volume> {
    let deadline = std::time::Instant::now() + timeout;
    let mut opened = false;
    loop {
        let v = get(client, volume).await?;
        match v.snapshot(snap) {
            Some(s) if s.ready => return Ok(v),
            Some(_) => {}
            None => anyhow::bail!("snapshot {volume}@{snap} was deleted meanwhile"),
        }
        if !opened {
            let opts = cairn_block::volume::VolumeOptions {
                lanes: 1,
                gc_every: None,
                ..Default::default()
            };
            match cairn_block::volume::Volume::open(client.clone(), v, opts).await {
                Ok(vol) => {
                    vol.close().await?;
                    opened = true;
                    continue;
                }
                Err(cairn_block::volume::Error::Busy(_)) => opened = true,
                Err(e) => return Err(e.into()),
            }
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!(
                "snapshot {volume}@{snap} is recorded but the server serving the volume did not take it within {timeout:?}"
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

fn obj_err(e: ObjectError) -> anyhow::Error {
    anyhow::anyhow!(e)
}

async fn change(client: &cairn_client::Client, op: ObjectOp) -> anyhow::Result<Volume> {
    match client.masters().object_op(&op).await?.map_err(obj_err)? {
        OpReply::Volume(v) => Ok(v),
        other => anyhow::bail!("the masters answered {other:?}"),
    }
}

async fn get(client: &cairn_client::Client, name: &str) -> anyhow::Result<Volume> {
    let q = ObjectQuery::Volume { name: name.into() };
    match client.masters().object_query(&q).await?.map_err(obj_err)? {
        QueryReply::Volume(v) => Ok(v),
        other => anyhow::bail!("the masters answered {other:?}"),
    }
}

fn print(v: &Volume, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(v)?);
    } else {
        if let Some(p) = &v.parent {
            println!("{:<24} clone of {}@{}", v.name, p.volume, p.snapshot);
        }
        println!(
            "{:<24} {:>14} B  block {:>6}  policy {:<10} {:04o} {:<12} id {}",
            v.name,
            v.size,
            v.block_size,
            if v.policy.is_empty() {
                "default"
            } else {
                &v.policy
            },
            v.mode,
            if v.owner.is_empty() {
                "(cluster)"
            } else {
                &v.owner
            },
            v.id
        );
    }
    Ok(())
}

pub fn run(c: VolumeCommand) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        match c {
            VolumeCommand::Create {
                name,
                size,
                block_size,
                policy,
                owner,
                mode,
                json,
                cluster,
            } => {
                if !policy.is_empty() {
                    policy
                        .parse::<cairn_client::Policy>()
                        .map_err(|e| anyhow::anyhow!("--policy {policy:?}: {e}"))?;
                }
                let client = crate::cluster::client(&cluster.masters()?).await?;
                let volume = Volume {
                    name,
                    id: fresh_id(),
                    size,
                    block_size: u32::try_from(block_size)
                        .map_err(|_| anyhow::anyhow!("--block-size too large"))?,
                    policy,
                    created_ms: now_ms(),
                    snapshots: Vec::new(),
                    parent: None,
                    lineage: Vec::new(),
                    owner,
                    mode,
                };
                let v = change(&client, ObjectOp::CreateVolume { volume }).await?;
                print(&v, json)
            }
            VolumeCommand::Chmod {
                mode,
                name,
                json,
                cluster,
            } => {
                let client = crate::cluster::client(&cluster.masters()?).await?;
                let op = ObjectOp::SetVolumeAttr {
                    name,
                    mode: Some(mode),
                    owner: None,
                };
                print(&change(&client, op).await?, json)
            }
            VolumeCommand::Chown {
                owner,
                name,
                json,
                cluster,
            } => {
                let client = crate::cluster::client(&cluster.masters()?).await?;
                let op = ObjectOp::SetVolumeAttr {
                    name,
                    mode: None,
                    owner: Some(owner),
                };
                print(&change(&client, op).await?, json)
            }
            VolumeCommand::List { json, cluster } => {
                let client = crate::cluster::client(&cluster.masters()?).await?;
                let vs = match client
                    .masters()
                    .object_query(&ObjectQuery::Volumes)
                    .await?
                    .map_err(obj_err)?
                {
                    QueryReply::Volumes(vs) => vs,
                    other => anyhow::bail!("the masters answered {other:?}"),
                };
                if json {
                    println!("{}", serde_json::to_string(&vs)?);
                } else {
                    for v in &vs {
                        print(v, false)?;
                    }
                }
                Ok(())
            }
            VolumeCommand::Info {
                name,
                json,
                cluster,
            } => {
                let client = crate::cluster::client(&cluster.masters()?).await?;
                let v = get(&client, &name).await?;
                let dir = cairn_block::volume::volume_dir(&v.id);
                let files = client.list(&dir).await.unwrap_or_default();
                let bytes: u64 = files.iter().map(|f| f.length).sum();
                let segments = files.iter().filter(|f| f.name.starts_with("seg-")).count();
                if json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "volume": v,
                            "dir": dir,
                            "files": files.len(),
                            "segments": segments,
                            "stored_bytes": bytes,
                        })
                    );
                } else {
                    print(&v, false)?;
                    println!(
                        "  {dir}: {} files, {segments} segments, {bytes} B",
                        files.len()
                    );
                    for s in &v.snapshots {
                        println!(
                            "  snapshot {:<24} {:>14} B  {}",
                            s.name,
                            s.size,
                            if s.ready { "ready" } else { "being taken" }
                        );
                    }
                }
                Ok(())
            }
            VolumeCommand::Resize {
                name,
                size,
                json,
                cluster,
            } => {
                let client = crate::cluster::client(&cluster.masters()?).await?;
                let v = change(&client, ObjectOp::ResizeVolume { name, size }).await?;
                print(&v, json)
            }
            VolumeCommand::Delete {
                name,
                json,
                cluster,
            } if name.contains('@') => {
                let (volume, snap) = split_snapshot(&name)?;
                let client = crate::cluster::client(&cluster.masters()?).await?;
                let v = get(&client, volume).await?;
                let s = v
                    .snapshot(snap)
                    .cloned()
                    .ok_or_else(|| obj_err(ObjectError::NoSuchSnapshot))?;
                let op = ObjectOp::DeleteSnapshot {
                    volume: volume.into(),
                    snapshot: snap.into(),
                };
                change(&client, op).await?;
                // The record first: the volume's server unpins its segments at its next
                // look; the file goes now.
                let path = format!(
                    "{}/{}",
                    cairn_block::volume::volume_dir(&v.id),
                    cairn_block::volume::snap_name(&s.id)
                );
                match client.delete(&path).await {
                    Ok(()) => {}
                    Err(cairn_client::Error::Meta(m))
                        if m.kind == cairn_rpc::ErrorKind::NotFound => {}
                    Err(e) => return Err(e.into()),
                }
                if json {
                    println!("{}", serde_json::json!({ "deleted": s, "volume": volume }));
                } else {
                    println!("deleted {volume}@{snap}");
                }
                Ok(())
            }
            VolumeCommand::Snapshot {
                volume,
                snapshot,
                timeout_secs,
                json,
                cluster,
            } => {
                let client = crate::cluster::client(&cluster.masters()?).await?;
                let snap = Snapshot {
                    name: snapshot.clone(),
                    id: fresh_id(),
                    size: 0,
                    created_ms: now_ms(),
                    ready: false,
                };
                let op = ObjectOp::CreateSnapshot {
                    volume: volume.clone(),
                    snapshot: snap,
                };
                change(&client, op).await?;
                let timeout = std::time::Duration::from_secs(timeout_secs);
                let v = await_snapshot(&client, &volume, &snapshot, timeout).await?;
                let s = v.snapshot(&snapshot).expect("ready");
                if json {
                    println!("{}", serde_json::json!({ "volume": volume, "snapshot": s }));
                } else {
                    println!("{volume}@{snapshot}: {} B, id {}", s.size, s.id);
                }
                Ok(())
            }
            VolumeCommand::Clone {
                snapshot,
                name,
                size,
                json,
                cluster,
            } => {
                let (volume, snap) = split_snapshot(&snapshot)?;
                let client = crate::cluster::client(&cluster.masters()?).await?;
                let pv = get(&client, volume).await?;
                let s = pv
                    .snapshot(snap)
                    .filter(|s| s.ready)
                    .cloned()
                    .ok_or_else(|| obj_err(ObjectError::NoSuchSnapshot))?;
                let v = Volume {
                    name,
                    id: fresh_id(),
                    size: size.unwrap_or(s.size),
                    block_size: pv.block_size,
                    policy: pv.policy.clone(),
                    created_ms: now_ms(),
                    snapshots: Vec::new(),
                    parent: Some(Parent {
                        volume: pv.name.clone(),
                        volume_id: pv.id.clone(),
                        snapshot: s.name.clone(),
                        snapshot_id: s.id.clone(),
                    }),
                    lineage: Vec::new(),
                    // A clone is its snapshot's volume's owner's, with its mode.
                    owner: pv.owner.clone(),
                    mode: pv.mode,
                };
                // Its first index before its record: a clone is never seen empty.
                cairn_block::volume::write_clone(&client, &pv.id, &s.id, &v.id)
                    .await
                    .map_err(|e| anyhow::anyhow!("writing the clone's index: {e}"))?;
                let dir = cairn_block::volume::volume_dir(&v.id);
                match change(&client, ObjectOp::CreateVolume { volume: v }).await {
                    Ok(v) => print(&v, json),
                    Err(e) => {
                        for f in client.list(&dir).await.unwrap_or_default() {
                            let _ = client.delete(&format!("{dir}/{}", f.name)).await;
                        }
                        let _ = client.delete(&dir).await;
                        Err(e)
                    }
                }
            }
            VolumeCommand::Delete {
                name,
                json,
                cluster,
            } => {
                let client = crate::cluster::client(&cluster.masters()?).await?;
                let v = change(&client, ObjectOp::DeleteVolume { name }).await?;
                // The record is gone first: no server opens the volume again; its files go.
                let dir = cairn_block::volume::volume_dir(&v.id);
                let files = client.list(&dir).await.unwrap_or_default();
                for f in &files {
                    client.delete(&format!("{dir}/{}", f.name)).await?;
                }
                let _ = client.delete(&dir).await;
                if json {
                    println!(
                        "{}",
                        serde_json::json!({ "deleted": v, "files_deleted": files.len() })
                    );
                } else {
                    println!("deleted {} ({} files)", v.name, files.len());
                }
                Ok(())
            }
        }
    })
}

#[derive(clap::Args)]
pub struct NbdArgs {
    /// Where NBD clients connect (`nbd://HOST:PORT/VOLUME`).
    #[arg(long, default_value = "127.0.0.1:10809")]
    listen: std::net::SocketAddr,
    /// Master addresses (`HOST:PORT,…`).
    #[arg(long)]
    masters: String,
    #[command(flatten)]
    service: crate::cluster::ServiceArgs,
    /// Serve Prometheus metrics at http://ADDR/metrics (port 0: any free port).
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// `HOST:PORT` clients reach this server at, as `cairn status` lists it (default: the
    /// bound address).
    #[arg(long)]
    advertise: Option<String>,
    /// The TLS directory NBD clients are served TLS with (its node.pem and node.key) and whose
    /// ca.pem their client certificates must chain to (`cairn user cert`); default --tls-dir.
    /// TLS is required unless --nbd-insecure.
    #[arg(long, env = "CAIRN_NBD_TLS_DIR")]
    nbd_tls_dir: Option<std::path::PathBuf>,
    /// Serve plain NBD: no TLS, no client certificates, every client opens every volume.
    /// Refused unless --listen is a loopback address.
    #[arg(long)]
    nbd_insecure: bool,
    /// Milliseconds between renewals of the volumes' writer leases (well under the masters'
    /// --lease-secs).
    #[arg(long, default_value_t = 5000)]
    renew_ms: u64,
    /// Segment files each volume writes at once.
    #[arg(long, default_value_t = 4)]
    lanes: usize,
    /// A volume starts a new segment file once its current one holds this many bytes.
    #[arg(long, default_value = "128m", value_parser = crate::bench::parse_size)]
    segment_bytes: u64,
    /// Milliseconds between a served volume's journal records of its index changes (a
    /// reopening server reads the data written after the last one) and reads of its record
    /// at the masters (snapshots asked for, a new size).
    #[arg(long, default_value_t = 1000)]
    record_every_ms: u64,
    /// Milliseconds between garbage collection passes (0: no collection).
    #[arg(long, default_value_t = 10_000)]
    gc_every_ms: u64,
    /// Segments with live bytes under this percentage of their length are compacted.
    #[arg(long, default_value_t = 50)]
    gc_live_pct: u8,
    /// Bytes per second garbage collection copies at most.
    #[arg(long, default_value = "64m", value_parser = crate::bench::parse_size)]
    gc_rate: u64,
    /// Write an audit log here: one JSON line per connect, refusal, open and close (user,
    /// volume, address), a file per day (docs/security.md "Audit"). `cairn up` sets it.
    #[arg(long)]
    audit_dir: Option<std::path::PathBuf>,
    /// Days of audit log kept.
    #[arg(long, default_value_t = 30)]
    audit_keep_days: usize,
    #[command(flatten)]
    connections: crate::limits::ConnectionArgs,
}

pub fn nbd(a: NbdArgs) -> anyhow::Result<()> {
    let tls = if a.nbd_insecure {
        anyhow::ensure!(
            a.listen.ip().is_loopback(),
            "--nbd-insecure serves every volume to anyone who reaches the port: refused on {} \
             (a non-loopback address); serve TLS with --nbd-tls-dir",
            a.listen
        );
        tracing::warn!("serving plain NBD (--nbd-insecure): every local client opens every volume");
        None
    } else {
        let dir = a
            .nbd_tls_dir
            .clone()
            .or_else(|| a.service.tls_dir())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "NBD is served over TLS with client certificates: pass --nbd-tls-dir (or \
                 --tls-dir) with a directory `cairn tls init` made, or --nbd-insecure for plain \
                 NBD on loopback"
                )
            })?;
        Some(cairn_rpc::tls::data::client_auth_acceptor(&dir)?)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("cairn-nbd")
        .build()?;
    rt.block_on(async {
        let masters: Vec<String> = a.masters.split(',').map(|m| m.trim().to_owned()).collect();
        let opts = a
            .service
            .options(cairn_rpc::auth::Service::Block, format!("nbd@{}", a.listen))?;
        let client = cairn_client::Client::with_options(
            &masters,
            cairn_client::ClientOptions {
                renew_every: std::time::Duration::from_millis(a.renew_ms.max(100)),
                ..opts
            },
        )
        .await?;
        if let Some(m) = a.metrics_listen {
            crate::metrics::serve(m, "nbd").await?;
        }
        let listener = tokio::net::TcpListener::bind(a.listen).await?;
        let addr = listener.local_addr()?;
        println!("listening on {addr}");
        use std::io::Write;
        std::io::stdout().flush()?;
        let server = cairn_block::nbd::NbdServer::new(
            client,
            cairn_block::nbd::NbdOptions {
                volume: cairn_block::volume::VolumeOptions {
                    lanes: a.lanes.max(1),
                    segment_bytes: a.segment_bytes.max(64 << 10),
                    gc_every: (a.gc_every_ms > 0)
                        .then(|| std::time::Duration::from_millis(a.gc_every_ms)),
                    gc_live_pct: a.gc_live_pct.min(100),
                    gc_bytes_per_sec: a.gc_rate.max(1),
                    poll_every: std::time::Duration::from_millis(a.record_every_ms.max(10)),
                    ..Default::default()
                },
                tls,
                audit: match &a.audit_dir {
                    Some(d) => {
                        cairn_rpc::audit::Audit::open(d, "nbd", a.audit_keep_days).map_err(|e| {
                            anyhow::anyhow!("cannot open the audit log in {}: {e}", d.display())
                        })?
                    }
                    None => cairn_rpc::audit::Audit::off(),
                },
                connections: a
                    .connections
                    .apply(cairn_block::nbd::default_connection_limits()),
                ..Default::default()
            },
        );
        let uri = format!(
            "nbd://{}",
            a.advertise.clone().unwrap_or_else(|| addr.to_string())
        );
        let announce = tokio::spawn(server.clone().announce(uri));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        server
            .serve(listener, async move {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            })
            .await;
        announce.abort();
        Ok(())
    })
}
