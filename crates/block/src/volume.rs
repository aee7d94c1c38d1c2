//! A volume open for serving (docs/block.md): writes are appended to segment files by a few
//! lanes, each batching the writes waiting for it into one append whose header says which
//! blocks it holds — so a write is durable, mapping and all, when its append is, and a FLUSH
//! has nothing to wait for. The index lives in memory; its changes reach the journal every
//! second (and at a FLUSH after a TRIM); each record names the segments being appended to
//! and how far their batches are in the index. A checkpoint of the whole index starts each
//! new journal.
//!
//! Files of volume ID, under `/.block/ID/`: `seg-N` (data), `journal-G` (index changes since
//! checkpoint G), `ckpt-G` (the index as journal G−1 left it). Opening a volume takes the
//! writer lease of its current journal (another server serving it is refused), replays the
//! journal on the newest whole checkpoint, seals the segments its last record names and maps
//! the batches after what it covers, writes the next checkpoint and starts the next journal:
//! it reads the index and at most the last second's data, never the rest.
//!
//! `snap-ID` files are snapshots (a checkpoint of the index at one instant); the segments
//! they name are never collected. A clone's index also names its ancestors' segments: the
//! top 16 bits of a segment id say whose (0: its own; k: the k-th of its lineage).
//! Garbage collection copies the live blocks of mostly-dead segments into new ones, journals
//! the new mappings, and deletes the old segments.

use crate::extent::ExtentMap;
use crate::journal::{Batch, BatchKind, Change, Checkpoint, Record, replay, scan_batches};
use bytes::{Bytes, BytesMut};
use cairn_client::{Client, CreateOptions, FlatLogFile};
use cairn_rpc::ErrorKind;
use cairn_rpc::object::Volume as VolumeMeta;
use cairn_rpc::object::{ObjectError, ObjectOp, ObjectQuery, QueryReply, Snapshot};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, oneshot};

/// Why a volume operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Another server holds the volume (its journal's writer lease).
    #[error("volume {0} is served by another server (its journal's lease is held)")]
    Busy(String),
    /// This server lost the volume to another (its lease ran out): it writes nothing more.
    #[error("volume {0}: fenced, another server took it over ({1})")]
    Fenced(String, String),
    /// The cluster failed the operation.
    #[error("volume {0}: {1}")]
    Io(String, String),
    /// A request outside the volume or not aligned to its blocks.
    #[error("{0}")]
    Invalid(String),
    /// The volume's files do not hold a usable index.
    #[error("volume {0}: {1}")]
    Corrupt(String, String),
    #[error("volume {0} is closed")]
    Closed(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// How a volume is served.
#[derive(Debug, Clone)]
pub struct VolumeOptions {
    /// Segment files written at once; each batches the writes waiting for it into one append.
    pub lanes: usize,
    /// A lane starts a new segment once its current one holds this many bytes.
    pub segment_bytes: u64,
    /// The most bytes one batch appends.
    pub max_batch: usize,
    /// A new checkpoint and journal once the journal holds this many bytes.
    pub journal_bytes: u64,
    /// How often the volume's record is read (snapshots asked for, a new size, deletion)
    /// and the index changes since the last journal record are journaled (which bounds the
    /// data a reopening server reads).
    pub poll_every: Duration,
    /// How often garbage collection looks for segments to compact (`None`: never).
    pub gc_every: Option<Duration>,
    /// Segments whose live bytes are under this percentage of their length are compacted.
    pub gc_live_pct: u8,
    /// Compaction copies at most this many bytes per second (on average).
    pub gc_bytes_per_sec: u64,
}

impl Default for VolumeOptions {
    fn default() -> Self {
        Self {
            lanes: 4,
            segment_bytes: 128 << 20,
            max_batch: 1 << 20,
            journal_bytes: 16 << 20,
            poll_every: Duration::from_secs(1),
            gc_every: Some(Duration::from_secs(10)),
            gc_live_pct: 50,
            gc_bytes_per_sec: 64 << 20,
        }
    }
}

/// The collector reads neighbouring live runs of a segment as one span of at most this many
/// bytes.
const GC_SPAN: u64 = 4 << 20;

/// Where volume `id`'s files live.
pub fn volume_dir(id: &str) -> String {
    format!("/.block/{id}")
}

/// The top bits of a segment id name whose segment it is: 0 the volume's own, k the k-th
/// volume of its lineage (a clone's parent is 1).
pub const ORIGIN_SHIFT: u32 = 48;
const SEG_NUMBER: u64 = (1 << ORIGIN_SHIFT) - 1;

/// A segment id's origin (0: the volume's own segment).
pub fn seg_origin(seg: u64) -> u64 {
    seg >> ORIGIN_SHIFT
}

/// The same segment named from a clone of the volume (one generation further); `None` when
/// the lineage would be deeper than an origin can say.
pub fn seg_from_child(seg: u64) -> Option<u64> {
    let origin = seg_origin(seg) + 1;
    (origin < 1 << (64 - ORIGIN_SHIFT)).then_some((origin << ORIGIN_SHIFT) | (seg & SEG_NUMBER))
}

fn seg_name(n: u64) -> String {
    format!("seg-{:08}", n & SEG_NUMBER)
}

/// A snapshot's file in its volume's directory.
pub fn snap_name(id: &str) -> String {
    format!("snap-{id}")
}

fn journal_name(g: u64) -> String {
    format!("journal-{g:08}")
}

fn ckpt_name(g: u64) -> String {
    format!("ckpt-{g:08}")
}

/// The number in `name` if it is `prefix` followed by digits.
fn numbered(name: &str, prefix: &str) -> Option<u64> {
    name.strip_prefix(prefix)?.parse().ok()
}

struct WriteReq {
    lba: u64,
    data: Bytes,
    done: oneshot::Sender<Result<()>>,
}

/// The index and the changes made to it since the last journal record.
struct State {
    map: ExtentMap,
    pending: Vec<Change>,
    /// Segments being appended to: the end of the last batch whose writes are in `map`.
    covers: BTreeMap<u64, u64>,
    /// `pending` holds changes no segment batch carries (trims, the collector's moves): a
    /// FLUSH must journal them.
    unbatched: bool,
}

struct Journal {
    file: Option<FlatLogFile>,
    generation: u64,
    seq: u64,
    bytes: u64,
}

/// Statistics of a volume being served.
#[derive(Debug, Default)]
pub struct VolumeStats {
    /// Bytes written by clients.
    pub written: AtomicU64,
    /// Bytes appended to segments (client data; garbage collection adds to it later).
    pub appended: AtomicU64,
    /// Appends to segments (batches).
    pub batches: AtomicU64,
    /// Journal records appended.
    pub records: AtomicU64,
    /// Checkpoints written.
    pub checkpoints: AtomicU64,
    /// Bytes garbage collection copied (also counted in `appended`).
    pub gc_bytes: AtomicU64,
    /// Segments garbage collection deleted.
    pub gc_segments: AtomicU64,
    /// Snapshots taken.
    pub snapshots: AtomicU64,
}

/// An open volume.
pub struct Volume {
    client: Client,
    meta: VolumeMeta,
    dir: String,
    opts: VolumeOptions,
    state: Mutex<State>,
    journal: tokio::sync::Mutex<Journal>,
    queue: Mutex<Option<mpsc::Sender<WriteReq>>>,
    lanes: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    next_seg: Arc<AtomicU64>,
    /// The size now (grown while served by `cairn volume resize`).
    size: AtomicU64,
    /// Own segments each snapshot (by id) names: never collected.
    pinned: Mutex<HashMap<String, BTreeSet<u64>>>,
    /// Own segments being appended to (by lanes or the collector): not collected.
    active: Mutex<HashSet<u64>>,
    /// The record poller and the collector.
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Set once the volume cannot go on (fenced, or the journal failed): every call fails.
    failed: Mutex<Option<Error>>,
    /// The number of the next batch appended (orders batches across segments).
    batch_seq: AtomicU64,
    /// Block ranges being written (start → end, disjoint): a write overlapping one waits
    /// for it, so the later of two writes to a block has the later batch.
    writing: Mutex<BTreeMap<u64, u64>>,
    written_one: Notify,
    pub stats: VolumeStats,
    /// How opening went: the journal records replayed and the time it took.
    pub opened: OpenReport,
}

/// What opening a volume read.
#[derive(Debug, Clone, Default)]
pub struct OpenReport {
    pub checkpoint_runs: usize,
    pub journal_records: usize,
    pub journal_bytes: u64,
    /// Segments sealed and read after what the last record covers, and what they held.
    pub tail_segments: usize,
    pub tail_batches: usize,
    pub tail_bytes: u64,
    pub millis: u64,
}

impl Volume {
    /// Opens `meta` for serving: takes its journal's lease, reads its index.
    ///
    /// # Errors
    /// [`Error::Busy`] if another server serves it; the cluster's errors.
    pub async fn open(client: Client, meta: VolumeMeta, opts: VolumeOptions) -> Result<Arc<Self>> {
        let began = std::time::Instant::now();
        let name = meta.name.clone();
        let io = |e: cairn_client::Error| Error::Io(name.clone(), e.to_string());
        let dir = volume_dir(&meta.id);
        client.mkdir(&dir, true).await.or_else(|e| match &e {
            cairn_client::Error::Meta(m) if m.kind == ErrorKind::AlreadyExists => Ok(()),
            _ => Err(io(e)),
        })?;
        let listing = client.list(&dir).await.map_err(io)?;
        let names: Vec<String> = listing.iter().map(|e| e.name.clone()).collect();
        let mut ckpts: Vec<u64> = names.iter().filter_map(|n| numbered(n, "ckpt-")).collect();
        ckpts.sort_unstable();
        let mut report = OpenReport::default();
        // The newest whole checkpoint; newer ones are the torn writes of a crash.
        let mut chosen: Option<(u64, Checkpoint)> = None;
        let mut torn = Vec::new();
        for &g in ckpts.iter().rev() {
            let path = format!("{dir}/{}", ckpt_name(g));
            match read_all(&client, &path)
                .await
                .map(|b| Checkpoint::decode(&b))
            {
                Ok(Ok(c)) if c.block_size == meta.block_size => {
                    chosen = Some((g, c));
                    break;
                }
                Ok(_) => torn.push(path),
                Err(e) => return Err(io(e)),
            }
        }
        // No whole checkpoint: a fresh volume — or one whose very first open crashed while
        // writing checkpoint 1 (no journal was made yet). With a journal there must be one.
        let journals = names.iter().any(|n| numbered(n, "journal-").is_some());
        if chosen.is_none() && journals {
            return Err(Error::Corrupt(
                name.clone(),
                "a journal but no whole checkpoint".into(),
            ));
        }
        let (generation, ckpt) = chosen.unwrap_or((
            0,
            Checkpoint {
                seq: 0,
                block_size: meta.block_size,
                map: ExtentMap::new(meta.block_size),
                covers: Vec::new(),
            },
        ));
        report.checkpoint_runs = ckpt.map.len();
        let mut map = ckpt.map;
        let mut seq = ckpt.seq;
        let mut covers = ckpt.covers;
        // The journal after that checkpoint: its lease is the volume's.
        let jpath = format!("{dir}/{}", journal_name(generation));
        if names.contains(&journal_name(generation)) {
            let st = client.stat(&jpath).await.map_err(io)?;
            let held = if st.sealed {
                None
            } else {
                match client.open_append(&jpath).await {
                    Ok(f) => Some(f),
                    Err(cairn_client::Error::Meta(m)) if m.kind == ErrorKind::LeaseHeld => {
                        return Err(Error::Busy(name));
                    }
                    Err(e) => return Err(io(e)),
                }
            };
            let len = match &held {
                Some(f) => f.len(),
                None => st.length,
            };
            let bytes = if len == 0 {
                Vec::new()
            } else {
                client.read(&jpath, 0, len as usize).await.map_err(io)?
            };
            let (records, _) = replay(&bytes);
            report.journal_records = records.len();
            report.journal_bytes = len;
            for r in records {
                // Each record names every segment being appended to when it was written.
                covers.clear();
                for c in &r.changes {
                    match *c {
                        Change::Cover { seg, off } => covers.push((seg, off)),
                        _ => c.apply(&mut map),
                    }
                }
                seq = seq.max(r.seq);
            }
            if let Some(f) = held {
                f.seal().await.map_err(io)?;
            }
        }
        // The batches appended after what the last record covers: their segments sealed
        // (a server that lost the volume writes no more), read, and mapped in batch order.
        let mut tail = Vec::new();
        for &(seg, off) in &covers {
            let path = format!("{dir}/{}", seg_name(seg));
            let (batches, bytes) = read_tail(&client, &path, off, meta.block_size)
                .await
                .map_err(|e| match e {
                    TailError::Busy => Error::Busy(name.clone()),
                    TailError::Io(e) => io(e),
                })?;
            report.tail_segments += 1;
            report.tail_bytes += bytes;
            tail.extend(batches.into_iter().map(|(b, at)| (b, seg, at)));
        }
        tail.sort_by_key(|(b, _, _)| b.seq);
        report.tail_batches = tail.len();
        for (b, seg, mut at) in tail {
            if b.kind != BatchKind::Writes {
                continue;
            }
            for (lba, blocks) in b.extents {
                map.insert(lba, u64::from(blocks), seg, at);
                at += u64::from(blocks) * u64::from(meta.block_size);
            }
        }
        for p in torn {
            let _ = client.delete(&p).await;
        }
        // The snapshots' segments are pinned; files of snapshots no longer recorded go (only
        // the volume's server writes them, and that is this one now).
        let mut pinned = HashMap::new();
        for n in names.iter().filter(|n| n.starts_with("snap-")) {
            let path = format!("{dir}/{n}");
            let Some(snap) = meta
                .snapshots
                .iter()
                .find(|s| s.ready && snap_name(&s.id) == *n)
            else {
                if !meta.snapshots.iter().any(|s| snap_name(&s.id) == *n) {
                    let _ = client.delete(&path).await;
                }
                continue;
            };
            let ck = read_all(&client, &path).await.map_err(io).and_then(|b| {
                Checkpoint::decode(&b).map_err(|e| {
                    Error::Corrupt(name.clone(), format!("snapshot {}: {e}", snap.name))
                })
            })?;
            pinned.insert(snap.id.clone(), own_segments(&ck.map));
        }
        if let Some(s) = meta
            .snapshots
            .iter()
            .find(|s| s.ready && !pinned.contains_key(&s.id))
        {
            return Err(Error::Corrupt(
                name.clone(),
                format!(
                    "snapshot {}: its file {} is missing",
                    s.name,
                    snap_name(&s.id)
                ),
            ));
        }
        // The next checkpoint, then the next journal (created: a second opener racing this
        // one finds it exists and is refused).
        let next = generation + 1;
        let ckpt = Checkpoint {
            seq,
            block_size: meta.block_size,
            map,
            covers: Vec::new(),
        };
        write_file(
            &client,
            &format!("{dir}/{}", ckpt_name(next)),
            &ckpt.encode(),
        )
        .await
        .map_err(|e| busy_or(&name, e))?;
        let journal = client
            .create(
                &format!("{dir}/{}", journal_name(next)),
                CreateOptions::default(),
            )
            .await
            .map_err(|e| busy_or(&name, e))?;
        for n in &names {
            let old = numbered(n, "journal-")
                .or_else(|| numbered(n, "ckpt-"))
                .is_some_and(|g| g <= generation);
            if old {
                let _ = client.delete(&format!("{dir}/{n}")).await;
            }
        }
        let next_seg = names
            .iter()
            .filter_map(|n| numbered(n, "seg-"))
            .max()
            .map_or(1, |m| m + 1);
        report.millis = began.elapsed().as_millis() as u64;
        let vol = Arc::new(Self {
            client,
            dir,
            opts: opts.clone(),
            state: Mutex::new(State {
                map: ckpt.map,
                pending: Vec::new(),
                covers: BTreeMap::new(),
                unbatched: false,
            }),
            journal: tokio::sync::Mutex::new(Journal {
                file: Some(journal),
                generation: next,
                seq,
                bytes: 0,
            }),
            queue: Mutex::new(None),
            lanes: Mutex::new(Vec::new()),
            next_seg: Arc::new(AtomicU64::new(next_seg)),
            size: AtomicU64::new(meta.size),
            pinned: Mutex::new(pinned),
            active: Mutex::new(HashSet::new()),
            tasks: Mutex::new(Vec::new()),
            failed: Mutex::new(None),
            batch_seq: AtomicU64::new(1),
            writing: Mutex::new(BTreeMap::new()),
            written_one: Notify::new(),
            stats: VolumeStats::default(),
            opened: report,
            meta,
        });
        // Snapshots asked for while nobody served the volume are taken now.
        let pending: Vec<Snapshot> = vol
            .meta
            .snapshots
            .iter()
            .filter(|s| !s.ready)
            .cloned()
            .collect();
        for s in &pending {
            // One that fails is taken by the poller (the snapshot stays asked for).
            if let Err(e) = vol.take_snapshot(s).await {
                tracing::warn!(volume = %vol.meta.name, snapshot = %s.name, error = %e, "snapshot failed; trying again");
            }
        }
        let (tx, rx) = mpsc::channel::<WriteReq>(1024);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let lanes = (0..opts.lanes.max(1))
            .map(|_| tokio::spawn(vol.clone().lane(rx.clone())))
            .collect();
        *vol.queue.lock() = Some(tx);
        *vol.lanes.lock() = lanes;
        let mut tasks = vec![tokio::spawn(vol.clone().poll())];
        if let Some(every) = opts.gc_every {
            tasks.push(tokio::spawn(vol.clone().collector(every)));
        }
        *vol.tasks.lock() = tasks;
        Ok(vol)
    }

    pub fn meta(&self) -> &VolumeMeta {
        &self.meta
    }

    pub fn block_size(&self) -> u64 {
        u64::from(self.meta.block_size)
    }

    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    /// Runs in the index.
    pub fn index_runs(&self) -> usize {
        self.state.lock().map.len()
    }

    fn check(&self) -> Result<()> {
        match &*self.failed.lock() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn fail(&self, e: Error) -> Error {
        let mut f = self.failed.lock();
        if f.is_none() {
            tracing::error!(volume = %self.meta.name, error = %e, "volume stops serving");
            *f = Some(e.clone());
        }
        e
    }

    /// The blocks of `offset..offset+len` (bytes; block-aligned, inside the volume).
    fn blocks(&self, offset: u64, len: u64) -> Result<(u64, u64)> {
        let bs = self.block_size();
        if !offset.is_multiple_of(bs) || !len.is_multiple_of(bs) {
            return Err(Error::Invalid(format!(
                "{len} bytes at {offset}: not aligned to the block size {bs}"
            )));
        }
        let size = self.size();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::Invalid(format!(
                "{len} bytes at {offset}: past the end of the volume ({size} bytes)"
            )));
        }
        Ok((offset / bs, len / bs))
    }

    /// Reads `len` bytes at `offset`; blocks never written read as zeros.
    ///
    /// # Errors
    /// Misaligned or out of range ([`Error::Invalid`]); the cluster failed.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes> {
        self.check()?;
        let (lba, blocks) = self.blocks(offset, len)?;
        let mut pieces = self.state.lock().map.lookup(lba, blocks);
        let mut tries = 0;
        loop {
            match self.read_pieces(&pieces, len).await {
                Ok(out) => return Ok(out),
                Err(e) => {
                    // Garbage collection may have moved the blocks and deleted the segment
                    // the lookup named: read again where they are now.
                    let now = self.state.lock().map.lookup(lba, blocks);
                    tries += 1;
                    if now == pieces || tries >= 4 {
                        return Err(e);
                    }
                    pieces = now;
                }
            }
        }
    }

    /// The pieces' bytes: one mapped piece is the client's buffer as it came (no copy);
    /// several are read `READ_AHEAD` at a time and joined.
    async fn read_pieces(&self, pieces: &[crate::extent::Piece], len: u64) -> Result<Bytes> {
        let mut parts = Vec::with_capacity(pieces.len());
        for group in pieces.chunks(READ_AHEAD) {
            parts.extend(
                futures::future::try_join_all(group.iter().map(|p| self.read_piece(p))).await?,
            );
        }
        if parts.len() == 1 {
            return Ok(parts.pop().expect("one"));
        }
        let mut out = BytesMut::with_capacity(len as usize);
        for p in parts {
            out.extend_from_slice(&p);
        }
        Ok(out.freeze())
    }

    async fn read_piece(&self, p: &crate::extent::Piece) -> Result<Bytes> {
        let n = (p.blocks * self.block_size()) as usize;
        match p.at {
            None => Ok(Bytes::from(vec![0u8; n])),
            Some((seg, off)) => {
                let path = self.seg_path(seg)?;
                self.client
                    .read_acknowledged(&path, off, n)
                    .await
                    .map(Bytes::from)
                    .map_err(|e| Error::Io(self.meta.name.clone(), e.to_string()))
            }
        }
    }

    /// The file of segment `seg` (own, or an ancestor's for a clone).
    fn seg_path(&self, seg: u64) -> Result<String> {
        let dir = match seg_origin(seg) {
            0 => self.dir.clone(),
            k => match self.meta.lineage.get(k as usize - 1) {
                Some(id) => volume_dir(id),
                None => {
                    return Err(Error::Corrupt(
                        self.meta.name.clone(),
                        format!("segment {seg:#x} of an ancestor the volume does not have"),
                    ));
                }
            },
        };
        Ok(format!("{dir}/{}", seg_name(seg)))
    }

    /// Writes `data` at `offset`; durable once answered (its batch names its blocks); with
    /// `fua`, trims noted before it are journaled too.
    ///
    /// # Errors
    /// As [`Volume::read`]; the volume was fenced.
    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<()> {
        self.check()?;
        let (lba, blocks) = self.blocks(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let n = data.len() as u64;
        let _writing = self.start_writing(lba, lba + blocks).await;
        let (done, rx) = oneshot::channel();
        let queue = self.queue.lock().clone();
        let Some(queue) = queue else {
            return Err(Error::Closed(self.meta.name.clone()));
        };
        queue
            .send(WriteReq { lba, data, done })
            .await
            .map_err(|_| Error::Closed(self.meta.name.clone()))?;
        rx.await
            .map_err(|_| Error::Closed(self.meta.name.clone()))??;
        self.stats.written.fetch_add(n, Ordering::Relaxed);
        metrics::counter!("cairn_block_written_bytes_total").increment(n);
        if fua {
            self.flush().await?;
        }
        Ok(())
    }

    /// Waits until no write in flight overlaps `lba..end`, then holds that range until the
    /// guard goes.
    async fn start_writing(&self, lba: u64, end: u64) -> Writing<'_> {
        loop {
            let written = self.written_one.notified();
            tokio::pin!(written);
            written.as_mut().enable();
            {
                let mut w = self.writing.lock();
                // Ranges held are disjoint: only the last one starting before `end` can
                // overlap.
                let clash = w.range(..end).next_back().is_some_and(|(_, &e)| e > lba);
                if !clash {
                    w.insert(lba, end);
                    return Writing { vol: self, lba };
                }
            }
            written.await;
        }
    }

    /// Drops `len` bytes at `offset` (TRIM, WRITE_ZEROES): they read as zeros.
    ///
    /// # Errors
    /// As [`Volume::write`].
    pub async fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.check()?;
        let (lba, blocks) = self.blocks(offset, len)?;
        {
            let mut st = self.state.lock();
            // Changes are at most u32::MAX blocks each.
            let mut at = lba;
            while at < lba + blocks {
                let n = (lba + blocks - at).min(u64::from(u32::MAX));
                st.map.punch(at, n);
                st.pending.push(Change::Trim {
                    lba: at,
                    blocks: n as u32,
                });
                at += n;
            }
            st.unbatched = true;
        }
        if fua {
            self.flush().await?;
        }
        Ok(())
    }

    /// Makes every write and trim completed before it durable. A write is, once answered
    /// (its batch names its blocks); trims since the last record are journaled.
    ///
    /// # Errors
    /// The journal append failed: the volume stops serving (its lease may be lost).
    pub async fn flush(&self) -> Result<()> {
        self.check()?;
        // Taken even when there is nothing to journal: a rotation under way (a checkpoint
        // and a new journal) finishes first.
        let mut j = self.journal.lock().await;
        self.check()?;
        if !self.state.lock().unbatched {
            return Ok(());
        }
        self.record_locked(&mut j, false).await
    }

    /// Journals the index changes since the last record (with `force`, a record even when
    /// there are none: the segments being appended to changed).
    ///
    /// # Errors
    /// As [`Volume::flush`].
    async fn record(&self, force: bool) -> Result<()> {
        self.check()?;
        let mut j = self.journal.lock().await;
        self.check()?;
        self.record_locked(&mut j, force).await
    }

    async fn record_locked(&self, j: &mut Journal, force: bool) -> Result<()> {
        let changes = {
            let mut st = self.state.lock();
            if st.pending.is_empty() && !force {
                return Ok(());
            }
            st.unbatched = false;
            let mut c = std::mem::take(&mut st.pending);
            c.extend(
                st.covers
                    .iter()
                    .map(|(&seg, &off)| Change::Cover { seg, off }),
            );
            c
        };
        let rec = Record {
            seq: j.seq + 1,
            changes,
        }
        .encode();
        let Some(file) = j.file.as_mut() else {
            return Err(Error::Closed(self.meta.name.clone()));
        };
        if let Err(e) = file.append(&rec).await {
            return Err(self.fail(fenced_or_io(&self.meta.name, e)));
        }
        j.seq += 1;
        j.bytes += rec.len() as u64;
        self.stats.records.fetch_add(1, Ordering::Relaxed);
        if j.bytes >= self.opts.journal_bytes {
            self.rotate(j).await?;
        }
        Ok(())
    }

    /// A checkpoint of the whole index, then a new journal; the old journal and checkpoint
    /// go.
    async fn rotate(&self, j: &mut Journal) -> Result<()> {
        let (map, covers) = {
            let mut st = self.state.lock();
            // Pending changes are in the map copied: the checkpoint holds them.
            st.pending.clear();
            st.unbatched = false;
            let covers = st.covers.iter().map(|(&s, &o)| (s, o)).collect();
            (st.map.clone(), covers)
        };
        let next = j.generation + 1;
        let ckpt = Checkpoint {
            seq: j.seq,
            block_size: self.meta.block_size,
            map,
            covers,
        };
        let r: Result<FlatLogFile> = async {
            write_file(
                &self.client,
                &format!("{}/{}", self.dir, ckpt_name(next)),
                &ckpt.encode(),
            )
            .await
            .map_err(|e| busy_or(&self.meta.name, e))?;
            self.client
                .create(
                    &format!("{}/{}", self.dir, journal_name(next)),
                    CreateOptions::default(),
                )
                .await
                .map_err(|e| busy_or(&self.meta.name, e))
        }
        .await;
        let file = r.map_err(|e| self.fail(e))?;
        if let Some(old) = j.file.replace(file) {
            let _ = old.seal().await;
        }
        for p in [journal_name(j.generation), ckpt_name(j.generation)] {
            let _ = self.client.delete(&format!("{}/{p}", self.dir)).await;
        }
        j.generation = next;
        j.bytes = 0;
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Flushes, stops the lanes and seals the volume's open files (the lease goes back).
    ///
    /// # Errors
    /// The final flush failed.
    pub async fn close(&self) -> Result<()> {
        let tasks = std::mem::take(&mut *self.tasks.lock());
        for t in tasks {
            t.abort();
            let _ = t.await;
        }
        let r = self.record(false).await;
        self.queue.lock().take();
        let lanes = std::mem::take(&mut *self.lanes.lock());
        for l in lanes {
            let _ = l.await;
        }
        let mut j = self.journal.lock().await;
        if let Some(f) = j.file.take() {
            let _ = f.seal().await;
        }
        *self.failed.lock() = Some(Error::Closed(self.meta.name.clone()));
        r
    }

    /// One lane: takes the writes waiting, appends them as one batch to its segment, maps
    /// them in the index and answers them.
    async fn lane(self: Arc<Self>, rx: Arc<tokio::sync::Mutex<mpsc::Receiver<WriteReq>>>) {
        let mut seg: Option<(u64, FlatLogFile)> = None;
        loop {
            let batch = {
                let mut rx = rx.lock().await;
                let Some(first) = rx.recv().await else { break };
                let mut size = first.data.len();
                let mut batch = vec![first];
                while size < self.opts.max_batch {
                    match rx.try_recv() {
                        Ok(w) => {
                            size += w.data.len();
                            batch.push(w);
                        }
                        Err(_) => break,
                    }
                }
                batch
            };
            if let Err(e) = self.check() {
                for w in batch {
                    let _ = w.done.send(Err(e.clone()));
                }
                continue;
            }
            let r = self.append_batch(&mut seg, &batch).await;
            match r {
                Ok((n, start, end)) => {
                    let bs = self.block_size();
                    let mut st = self.state.lock();
                    st.covers.insert(n, end);
                    let mut off = start;
                    for w in &batch {
                        let blocks = w.data.len() as u64 / bs;
                        st.map.insert(w.lba, blocks, n, off);
                        st.pending.push(Change::Map {
                            lba: w.lba,
                            blocks: blocks as u32,
                            seg: n,
                            off,
                        });
                        off += w.data.len() as u64;
                    }
                    drop(st);
                    for w in batch {
                        let _ = w.done.send(Ok(()));
                    }
                }
                Err(e) => {
                    // The segment is given up; the next batch starts a new one.
                    if let Some((n, f)) = seg.take() {
                        drop(f);
                        self.state.lock().covers.remove(&n);
                        self.active.lock().remove(&n);
                    }
                    if matches!(e, Error::Fenced(..)) {
                        self.fail(e.clone());
                    }
                    for w in batch {
                        let _ = w.done.send(Err(e.clone()));
                    }
                }
            }
        }
        if let Some((n, f)) = seg.take() {
            let _ = f.seal().await;
            self.state.lock().covers.remove(&n);
            self.active.lock().remove(&n);
        }
    }

    /// Appends `batch` to the lane's segment (a new one when there is none or it is full)
    /// behind a header naming its blocks; returns the segment, the offset its data starts
    /// at and where it ends.
    async fn append_batch(
        &self,
        seg: &mut Option<(u64, FlatLogFile)>,
        batch: &[WriteReq],
    ) -> Result<(u64, u64, u64)> {
        let bs = self.block_size();
        let extents = batch
            .iter()
            .map(|w| (w.lba, (w.data.len() as u64 / bs) as u32))
            .collect();
        let data: Vec<&[u8]> = batch.iter().map(|w| &w.data[..]).collect();
        self.append_to(seg, BatchKind::Writes, extents, &data).await
    }

    /// Appends a batch of `kind` holding `data` (its `extents`) to `seg` (a new segment
    /// when there is none or it is full); returns the segment, the offset the data starts
    /// at and where the batch ends.
    async fn append_to(
        &self,
        seg: &mut Option<(u64, FlatLogFile)>,
        kind: BatchKind,
        extents: Vec<(u64, u32)>,
        data: &[&[u8]],
    ) -> Result<(u64, u64, u64)> {
        let io = |e: cairn_client::Error| fenced_or_io(&self.meta.name, e);
        if seg
            .as_ref()
            .is_some_and(|(_, f)| f.len() >= self.opts.segment_bytes)
        {
            let (n, f) = seg.take().expect("checked");
            let _ = f.seal().await;
            self.state.lock().covers.remove(&n);
            self.active.lock().remove(&n);
        }
        if seg.is_none() {
            let policy = match self.meta.policy.as_str() {
                "" => None,
                p => Some(
                    p.parse()
                        .map_err(|e| Error::Invalid(format!("volume policy {p:?}: {e}")))?,
                ),
            };
            loop {
                let n = self.next_seg.fetch_add(1, Ordering::Relaxed);
                let path = format!("{}/{}", self.dir, seg_name(n));
                let opts = CreateOptions {
                    policy,
                    ..CreateOptions::default()
                };
                // Listed active before it exists: the collector never takes it.
                self.active.lock().insert(n);
                match self.client.create(&path, opts).await {
                    Ok(f) => {
                        // Journaled before its first batch: a reopening server seals and
                        // reads every segment that may hold batches no record covers (and
                        // a server that lost the volume cannot start one unnoticed).
                        self.state.lock().covers.insert(n, 0);
                        if let Err(e) = self.record(true).await {
                            self.state.lock().covers.remove(&n);
                            self.active.lock().remove(&n);
                            return Err(e);
                        }
                        *seg = Some((n, f));
                        break;
                    }
                    Err(cairn_client::Error::Meta(m)) if m.kind == ErrorKind::AlreadyExists => {
                        self.active.lock().remove(&n);
                    }
                    Err(e) => {
                        self.active.lock().remove(&n);
                        return Err(io(e));
                    }
                }
            }
        }
        let (n, f) = seg.as_mut().expect("made");
        let len: usize = data.iter().map(|d| d.len()).sum();
        let header = Batch {
            seq: self.batch_seq.fetch_add(1, Ordering::Relaxed),
            kind,
            extents,
        };
        let head = header.encode_parts(data);
        let mut b = BytesMut::with_capacity(head.len() + len);
        b.extend_from_slice(&head);
        for d in data {
            b.extend_from_slice(d);
        }
        let total = b.len() as u64;
        let start = f.append_bytes(b.freeze()).await.map_err(io)?;
        self.stats.appended.fetch_add(len as u64, Ordering::Relaxed);
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        Ok((*n, start + head.len() as u64, start + total))
    }
}

impl Volume {
    /// Takes snapshot `snap` (asked for at the masters): the index as it is now — every
    /// write answered so far, whose data is durable whether flushed or not — is written as
    /// `snap-ID` and its segments pinned; then the masters mark it ready.
    ///
    /// # Errors
    /// The cluster failed; the snapshot stays asked for (the poller tries again).
    pub async fn take_snapshot(&self, snap: &Snapshot) -> Result<()> {
        let io = |e: cairn_client::Error| Error::Io(self.meta.name.clone(), e.to_string());
        let ckpt = {
            let st = self.state.lock();
            // Pinned with the copy, under the lock the collector checks before deleting.
            self.pinned
                .lock()
                .insert(snap.id.clone(), own_segments(&st.map));
            Checkpoint {
                seq: 0,
                block_size: self.meta.block_size,
                map: st.map.clone(),
                covers: Vec::new(),
            }
        };
        let path = format!("{}/{}", self.dir, snap_name(&snap.id));
        match write_file(&self.client, &path, &ckpt.encode()).await {
            Ok(()) => {}
            // Left by a crash of this or an earlier server between writing and marking:
            // kept if whole, else written again.
            Err(cairn_client::Error::Meta(m)) if m.kind == ErrorKind::AlreadyExists => {
                let whole = read_all(&self.client, &path)
                    .await
                    .ok()
                    .and_then(|b| Checkpoint::decode(&b).ok());
                match whole {
                    Some(c) => {
                        self.pinned
                            .lock()
                            .entry(snap.id.clone())
                            .or_default()
                            .extend(own_segments(&c.map));
                    }
                    None => {
                        self.client.delete(&path).await.map_err(io)?;
                        write_file(&self.client, &path, &ckpt.encode())
                            .await
                            .map_err(io)?;
                    }
                }
            }
            Err(e) => return Err(io(e)),
        }
        let op = ObjectOp::SnapshotReady {
            volume: self.meta.name.clone(),
            snapshot: snap.name.clone(),
        };
        self.client
            .masters()
            .object_op(&op)
            .await
            .map_err(|e| Error::Io(self.meta.name.clone(), e.to_string()))?
            .map_err(|e| Error::Io(self.meta.name.clone(), format!("snapshot ready: {e}")))?;
        self.stats.snapshots.fetch_add(1, Ordering::Relaxed);
        tracing::info!(volume = %self.meta.name, snapshot = %snap.name, runs = ckpt.map.len(), "snapshot taken");
        Ok(())
    }

    /// Reads the volume's record every `poll_every`: takes the snapshots asked for, unpins
    /// the deleted ones, grows to a new size, and stops serving a volume deleted.
    async fn poll(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.opts.poll_every).await;
            if self.check().is_err() {
                return;
            }
            // The index changes since the last record: a reopening server reads only the
            // batches after them.
            if let Err(e) = self.record(false).await {
                tracing::warn!(volume = %self.meta.name, error = %e, "journal record failed");
            }
            let q = ObjectQuery::Volume {
                name: self.meta.name.clone(),
            };
            let v = match self.client.masters().object_query(&q).await {
                Ok(Ok(QueryReply::Volume(v))) => v,
                Ok(Err(ObjectError::NoSuchVolume)) => {
                    self.fail(Error::Closed(self.meta.name.clone()));
                    return;
                }
                _ => continue,
            };
            if v.id != self.meta.id {
                self.fail(Error::Closed(self.meta.name.clone()));
                return;
            }
            self.size.fetch_max(v.size, Ordering::Relaxed);
            for s in v.snapshots.iter().filter(|s| !s.ready) {
                if let Err(e) = self.take_snapshot(s).await {
                    tracing::warn!(volume = %self.meta.name, snapshot = %s.name, error = %e, "snapshot failed; trying again");
                }
            }
            self.pinned
                .lock()
                .retain(|id, _| v.snapshots.iter().any(|s| s.id == *id));
        }
    }

    /// Garbage collection: every `every`, one pass.
    async fn collector(self: Arc<Self>, every: Duration) {
        let mut seg: Option<(u64, FlatLogFile)> = None;
        loop {
            tokio::time::sleep(every).await;
            if self.check().is_err() {
                return;
            }
            if let Err(e) = self.collect_pass(&mut seg).await {
                tracing::warn!(volume = %self.meta.name, error = %e, "garbage collection pass failed");
                if let Some((n, f)) = seg.take() {
                    drop(f);
                    self.state.lock().covers.remove(&n);
                    self.active.lock().remove(&n);
                }
            }
        }
    }

    /// One pass: the own segments that are sealed (or left open by a crashed server),
    /// neither being appended to nor named by a snapshot, with live bytes under
    /// `gc_live_pct` of their length, emptiest first: their live runs are copied into the
    /// collector's segment and remapped (where no write or trim came since), the changes
    /// journaled, then the segments deleted.
    ///
    /// # Errors
    /// The cluster failed; nothing was deleted that the index may still name.
    pub async fn collect_pass(&self, seg: &mut Option<(u64, FlatLogFile)>) -> Result<u64> {
        let io = |e: cairn_client::Error| Error::Io(self.meta.name.clone(), e.to_string());
        let listing = self.client.list(&self.dir).await.map_err(io)?;
        let live = self.state.lock().map.live_bytes();
        let pinned: BTreeSet<u64> = self.pinned.lock().values().flatten().copied().collect();
        let active = self.active.lock().clone();
        let mut candidates: Vec<(u64, u64, u64, bool)> = listing
            .iter()
            .filter_map(|e| {
                let n = numbered(&e.name, "seg-")?;
                let l = live.get(&n).copied().unwrap_or(0);
                let sparse = l == 0
                    || l.saturating_mul(100)
                        < e.length.saturating_mul(u64::from(self.opts.gc_live_pct));
                let take = !active.contains(&n) && !pinned.contains(&n) && sparse;
                take.then_some((n, l, e.length, e.sealed))
            })
            .collect();
        // Emptiest first.
        candidates.sort_by(|a, b| (a.1 * b.2.max(1)).cmp(&(b.1 * a.2.max(1))));
        // Their runs, in one pass over the index (runs written over meanwhile are copied for
        // nothing: the remap keeps what was written since).
        let mut runs = {
            let segs: BTreeSet<u64> = candidates.iter().map(|c| c.0).collect();
            self.state.lock().map.runs_in(&segs)
        };
        let mut done = Vec::new();
        let mut copied = 0u64;
        let began = std::time::Instant::now();
        for (n, _, _, sealed) in candidates {
            let path = format!("{}/{}", self.dir, seg_name(n));
            if !sealed {
                // Left open by a server that crashed: sealed where its lease ended (refused
                // while another holds it).
                match self.client.open_append(&path).await {
                    Ok(f) => {
                        f.seal().await.map_err(io)?;
                    }
                    Err(_) => continue,
                }
            }
            let bs = self.block_size();
            // The live runs as pieces of at most one batch, in segment order; neighbours are
            // read as one span (at most GC_SPAN bytes) and appended as one batch, so a
            // segment left in many small runs by random writes costs few round trips.
            let step = (self.opts.max_batch as u64 / bs).max(1);
            let mut pieces: Vec<(u64, u64, u64)> = Vec::new();
            for (lba, r) in runs.remove(&n).unwrap_or_default() {
                let mut i = 0;
                while i < r.blocks {
                    let k = step.min(r.blocks - i);
                    pieces.push((lba + i, k, r.off.wrapping_add(i * bs)));
                    i += k;
                }
            }
            pieces.sort_by_key(|p| p.2);
            let mut i = 0;
            while i < pieces.len() {
                let first = pieces[i].2;
                let mut j = i;
                let mut live = 0;
                while let Some(&(_, k, off)) = pieces.get(j) {
                    let end = off.saturating_add(k * bs);
                    if j > i
                        && (end.saturating_sub(first) > GC_SPAN
                            || live + k * bs > self.opts.max_batch as u64)
                    {
                        break;
                    }
                    live += k * bs;
                    j += 1;
                }
                let group = &pieces[i..j];
                let (_, lk, loff) = group[group.len() - 1];
                let span = loff.saturating_add(lk * bs).saturating_sub(first);
                let data = self
                    .client
                    .read(&path, first, span as usize)
                    .await
                    .map_err(io)?;
                let parts: Vec<&[u8]> = group
                    .iter()
                    .map(|&(_, k, off)| {
                        let at = (off - first) as usize;
                        &data[at..at + (k * bs) as usize]
                    })
                    .collect();
                let (to_seg, to, end) = self
                    .append_to(seg, BatchKind::Copies, Vec::new(), &parts)
                    .await?;
                copied += live;
                {
                    let mut st = self.state.lock();
                    st.covers.insert(to_seg, end);
                    st.unbatched = true;
                    let mut at = to;
                    for &(lba, k, off) in group {
                        for (l, b, s2, o) in st.map.remap(lba, k, (n, off), (to_seg, at)) {
                            st.pending.push(Change::Map {
                                lba: l,
                                blocks: b as u32,
                                seg: s2,
                                off: o,
                            });
                        }
                        at += k * bs;
                    }
                }
                i = j;
                // The rate cap, on average over the pass.
                let due = Duration::from_secs_f64(
                    copied as f64 / self.opts.gc_bytes_per_sec.max(1) as f64,
                );
                if let Some(wait) = due.checked_sub(began.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
            done.push(n);
        }
        if done.is_empty() {
            return Ok(0);
        }
        // The copies are durable (acknowledged appends); the journal now says where.
        self.flush().await?;
        // What the index still names or a snapshot pins, taken under the index's lock, which
        // a snapshot also takes to pin: a segment no longer named by the index cannot be
        // named by a snapshot taken after.
        let keep = {
            let st = self.state.lock();
            let mut keep = own_segments(&st.map);
            keep.extend(self.pinned.lock().values().flatten());
            keep
        };
        let mut deleted = 0;
        for n in done.into_iter().filter(|n| !keep.contains(n)) {
            self.client
                .delete(&format!("{}/{}", self.dir, seg_name(n)))
                .await
                .map_err(io)?;
            deleted += 1;
        }
        self.stats.gc_bytes.fetch_add(copied, Ordering::Relaxed);
        self.stats.gc_segments.fetch_add(deleted, Ordering::Relaxed);
        metrics::counter!("cairn_block_gc_bytes_total").increment(copied);
        metrics::counter!("cairn_block_gc_segments_total").increment(deleted);
        tracing::info!(volume = %self.meta.name, copied, deleted, "garbage collection pass");
        Ok(deleted)
    }
}

/// The volume's own segments a map names.
fn own_segments(map: &ExtentMap) -> BTreeSet<u64> {
    map.iter()
        .map(|(_, r)| r.seg)
        .filter(|&s| seg_origin(s) == 0)
        .collect()
}

/// A clone's first index: the snapshot's, its segments named one generation further.
///
/// # Errors
/// The lineage would be deeper than a segment id can say.
pub fn clone_checkpoint(snapshot: &Checkpoint) -> std::result::Result<Checkpoint, String> {
    let mut map = ExtentMap::new(snapshot.block_size);
    for (lba, r) in snapshot.map.iter() {
        let seg = seg_from_child(r.seg).ok_or("clones nest too deep")?;
        map.insert(lba, r.blocks, seg, r.off);
    }
    Ok(Checkpoint {
        seq: 0,
        block_size: snapshot.block_size,
        map,
        covers: Vec::new(),
    })
}

/// Writes a clone's first checkpoint (`ckpt-1`) into its directory, from its parent's
/// snapshot file: the clone opens with the snapshot's contents and no data copied.
///
/// # Errors
/// The snapshot's file is unreadable or damaged; the cluster failed.
pub async fn write_clone(
    client: &Client,
    parent_id: &str,
    snapshot_id: &str,
    clone_id: &str,
) -> std::result::Result<usize, String> {
    let path = format!("{}/{}", volume_dir(parent_id), snap_name(snapshot_id));
    let b = read_all(client, &path)
        .await
        .map_err(|e| format!("{path}: {e}"))?;
    let snap = Checkpoint::decode(&b).map_err(|e| format!("{path}: {e}"))?;
    let ck = clone_checkpoint(&snap)?;
    let dir = volume_dir(clone_id);
    client
        .mkdir(&dir, true)
        .await
        .map_err(|e| format!("{dir}: {e}"))?;
    write_file(client, &format!("{dir}/{}", ckpt_name(1)), &ck.encode())
        .await
        .map_err(|e| format!("{dir}: {e}"))?;
    Ok(ck.map.len())
}

fn fenced_or_io(name: &str, e: cairn_client::Error) -> Error {
    let lost = match &e {
        cairn_client::Error::Meta(m) => matches!(m.kind, ErrorKind::LeaseLost | ErrorKind::Sealed),
        // The writer reports a lease its renewal lost as text (FlatLogFile::check).
        cairn_client::Error::Writer(m) => m.ends_with("write lease lost"),
        _ => false,
    };
    if lost {
        Error::Fenced(name.into(), e.to_string())
    } else {
        Error::Io(name.into(), e.to_string())
    }
}

/// A create that finds the file there means another server is opening the volume.
fn busy_or(name: &str, e: cairn_client::Error) -> Error {
    match &e {
        cairn_client::Error::Meta(m) if m.kind == ErrorKind::AlreadyExists => {
            Error::Busy(name.into())
        }
        _ => Error::Io(name.into(), e.to_string()),
    }
}

/// A whole small file.
async fn read_all(
    client: &Client,
    path: &str,
) -> std::result::Result<Vec<u8>, cairn_client::Error> {
    let st = client.stat(path).await?;
    if st.length == 0 {
        return Ok(Vec::new());
    }
    client.read(path, 0, st.length as usize).await
}

/// Creates `path` with `body` and seals it.
async fn write_file(
    client: &Client,
    path: &str,
    body: &[u8],
) -> std::result::Result<(), cairn_client::Error> {
    let mut f = client.create(path, CreateOptions::default()).await?;
    f.append(body).await?;
    f.seal().await?;
    Ok(())
}

/// A range of blocks being written (see [`Volume::start_writing`]).
struct Writing<'a> {
    vol: &'a Volume,
    lba: u64,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.vol.writing.lock().remove(&self.lba);
        self.vol.written_one.notify_waiters();
    }
}

enum TailError {
    Busy,
    Io(cairn_client::Error),
}

/// Pieces of one read (of a fragmented range) read at once.
const READ_AHEAD: usize = 16;

/// Bytes of a segment's tail read at once when reopening.
const TAIL_READ: usize = 8 << 20;

/// Seals segment `path` (taking its lease once the server that wrote it has lost it) and
/// reads its whole batches from byte `from` on, each with the segment offset its data
/// starts at; and the bytes read. A torn batch at the end (never answered) ends it.
async fn read_tail(
    client: &Client,
    path: &str,
    from: u64,
    block_size: u32,
) -> std::result::Result<(Vec<(Batch, u64)>, u64), TailError> {
    let st = match client.stat(path).await {
        Ok(st) => st,
        // Deleted by the collector after a record that no longer names it.
        Err(cairn_client::Error::Meta(m)) if m.kind == ErrorKind::NotFound => {
            return Ok((Vec::new(), 0));
        }
        Err(e) => return Err(TailError::Io(e)),
    };
    let len = if st.sealed {
        st.length
    } else {
        // Its writer's lease runs out at most one renewal period after the journal's (a
        // segment created after the last renewal got a fresh lease); 10 s are waited for
        // before the open is refused as busy.
        let mut tries = 0;
        loop {
            match client.open_append(path).await {
                Ok(f) => {
                    let len = f.len();
                    f.seal().await.map_err(TailError::Io)?;
                    break len;
                }
                Err(cairn_client::Error::Meta(m)) if m.kind == ErrorKind::LeaseHeld => {
                    tries += 1;
                    if tries > 40 {
                        return Err(TailError::Busy);
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(TailError::Io(e)),
            }
        }
    };
    let mut out = Vec::new();
    let mut at = from;
    let mut want = TAIL_READ;
    let mut read = 0u64;
    while at < len {
        let n = want.min((len - at) as usize);
        let b = client.read(path, at, n).await.map_err(TailError::Io)?;
        read += b.len() as u64;
        let (batches, used, bad) = scan_batches(&b, block_size);
        out.extend(batches.into_iter().map(|(x, d)| (x, at + d as u64)));
        at += used as u64;
        if bad {
            break;
        }
        if used == 0 {
            // The batch at `at` is longer than what was read: cut short by the segment's
            // end (a torn batch), or longer than any written, or read again with more.
            if n as u64 == len - at || want >= MAX_TAIL_BATCH {
                break;
            }
            want = (want * 2).min(MAX_TAIL_BATCH);
        } else {
            want = TAIL_READ;
        }
    }
    Ok((out, read))
}

/// The longest batch (header and data) a tail read looks for.
const MAX_TAIL_BATCH: usize = crate::journal::MAX_BATCH_DATA
    + crate::journal::BATCH_HEADER * 2
    + (crate::journal::MAX_BATCH_DATA / 512) * crate::journal::BATCH_EXTENT;
