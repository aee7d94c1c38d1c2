//! The partitions a master hosts (docs/partitions.md): one Raft group each, with its own log
//! and state store in the partition's directory, all in this process.

use crate::network::{Incoming, Network};
use crate::node::MasterOptions;
use crate::state::partitions::{PartitionId, ROOT_PARTITION};
use crate::state::{Command, Reply};
use crate::store::{Applied, Raft, StateMachine, open_db_with};
use crate::wal::{LogStore, OpenHandle};
use cairn_rpc::{ErrorKind, MetaError};
use openraft::async_runtime::WatchReceiver;
use openraft::{Config, ReadPolicy, SnapshotPolicy};
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Where partition `id` keeps its files: the root in the data directory itself (where every
/// master before partitions kept them), partition N in `partitions/N/`.
pub fn dir(data_dir: &Path, id: PartitionId) -> PathBuf {
    if id == ROOT_PARTITION {
        data_dir.to_path_buf()
    } else {
        data_dir.join("partitions").join(id.to_string())
    }
}

/// One partition's Raft node on this master.
pub struct Hosted {
    pub id: PartitionId,
    /// This master's id in the group.
    node_id: u64,
    pub raft: Raft,
    pub sm: Arc<Mutex<Applied>>,
    /// The state machine itself (its store), for digests.
    pub machine: StateMachine,
    /// The snapshot being received for it.
    pub incoming: Incoming,
    /// Its state caught up with what this master applied before it last stopped (the
    /// committed index is not persisted: node.rs).
    pub recovered: Arc<AtomicBool>,
    db: Arc<redb::Database>,
    log: OpenHandle,
}

impl Hosted {
    /// Opens partition `id`'s log and state in its directory and starts its Raft node.
    ///
    /// # Errors
    /// The store or the log does not open, or Raft does not start.
    pub async fn open(
        opts: &MasterOptions,
        id: PartitionId,
        tls: Option<cairn_rpc::tls::ClientTlsConfig>,
    ) -> Result<Arc<Self>, Box<dyn std::error::Error + Send + Sync>> {
        let dir = dir(&opts.data_dir, id);
        std::fs::create_dir_all(&dir)?;
        let db = open_db_with(&dir.join("master.redb"), opts.store_cache)?;
        let log = LogStore::open_with(&dir, &db, opts.log_flush_gap, opts.log_cache)?;
        let log_open = log.open_handle();
        let sm = StateMachine::open(db.clone(), &dir, opts.state_cache)?;
        let shared = sm.shared();
        let machine = sm.clone();
        let config = Config {
            cluster_name: format!("cairn-{id}"),
            heartbeat_interval: 100,
            election_timeout_min: 400,
            election_timeout_max: 800,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(opts.snapshot_every),
            max_in_snapshot_log_to_keep: opts.log_keep,
            // A leader restarted before a follower stood for election would otherwise lead
            // again in its old term without one (openraft's default). Its log flushes after
            // the followers' (the flusher batches), so a SIGKILL can take entries that the
            // followers hold and that were committed on their acks; leading again, it gives
            // its next entries the same log ids, which followers take for the ones they
            // hold: the copies diverge and a committed write can be lost (the long nemesis,
            // seed 53: RELIABILITY.md). An election makes a follower with the longer log
            // win, as Raft requires.
            enable_leader_restore: Some(false),
            ..Default::default()
        }
        .validate()?;
        let network = Network {
            id: opts.id,
            group: id,
            secret: opts.cluster_secret.clone(),
            tls,
        };
        let raft: Raft = Raft::new(opts.id, Arc::new(config), network, log, sm).await?;
        // The state machine is rebuilt from the last snapshot on start, and the committed log
        // id is not persisted: until the cluster's commit covers this master's log and it is
        // applied, the state may be older than what this master served before it stopped
        // (openraft `save_committed` docs). Calls wait for that (they answer unavailable).
        let recovered = Arc::new(AtomicBool::new(false));
        {
            let (raft, recovered) = (raft.clone(), recovered.clone());
            tokio::spawn(async move {
                match raft.wait_for_recovery(None).await {
                    Ok(_) => recovered.store(true, Ordering::Release),
                    Err(e) => tracing::error!(partition = id, error = %e,
                        "state machine recovery wait failed"),
                }
            });
        }
        Ok(Arc::new(Self {
            id,
            node_id: opts.id,
            raft,
            sm: shared,
            machine,
            incoming: Incoming::new(crate::store::incoming_dir(&dir)),
            recovered,
            db,
            log: log_open,
        }))
    }

    pub fn recovered(&self) -> bool {
        self.recovered.load(Ordering::Acquire)
    }

    /// The term in which this master leads the partition; otherwise where its leader is.
    ///
    /// # Errors
    /// `Unavailable` while recovering; `NotLeader` naming the partition's leader.
    pub fn leader_check(&self) -> Result<u64, MetaError> {
        if !self.recovered() {
            return Err(MetaError::new(
                ErrorKind::Unavailable,
                format!("partition {} is still recovering its state", self.id),
            ));
        }
        let m = self.raft.metrics().borrow_watched().clone();
        if m.current_leader == Some(self.raft_id()) {
            return Ok(m.current_term);
        }
        Err(not_leader(&m))
    }

    /// A linearizable read point in the partition (as the root's: a lease read).
    ///
    /// # Errors
    /// As [`Hosted::leader_check`].
    pub async fn read_barrier(&self) -> Result<u64, MetaError> {
        let term = self.leader_check()?;
        lease_read(&self.raft).await?;
        Ok(term)
    }

    /// Proposes `cmd` to the partition's group and waits until it is applied here.
    ///
    /// # Errors
    /// What applying it answered; `NotLeader` or `Unavailable` when it was not committed.
    pub async fn write(&self, cmd: Command) -> Result<Reply, MetaError> {
        write(&self.raft, cmd).await
    }

    fn raft_id(&self) -> u64 {
        self.node_id
    }

    /// Stops the Raft node and waits (up to `until`) for its store and log to close: a
    /// restart in the same process must not find them still open (the log's directory lock
    /// would refuse it).
    pub async fn shutdown(self: Arc<Self>, until: Instant) {
        let _ = self.raft.shutdown().await;
        if let Err(e) = self.machine.commit_all() {
            // Nothing is lost: the next start applies the log's tail again.
            tracing::warn!(partition = self.id, "commit at stop: {e}");
        }
        let (db, log) = (Arc::downgrade(&self.db), self.log.clone());
        // Nothing else holds the node or the store once it is shut down.
        drop(self);
        while (db.strong_count() > 0 || log.is_open()) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// `NotLeader`, naming the group's leader as `m` knows it (if it does).
pub fn not_leader(m: &openraft::RaftMetrics<crate::store::TypeConfig>) -> MetaError {
    let addr = m.current_leader.and_then(|l| {
        m.membership_config
            .membership()
            .get_node(&l)
            .map(|n| n.addr.clone())
    });
    MetaError::not_leader(addr)
}

/// Waits until `raft`'s state machine has applied everything committed before now, while this
/// master leads (openraft's lease read).
///
/// # Errors
/// `NotLeader` naming the leader, or `Unavailable`.
pub async fn lease_read(raft: &Raft) -> Result<(), MetaError> {
    raft.ensure_linearizable(ReadPolicy::LeaseRead)
        .await
        .map(|_| ())
        .map_err(|e| match e.forward_to_leader() {
            Some(f) => MetaError::not_leader(f.leader_node.as_ref().map(|n| n.addr.clone())),
            None => MetaError::new(ErrorKind::Unavailable, e.to_string()),
        })
}

/// Proposes `cmd` to `raft`'s group and waits until it is applied here.
///
/// # Errors
/// What applying it answered; `NotLeader` or `Unavailable` when it was not committed.
pub async fn write(raft: &Raft, cmd: Command) -> Result<Reply, MetaError> {
    let started = Instant::now();
    let r = raft.client_write(cmd).await;
    metrics::histogram!("cairn_master_raft_write_seconds").record(started.elapsed());
    match r {
        Ok(r) => r.data,
        Err(e) => Err(match e.forward_to_leader() {
            Some(f) => MetaError::not_leader(f.leader_node.as_ref().map(|n| n.addr.clone())),
            None => MetaError::new(ErrorKind::Unavailable, e.to_string()),
        }),
    }
}

/// The partitions this master hosts, by number.
#[derive(Default)]
pub struct Groups {
    map: RwLock<BTreeMap<PartitionId, Arc<Hosted>>>,
}

impl Groups {
    pub fn get(&self, id: PartitionId) -> Option<Arc<Hosted>> {
        self.map.read().get(&id).cloned()
    }

    pub fn insert(&self, h: Arc<Hosted>) {
        self.map.write().insert(h.id, h);
    }

    /// Every hosted partition, the root first.
    pub fn all(&self) -> Vec<Arc<Hosted>> {
        self.map.read().values().cloned().collect()
    }

    /// Removes every partition (for shutting them down).
    pub fn take_all(&self) -> Vec<Arc<Hosted>> {
        std::mem::take(&mut *self.map.write())
            .into_values()
            .collect()
    }
}
