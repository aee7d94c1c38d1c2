//! openraft's state machine and its snapshots, in one redb database per master (`master.redb`);
//! the log and the vote are in [`crate::wal`].
//!
//! Table `snapshot` (values JSON, so `cairn` tools and people can read them): `meta` → snapshot
//! meta, `data` → the serialized [`State`].
//!
//! The state machine lives in memory. On start it is loaded from the last snapshot; the log
//! after it is re-applied once this master learns the commit index (as leader: when its first
//! entry of the new term commits). The commit index is not stored: that would cost a redb
//! transaction per applied batch (measured: the master's CPU is mostly redb commits).
//!
//! With [`crate::MasterOptions::state_tables`] the state lives in the database's tables
//! instead (docs/formats/master-state.md): each applied batch is one transaction that also
//! records the last applied log id (table `applied`), committed without fsync; building a
//! snapshot commits durably first, so the state on disk is never behind a snapshot whose log
//! openraft purges. After a crash the database opens at its last durable commit and the log
//! after it is applied again. The first start with tables writes the last JSON snapshot's
//! state into them in one transaction (a crash before it commits leaves the JSON snapshot to
//! read again). Snapshots sent to other masters are still the JSON of the whole state.

use crate::kv::Store;
use crate::state::{Command, Response, State};
use futures::TryStreamExt;
use openraft::storage::EntryResponder;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::type_config::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::{EntryPayload, OptionalSend};
use parking_lot::Mutex;
use redb::{Database, Durability, ReadableDatabase, TableDefinition};
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::io;
use std::path::Path;
use std::sync::Arc;

openraft::declare_raft_types!(
    /// Cairn's Raft types: masters are numbered u64s reached at a `BasicNode` address.
    pub TypeConfig:
        D = Command,
        R = Response,
);

pub type Raft = openraft::Raft<TypeConfig, StateMachine>;

const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshot");
/// With the state in tables: `last` → JSON of ([`Applied::last_applied`], membership), written
/// in the transaction of every applied batch.
const APPLIED: TableDefinition<&str, &[u8]> = TableDefinition::new("applied");

type Position = (Option<LogIdOf<TypeConfig>>, StoredMembershipOf<TypeConfig>);

fn put_position(tx: &redb::WriteTransaction, a: &Applied) -> io::Result<()> {
    let bytes = serde_json::to_vec(&(a.last_applied, &a.membership)).map_err(io_err)?;
    tx.open_table(APPLIED)
        .map_err(io_err)?
        .insert("last", bytes.as_slice())
        .map_err(io_err)?;
    Ok(())
}

/// Commits a batch's changes: without fsync (the log holds them durably), or durably.
fn commit_batch(store: &Store, a: &mut Applied, durability: Durability) -> io::Result<()> {
    let mut tx = store.db().begin_write().map_err(io_err)?;
    tx.set_durability(durability).map_err(io_err)?;
    a.state.flush(&tx).map_err(io_err)?;
    put_position(&tx, a)?;
    tx.commit().map_err(io_err)?;
    store.committed();
    Ok(())
}

pub(crate) fn io_err(e: impl std::error::Error + Send + Sync + 'static) -> io::Error {
    io::Error::other(e)
}

/// Opens (creating) the master's database.
pub fn open_db(path: &Path) -> io::Result<Arc<Database>> {
    let db = Database::create(path).map_err(io_err)?;
    let tx = db.begin_write().map_err(io_err)?;
    tx.open_table(SNAPSHOT).map_err(io_err)?;
    tx.open_table(APPLIED).map_err(io_err)?;
    tx.commit().map_err(io_err)?;
    Ok(Arc::new(db))
}

fn get_json<T: for<'a> Deserialize<'a>>(
    db: &Database,
    table: TableDefinition<&str, &[u8]>,
    key: &str,
) -> io::Result<Option<T>> {
    let tx = db.begin_read().map_err(io_err)?;
    let t = tx.open_table(table).map_err(io_err)?;
    match t.get(key).map_err(io_err)? {
        Some(v) => Ok(Some(serde_json::from_slice(v.value()).map_err(io_err)?)),
        None => Ok(None),
    }
}

fn put_json<T: Serialize>(
    db: &Database,
    table: TableDefinition<&str, &[u8]>,
    key: &str,
    value: &T,
) -> io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(io_err)?;
    let mut tx = db.begin_write().map_err(io_err)?;
    tx.set_durability(Durability::Immediate).map_err(io_err)?;
    tx.open_table(table)
        .map_err(io_err)?
        .insert(key, bytes.as_slice())
        .map_err(io_err)?;
    tx.commit().map_err(io_err)
}

/// Runs blocking redb work off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(e.to_string()))?
}

/// What the state machine holds besides [`State`].
#[derive(Default, Clone, Serialize, Deserialize)]
pub struct Applied {
    pub last_applied: Option<LogIdOf<TypeConfig>>,
    pub membership: StoredMembershipOf<TypeConfig>,
    pub state: State,
}

/// The state machine: [`State`] in memory, shared with the gRPC service for reads.
#[derive(Clone)]
pub struct StateMachine {
    db: Arc<Database>,
    pub(crate) inner: Arc<Mutex<Applied>>,
    /// The state lives in the store's tables, each keeping this many records cached.
    tables: Option<(Arc<Store>, usize)>,
}

impl StateMachine {
    /// Loads the last snapshot (or an empty state); with `tables` (a cache size), opens the
    /// state kept in the database's tables, writing the last snapshot's into them first if
    /// they hold none.
    pub fn open(db: Arc<Database>, tables: Option<usize>) -> io::Result<Self> {
        let position = get_json::<Position>(&db, APPLIED, "last")?;
        let Some(cache) = tables else {
            if position.is_some() {
                return Err(io::Error::other(
                    "this master's state is in its store's tables (state tables); \
                     start it with them",
                ));
            }
            let mut applied = get_json::<Applied>(&db, SNAPSHOT, "data")?.unwrap_or_default();
            applied.state.rebuild();
            return Ok(Self {
                db,
                inner: Arc::new(Mutex::new(applied)),
                tables: None,
            });
        };
        let store = Store::new(db.clone());
        let applied = match (position, State::open(&store, cache).map_err(io_err)?) {
            (Some((last_applied, membership)), Some(state)) => Applied {
                last_applied,
                membership,
                state,
            },
            _ => {
                let mut applied = get_json::<Applied>(&db, SNAPSHOT, "data")?.unwrap_or_default();
                applied.state.rebuild();
                let mut tx = db.begin_write().map_err(io_err)?;
                tx.set_durability(Durability::Immediate).map_err(io_err)?;
                applied
                    .state
                    .write_out(&store, &tx, cache)
                    .map_err(io_err)?;
                put_position(&tx, &applied)?;
                tx.commit().map_err(io_err)?;
                store.committed();
                tracing::info!(
                    last_applied = ?applied.last_applied,
                    "master state written into the store's tables"
                );
                applied
            }
        };
        Ok(Self {
            db,
            inner: Arc::new(Mutex::new(applied)),
            tables: Some((store, cache)),
        })
    }

    pub fn shared(&self) -> Arc<Mutex<Applied>> {
        self.inner.clone()
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<TypeConfig, Vec<u8>>, io::Error> {
        let applied = {
            let mut a = self.inner.lock();
            if let Some((store, _)) = &self.tables {
                // Durable up to the snapshot before openraft purges the log below it.
                commit_batch(store, &mut a, Durability::Immediate)?;
            }
            a.clone()
        };
        let db = self.db.clone();
        blocking(move || {
            let data = serde_json::to_vec(&applied).map_err(io_err)?;
            let meta = SnapshotMetaOf::<TypeConfig> {
                last_log_id: applied.last_applied,
                last_membership: applied.membership.clone(),
            };
            put_json(&db, SNAPSHOT, "meta", &meta)?;
            put_json(&db, SNAPSHOT, "data", &applied)?;
            Ok(SnapshotOf::<TypeConfig, Vec<u8>> {
                meta,
                snapshot: data,
            })
        })
        .await
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogIdOf<TypeConfig>>, StoredMembershipOf<TypeConfig>), io::Error> {
        let a = self.inner.lock();
        Ok((a.last_applied, a.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: futures::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>>
            + Unpin
            + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let response = {
                let mut a = self.inner.lock();
                a.last_applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Blank => Ok(Default::default()),
                    EntryPayload::Normal(ref cmd) => a.state.apply(cmd),
                    EntryPayload::Membership(ref m) => {
                        a.membership =
                            StoredMembershipOf::<TypeConfig>::new(Some(entry.log_id), m.clone());
                        Ok(Default::default())
                    }
                }
            };
            if let Some(r) = responder {
                r.send(response);
            }
        }
        if let Some((store, _)) = &self.tables {
            commit_batch(store, &mut self.inner.lock(), Durability::None)?;
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        snapshot: Vec<u8>,
    ) -> Result<(), io::Error> {
        let mut applied: Applied = serde_json::from_slice(&snapshot).map_err(io_err)?;
        applied.state.rebuild();
        let (db, meta2, a2) = (self.db.clone(), meta.clone(), applied.clone());
        blocking(move || {
            put_json(&db, SNAPSHOT, "meta", &meta2)?;
            put_json(&db, SNAPSHOT, "data", &a2)
        })
        .await?;
        let mut inner = self.inner.lock();
        if let Some((store, cache)) = &self.tables {
            let mut tx = self.db.begin_write().map_err(io_err)?;
            tx.set_durability(Durability::Immediate).map_err(io_err)?;
            applied
                .state
                .write_out(store, &tx, *cache)
                .map_err(io_err)?;
            put_position(&tx, &applied)?;
            tx.commit().map_err(io_err)?;
            store.committed();
        }
        *inner = applied;
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, Vec<u8>>>, io::Error> {
        let Some(meta) = get_json::<SnapshotMetaOf<TypeConfig>>(&self.db, SNAPSHOT, "meta")? else {
            return Ok(None);
        };
        let tx = self.db.begin_read().map_err(io_err)?;
        let t = tx.open_table(SNAPSHOT).map_err(io_err)?;
        let data = t
            .get("data")
            .map_err(io_err)?
            .map(|v| v.value().to_vec())
            .unwrap_or_default();
        Ok(Some(SnapshotOf::<TypeConfig, Vec<u8>> {
            meta,
            snapshot: data,
        }))
    }
}
