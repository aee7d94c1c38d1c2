//! `cairn master`: one master of the Raft group.

use cairn_master::{MasterOptions, RegistryOptions, serve};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct MasterArgs {
    /// This master's id in the group (1, 2, 3, …).
    #[arg(long, default_value_t = 1)]
    id: u64,
    /// Where the Raft log and vote (raft-log/) and snapshots (master.redb) live.
    #[arg(long, default_value = "./cairn-data/master-1")]
    data_dir: PathBuf,
    /// Address for clients, chunkservers and the other masters. Printed as `listening on ADDR`.
    #[arg(long, default_value = "127.0.0.1:7000")]
    listen: std::net::SocketAddr,
    /// Address the others use to reach this master (default: the listen address).
    #[arg(long)]
    advertise: Option<String>,
    /// The group at bootstrap: `1=HOST:PORT,2=HOST:PORT,…` (default: this master alone). The
    /// lowest id initializes a new group; a master that has a log ignores this.
    #[arg(long)]
    peers: Option<String>,
    /// Seconds a writer's lease lasts without renewal.
    #[arg(long, default_value_t = 20)]
    lease_secs: u64,
    /// Seconds before a chunk no file owns is deleted from its chunkserver.
    #[arg(long, default_value_t = 60)]
    orphan_grace_secs: u64,
    /// A chunkserver silent this long is suspect (no new chunks go to it).
    #[arg(long, default_value_t = 5000)]
    suspect_after_ms: u64,
    /// A chunkserver silent this long is down: its chunks are re-replicated elsewhere.
    #[arg(long, default_value_t = 15000)]
    down_after_ms: u64,
    /// A sealed chunk short of copies this long is repaired.
    #[arg(long, default_value_t = 3000)]
    repair_after_ms: u64,
    /// Microseconds between the Raft log's fsyncs at most: writes arriving within it of the last
    /// fsync share the next one (group commit under load; a lone write is not delayed).
    #[arg(long, env = "CAIRN_LOG_FLUSH_GAP_US", default_value_t = cairn_master::wal::DEFAULT_FLUSH_GAP.as_micros() as u64)]
    log_flush_gap_us: u64,
    /// Raft log entries between snapshots of the state (after one, the log before it is
    /// purged but for the last 1,000 entries).
    #[arg(long, default_value_t = 10_000)]
    snapshot_every: u64,
    /// Raft log entries kept below a snapshot: a master further behind than this is sent the
    /// snapshot (the state's tables, streamed) instead of the entries.
    #[arg(long, default_value_t = 1_000)]
    log_keep: u64,
    /// MiB of decoded records each table of the state keeps in memory, estimated (the state
    /// itself is in the master's store: docs/formats/master-state.md); more is faster, less is
    /// smaller.
    #[arg(long, env = "CAIRN_STATE_CACHE_MIB", default_value_t = cairn_master::kv::DEFAULT_CACHE_BYTES >> 20)]
    state_cache_mib: usize,
    /// MiB of the master's database pages kept in memory (redb's page cache).
    #[arg(long, env = "CAIRN_STORE_CACHE_MIB", default_value_t = cairn_master::store::DEFAULT_STORE_CACHE >> 20)]
    store_cache_mib: usize,
    /// MiB of the newest Raft log entries kept in memory (older ones are read from the log's
    /// files), in each partition.
    #[arg(long, env = "CAIRN_LOG_CACHE_MIB", default_value_t = cairn_master::wal::DEFAULT_CACHE_BYTES >> 20)]
    log_cache_mib: usize,
    /// A partition holding more files and directories than this splits on its own: the
    /// directory nearest half of it moves to a new partition (docs/partitions.md); 0: never.
    #[arg(long, env = "CAIRN_SPLIT_FILES", default_value_t = cairn_master::SplitPolicy::default().files)]
    split_files: u64,
    /// A partition taking more namespace calls a second than this (over --split-every-secs)
    /// splits on its own: the directory taking nearest half of them; 0: never.
    #[arg(long, env = "CAIRN_SPLIT_LOAD", default_value_t = cairn_master::SplitPolicy::default().load)]
    split_load: u64,
    /// How often the leader looks for partitions to split (and the window --split-load
    /// counts calls over).
    #[arg(long, default_value_t = cairn_master::SplitPolicy::default().every.as_secs())]
    split_every_secs: u64,
    /// Seconds between rounds of the file service's segment collection (docs/files.md
    /// "Segment collection"); 0: never.
    #[arg(long, default_value_t = cairn_master::SegmentCollection::default().every.as_secs_f64())]
    segment_collect_secs: f64,
    /// Seconds a segment is left alone after its last append, seal or lease renewal before
    /// it may be collected (also how long a file unlinked elsewhere stays readable where it
    /// is open).
    #[arg(long, default_value_t = cairn_master::SegmentCollection::default().grace.as_secs_f64())]
    segment_grace_secs: f64,
    /// A file holding the cluster secret (hex; `cairn up` makes DATA_DIR/cluster.secret):
    /// servers prove they hold it on every call between them, and every call is refused
    /// without a proof of a server or a user (docs/security.md). Required unless --insecure.
    #[arg(long, env = "CAIRN_CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<std::path::PathBuf>,
    /// A TLS directory (`cairn tls init`): serve TLS with its node.pem and node.key, and talk
    /// TLS to the other masters, checking them with its ca.pem.
    #[arg(long, env = "CAIRN_TLS_DIR")]
    tls_dir: Option<std::path::PathBuf>,
    /// Run without the cluster secret (one given is ignored): every call is served without
    /// asking who sends it. For experiments only (docs/security.md).
    #[arg(long)]
    insecure: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (port 0: any free port).
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Where the audit log goes (one JSON line per mutating call and per refusal, a file per
    /// day; docs/security.md "Audit"). Default: DATA_DIR/audit.
    #[arg(long)]
    audit_dir: Option<PathBuf>,
    /// Days of audit log kept.
    #[arg(long, default_value_t = 30)]
    audit_keep_days: usize,
    /// Write no audit log.
    #[arg(long)]
    no_audit: bool,
    #[command(flatten)]
    connections: crate::limits::ConnectionArgs,
}

/// The secret in `path`; none only when the server runs `--insecure`.
pub fn cluster_secret(
    path: Option<&std::path::Path>,
    insecure: bool,
) -> anyhow::Result<Option<cairn_rpc::auth::ClusterSecret>> {
    match (path, insecure) {
        (Some(p), false) => Ok(Some(cairn_rpc::auth::ClusterSecret::read(p)?)),
        (_, true) => {
            tracing::warn!(
                "running --insecure: anyone who reaches this server's port can do anything"
            );
            Ok(None)
        }
        (None, false) => anyhow::bail!(
            "no cluster secret: pass --cluster-secret-file (or CAIRN_CLUSTER_SECRET_FILE; `cairn up` \
             makes DATA_DIR/cluster.secret), or --insecure for an experiment without security"
        ),
    }
}

pub fn parse_peers(s: &str) -> anyhow::Result<BTreeMap<u64, String>> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (id, addr) = p
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("peer {p:?} is not ID=HOST:PORT"))?;
            Ok((id.trim().parse()?, addr.trim().to_owned()))
        })
        .collect()
}

pub fn run(a: MasterArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("cairn-master")
        .build()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(a.listen).await?;
        let addr = listener.local_addr()?.to_string();
        let advertise = a.advertise.clone().unwrap_or_else(|| addr.clone());
        let peers = match &a.peers {
            Some(p) => parse_peers(p)?,
            None => BTreeMap::from([(a.id, advertise.clone())]),
        };
        anyhow::ensure!(
            peers.contains_key(&a.id),
            "--peers must name this master (id {})",
            a.id
        );
        let opts = MasterOptions {
            id: a.id,
            data_dir: a.data_dir.clone(),
            advertise,
            peers,
            lease: Duration::from_secs(a.lease_secs),
            registry: RegistryOptions {
                orphan_grace: Duration::from_secs(a.orphan_grace_secs),
                suspect_after: Duration::from_millis(a.suspect_after_ms),
                down_after: Duration::from_millis(a.down_after_ms.max(a.suspect_after_ms)),
                repair_after: Duration::from_millis(a.repair_after_ms),
            },
            snapshot_every: a.snapshot_every.max(1),
            log_keep: a.log_keep,
            state_cache: a.state_cache_mib << 20,
            store_cache: a.store_cache_mib.max(1) << 20,
            log_cache: a.log_cache_mib.max(1) << 20,
            split: cairn_master::SplitPolicy {
                files: a.split_files,
                load: a.split_load,
                every: Duration::from_secs(a.split_every_secs.max(1)),
            },
            segments: cairn_master::SegmentCollection {
                every: Duration::try_from_secs_f64(a.segment_collect_secs)
                    .map_err(|e| anyhow::anyhow!("--segment-collect-secs: {e}"))?,
                grace: Duration::try_from_secs_f64(a.segment_grace_secs)
                    .map_err(|e| anyhow::anyhow!("--segment-grace-secs: {e}"))?,
            },
            log_flush_gap: Duration::from_micros(a.log_flush_gap_us),
            cluster_secret: cluster_secret(a.cluster_secret_file.as_deref(), a.insecure)?,
            tls_dir: a.tls_dir.clone(),
            audit: if a.no_audit {
                cairn_rpc::audit::Audit::off()
            } else {
                let dir = a
                    .audit_dir
                    .clone()
                    .unwrap_or_else(|| a.data_dir.join("audit"));
                cairn_rpc::audit::Audit::open(&dir, "master", a.audit_keep_days).map_err(|e| {
                    anyhow::anyhow!("cannot open the audit log in {}: {e}", dir.display())
                })?
            },
            connections: a
                .connections
                .apply(cairn_master::node::default_connection_limits()),
        };
        if let Some(m) = a.metrics_listen {
            crate::metrics::serve(m, "master").await?;
        }
        println!("listening on {addr}");
        use std::io::Write;
        std::io::stdout().flush()?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        serve(opts, listener, async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
    })
}
