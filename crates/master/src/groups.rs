//! The partitions a master hosts (docs/partitions.md): one Raft group each, with its own log
//! and state store in the partition's directory, all in this process.

use crate::network::{Incoming, Network};
use crate::node::MasterOptions;
use crate::state::partitions::{PartitionId, ROOT_PARTITION};
use crate::store::{Applied, Raft, StateMachine, open_db_with};
use crate::wal::{LogStore, OpenHandle};
use openraft::{Config, SnapshotPolicy};
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
    pub raft: Raft,
    pub sm: Arc<Mutex<Applied>>,
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
        let log = LogStore::open(&dir, &db, opts.log_flush_gap)?;
        let log_open = log.open_handle();
        let sm = StateMachine::open(db.clone(), &dir, opts.state_cache)?;
        let shared = sm.shared();
        let config = Config {
            cluster_name: format!("cairn-{id}"),
            heartbeat_interval: 100,
            election_timeout_min: 400,
            election_timeout_max: 800,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(opts.snapshot_every),
            max_in_snapshot_log_to_keep: opts.log_keep,
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
            raft,
            sm: shared,
            incoming: Incoming::new(crate::store::incoming_dir(&dir)),
            recovered,
            db,
            log: log_open,
        }))
    }

    pub fn recovered(&self) -> bool {
        self.recovered.load(Ordering::Acquire)
    }

    /// Stops the Raft node and waits (up to `until`) for its store and log to close: a
    /// restart in the same process must not find them still open (the log's directory lock
    /// would refuse it).
    pub async fn shutdown(self: Arc<Self>, until: Instant) {
        let _ = self.raft.shutdown().await;
        let (db, log) = (Arc::downgrade(&self.db), self.log.clone());
        // Nothing else holds the node or the store once it is shut down.
        drop(self);
        while (db.strong_count() > 0 || log.is_open()) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
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
