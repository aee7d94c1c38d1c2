//! `cairn chunkserver`: one chunkserver process serving its disks on the data plane.

use cairn_chunkserver::{Chunkserver, DiskSet, DiskSetOptions, ServerOptions, control};
use cairn_chunkstore::{Durability, FormatOptions, OpenOptions};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ChunkserverArgs {
    /// Directory of this server's store files (disk0.cairn, disk1.cairn, …).
    #[arg(long, default_value = "./cairn-data/chunkserver")]
    data_dir: PathBuf,
    /// This server's id with the masters, on its first start (kept in DATA_DIR/server-id;
    /// default: a random one). Ids are what `cairn status` shows and `cairn admin drain` takes.
    #[arg(long)]
    server_id: Option<u64>,
    /// Store files (disks) to serve; missing ones are created and formatted.
    #[arg(long, default_value_t = 1)]
    disks: usize,
    /// Size of each store file created here (4k, 64m, 4g, …).
    #[arg(long, default_value = "1g", value_parser = crate::bench::parse_size)]
    disk_size: u64,
    /// Address for the data plane; port 0 picks a free port. The bound address is printed on
    /// stdout as `listening on ADDR`.
    #[arg(long, default_value = "127.0.0.1:7100")]
    listen: std::net::SocketAddr,
    /// sync (default): every acknowledged append is on the disk. none: benchmarks only.
    #[arg(long, default_value = "sync", value_parser = ["sync", "none"])]
    durability: String,
    /// Do not write zeros over new store files. They are then created at once, but on
    /// ext4/xfs the first append into each never-written block also commits a journal
    /// transaction: appends are slower until every block has been written once.
    #[arg(long)]
    no_zero_fill: bool,
    /// The masters (`HOST:PORT,…`): register, heartbeat and report chunks to them. Without
    /// it the server only serves the data plane.
    #[arg(long, env = "CAIRN_MASTERS")]
    masters: Option<String>,
    /// Address clients reach the data plane at (default: the listen address).
    #[arg(long)]
    advertise: Option<String>,
    /// The host this server runs on, a failure domain placement spreads copies over
    /// (default: none).
    #[arg(long, default_value = "")]
    host: String,
    /// The rack, the failure domain above the host (default: none).
    #[arg(long, default_value = "")]
    rack: String,
    /// Milliseconds between heartbeats.
    #[arg(long, default_value_t = 1000)]
    heartbeat_ms: u64,
    /// Accept `cairn admin fault` (delays, errors, stalls, a full disk) for tests and drills.
    /// Never on a server holding data anyone needs.
    #[arg(long)]
    fault_injection: bool,
    /// A file holding the cluster secret (hex; `cairn up` makes DATA_DIR/cluster.secret):
    /// servers prove they hold it on every call between them (docs/security.md). Required
    /// unless --insecure.
    #[arg(long, env = "CAIRN_CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<std::path::PathBuf>,
    /// A TLS directory (`cairn tls init`): talk TLS to the masters, checking them with its
    /// `ca.pem`.
    #[arg(long, env = "CAIRN_TLS_DIR")]
    tls_dir: Option<std::path::PathBuf>,
    /// Serve the data plane over TLS only (with --tls-dir's `node.pem`, whose SANs must
    /// hold the address clients dial), and dial peers for repair over TLS. Clients need
    /// their own --data-tls.
    #[arg(long, env = "CAIRN_DATA_TLS", requires = "tls_dir")]
    data_tls: bool,
    /// Serve every request without checking its capability, and run without the cluster
    /// secret: anyone who reaches the port can read, write and delete any chunk. For
    /// experiments only (docs/security.md).
    #[arg(long)]
    insecure: bool,
    /// Connections served at once, in all.
    #[arg(long, default_value_t = 4096)]
    max_connections: usize,
    /// Connections served at once from one peer address.
    #[arg(long, default_value_t = 1024)]
    max_connections_per_peer: usize,
    /// Seconds a connection may start no request before it is closed.
    #[arg(long, default_value_t = 300)]
    idle_timeout_secs: u64,
    /// Milliseconds a connection has, from its accept, to show a valid capability; until then
    /// it holds one of the few slots for unproven connections (docs/security.md).
    #[arg(long, default_value_t = 2000)]
    proof_timeout_ms: u64,
    /// Unproven connections at once, in all.
    #[arg(long, default_value_t = 512)]
    max_unproven: usize,
    /// Unproven connections at once from one address.
    #[arg(long, default_value_t = 32)]
    max_unproven_per_peer: usize,
    /// Serve Prometheus metrics at http://ADDR/metrics (port 0: any free port).
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// The scrubber reads and CRC-checks every copy on this server once in this many seconds
    /// (default a week), at the rate the used bytes need, within the background bandwidth
    /// and behind foreground requests (0: no scrubbing).
    #[arg(long, default_value_t = 7 * 24 * 3600)]
    scrub_period_secs: u64,
    /// A fixed scrub rate (bytes/s, e.g. 64m) instead of the one the period sets.
    #[arg(long, value_parser = crate::bench::parse_size)]
    scrub_bytes_per_sec: Option<u64>,
}

pub fn run(a: ChunkserverArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.disks >= 1, "--disks must be at least 1");
    cairn_rpc::private::close_data_dir(&a.data_dir);
    let set = DiskSet::open(&DiskSetOptions {
        paths: (0..a.disks)
            .map(|i| a.data_dir.join(format!("disk{i}.cairn")))
            .collect(),
        create_bytes: a.disk_size,
        zero_fill: !a.no_zero_fill,
        format: FormatOptions::default(),
        open: OpenOptions {
            durability: if a.durability == "sync" {
                Durability::Sync
            } else {
                Durability::None
            },
            ..OpenOptions::default()
        },
    })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("cairn-cs")
        .build()?;
    let cs = Chunkserver::new(
        set,
        ServerOptions {
            fault_injection: a.fault_injection,
            require_capabilities: !a.insecure,
            max_connections: a.max_connections,
            max_connections_per_peer: a.max_connections_per_peer,
            idle_timeout: std::time::Duration::from_secs(a.idle_timeout_secs.max(1)),
            proof_timeout: std::time::Duration::from_millis(a.proof_timeout_ms.max(100)),
            max_unproven: a.max_unproven.max(1),
            max_unproven_per_peer: a.max_unproven_per_peer.max(1),
            data_tls: match (&a.tls_dir, a.data_tls) {
                (Some(d), true) => Some(cairn_rpc::tls::data::server_tls(d)?),
                _ => None,
            },
            ..ServerOptions::default()
        },
    );
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(a.listen).await?;
        let addr = listener.local_addr()?;
        if let Some(m) = a.metrics_listen {
            crate::metrics::serve(m, "chunkserver").await?;
        }
        println!("listening on {addr}");
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let control = match &a.masters {
            Some(m) => {
                let opts = control::ControlOptions {
                    masters: m
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect(),
                    server_id: control::server_id(&a.data_dir, a.server_id)?,
                    advertise: a.advertise.clone().unwrap_or_else(|| addr.to_string()),
                    host: a.host.clone(),
                    rack: a.rack.clone(),
                    interval: std::time::Duration::from_millis(a.heartbeat_ms.max(10)),
                    scrub: cairn_chunkserver::scrub::ScrubOptions {
                        period: std::time::Duration::from_secs(a.scrub_period_secs),
                        bytes_per_sec: a.scrub_bytes_per_sec.unwrap_or(0),
                    },
                    cluster_secret: crate::master::cluster_secret(
                        a.cluster_secret_file.as_deref(),
                        a.insecure,
                    )?,
                    tls: a
                        .tls_dir
                        .as_deref()
                        .map(cairn_rpc::tls::client_config)
                        .transpose()?,
                };
                let mut rx = stop_rx.clone();
                Some(tokio::spawn(control::run(cs.clone(), opts, async move {
                    let _ = rx.wait_for(|s| *s).await;
                })))
            }
            None if a.insecure => None,
            None => anyhow::bail!(
                "a chunkserver without --masters gets no capability keys and would refuse every \
                 request: pass --masters, or --insecure to serve without checking"
            ),
        };
        use std::io::Write;
        std::io::stdout().flush()?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        cs.clone()
            .serve(listener, async move {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            })
            .await;
        let _ = stop_tx.send(true);
        if let Some(c) = control {
            let _ = c.await;
        }
        drop(stop_rx);
        anyhow::Ok(())
    })?;
    // Let in-flight requests finish, then close every store (a final checkpoint each).
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    match std::sync::Arc::try_unwrap(cs) {
        Ok(cs) => cs.into_disks().close()?,
        Err(_) => tracing::warn!("connections still open at shutdown; stores dropped"),
    }
    Ok(())
}
