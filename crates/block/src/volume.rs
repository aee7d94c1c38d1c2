//! A volume open for serving (docs/block.md): writes are appended to segment files by a few
//! lanes, each batching the writes waiting for it into one append; the index lives in memory
//! and reaches the journal at every FLUSH; a checkpoint of the whole index starts each new
//! journal.
//!
//! Files of volume ID, under `/.block/ID/`: `seg-N` (data), `journal-G` (index changes since
//! checkpoint G), `ckpt-G` (the index as journal G−1 left it). Opening a volume takes the
//! writer lease of its current journal (another server serving it is refused), replays the
//! journal on the newest whole checkpoint, writes the next checkpoint and starts the next
//! journal: it reads the index, never the data.

use crate::extent::ExtentMap;
use crate::journal::{Change, Checkpoint, Record, replay};
use bytes::{Bytes, BytesMut};
use cairn_client::{Client, CreateOptions, FlatLogFile};
use cairn_rpc::ErrorKind;
use cairn_rpc::object::Volume as VolumeMeta;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{mpsc, oneshot};

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
}

impl Default for VolumeOptions {
    fn default() -> Self {
        Self {
            lanes: 4,
            segment_bytes: 128 << 20,
            max_batch: 1 << 20,
            journal_bytes: 16 << 20,
        }
    }
}

/// Where volume `id`'s files live.
pub fn volume_dir(id: &str) -> String {
    format!("/.block/{id}")
}

fn seg_name(n: u64) -> String {
    format!("seg-{n:08}")
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
    /// Set once the volume cannot go on (fenced, or the journal failed): every call fails.
    failed: Mutex<Option<Error>>,
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
            },
        ));
        report.checkpoint_runs = ckpt.map.len();
        let mut map = ckpt.map;
        let mut seq = ckpt.seq;
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
                for c in &r.changes {
                    c.apply(&mut map);
                }
                seq = seq.max(r.seq);
            }
            if let Some(f) = held {
                f.seal().await.map_err(io)?;
            }
        }
        for p in torn {
            let _ = client.delete(&p).await;
        }
        // The next checkpoint, then the next journal (created: a second opener racing this
        // one finds it exists and is refused).
        let next = generation + 1;
        let ckpt = Checkpoint {
            seq,
            block_size: meta.block_size,
            map,
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
            failed: Mutex::new(None),
            stats: VolumeStats::default(),
            opened: report,
            meta,
        });
        let (tx, rx) = mpsc::channel::<WriteReq>(1024);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let lanes = (0..opts.lanes.max(1))
            .map(|_| tokio::spawn(vol.clone().lane(rx.clone())))
            .collect();
        *vol.queue.lock() = Some(tx);
        *vol.lanes.lock() = lanes;
        Ok(vol)
    }

    pub fn meta(&self) -> &VolumeMeta {
        &self.meta
    }

    pub fn block_size(&self) -> u64 {
        u64::from(self.meta.block_size)
    }

    pub fn size(&self) -> u64 {
        self.meta.size
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
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.meta.size)
        {
            return Err(Error::Invalid(format!(
                "{len} bytes at {offset}: past the end of the volume ({} bytes)",
                self.meta.size
            )));
        }
        Ok((offset / bs, len / bs))
    }

    /// Reads `len` bytes at `offset`; blocks never written read as zeros.
    ///
    /// # Errors
    /// Misaligned or out of range ([`Error::Invalid`]); the cluster failed.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.check()?;
        let (lba, blocks) = self.blocks(offset, len)?;
        let pieces = self.state.lock().map.lookup(lba, blocks);
        let bs = self.block_size();
        let mut out = Vec::with_capacity(len as usize);
        for p in pieces {
            let n = (p.blocks * bs) as usize;
            match p.at {
                None => out.resize(out.len() + n, 0),
                Some((seg, off)) => {
                    let path = format!("{}/{}", self.dir, seg_name(seg));
                    let b = self
                        .client
                        .read_acknowledged(&path, off, n)
                        .await
                        .map_err(|e| Error::Io(self.meta.name.clone(), e.to_string()))?;
                    out.extend_from_slice(&b);
                }
            }
        }
        Ok(out)
    }

    /// Writes `data` at `offset`; durable at the next [`Volume::flush`] (or at once with
    /// `fua`).
    ///
    /// # Errors
    /// As [`Volume::read`]; the volume was fenced.
    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<()> {
        self.check()?;
        let (lba, _) = self.blocks(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let n = data.len() as u64;
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
        if fua {
            self.flush().await?;
        }
        Ok(())
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
        }
        if fua {
            self.flush().await?;
        }
        Ok(())
    }

    /// Makes every write completed before it durable: the index changes since the last
    /// record go to the journal as one record.
    ///
    /// # Errors
    /// The journal append failed: the volume stops serving (its lease may be lost).
    pub async fn flush(&self) -> Result<()> {
        self.check()?;
        let mut j = self.journal.lock().await;
        self.check()?;
        let changes = std::mem::take(&mut self.state.lock().pending);
        if changes.is_empty() {
            return Ok(());
        }
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
            self.rotate(&mut j).await?;
        }
        Ok(())
    }

    /// A checkpoint of the whole index, then a new journal; the old journal and checkpoint
    /// go.
    async fn rotate(&self, j: &mut Journal) -> Result<()> {
        let map = {
            let mut st = self.state.lock();
            // Pending changes are in the map copied: the checkpoint holds them.
            st.pending.clear();
            st.map.clone()
        };
        let next = j.generation + 1;
        let ckpt = Checkpoint {
            seq: j.seq,
            block_size: self.meta.block_size,
            map,
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
        let r = self.flush().await;
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
                Ok((n, start)) => {
                    let bs = self.block_size();
                    let mut st = self.state.lock();
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
                    if let Some((_, f)) = seg.take() {
                        drop(f);
                    }
                    for w in batch {
                        let _ = w.done.send(Err(e.clone()));
                    }
                }
            }
        }
        if let Some((_, f)) = seg.take() {
            let _ = f.seal().await;
        }
    }

    /// Appends `batch` to the lane's segment (a new one when there is none or it is full);
    /// returns the segment and the offset the batch starts at.
    async fn append_batch(
        &self,
        seg: &mut Option<(u64, FlatLogFile)>,
        batch: &[WriteReq],
    ) -> Result<(u64, u64)> {
        let io = |e: cairn_client::Error| fenced_or_io(&self.meta.name, e);
        if seg
            .as_ref()
            .is_some_and(|(_, f)| f.len() >= self.opts.segment_bytes)
        {
            let (_, f) = seg.take().expect("checked");
            let _ = f.seal().await;
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
                match self.client.create(&path, opts).await {
                    Ok(f) => {
                        *seg = Some((n, f));
                        break;
                    }
                    Err(cairn_client::Error::Meta(m)) if m.kind == ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io(e)),
                }
            }
        }
        let (n, f) = seg.as_mut().expect("made");
        let data = if batch.len() == 1 {
            batch[0].data.clone()
        } else {
            let mut b = BytesMut::with_capacity(batch.iter().map(|w| w.data.len()).sum());
            for w in batch {
                b.extend_from_slice(&w.data);
            }
            b.freeze()
        };
        let len = data.len() as u64;
        let start = f.append_bytes(data).await.map_err(io)?;
        self.stats.appended.fetch_add(len, Ordering::Relaxed);
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        Ok((*n, start))
    }
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
