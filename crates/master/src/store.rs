//! openraft's state machine and its snapshots, in one redb database per master (`master.redb`)
//! and the directory `snapshots/`; the log and the vote are in [`crate::wal`].
//!
//! The state lives in the database's tables (docs/formats/master-state.md), of which the
//! master keeps a batch's changes and bounded caches in memory. Each applied batch is one
//! transaction that also records the last applied log id (table `applied`), committed
//! without fsync: the Raft log is the durable copy, and after a crash the database opens at
//! its last durable commit and the log after it is applied again. Restart opens the tables
//! and replays only that log: its time does not grow with the state.
//!
//! A snapshot is the tables themselves. Building one (openraft asks every
//! `--snapshot-every` entries, before it purges the log below) is a durable commit of the
//! state; table `snapshot` records its meta (`current` → JSON of [`Current`]). Nothing is
//! copied: the data directory holds the state once. Only when a master needs the state (it
//! is new, or so far behind that its log is gone) does the leader stream the tables' rows
//! from one read transaction into the chunks it sends ([`crate::snapshot`],
//! [`SnapshotData::Tables`]); openraft takes that snapshot's meta from what it sends, which
//! is the state at the moment it was asked for.
//!
//! The receiving master keeps the rows as a file while it installs them: it checks the whole
//! file, names it current and drops the applied position in one durable transaction, streams
//! the rows into the tables and writes the position (and forgets the file) in the last: a
//! crash in between leaves no position, so the next start begins from an empty state and
//! openraft installs the named file again. The file is deleted once installed.
//!
//! Masters that kept their state in memory wrote it into `snapshot` as JSON (`meta`, `data`);
//! the first start moves it into the tables in one transaction (a crash before it commits
//! leaves the JSON to read again), then records that state as the current snapshot and drops
//! the JSON. Masters that wrote snapshot files of every build (before the tables were the
//! snapshot) keep none: the first start forgets the file.

use crate::kv::Store;
use crate::snapshot;
use crate::state::{Command, Response, State};
use futures::TryStreamExt;
use openraft::storage::EntryResponder;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::type_config::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::{EntryPayload, OptionalSend};
use parking_lot::Mutex;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

openraft::declare_raft_types!(
    /// Cairn's Raft types: masters are numbered u64s reached at a `BasicNode` address.
    pub TypeConfig:
        D = Command,
        R = Response,
);

pub type Raft = openraft::Raft<TypeConfig, StateMachine>;

/// `current` → JSON of [`Current`]; before snapshot files, `meta` and `data` (JSON of
/// [`Applied`]).
const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshot");
/// `last` → JSON of ([`Applied::last_applied`], membership), written in every commit of the
/// tables ([`commit_batch`]); absent while a snapshot is being installed.
const APPLIED: TableDefinition<&str, &[u8]> = TableDefinition::new("applied");

type Position = (Option<LogIdOf<TypeConfig>>, StoredMembershipOf<TypeConfig>);

/// The current snapshot: its meta, and while it is being installed, its file in the snapshot
/// directory (none when the tables hold it).
#[derive(Serialize, Deserialize)]
struct Current {
    meta: SnapshotMetaOf<TypeConfig>,
    #[serde(default)]
    file: Option<String>,
}

/// A snapshot's file, open (its bytes stay readable while a newer snapshot replaces it).
#[derive(Debug)]
pub struct SnapshotFile {
    pub path: PathBuf,
    pub file: File,
}

/// A snapshot's rows: the tables as a read transaction sees them (what the leader sends), or
/// a file (received, or being installed).
pub enum SnapshotData {
    Tables(Arc<redb::ReadTransaction>),
    File(SnapshotFile),
}

impl Debug for SnapshotData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tables(_) => f.write_str("SnapshotData::Tables"),
            Self::File(file) => write!(f, "SnapshotData::File({})", file.path.display()),
        }
    }
}

impl SnapshotFile {
    pub fn open(path: PathBuf) -> io::Result<Self> {
        let file = File::open(&path)?;
        Ok(Self { path, file })
    }
}

/// The file name of the snapshot with `meta` (from its last log id: the same id, the same
/// rows).
pub fn snapshot_name(meta: &SnapshotMetaOf<TypeConfig>) -> String {
    let id = match &meta.last_log_id {
        Some(l) => l.to_string(),
        None => "empty".to_owned(),
    };
    let id: String = id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("{id}.snap")
}

/// Names the snapshot with `meta` current (with `file` while it is being installed: its
/// [`snapshot_name`]) and drops the JSON snapshot of older masters.
fn put_current(
    t: &mut redb::Table<&str, &[u8]>,
    meta: &SnapshotMetaOf<TypeConfig>,
    file: bool,
) -> io::Result<()> {
    let current = Current {
        meta: meta.clone(),
        file: file.then(|| snapshot_name(meta)),
    };
    let bytes = serde_json::to_vec(&current).map_err(io_err)?;
    t.insert("current", bytes.as_slice()).map_err(io_err)?;
    t.remove("meta").map_err(io_err)?;
    t.remove("data").map_err(io_err)?;
    Ok(())
}

fn put_position(tx: &redb::WriteTransaction, p: &Position) -> Result<(), redb::Error> {
    let bytes = serde_json::to_vec(p).map_err(|e| redb::Error::Corrupted(e.to_string()))?;
    tx.open_table(APPLIED)?.insert("last", bytes.as_slice())?;
    Ok(())
}

fn position(a: &Applied) -> Position {
    (a.last_applied, a.membership.clone())
}

/// Commits a batch's changes: without fsync (the log holds them durably), or durably.
pub(crate) fn commit_batch(
    store: &Store,
    a: &mut Applied,
    durability: Durability,
) -> io::Result<()> {
    let mut tx = store.db().begin_write().map_err(io_err)?;
    tx.set_durability(durability).map_err(io_err)?;
    a.state.flush(&tx).map_err(io_err)?;
    put_position(&tx, &position(a)).map_err(io_err)?;
    tx.commit().map_err(io_err)?;
    store.committed();
    a.uncommitted = 0;
    Ok(())
}

/// Ends an applied batch: commits (without fsync) once `every` entries wait uncommitted.
pub(crate) fn end_batch(store: &Store, a: &mut Applied, every: u64) -> io::Result<()> {
    if a.uncommitted >= every {
        commit_batch(store, a, Durability::None)?;
    }
    Ok(())
}

pub(crate) fn io_err(e: impl std::error::Error + Send + Sync + 'static) -> io::Error {
    io::Error::other(e)
}

/// Bytes of database pages redb keeps cached by default (its own default is 1 GiB, which a
/// master filled with the pages it wrote: measured 1.6 KiB of RSS per S3 object). The decoded
/// records' caches sit in front of it and the kernel's page cache behind it: 16 MiB created
/// files as fast as 64 did and kept 40 MiB less resident (BENCHMARKS.md "Where a master's
/// memory goes").
pub const DEFAULT_STORE_CACHE: usize = 16 << 20;

/// Opens (creating) the master's database with the default page cache.
pub fn open_db(path: &Path) -> io::Result<Arc<Database>> {
    open_db_with(path, DEFAULT_STORE_CACHE)
}

/// Opens (creating) the master's database, caching up to `cache` bytes of its pages.
pub fn open_db_with(path: &Path, cache: usize) -> io::Result<Arc<Database>> {
    let db = Database::builder()
        .set_cache_size(cache)
        .create(path)
        .map_err(io_err)?;
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

/// Runs blocking redb and file work off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(e.to_string()))?
}

/// What the state machine holds besides [`State`].
#[derive(Default, Serialize, Deserialize)]
pub struct Applied {
    pub last_applied: Option<LogIdOf<TypeConfig>>,
    pub membership: StoredMembershipOf<TypeConfig>,
    pub state: State,
    /// Log entries applied since the last commit of the store (their changes are in the
    /// tables' overlays, where reads see them): see [`COMMIT_EVERY`].
    #[serde(skip)]
    pub uncommitted: u64,
}

/// Log entries the state machine applies before it commits them to the store (without
/// fsync). A commit costs ~60 µs of CPU whatever it holds (`cairn bench master-state --files
/// 200000 --commit-every 1` against 64: 80–125 against 13–22 µs a command), and a serial
/// workload — tar, `rm -rf` — hands the state machine one entry at a time. Until the commit
/// the changes wait in the tables' overlays, where every read sees them; nothing is less
/// durable for it, since a commit without fsync does not survive a crash either (the log
/// does, and a restart applies it again from the last durable commit: a snapshot's). Reads
/// of the store itself (a snapshot, a digest) commit first.
pub const COMMIT_EVERY: u64 = 64;

/// The state machine: [`State`] in the store's tables, shared with the gRPC service for
/// reads.
#[derive(Clone)]
pub struct StateMachine {
    db: Arc<Database>,
    pub(crate) store: Arc<Store>,
    /// Clean records each table keeps decoded.
    cache: usize,
    /// Where snapshot files are.
    dir: PathBuf,
    pub(crate) inner: Arc<Mutex<Applied>>,
}

/// The directory of a master's snapshot files, under its data directory.
pub fn snapshot_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("snapshots")
}

/// Where snapshots being received are written, under a master's data directory.
pub fn incoming_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("snapshots-incoming")
}

impl StateMachine {
    /// Opens the state kept in the database's tables (`cache`: records each keeps decoded)
    /// with its snapshots in `data_dir`; moves a state kept as JSON (masters before the
    /// tables) into them first.
    pub fn open(db: Arc<Database>, data_dir: &Path, cache: usize) -> io::Result<Self> {
        let dir = snapshot_dir(data_dir);
        std::fs::create_dir_all(&dir)?;
        std::fs::create_dir_all(incoming_dir(data_dir))?;
        snapshot::remove_others(&incoming_dir(data_dir), None)?;
        let store = Store::new(db.clone());
        if get_json::<Position>(&db, APPLIED, "last")?.is_none() {
            // A new master, one that kept its state in memory, or one stopped while
            // installing a snapshot (openraft installs the current one again).
            let mut applied = get_json::<Applied>(&db, SNAPSHOT, "data")?.unwrap_or_default();
            applied.state.rebuild();
            let mut tx = db.begin_write().map_err(io_err)?;
            tx.set_durability(Durability::Immediate).map_err(io_err)?;
            applied
                .state
                .write_out(&store, &tx, cache)
                .map_err(io_err)?;
            put_position(&tx, &position(&applied)).map_err(io_err)?;
            tx.commit().map_err(io_err)?;
            store.committed();
            tracing::info!(last_applied = ?applied.last_applied, "master state tables written");
        }
        let Some((last_applied, membership)) = get_json::<Position>(&db, APPLIED, "last")? else {
            return Err(io::Error::other("the applied position vanished"));
        };
        let state = State::open(&store, cache)
            .map_err(io_err)?
            .ok_or_else(|| io::Error::other("the state tables are missing"))?;
        let sm = Self {
            db,
            store,
            cache,
            dir,
            inner: Arc::new(Mutex::new(Applied {
                last_applied,
                membership,
                state,
                uncommitted: 0,
            })),
        };
        let current = get_json::<Current>(&sm.db, SNAPSHOT, "current")?;
        let json = get_json::<serde_json::Value>(&sm.db, SNAPSHOT, "data")?.is_some();
        let installing =
            last_applied.is_none() && current.as_ref().is_some_and(|c| c.file.is_some());
        if json || (!installing && current.as_ref().is_some_and(|c| c.file.is_some())) {
            // The JSON snapshot's state is in the tables, or the file is an older master's
            // copy of them: the tables become the snapshot.
            let (meta, _rx) = sm.checkpoint()?;
            sm.record_built(&meta)?;
        }
        // Only a file being installed stays (any other was just forgotten, or is left over).
        let keep = current
            .and_then(|c| c.file)
            .filter(|_| installing)
            .map(|f| sm.dir.join(f));
        snapshot::remove_others(&sm.dir, keep.as_deref())?;
        Ok(sm)
    }

    pub fn shared(&self) -> Arc<Mutex<Applied>> {
        self.inner.clone()
    }

    /// Commits the state durably and returns its meta with a read transaction that sees it.
    fn checkpoint(&self) -> io::Result<(SnapshotMetaOf<TypeConfig>, redb::ReadTransaction)> {
        let mut a = self.inner.lock();
        // Durable up to the snapshot before openraft purges the log below it.
        commit_batch(&self.store, &mut a, Durability::Immediate)?;
        let rx = self.db.begin_read().map_err(io_err)?;
        let meta = SnapshotMetaOf::<TypeConfig> {
            last_log_id: a.last_applied,
            last_membership: a.membership.clone(),
        };
        Ok((meta, rx))
    }

    /// Commits durably what applied entries wait uncommitted ([`COMMIT_EVERY`]): at a
    /// clean stop, so the next start opens the tables at the last entry applied instead of
    /// applying the log's tail again.
    ///
    /// # Errors
    /// The store cannot be written.
    pub fn commit_all(&self) -> io::Result<()> {
        commit_batch(&self.store, &mut self.inner.lock(), Durability::Immediate)
    }

    /// The digest of this copy of the state ([`crate::snapshot::digest`]) at the log entry it
    /// has applied: what it applied is committed (not durably) first, so the tables read hold
    /// exactly that entry's state.
    ///
    /// # Errors
    /// The store cannot be written or read.
    pub fn digest(&self) -> io::Result<Digest> {
        let (at, rx) = {
            let mut a = self.inner.lock();
            commit_batch(&self.store, &mut a, Durability::None)?;
            (a.last_applied, self.db.begin_read().map_err(io_err)?)
        };
        let tables = crate::state::disk::TABLES;
        let (rows, crc) = snapshot::digest(&rx, tables).map_err(io_err)?;
        let by_table = snapshot::table_digests(&rx, tables).map_err(io_err)?;
        Ok(Digest {
            at,
            rows,
            crc,
            tables: by_table,
        })
    }

    /// Records the durably committed state at `meta` as the current snapshot (unless a newer
    /// one is: an installed snapshot may overtake a build).
    fn record_built(&self, meta: &SnapshotMetaOf<TypeConfig>) -> io::Result<()> {
        let mut tx = self.db.begin_write().map_err(io_err)?;
        tx.set_durability(Durability::Immediate).map_err(io_err)?;
        {
            let mut t = tx.open_table(SNAPSHOT).map_err(io_err)?;
            let newer = match t.get("current").map_err(io_err)? {
                Some(v) => {
                    serde_json::from_slice::<Current>(v.value())
                        .map_err(io_err)?
                        .meta
                        .last_log_id
                        > meta.last_log_id
                }
                None => false,
            };
            if newer {
                drop(t);
                tx.abort().map_err(io_err)?;
                return Ok(());
            }
            put_current(&mut t, meta, false)?;
        }
        tx.commit().map_err(io_err)?;
        tracing::debug!(last = ?meta.last_log_id, "snapshot built: the tables, committed durably");
        metrics::counter!("cairn_master_snapshots_total", "how" => "built").increment(1);
        Ok(())
    }

    /// Replaces the state with the snapshot in `file` (checked whole first).
    fn install(&self, meta: &SnapshotMetaOf<TypeConfig>, file: &Path) -> io::Result<PathBuf> {
        // Checked where it is: a bad file must not replace a good one of the same name.
        let header = snapshot::verify(file, crate::state::disk::TABLES)?;
        let inside: SnapshotMetaOf<TypeConfig> = serde_json::from_slice(&header).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, snapshot::SnapshotError::Meta(e))
        })?;
        if inside != *meta {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("snapshot file holds {inside:?}, not {meta:?}"),
            ));
        }
        let path = self.dir.join(snapshot_name(meta));
        if file != path {
            std::fs::rename(file, &path)?;
            snapshot::sync_dir(&path)?;
        }
        // From here until the position is written again, a restart installs this again.
        let mut tx = self.db.begin_write().map_err(io_err)?;
        tx.set_durability(Durability::Immediate).map_err(io_err)?;
        {
            put_current(&mut tx.open_table(SNAPSHOT).map_err(io_err)?, meta, true)?;
            tx.open_table(APPLIED)
                .map_err(io_err)?
                .remove("last")
                .map_err(io_err)?;
        }
        tx.commit().map_err(io_err)?;
        let position: Position = (meta.last_log_id, meta.last_membership.clone());
        let rows = snapshot::load(
            &path,
            crate::state::disk::TABLES,
            || Ok(self.db.begin_write()?),
            |tx| {
                put_position(tx, &position)?;
                let mut t = tx.open_table(SNAPSHOT)?;
                put_current(&mut t, meta, false).map_err(|e| redb::Error::Corrupted(e.to_string()))
            },
        )?;
        tracing::info!(rows, file = %path.display(), "snapshot installed");
        metrics::counter!("cairn_master_snapshots_total", "how" => "installed").increment(1);
        Ok(path)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<TypeConfig, SnapshotData>, io::Error> {
        let sm = self.clone();
        blocking(move || {
            let (meta, rx) = sm.checkpoint()?;
            sm.record_built(&meta)?;
            Ok(SnapshotOf::<TypeConfig, SnapshotData> {
                meta,
                snapshot: SnapshotData::Tables(Arc::new(rx)),
            })
        })
        .await
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;
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
                a.uncommitted += 1;
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
        end_batch(&self.store, &mut self.inner.lock(), COMMIT_EVERY)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let (sm, meta) = (self.clone(), meta.clone());
        blocking(move || {
            let file = match snapshot {
                SnapshotData::File(f) => f.path,
                SnapshotData::Tables(rx) => {
                    // Another state machine's tables (openraft's storage suite does this).
                    let path = incoming_dir(sm.dir.parent().unwrap_or(Path::new(".")))
                        .join(format!("{}.part", snapshot_name(&meta)));
                    let header = serde_json::to_vec(&meta).map_err(io_err)?;
                    snapshot::write(&path, &header, &rx, crate::state::disk::TABLES)?;
                    path
                }
            };
            // Held throughout: a snapshot build must not commit the old state's position
            // between the install's transactions (reads wait too). An error leaves no
            // position: openraft stops this master, and its restart installs the snapshot.
            let mut inner = sm.inner.lock();
            sm.install(&meta, &file)?;
            sm.store.committed();
            let state = State::open(&sm.store, sm.cache)
                .map_err(io_err)?
                .ok_or_else(|| io::Error::other("an installed snapshot has no state"))?;
            *inner = Applied {
                last_applied: meta.last_log_id,
                membership: meta.last_membership.clone(),
                state,
                uncommitted: 0,
            };
            drop(inner);
            // Installed: the tables hold it.
            snapshot::remove_others(&sm.dir, None)
        })
        .await
    }

    /// The snapshot being installed (a restart finishes it), or else the tables as they are
    /// now, committed durably (a snapshot at least as new as the last one built); none before
    /// the first build or install.
    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, SnapshotData>>, io::Error> {
        let sm = self.clone();
        blocking(move || {
            let Some(current) = get_json::<Current>(&sm.db, SNAPSHOT, "current")? else {
                return Ok(None);
            };
            if let Some(file) = current.file {
                return Ok(Some(SnapshotOf::<TypeConfig, SnapshotData> {
                    meta: current.meta,
                    snapshot: SnapshotData::File(SnapshotFile::open(sm.dir.join(file))?),
                }));
            }
            let (meta, rx) = sm.checkpoint()?;
            Ok(Some(SnapshotOf::<TypeConfig, SnapshotData> {
                meta,
                snapshot: SnapshotData::Tables(Arc::new(rx)),
            }))
        })
        .await
    }
}

/// A copy's digest ([`StateMachine::digest`]): the entry applied, the rows and CRC of the
/// whole snapshot stream, and each table's.
pub struct Digest {
    pub at: Option<LogIdOf<TypeConfig>>,
    pub rows: u64,
    pub crc: u32,
    pub tables: Vec<(&'static str, u64, u32)>,
}

#[cfg(test)]
mod tests;
