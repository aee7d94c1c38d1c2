//! `cairn volume …`: the block service's volumes (docs/block.md), and `cairn nbd`, the server
//! that exports them over NBD.

use crate::cluster::ClusterArgs;
use cairn_rpc::object::{ObjectError, ObjectOp, ObjectQuery, OpReply, QueryReply, Volume};

#[derive(clap::Subcommand)]
pub enum VolumeCommand {
    /// Create a volume: its record with the masters (its files are made when it is first
    /// served).
    Create {
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
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List the volumes.
    List {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// A volume's record and what its files hold.
    Info {
        name: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Grow a volume (served volumes see the new size when next opened).
    Resize {
        name: String,
        #[arg(long, value_parser = crate::bench::parse_size)]
        size: u64,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Delete a volume and its files.
    Delete {
        name: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
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
        println!(
            "{:<24} {:>14} B  block {:>6}  policy {:<10} id {}",
            v.name,
            v.size,
            v.block_size,
            if v.policy.is_empty() {
                "default"
            } else {
                &v.policy
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
                    id: format!("{:016x}", rand::random::<u64>()),
                    size,
                    block_size: u32::try_from(block_size)
                        .map_err(|_| anyhow::anyhow!("--block-size too large"))?,
                    policy,
                    created_ms: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)?
                        .as_millis() as u64,
                };
                let v = change(&client, ObjectOp::CreateVolume { volume }).await?;
                print(&v, json)
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
    /// Milliseconds between renewals of the volumes' writer leases (well under the masters'
    /// --lease-secs).
    #[arg(long, default_value_t = 5000)]
    renew_ms: u64,
    /// Segment files each volume writes at once.
    #[arg(long, default_value_t = 4)]
    lanes: usize,
}

pub fn nbd(a: NbdArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("cairn-nbd")
        .build()?;
    rt.block_on(async {
        let masters: Vec<String> = a.masters.split(',').map(|m| m.trim().to_owned()).collect();
        let opts = a.service.options(format!("nbd@{}", a.listen))?;
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
                    ..Default::default()
                },
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
