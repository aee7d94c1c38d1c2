//! Starting one master: storage, Raft, and the gRPC server for clients, chunkservers and peers.

use crate::groups::{Groups, Hosted};
use crate::network::RaftService;
use crate::registry::{Registry, RegistryOptions};
use crate::service::{Inner, MetaService};
use crate::state::partitions::ROOT_PARTITION;
use cairn_rpc::pb::{meta_server::MetaServer, raft_server::RaftServer};

/// The largest Raft message a master takes (tonic's default is 4 MiB).
const RAFT_MESSAGE_BYTES: usize = 64 << 20;
use openraft::BasicNode;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How a master runs.
#[derive(Debug, Clone)]
pub struct MasterOptions {
    /// This master's id in the group (≥ 1).
    pub id: u64,
    pub data_dir: PathBuf,
    /// Address the others reach this master at (clients, chunkservers, peers).
    pub advertise: String,
    /// The group's masters at bootstrap (id → address), this one included. The master with the
    /// lowest id initializes a new group; later starts ignore this (membership is in the log).
    pub peers: BTreeMap<u64, String>,
    /// How long a writer's lease lasts without renewal.
    pub lease: Duration,
    pub registry: RegistryOptions,
    /// Log entries between snapshots.
    pub snapshot_every: u64,
    /// Log entries kept below a snapshot: a follower further behind receives the snapshot.
    pub log_keep: u64,
    /// Bytes of clean records each table of the state keeps decoded in memory, estimated
    /// (the state itself is in the store's tables: docs/formats/master-state.md).
    pub state_cache: usize,
    /// Bytes of the store's pages (`master.redb`) kept in memory.
    pub store_cache: usize,
    /// Bytes of the newest Raft log entries kept in memory.
    pub log_cache: usize,
    /// The Raft log starts at most one fsync per this gap: writes arriving within it of the
    /// last fsync share the next one (group commit under load; a lone write is not delayed).
    pub log_flush_gap: Duration,
    /// The cluster secret: chunkservers' and peer masters' calls must prove they hold it
    /// (cairn_rpc::auth); `None` accepts any (tests, single-user setups).
    pub cluster_secret: Option<cairn_rpc::auth::ClusterSecret>,
    /// A TLS directory (cairn_rpc::tls): serve TLS with its certificate, and talk TLS to the
    /// other masters checking them with its CA. `None`: plain TCP.
    pub tls_dir: Option<PathBuf>,
    /// Where accepted mutating calls and refusals are recorded (docs/security.md "Audit").
    pub audit: cairn_rpc::audit::Audit,
    /// Connection slots (docs/security.md "Resource limits"): a connection is proven by its
    /// first call whose proof checks.
    pub connections: cairn_rpc::admission::Limits,
    /// When partitions split on their own (docs/partitions.md "Automatic splits").
    pub split: crate::SplitPolicy,
    /// When the file service's segments are collected (docs/files.md).
    pub segments: crate::SegmentCollection,
}

/// The masters' connection limits by default: a first call may carry the largest body
/// (`cairn_rpc::auth::MAX_BODY`) before its proof is checked, hence the byte budget.
pub fn default_connection_limits() -> cairn_rpc::admission::Limits {
    cairn_rpc::admission::Limits {
        max_unproven: 256,
        max_unproven_per_peer: 32,
        max_unproven_bytes: 6 << 20,
        ..Default::default()
    }
}

/// The metric names of the masters' connection slots.
const CONNECTION_METRICS: cairn_rpc::admission::Names = cairn_rpc::admission::Names {
    open: "cairn_master_connections",
    unproven: "cairn_master_connections_unproven",
    refused: "cairn_master_connections_refused_total",
};

impl MasterOptions {
    pub fn single(data_dir: PathBuf, advertise: String) -> Self {
        Self {
            id: 1,
            data_dir,
            peers: BTreeMap::from([(1, advertise.clone())]),
            advertise,
            lease: Duration::from_secs(20),
            registry: RegistryOptions::default(),
            snapshot_every: 10_000,
            log_keep: 1_000,
            state_cache: crate::kv::DEFAULT_CACHE_BYTES,
            store_cache: crate::store::DEFAULT_STORE_CACHE,
            log_cache: crate::wal::DEFAULT_CACHE_BYTES,
            log_flush_gap: crate::wal::DEFAULT_FLUSH_GAP,
            cluster_secret: None,
            tls_dir: None,
            audit: cairn_rpc::audit::Audit::off(),
            connections: default_connection_limits(),
            split: crate::SplitPolicy::default(),
            segments: crate::SegmentCollection::default(),
        }
    }
}

/// Runs a master on `listener` until `shutdown` completes.
///
/// # Errors
/// The database does not open, Raft does not start, or the server fails.
pub async fn serve(
    opts: MasterOptions,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if opts.id == 0 {
        return Err("master id must be at least 1".into());
    }
    std::fs::create_dir_all(&opts.data_dir)?;
    cairn_rpc::private::close_data_dir(&opts.data_dir);
    let tls = match &opts.tls_dir {
        Some(d) => Some((
            cairn_rpc::tls::server_config(d)?,
            cairn_rpc::tls::client_config(d)?,
        )),
        None => None,
    };
    let groups = Arc::new(Groups::default());
    let root = Hosted::open(&opts, ROOT_PARTITION, tls.as_ref().map(|t| t.1.clone())).await?;
    groups.insert(root.clone());
    let raft = root.raft.clone();
    if !raft.is_initialized().await? && opts.peers.keys().next() == Some(&opts.id) {
        let members: BTreeMap<u64, BasicNode> = opts
            .peers
            .iter()
            .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
            .collect();
        tracing::info!(?members, "initializing a new master group");
        raft.initialize(members).await?;
    }
    let auth = Arc::new(cairn_rpc::auth::Verifier::new(opts.cluster_secret.clone()));
    let meta = MetaService::new(Inner {
        id: opts.id,
        raft: raft.clone(),
        sm: root.sm.clone(),
        groups: groups.clone(),
        hosting: Default::default(),
        moving: Default::default(),
        renaming: Default::default(),
        deleting_buckets: Default::default(),
        tls: tls.as_ref().map(|t| t.1.clone()),
        opts: opts.clone(),
        registry: parking_lot::Mutex::new(Registry::new(opts.registry.clone())),
        lease: opts.lease,
        recovered: root.recovered.clone(),
        auth: auth.clone(),
        led_term: std::sync::atomic::AtomicU64::new(0),
        sealed_term: std::sync::atomic::AtomicU64::new(0),
        sealer: opts
            .cluster_secret
            .as_ref()
            .map(cairn_rpc::seal::Sealer::new),
        audit: opts.audit.clone(),
        refusals: Default::default(),
        auto_split: Default::default(),
        segments: Default::default(),
    });
    let scanner = {
        let meta = meta.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                meta.host_partitions().await;
                meta.resume_move();
                meta.auto_split();
                meta.resume_renames();
                meta.collect_segments();
                meta.resume_bucket_deletes().await;
                meta.scan_repairs();
                meta.scan_conversions().await;
                meta.export_metrics();
            }
        })
    };
    let trimmer = crate::heap::spawn_trimmer(crate::heap::TRIM_EVERY);
    // Strangers get a small pool of slots and a short time (cairn_rpc::admission).
    let incoming = cairn_rpc::admission::incoming(
        listener,
        cairn_rpc::admission::Admission::new(opts.connections.clone(), CONNECTION_METRICS),
    );
    let mut builder = tonic::transport::Server::builder();
    if let Some((server_tls, _)) = tls {
        builder = builder.tls_config(server_tls)?;
    }
    // Every call's body is read and digested first: proofs sign it (cairn_rpc::auth).
    let result = builder
        .layer(cairn_rpc::auth::DigestLayer)
        .add_service(MetaServer::new(meta))
        .add_service(
            // Entries of a lagging follower's catch-up travel together (up to openraft's 300
            // per message): room for many full ones (a subtree's rows, moves.rs).
            RaftServer::new(RaftService {
                groups: groups.clone(),
                auth,
                refusals: Default::default(),
            })
            .max_decoding_message_size(RAFT_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    scanner.abort();
    let _ = scanner.await;
    trimmer.abort();
    drop((raft, root));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    for g in groups.take_all() {
        g.shutdown(deadline).await;
    }
    result?;
    Ok(())
}
