//! The Raft log and vote: a write-ahead log of [`raft_log`] in `<data-dir>/raft-log/`.
//!
//! `raft_log` (by openraft's author; databend's meta service runs on it) keeps the log's index
//! and recent payloads in memory and hands writes to one flush thread that writes whatever has
//! queued since its last `fdatasync` and syncs once: group commit. So [`LogStore::append`]
//! returns as soon as the entries are queued (they are readable from memory at once) and tells
//! openraft they are durable from the flush thread; openraft meanwhile accepts more client
//! writes and queues the next batch behind the running flush. Before this, each append was one
//! redb transaction awaited in turn (~1.2 ms each, one at a time).
//!
//! What the records hold (byte layout in docs/masters.md "Log records"): the log id and the
//! vote as openraft's serde JSON, the entry payload as JSON. Reading them back is fuzzed
//! (`fuzz/fuzz_targets/raft_wal.rs`).
//!
//! Masters before this module kept the log in redb (`master.redb`, tables `log` and `meta`);
//! [`LogStore::open`] moves such a log here once (see [`migrate`]).

use crate::store::{TypeConfig, io_err};
use openraft::OptionalSend;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::type_config::alias::{EntryOf, LogIdOf, PayloadOf, VoteOf};
use parking_lot::Mutex;
use raft_log::api::raft_log_writer::RaftLogWriter;
use raft_log::codeq::{Decode, Encode};
use raft_log::{RaftLog, Types};
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use std::cmp::Ordering;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Directory of the log inside a master's data directory.
pub const DIR: &str = "raft-log";

/// Default of [`crate::MasterOptions::log_flush_gap`]: measured in BENCHMARKS.md ("Raft log").
pub const DEFAULT_FLUSH_GAP: Duration = Duration::from_micros(500);

/// Default of [`crate::MasterOptions::log_cache`]: bytes of the newest entries' payloads kept
/// in memory (older ones are read from the log files: a follower that far behind, or a
/// restart's replay). 64 MiB had held ~50 000 entries that nothing read again (BENCHMARKS.md
/// "Where a master's memory goes").
pub const DEFAULT_CACHE_BYTES: usize = 16 << 20;
/// At most this many entries stay cached, whatever their size.
const CACHE_ENTRIES: usize = 20_000;
/// A log file is closed and a new one started at this size; files whose entries are all purged
/// (after a snapshot) are deleted, so the open file is what a master's data directory holds of
/// the log beyond the entries since the last snapshot. 64 MiB (before session 46) was 21 bytes
/// per object after two million S3 PUTs (BENCHMARKS.md "Where a master's memory goes").
const FILE_BYTES: usize = 16 << 20;
const FILE_ENTRIES: usize = 25_000;

/// `raft_log`'s type parameters for Cairn.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WalTypes;

/// openraft's log id, ordered as openraft orders it; stored as JSON.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Id(pub LogIdOf<TypeConfig>);

/// openraft's vote, ordered as openraft orders it; stored as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vote(pub VoteOf<TypeConfig>);

impl PartialOrd for Vote {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.0.partial_cmp(&other.0)
    }
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

fn encode_json<W: io::Write>(value: &impl serde::Serialize, w: W) -> io::Result<usize> {
    serde_json::to_vec(value).map_err(invalid)?.encode(w)
}

fn decode_json<T: for<'a> serde::Deserialize<'a>, R: io::Read>(r: R) -> io::Result<T> {
    serde_json::from_slice(&Vec::<u8>::decode(r)?).map_err(invalid)
}

impl Encode for Id {
    fn encode<W: io::Write>(&self, w: W) -> io::Result<usize> {
        encode_json(&self.0, w)
    }
}

impl Decode for Id {
    fn decode<R: io::Read>(r: R) -> io::Result<Self> {
        decode_json(r).map(Id)
    }
}

impl Encode for Vote {
    fn encode<W: io::Write>(&self, w: W) -> io::Result<usize> {
        encode_json(&self.0, w)
    }
}

impl Decode for Vote {
    fn decode<R: io::Read>(r: R) -> io::Result<Self> {
        decode_json(r).map(Vote)
    }
}

/// Who hears that a write reached the disk: openraft, or a caller waiting for it.
pub enum Flushed {
    Raft(IOFlushed<TypeConfig>),
    Wait(tokio::sync::oneshot::Sender<io::Result<()>>),
    /// For a caller outside async code (start-up).
    Block(std::sync::mpsc::Sender<io::Result<()>>),
    /// The appends one flush of the [`Flusher`] covers.
    Many(Vec<IOFlushed<TypeConfig>>),
}

impl raft_log::Callback for Flushed {
    fn send(self, res: io::Result<()>) {
        match self {
            Flushed::Raft(cb) => cb.io_completed(res),
            Flushed::Wait(tx) => {
                let _ = tx.send(res);
            }
            Flushed::Block(tx) => {
                let _ = tx.send(res);
            }
            Flushed::Many(callbacks) => {
                for cb in callbacks {
                    let r = match &res {
                        Ok(()) => Ok(()),
                        Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
                    };
                    cb.io_completed(r);
                }
            }
        }
    }
}

impl Types for WalTypes {
    type LogId = Id;
    /// The entry's payload as JSON.
    type LogPayload = Vec<u8>;
    type Vote = Vote;
    type Callback = Flushed;
    type UserData = Vec<u8>;

    fn log_index(log_id: &Id) -> u64 {
        log_id.0.index
    }

    fn payload_size(payload: &Vec<u8>) -> u64 {
        payload.len() as u64
    }
}

/// Decodes a stored entry: the log id and the payload's JSON.
///
/// # Errors
/// The payload is not an entry payload.
pub fn decode_entry(id: Id, payload: &[u8]) -> io::Result<EntryOf<TypeConfig>> {
    let payload: PayloadOf<TypeConfig> = serde_json::from_slice(payload).map_err(invalid)?;
    Ok(EntryOf::<TypeConfig> {
        log_id: id.0,
        payload,
    })
}

fn config(dir: &Path, cache_bytes: usize) -> Arc<raft_log::Config> {
    let mut c = raft_log::Config::new(dir.display());
    c.log_cache_max_items = Some(CACHE_ENTRIES);
    c.log_cache_capacity = Some(cache_bytes.max(1 << 20));
    c.wal.chunk_max_size = Some(FILE_BYTES);
    c.wal.chunk_max_records = Some(FILE_ENTRIES);
    // Batching is the flusher's job (see `Flusher`): raft_log's wait would delay lone writes.
    c.wal.flush_batch_wait = Some(Duration::ZERO);
    Arc::new(c)
}

/// The Raft log and vote of one master. Clones share the log.
#[derive(Clone)]
pub struct LogStore {
    log: Arc<Mutex<RaftLog<WalTypes>>>,
    flusher: Arc<Flusher>,
    /// Held for its `Drop`: the last clone stops the flusher thread.
    _stop: Arc<StopFlusher>,
}

/// See [`LogStore::open_handle`].
#[derive(Clone)]
pub struct OpenHandle(std::sync::Weak<Mutex<RaftLog<WalTypes>>>);

impl OpenHandle {
    /// False once every user let go of the log: its files and directory lock are released
    /// (raft-log joins its flush thread first).
    pub fn is_open(&self) -> bool {
        self.0.strong_count() > 0
    }
}

/// Appends waiting for their flush, and the thread that asks for it.
///
/// Group commit with a rate limit: at most one flush starts per `min_gap`. A lone write
/// (nothing flushed in the last `min_gap`, nothing waiting) asks for its flush itself, from
/// the append; under load, writes arriving within `min_gap` of the last flush wait here and
/// the thread flushes them together once the gap is over. (raft_log's own batch wait would
/// delay every flush, lone writes included; handing a lone write to the thread cost a wake-up
/// of it per serial write, about a tenth of a master's CPU a write on 2 cores.)
struct Flusher {
    /// Callbacks of appends whose entries are in the log's write buffer. Pushed and taken
    /// while holding the log's lock, so a flush always covers the entries of the callbacks it
    /// carries.
    waiting: Mutex<Vec<IOFlushed<TypeConfig>>>,
    /// Entries of those appends (for the metric of entries per fsync).
    waiting_entries: std::sync::atomic::AtomicUsize,
    wake: parking_lot::Condvar,
    stop: std::sync::atomic::AtomicBool,
    /// When the last flush was asked for, by the thread or by an append.
    last: Mutex<Option<std::time::Instant>>,
    min_gap: Duration,
}

/// Stops the flusher thread when the last [`LogStore`] clone goes.
struct StopFlusher(Arc<Flusher>);

impl Drop for StopFlusher {
    fn drop(&mut self) {
        // Under the lock the flusher checks `stop` with, so the wake-up cannot fall between
        // its check and its wait.
        let _waiting = self.0.waiting.lock();
        self.0
            .stop
            .store(true, std::sync::atomic::Ordering::Release);
        self.0.wake.notify_one();
    }
}

impl Flusher {
    /// Whether a flush may start now (none started in the last `min_gap`); if so, it counts
    /// as started.
    fn start_now(&self) -> bool {
        let mut last = self.last.lock();
        if last.is_some_and(|t| t.elapsed() < self.min_gap) {
            return false;
        }
        *last = Some(std::time::Instant::now());
        true
    }

    fn run(self: Arc<Self>, log: std::sync::Weak<Mutex<RaftLog<WalTypes>>>) {
        loop {
            {
                let mut waiting = self.waiting.lock();
                while waiting.is_empty() {
                    if self.stop.load(std::sync::atomic::Ordering::Acquire) {
                        return;
                    }
                    self.wake.wait(&mut waiting);
                }
            }
            let gap = self
                .last
                .lock()
                .and_then(|t| self.min_gap.checked_sub(t.elapsed()));
            if let Some(gap) = gap {
                std::thread::sleep(gap);
            }
            let Some(log) = log.upgrade() else { return };
            let mut log = log.lock();
            *self.last.lock() = Some(std::time::Instant::now());
            let callbacks = std::mem::take(&mut *self.waiting.lock());
            let entries = self
                .waiting_entries
                .swap(0, std::sync::atomic::Ordering::Relaxed);
            metrics::histogram!("cairn_master_log_flush_entries").record(entries as f64);
            if let Err(e) = log.flush(true, Some(Flushed::Many(callbacks))) {
                // The flush thread is gone: nothing more becomes durable, openraft's pending
                // appends are never acknowledged (their callbacks were dropped with the request).
                tracing::error!("raft log flush failed: {e}");
            }
        }
    }
}

impl LogStore {
    /// Opens the log in `data_dir/raft-log`, first moving a log kept in `legacy` (redb, before
    /// this store) there if the directory does not exist yet.
    ///
    /// # Errors
    /// The log files are unreadable or inconsistent, or the move fails.
    pub fn open(data_dir: &Path, legacy: &Database, min_flush_gap: Duration) -> io::Result<Self> {
        Self::open_with(data_dir, legacy, min_flush_gap, DEFAULT_CACHE_BYTES)
    }

    /// [`LogStore::open`] keeping up to `cache_bytes` of the newest entries in memory.
    ///
    /// # Errors
    /// As [`LogStore::open`].
    pub fn open_with(
        data_dir: &Path,
        legacy: &Database,
        min_flush_gap: Duration,
        cache_bytes: usize,
    ) -> io::Result<Self> {
        let dir = data_dir.join(DIR);
        if !dir.exists() {
            migrate(data_dir, legacy)?;
        }
        clear_legacy(legacy)?;
        let log = Arc::new(Mutex::new(RaftLog::open(config(&dir, cache_bytes))?));
        let flusher = Arc::new(Flusher {
            waiting: Mutex::new(Vec::new()),
            waiting_entries: std::sync::atomic::AtomicUsize::new(0),
            wake: parking_lot::Condvar::new(),
            stop: std::sync::atomic::AtomicBool::new(false),
            last: Mutex::new(None),
            min_gap: min_flush_gap,
        });
        let (f, weak) = (flusher.clone(), Arc::downgrade(&log));
        std::thread::Builder::new()
            .name("raft-log-flusher".into())
            .spawn(move || f.run(weak))?;
        Ok(Self {
            log,
            _stop: Arc::new(StopFlusher(flusher.clone())),
            flusher,
        })
    }

    /// Tells whether the log is still open without keeping it open.
    pub fn open_handle(&self) -> OpenHandle {
        OpenHandle(Arc::downgrade(&self.log))
    }

    /// The entries with index in `from..to` (those not purged).
    ///
    /// # Errors
    /// A log file is unreadable or an entry does not decode.
    pub fn entries(&self, from: u64, to: u64) -> io::Result<Vec<EntryOf<TypeConfig>>> {
        let log = self.log.lock();
        log.read(from, to)
            .map(|r| r.and_then(|(id, payload)| decode_entry(id, &payload)))
            .collect()
    }

    /// Queues a flush and waits for it (and everything queued before it) to be durable.
    async fn flush_and_wait(&self) -> io::Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.log.lock().flush(true, Some(Flushed::Wait(tx)))?;
        rx.await
            .map_err(|_| io::Error::other("raft log flush thread stopped"))?
    }
}

/// Legacy redb tables of the log (before [`LogStore`]).
const LEGACY_LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const LEGACY_META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// Moves a log kept in redb to a new `raft-log` directory: written to `raft-log.new`, synced,
/// then renamed, so a crash leaves either no new log (and the redb one) or the whole new one.
/// The redb copy is dropped only after that (by [`clear_legacy`]).
fn migrate(data_dir: &Path, legacy: &Database) -> io::Result<()> {
    let tmp = data_dir.join(format!("{DIR}.new"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp)?;
    {
        let mut log = RaftLog::<WalTypes>::open(config(&tmp, DEFAULT_CACHE_BYTES))?;
        let tx = legacy.begin_read().map_err(io_err)?;
        if let Ok(meta) = tx.open_table(LEGACY_META) {
            if let Some(v) = meta.get("vote").map_err(io_err)? {
                let vote: VoteOf<TypeConfig> =
                    serde_json::from_slice(v.value()).map_err(invalid)?;
                log.save_vote(Vote(vote))?;
            }
            if let Some(v) = meta.get("purged").map_err(io_err)? {
                let purged: Option<LogIdOf<TypeConfig>> =
                    serde_json::from_slice(v.value()).map_err(invalid)?;
                if let Some(p) = purged {
                    log.purge(Id(p))?;
                }
            }
        }
        if let Ok(table) = tx.open_table(LEGACY_LOG) {
            for item in table.iter().map_err(io_err)? {
                let (_, v) = item.map_err(io_err)?;
                let e: EntryOf<TypeConfig> = serde_json::from_slice(v.value()).map_err(invalid)?;
                let payload = serde_json::to_vec(&e.payload).map_err(invalid)?;
                log.append([(Id(e.log_id), payload)])?;
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        log.flush(true, Some(Flushed::Block(tx)))?;
        rx.recv()
            .map_err(|_| io::Error::other("raft log flush thread stopped"))??;
    }
    std::fs::rename(&tmp, data_dir.join(DIR))?;
    std::fs::File::open(data_dir)?.sync_all()?;
    Ok(())
}

/// Drops the legacy redb log and vote once the new log holds them.
fn clear_legacy(legacy: &Database) -> io::Result<()> {
    let has_log = {
        let tx = legacy.begin_read().map_err(io_err)?;
        let log = tx
            .open_table(LEGACY_LOG)
            .map(|t| t.len().unwrap_or(0) > 0)
            .unwrap_or(false);
        let meta = tx
            .open_table(LEGACY_META)
            .map(|t| t.len().unwrap_or(0) > 0)
            .unwrap_or(false);
        log || meta
    };
    if !has_log {
        return Ok(());
    }
    let tx = legacy.begin_write().map_err(io_err)?;
    tx.delete_table(LEGACY_LOG).map_err(io_err)?;
    tx.delete_table(LEGACY_META).map_err(io_err)?;
    tx.commit().map_err(io_err)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<EntryOf<TypeConfig>>, io::Error> {
        let from = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i + 1,
            Bound::Unbounded => 0,
        };
        let to = match range.end_bound() {
            Bound::Included(&i) => i + 1,
            Bound::Excluded(&i) => i,
            Bound::Unbounded => u64::MAX,
        };
        self.entries(from, to)
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<TypeConfig>>, io::Error> {
        Ok(self.log.lock().log_state().vote().map(|v| v.0))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let log = self.log.lock();
        let state = log.log_state();
        Ok(LogState {
            last_purged_log_id: state.purged().map(|i| i.0),
            last_log_id: state.last().map(|i| i.0),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &VoteOf<TypeConfig>) -> Result<(), io::Error> {
        self.log.lock().save_vote(Vote(*vote))?;
        self.flush_and_wait().await
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = EntryOf<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let encoded = entries
            .into_iter()
            .map(|e| {
                Ok((
                    Id(e.log_id),
                    serde_json::to_vec(&e.payload).map_err(invalid)?,
                ))
            })
            .collect::<io::Result<Vec<_>>>()?;
        let n = encoded.len();
        let mut log = self.log.lock();
        log.append(encoded)?;
        // Returns at once; raft_log's flush thread calls `callback` when the entries are on
        // disk. A lone write asks for its flush here; otherwise the flusher thread asks, for
        // every append waiting, once the gap since the last flush is over. (Under the log's
        // lock: a flush asked for covers every entry appended before it.)
        let mut waiting = self.flusher.waiting.lock();
        if waiting.is_empty() && self.flusher.start_now() {
            drop(waiting);
            metrics::histogram!("cairn_master_log_flush_entries").record(n as f64);
            return log.flush(true, Some(Flushed::Raft(callback)));
        }
        waiting.push(callback);
        drop(waiting);
        self.flusher
            .waiting_entries
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        self.flusher.wake.notify_one();
        Ok(())
    }

    async fn truncate_after(
        &mut self,
        last_log_id: Option<LogIdOf<TypeConfig>>,
    ) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |l| l.index + 1);
        {
            let mut log = self.log.lock();
            // Nothing after `last_log_id`: raft_log refuses to truncate at an absent index.
            if WalTypes::next_log_index(log.log_state().last()) <= from {
                return Ok(());
            }
            log.truncate(from)?;
        }
        self.flush_and_wait().await
    }

    async fn purge(&mut self, log_id: LogIdOf<TypeConfig>) -> Result<(), io::Error> {
        self.log.lock().purge(Id(log_id))?;
        self.flush_and_wait().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{StateMachine, open_db};
    use openraft::testing::log::{StoreBuilder, Suite};
    use openraft::type_config::TypeConfigExt;
    use openraft::type_config::alias::LeaderIdOf;
    use openraft::vote::RaftLeaderId;
    use openraft::{EntryPayload, RaftLogReader, StorageError};

    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
        async fn build(
            &self,
        ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
            let dir = tempfile::tempdir().unwrap();
            let db = open_db(&dir.path().join("master.redb")).unwrap();
            let log = LogStore::open(dir.path(), &db, Duration::ZERO).unwrap();
            let sm = StateMachine::open(db, dir.path(), 64).unwrap();
            Ok((dir, log, sm))
        }
    }

    /// openraft's own conformance suite for log and state machine storage.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn openraft_storage_suite() {
        Suite::test_all(Builder).await.unwrap();
    }

    fn log_id(term: u64, index: u64) -> LogIdOf<TypeConfig> {
        LogIdOf::<TypeConfig>::new(LeaderIdOf::<TypeConfig>::new(term, 1).to_committed(), index)
    }

    fn entry(term: u64, index: u64) -> EntryOf<TypeConfig> {
        EntryOf::<TypeConfig> {
            log_id: log_id(term, index),
            payload: EntryPayload::Blank,
        }
    }

    async fn append(log: &mut LogStore, entries: Vec<EntryOf<TypeConfig>>) {
        let (tx, rx) = TypeConfig::oneshot();
        log.append(entries, IOFlushed::signal(tx)).await.unwrap();
        rx.await.unwrap().unwrap();
    }

    /// What was flushed is there after the store is dropped and opened again: entries after a
    /// truncation and a purge, and the vote.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn flushed_log_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let db = open_db(&dir.path().join("master.redb")).unwrap();
        {
            let mut log = LogStore::open(dir.path(), &db, Duration::ZERO).unwrap();
            append(&mut log, (0..10).map(|i| entry(1, i)).collect()).await;
            log.truncate_after(Some(log_id(1, 6))).await.unwrap();
            append(&mut log, (7..12).map(|i| entry(2, i)).collect()).await;
            log.purge(log_id(1, 3)).await.unwrap();
            let vote = VoteOf::<TypeConfig>::new(2, 1);
            log.save_vote(&vote).await.unwrap();
        }
        let mut log = LogStore::open(dir.path(), &db, Duration::ZERO).unwrap();
        let want: Vec<_> = (4..7)
            .map(|i| log_id(1, i))
            .chain((7..12).map(|i| log_id(2, i)))
            .collect();
        check(
            &mut log,
            log_id(1, 3),
            &want,
            VoteOf::<TypeConfig>::new(2, 1),
        )
        .await;
    }

    /// A lone write asks for its flush from its append; writes within the flush gap of the
    /// last flush wait for the flusher thread, which flushes them together once the gap is
    /// over; all are there after a reopen.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_within_the_gap_wait_for_the_flusher() {
        let dir = tempfile::tempdir().unwrap();
        let db = open_db(&dir.path().join("master.redb")).unwrap();
        {
            let mut log = LogStore::open(dir.path(), &db, Duration::from_secs(2)).unwrap();
            append(&mut log, vec![entry(1, 0)]).await;
            assert!(log.flusher.waiting.lock().is_empty());
            let mut flushed = Vec::new();
            for i in 1..3 {
                let (tx, rx) = TypeConfig::oneshot();
                log.append(vec![entry(1, i)], IOFlushed::signal(tx))
                    .await
                    .unwrap();
                flushed.push(rx);
            }
            // Within 2 s of the first flush: both wait for the thread's one flush.
            assert_eq!(log.flusher.waiting.lock().len(), 2);
            for rx in flushed {
                rx.await.unwrap().unwrap();
            }
            assert!(log.flusher.waiting.lock().is_empty());
        }
        let mut log = LogStore::open(dir.path(), &db, Duration::ZERO).unwrap();
        let want: Vec<_> = (0..3).map(|i| log_id(1, i)).collect();
        assert_eq!(ids(&mut log).await, want);
    }

    /// The ids of the entries the log holds.
    async fn ids(log: &mut LogStore) -> Vec<LogIdOf<TypeConfig>> {
        log.try_get_log_entries(0..100)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.log_id)
            .collect()
    }

    /// The log holds exactly `ids` after `purged`, and `vote`.
    async fn check(
        log: &mut LogStore,
        purged: LogIdOf<TypeConfig>,
        ids: &[LogIdOf<TypeConfig>],
        vote: VoteOf<TypeConfig>,
    ) {
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(purged));
        assert_eq!(state.last_log_id, ids.last().copied());
        assert_eq!(self::ids(log).await, ids);
        assert_eq!(log.read_vote().await.unwrap(), Some(vote));
    }

    /// A master that kept its log in redb finds it in the new log, and the redb copy is gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn legacy_redb_log_is_moved() {
        let dir = tempfile::tempdir().unwrap();
        let db = open_db(&dir.path().join("master.redb")).unwrap();
        let vote = VoteOf::<TypeConfig>::new(3, 1);
        {
            let tx = db.begin_write().unwrap();
            {
                let mut meta = tx.open_table(LEGACY_META).unwrap();
                meta.insert("vote", serde_json::to_vec(&vote).unwrap().as_slice())
                    .unwrap();
                let purged = Some(log_id(1, 4));
                meta.insert("purged", serde_json::to_vec(&purged).unwrap().as_slice())
                    .unwrap();
                let mut t = tx.open_table(LEGACY_LOG).unwrap();
                for i in 5..9 {
                    t.insert(i, serde_json::to_vec(&entry(2, i)).unwrap().as_slice())
                        .unwrap();
                }
            }
            tx.commit().unwrap();
        }
        let mut log = LogStore::open(dir.path(), &db, Duration::ZERO).unwrap();
        let want: Vec<_> = (5..9).map(|i| log_id(2, i)).collect();
        check(&mut log, log_id(1, 4), &want, vote).await;
        let tx = db.begin_read().unwrap();
        assert!(
            tx.open_table(LEGACY_LOG).is_err(),
            "legacy log table still there"
        );
        assert!(!dir.path().join(format!("{DIR}.new")).exists());
    }

    /// The log files of a directory.
    pub fn files(dir: &Path) -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(dir.join(DIR))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "wal"))
            .collect();
        v.sort();
        v
    }

    /// Flipping any byte of a log file gives an error or a log that reads back (a torn tail is
    /// cut) — never a panic, and never an entry that was not written.
    #[test]
    fn flipped_bytes_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let db = open_db(&dir.path().join("master.redb")).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let written: Vec<_> = {
            let mut log = LogStore::open(dir.path(), &db, Duration::ZERO).unwrap();
            rt.block_on(async {
                let vote = VoteOf::<TypeConfig>::new(1, 1);
                log.save_vote(&vote).await.unwrap();
                for i in 0..4 {
                    let (tx, rx) = std::sync::mpsc::channel();
                    let e = entry(1, i);
                    log.log
                        .lock()
                        .append([(Id(e.log_id), serde_json::to_vec(&e.payload).unwrap())])
                        .unwrap();
                    log.log
                        .lock()
                        .flush(true, Some(Flushed::Block(tx)))
                        .unwrap();
                    rx.recv().unwrap().unwrap();
                }
            });
            log.entries(0, 100).unwrap()
        };
        assert_eq!(written.len(), 4);
        let files = files(dir.path());
        assert_eq!(files.len(), 1, "{files:?}");
        let good = std::fs::read(&files[0]).unwrap();
        let mut errors = 0;
        for pos in 0..good.len() {
            let mut bad = good.clone();
            bad[pos] ^= 0x5a;
            std::fs::write(&files[0], &bad).unwrap();
            match LogStore::open(dir.path(), &db, Duration::ZERO).and_then(|l| l.entries(0, 100)) {
                Ok(got) => assert!(
                    got.iter().zip(&written).all(|(a, b)| a.log_id == b.log_id),
                    "byte {pos}: {got:?}"
                ),
                Err(_) => errors += 1,
            }
        }
        // Canary: most flips must be caught (the records carry checksums).
        assert!(
            errors > good.len() / 2,
            "{errors} errors of {} flips",
            good.len()
        );
    }
}
