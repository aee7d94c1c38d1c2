//! The FlatLogFile API: the client that replicates appends itself.

use crate::data::{DataConn, Error as DataError};
use cairn_proto::frame::Status;
use cairn_rpc::{Masters, MetaError, pb};
use futures::future::join_all;
use lru::LruCache;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The masters refused or could not be reached (the kind says which).
    #[error(transparent)]
    Meta(#[from] MetaError),
    /// A chunkserver failed a request.
    #[error("chunkserver {server} ({addr}): {source}")]
    Data {
        server: u64,
        addr: String,
        source: DataError,
    },
    /// Every replica of a chunk failed a read.
    #[error("no replica of chunk {chunk} could serve the read; last error: {last}")]
    NoReplica { chunk: u64, last: String },
    #[error("read of {len} bytes at {offset} is past the end of {path} ({length} bytes)")]
    OutOfRange {
        path: String,
        offset: u64,
        len: u64,
        length: u64,
    },
    /// The writer can no longer append (an earlier append failed, the lease was lost, or the
    /// file was closed); open the file again to go on.
    #[error("{0}")]
    Writer(String),
    #[error("chunkserver {0} has no known address")]
    UnknownServer(u64),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// A chunk is sealed and the writer moves to the next one at this size (the chunk store's
    /// maximum chunk size; 64 MiB by default).
    pub chunk_size: u64,
    /// Largest single write to a chunkserver; longer appends are split into pieces this big.
    pub max_append: usize,
    /// Spare chunks asked for whenever chunks are allocated (the paper's prefetch).
    pub prefetch: u32,
    /// Files whose chunk lists are cached.
    pub cache_entries: usize,
    /// How long metadata calls keep trying through master elections.
    pub retry_for: Duration,
    /// How often a writer renews its lease.
    pub renew_every: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            chunk_size: 64 << 20,
            max_append: 4 << 20,
            prefetch: 1,
            cache_entries: 4096,
            retry_for: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
        }
    }
}

/// How a new file is made.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// Copies of every chunk.
    pub replicas: u32,
    pub compression: bool,
    /// Create missing parent directories.
    pub parents: bool,
}

impl Default for CreateOptions {
    fn default() -> Self {
        Self {
            replicas: 3,
            compression: false,
            parents: true,
        }
    }
}

/// What [`Client::stat`] says about a path.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FileStat {
    pub path: String,
    pub is_dir: bool,
    /// Readable bytes: sealed chunks plus what every replica of an open chunk holds.
    pub length: u64,
    pub chunks: usize,
    pub sealed: bool,
    pub replicas: u32,
    pub ctime_ms: u64,
    pub mtime_ms: u64,
    /// Who holds the write lease, if anyone.
    pub writer: Option<String>,
}

/// One entry of [`Client::list`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DirEntry {
    pub name: String,
    pub is_dir: bool,
    /// Bytes the master knows (sealed chunks and committed lengths).
    pub length: u64,
    pub chunks: u32,
    pub sealed: bool,
    pub mtime_ms: u64,
}

/// A file's chunk list as the client caches it.
#[derive(Debug, Clone)]
struct View {
    chunks: Vec<pb::ChunkMeta>,
}

/// A handle on the cluster. Cheap to clone; clones share connections and caches.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    masters: Masters,
    opts: ClientOptions,
    client_id: String,
    addrs: Mutex<HashMap<u64, String>>,
    conns: Mutex<HashMap<u64, Arc<DataConn>>>,
    /// Smoothed read latency per server (µs), to pick the replica to read from.
    latency: Mutex<HashMap<u64, f64>>,
    cache: Mutex<LruCache<String, Arc<View>>>,
    locate: Locator,
}

impl Client {
    /// A client of the cluster whose masters are at `masters` (any of them; the leader is
    /// found). Nothing is contacted until the first call.
    ///
    /// # Errors
    /// No master address, or an address that does not parse.
    pub async fn connect(masters: &[String]) -> Result<Self> {
        Self::with_options(masters, ClientOptions::default()).await
    }

    /// # Errors
    /// As [`Client::connect`].
    pub async fn with_options(masters: &[String], opts: ClientOptions) -> Result<Self> {
        let m = Masters::new(masters)?.retry_for(opts.retry_for);
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        let client_id = format!(
            "{}-{}-{:08x}",
            host.trim(),
            std::process::id(),
            rand::random::<u32>()
        );
        let cache = NonZeroUsize::new(opts.cache_entries.max(1)).expect("non-zero");
        Ok(Self {
            inner: Arc::new(Inner {
                masters: m,
                client_id,
                addrs: Mutex::new(HashMap::new()),
                conns: Mutex::new(HashMap::new()),
                latency: Mutex::new(HashMap::new()),
                cache: Mutex::new(LruCache::new(cache)),
                locate: Locator::default(),
                opts,
            }),
        })
    }

    /// This client's name in write leases.
    pub fn client_id(&self) -> &str {
        &self.inner.client_id
    }

    pub fn masters(&self) -> &Masters {
        &self.inner.masters
    }

    /// # Errors
    /// The path exists as a file, a parent is missing (without `parents`), or bad input.
    pub async fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        let req = pb::MkdirRequest {
            path: path.into(),
            parents,
        };
        self.inner
            .masters
            .send(req, |mut c, r| async move { c.mkdir(r).await })
            .await?;
        Ok(())
    }

    /// Creates a file and opens it for appending (this client holds its write lease).
    ///
    /// # Errors
    /// The path exists, a parent is missing, or fewer chunkservers than replicas are up.
    pub async fn create(&self, path: &str, opts: CreateOptions) -> Result<FlatLogFile> {
        let req = pb::CreateRequest {
            path: path.into(),
            policy: Some(pb::Policy {
                replicas: opts.replicas,
                compression: opts.compression,
            }),
            client_id: self.inner.client_id.clone(),
            chunks: 1 + self.inner.opts.prefetch,
            parents: opts.parents,
        };
        let reply = self
            .inner
            .masters
            .send(req, |mut c, r| async move { c.create(r).await })
            .await?;
        let file = self.absorb(reply)?;
        Ok(FlatLogFile::new(self.clone(), path, file))
    }

    /// Opens an existing file for appending. Chunks a previous writer left open are sealed at
    /// the length all their replicas hold, and appends go on in a new chunk.
    ///
    /// # Errors
    /// The file does not exist, is sealed, or another writer holds its lease.
    pub async fn open_append(&self, path: &str) -> Result<FlatLogFile> {
        let req = pb::OpenWriteRequest {
            path: path.into(),
            client_id: self.inner.client_id.clone(),
            chunks: 0,
        };
        let reply = self
            .inner
            .masters
            .send(req, |mut c, r| async move { c.open_write(r).await })
            .await?;
        let file = self.absorb(reply)?;
        let mut w = FlatLogFile::new(self.clone(), path, file);
        w.recover().await?;
        Ok(w)
    }

    /// The masters' `Stat`, remembering the servers' addresses it names.
    async fn stat_node(&self, path: &str) -> Result<pb::NodeReply> {
        let req = pb::PathRequest { path: path.into() };
        let r = self
            .inner
            .masters
            .send(req, |mut c, r| async move { c.stat(r).await })
            .await?;
        self.remember_addrs(&r.servers);
        Ok(r)
    }

    /// # Errors
    /// The path does not exist or is refused.
    pub async fn stat(&self, path: &str) -> Result<FileStat> {
        let r = self.stat_node(path).await?;
        let Some(f) = r.file else {
            return Ok(FileStat {
                path: r.path,
                is_dir: true,
                length: 0,
                chunks: 0,
                sealed: false,
                replicas: 0,
                ctime_ms: r.ctime_ms,
                mtime_ms: r.mtime_ms,
                writer: None,
            });
        };
        let view = View {
            chunks: f.chunks.clone(),
        };
        let length = self.live_length(&view).await;
        self.inner.cache.lock().put(r.path.clone(), Arc::new(view));
        Ok(FileStat {
            path: r.path,
            is_dir: false,
            length,
            chunks: f.chunks.len(),
            sealed: f.sealed,
            replicas: f.policy.map_or(0, |p| p.replicas),
            ctime_ms: f.ctime_ms,
            mtime_ms: f.mtime_ms,
            writer: f.lease.map(|l| l.holder),
        })
    }

    /// # Errors
    /// The path does not exist or is a file.
    pub async fn list(&self, path: &str) -> Result<Vec<DirEntry>> {
        let req = pb::PathRequest { path: path.into() };
        let r = self
            .inner
            .masters
            .send(req, |mut c, r| async move { c.list(r).await })
            .await?;
        Ok(r.entries
            .into_iter()
            .map(|e| DirEntry {
                name: e.name,
                is_dir: e.is_dir,
                length: e.length,
                chunks: e.chunks,
                sealed: e.sealed,
                mtime_ms: e.mtime_ms,
            })
            .collect())
    }

    /// Moves a file or directory; the destination must not exist.
    ///
    /// # Errors
    /// Source missing, destination present, or a directory moved into itself.
    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        let req = pb::RenameRequest {
            from: from.into(),
            to: to.into(),
        };
        self.inner
            .masters
            .send(req, |mut c, r| async move { c.rename(r).await })
            .await?;
        self.inner.cache.lock().clear();
        Ok(())
    }

    /// Deletes a file (its chunks are reclaimed by the chunkservers) or an empty directory.
    ///
    /// # Errors
    /// Missing path or non-empty directory.
    pub async fn delete(&self, path: &str) -> Result<()> {
        let req = pb::PathRequest { path: path.into() };
        self.inner
            .masters
            .send(req, |mut c, r| async move { c.delete(r).await })
            .await?;
        self.inner.cache.lock().clear();
        Ok(())
    }

    /// Reads `len` bytes at `offset`. Bytes are readable once every replica acknowledged them.
    ///
    /// # Errors
    /// The range is past the readable end, the file is missing, or no replica can serve it.
    pub async fn read(&self, path: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
        // Sealed chunks never change: a cached list whose chunks are all sealed serves any
        // range inside them without asking the masters (a file that grew is asked again).
        let cached = self.inner.cache.lock().get(path).cloned();
        let view = match cached {
            Some(v)
                if v.chunks.iter().all(|c| c.sealed) && known_length(&v) >= offset + len as u64 =>
            {
                v
            }
            _ => self.refresh(path).await?,
        };
        let lengths = self.lengths(&view).await;
        let length: u64 = lengths.iter().sum();
        if offset + len as u64 > length {
            return Err(Error::OutOfRange {
                path: path.into(),
                offset,
                len: len as u64,
                length,
            });
        }
        let end = offset + len as u64;
        let mut out = Vec::with_capacity(len);
        let mut start = 0u64;
        for (c, clen) in view.chunks.iter().zip(lengths) {
            let (lo, hi) = (offset.max(start), end.min(start + clen));
            if lo < hi {
                out.extend(self.read_chunk(c, lo - start, (hi - lo) as usize).await?);
            }
            start += clen;
            if start >= end {
                break;
            }
        }
        Ok(out)
    }

    /// Where chunks are, batched: concurrent callers share one master call.
    ///
    /// # Errors
    /// The masters cannot be reached.
    pub async fn locate(&self, chunk_id: u64) -> Result<pb::ChunkMeta> {
        self.inner.locate.locate(self, chunk_id).await
    }

    async fn refresh(&self, path: &str) -> Result<Arc<View>> {
        let r = self.stat_node(path).await?;
        let f = r.file.ok_or_else(|| {
            MetaError::new(
                cairn_rpc::ErrorKind::IsADirectory,
                format!("{path}: is a directory"),
            )
        })?;
        let v = Arc::new(View { chunks: f.chunks });
        self.inner.cache.lock().put(path.to_owned(), v.clone());
        Ok(v)
    }

    fn remember_addrs(&self, servers: &[pb::ServerAddr]) {
        let mut a = self.inner.addrs.lock();
        for s in servers {
            if a.get(&s.id) != Some(&s.addr) {
                a.insert(s.id, s.addr.clone());
                self.inner.conns.lock().remove(&s.id);
            }
        }
    }

    fn absorb(&self, r: pb::FileReply) -> Result<pb::FileMeta> {
        self.remember_addrs(&r.servers);
        r.file
            .ok_or_else(|| MetaError::internal("reply without a file").into())
    }

    async fn conn(&self, server: u64) -> Result<Arc<DataConn>> {
        if let Some(c) = self.inner.conns.lock().get(&server) {
            return Ok(c.clone());
        }
        let addr = self
            .inner
            .addrs
            .lock()
            .get(&server)
            .cloned()
            .ok_or(Error::UnknownServer(server))?;
        let sock = addr.parse().map_err(|_| Error::UnknownServer(server))?;
        let c = Arc::new(DataConn::connect(sock).await.map_err(|e| Error::Data {
            server,
            addr: addr.clone(),
            source: e,
        })?);
        Ok(self.inner.conns.lock().entry(server).or_insert(c).clone())
    }

    /// Runs one data-plane call; a dead connection is dropped so the next call reconnects.
    async fn on<T, F, Fut>(&self, server: u64, f: F) -> Result<T>
    where
        F: FnOnce(Arc<DataConn>) -> Fut,
        Fut: std::future::Future<Output = crate::data::Result<T>>,
    {
        let conn = self.conn(server).await?;
        match f(conn.clone()).await {
            Ok(v) => Ok(v),
            Err(e) => {
                if matches!(
                    e,
                    DataError::ConnectionLost { .. } | DataError::Connect { .. }
                ) {
                    let mut conns = self.inner.conns.lock();
                    if conns.get(&server).is_some_and(|c| Arc::ptr_eq(c, &conn)) {
                        conns.remove(&server);
                    }
                }
                Err(Error::Data {
                    server,
                    addr: conn.addr().to_string(),
                    source: e,
                })
            }
        }
    }

    /// The length every replica of an open chunk holds (0 where a replica lacks the chunk);
    /// `None` when no replica answered.
    async fn replicated_length(&self, c: &pb::ChunkMeta) -> Option<u64> {
        self.replicas(c).await.min
    }

    /// Asks every replica of a chunk for its length.
    async fn replicas(&self, c: &pb::ChunkMeta) -> Replicas {
        let stats = join_all(
            c.servers
                .iter()
                .map(|s| self.on(*s, |d| async move { d.stat(c.id).await })),
        )
        .await;
        let mut r = Replicas {
            exists: false,
            min: None,
        };
        for s in stats {
            let l = match s {
                Ok(info) => {
                    r.exists = true;
                    info.length
                }
                Err(Error::Data {
                    source:
                        DataError::Status {
                            status: Status::NotFound,
                            ..
                        },
                    ..
                }) => 0,
                Err(_) => continue,
            };
            r.min = Some(r.min.map_or(l, |m: u64| m.min(l)));
        }
        r
    }

    /// Readable bytes of each chunk: a sealed chunk's length; for an open chunk, what every
    /// replica holds (the master's committed length if no replica answers).
    async fn lengths(&self, v: &View) -> Vec<u64> {
        join_all(v.chunks.iter().map(|c| async move {
            if c.sealed {
                c.length
            } else {
                self.replicated_length(c)
                    .await
                    .unwrap_or(c.length)
                    .max(c.length)
            }
        }))
        .await
    }

    async fn live_length(&self, v: &View) -> u64 {
        self.lengths(v).await.iter().sum()
    }

    /// Reads from the replica with the lowest observed latency, falling over to the others,
    /// then to fresh locations from the masters.
    async fn read_chunk(&self, c: &pb::ChunkMeta, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut last = String::from("no replicas");
        for attempt in 0..2 {
            let servers = if attempt == 0 {
                c.servers.clone()
            } else {
                let fresh = self.locate(c.id).await?;
                fresh.servers
            };
            let mut order = servers.clone();
            {
                let lat = self.inner.latency.lock();
                order.sort_by(|a, b| {
                    let la = lat.get(a).copied().unwrap_or(0.0);
                    let lb = lat.get(b).copied().unwrap_or(0.0);
                    la.total_cmp(&lb)
                });
            }
            for s in order {
                let t = Instant::now();
                match self
                    .on(s, |d| async move { d.read(c.id, offset, len).await })
                    .await
                {
                    Ok(data) => {
                        let us = t.elapsed().as_secs_f64() * 1e6;
                        let mut lat = self.inner.latency.lock();
                        let e = lat.entry(s).or_insert(us);
                        *e = 0.8 * *e + 0.2 * us;
                        return Ok(data);
                    }
                    Err(e) => {
                        // A failing server goes to the back of the line (a 1 s penalty that
                        // later successes wear off; blacklisting with probes is issue 5).
                        let mut lat = self.inner.latency.lock();
                        let penalty = lat.entry(s).or_insert(0.0);
                        *penalty = penalty.max(1e6);
                        last = e.to_string();
                    }
                }
            }
        }
        Err(Error::NoReplica { chunk: c.id, last })
    }
}

fn known_length(v: &View) -> u64 {
    v.chunks.iter().map(|c| c.length).sum()
}

/// What the replicas of a chunk said: whether any has it, and the least length among those
/// that answered (a replica without the chunk counts as 0); `None` when none answered.
struct Replicas {
    exists: bool,
    min: Option<u64>,
}

/// Batches chunk-location look-ups: the first caller waits a moment for others, then one
/// `Locate` call answers all of them.
#[derive(Default)]
struct Locator {
    pending: Mutex<Vec<(u64, oneshot::Sender<Result<pb::ChunkMeta>>)>>,
    flushing: AtomicBool,
}

impl Locator {
    async fn locate(&self, client: &Client, id: u64) -> Result<pb::ChunkMeta> {
        let (tx, rx) = oneshot::channel();
        self.pending.lock().push((id, tx));
        if !self.flushing.swap(true, Ordering::AcqRel) {
            let client = client.clone();
            tokio::spawn(async move {
                let me = &client.inner.locate;
                loop {
                    tokio::time::sleep(Duration::from_micros(200)).await;
                    let batch = std::mem::take(&mut *me.pending.lock());
                    if batch.is_empty() {
                        me.flushing.store(false, Ordering::Release);
                        // A caller may have queued between the take and the store.
                        if me.pending.lock().is_empty() || me.flushing.swap(true, Ordering::AcqRel)
                        {
                            return;
                        }
                        continue;
                    }
                    let req = pb::LocateRequest {
                        chunk_ids: batch.iter().map(|(id, _)| *id).collect(),
                    };
                    let r = client
                        .inner
                        .masters
                        .send(req, |mut c, r| async move { c.locate(r).await })
                        .await;
                    match r {
                        Ok(reply) => {
                            client.remember_addrs(&reply.servers);
                            for ((_, tx), c) in batch.into_iter().zip(reply.chunks) {
                                let _ = tx.send(Ok(c));
                            }
                        }
                        Err(e) => {
                            for (_, tx) in batch {
                                let _ = tx.send(Err(e.clone().into()));
                            }
                        }
                    }
                }
            });
        }
        rx.await
            .map_err(|_| Error::Meta(MetaError::internal("locate batch dropped")))?
    }
}

/// A file open for appending. Appends are ordered; each is acknowledged when every replica of
/// its chunk has it durably. Close (or seal) when done: otherwise the lease runs out and the
/// next writer recovers the open chunk.
pub struct FlatLogFile {
    client: Client,
    path: String,
    chunks: Vec<pb::ChunkMeta>,
    /// Index in `chunks` of the chunk being written.
    active: Option<usize>,
    active_len: u64,
    length: u64,
    failed: Option<String>,
    lease_lost: Arc<AtomicBool>,
    renew: Option<tokio::task::JoinHandle<()>>,
}

impl FlatLogFile {
    fn new(client: Client, path: &str, file: pb::FileMeta) -> Self {
        let length = file
            .chunks
            .iter()
            .filter(|c| c.sealed)
            .map(|c| c.length)
            .sum();
        let lease_lost = Arc::new(AtomicBool::new(false));
        let renew = {
            let (client, path, lost) = (client.clone(), path.to_owned(), lease_lost.clone());
            tokio::spawn(async move {
                let every = client.inner.opts.renew_every;
                loop {
                    tokio::time::sleep(every).await;
                    let req = pb::CommitRequest {
                        path: path.clone(),
                        client_id: client.inner.client_id.clone(),
                        ..Default::default()
                    };
                    let r = client
                        .inner
                        .masters
                        .send(req, |mut c, r| async move { c.commit(r).await })
                        .await;
                    if let Err(e) = r
                        && matches!(
                            e.kind,
                            cairn_rpc::ErrorKind::LeaseLost
                                | cairn_rpc::ErrorKind::NotFound
                                | cairn_rpc::ErrorKind::Sealed
                        )
                    {
                        tracing::warn!(%path, error = %e, "write lease lost");
                        lost.store(true, Ordering::Release);
                        return;
                    }
                }
            })
        };
        Self {
            client,
            path: path.to_owned(),
            chunks: file.chunks,
            active: None,
            active_len: 0,
            length,
            failed: None,
            lease_lost,
            renew: Some(renew),
        }
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// Bytes in the file (acknowledged appends included).
    pub fn len(&self) -> u64 {
        self.length
    }

    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Seals chunks a previous writer left open, at the length all reachable replicas hold.
    async fn recover(&mut self) -> Result<()> {
        let mut updates = Vec::new();
        for c in self.chunks.iter_mut().filter(|c| !c.sealed) {
            let Replicas { exists, min } = self.client.replicas(c).await;
            if !exists {
                continue; // never written: a spare, still usable
            }
            let len = min.unwrap_or(0).max(c.length);
            for s in &c.servers {
                let id = c.id;
                if let Err(e) = self
                    .client
                    .on(*s, |d| async move { d.seal(id).await })
                    .await
                {
                    tracing::warn!(chunk = id, server = s, error = %e, "seal during recovery failed");
                }
            }
            c.length = len;
            c.sealed = true;
            updates.push(pb::ChunkUpdate {
                chunk_id: c.id,
                length: len,
                sealed: true,
            });
        }
        if !updates.is_empty() {
            self.commit(updates, false, false, false).await?;
        }
        self.length = self
            .chunks
            .iter()
            .filter(|c| c.sealed)
            .map(|c| c.length)
            .sum();
        Ok(())
    }

    fn check(&self) -> Result<()> {
        if let Some(f) = &self.failed {
            return Err(Error::Writer(format!(
                "{}: writer failed earlier: {f}",
                self.path
            )));
        }
        if self.lease_lost.load(Ordering::Acquire) {
            return Err(Error::Writer(format!("{}: write lease lost", self.path)));
        }
        Ok(())
    }

    /// Appends `data`; returns the file offset it starts at. Appends longer than
    /// [`ClientOptions::max_append`] or crossing a chunk boundary go as several pieces.
    ///
    /// # Errors
    /// A replica failed (the writer is then unusable; reopen the file), or the lease is lost.
    pub async fn append(&mut self, data: &[u8]) -> Result<u64> {
        self.check()?;
        let start = self.length;
        let mut rest = data;
        while !rest.is_empty() {
            let chunk_size = self.client.inner.opts.chunk_size;
            if (self.active.is_none() || self.active_len >= chunk_size)
                && let Err(e) = self.switch_chunk().await
            {
                self.failed = Some(e.to_string());
                return Err(e);
            }
            let room = (chunk_size - self.active_len) as usize;
            let n = rest.len().min(room).min(self.client.inner.opts.max_append);
            if let Err(e) = self.write_piece(&rest[..n]).await {
                self.failed = Some(e.to_string());
                return Err(e);
            }
            rest = &rest[n..];
        }
        Ok(start)
    }

    /// Sends one piece to every replica of the active chunk in parallel.
    async fn write_piece(&mut self, piece: &[u8]) -> Result<()> {
        let c = &self.chunks[self.active.expect("switched")];
        let (id, version, offset) = (c.id, c.version, self.active_len);
        let results = join_all(c.servers.iter().map(|s| {
            let client = &self.client;
            async move {
                client
                    .on(*s, |d| async move {
                        if offset == 0 {
                            d.create(id, version, piece).await
                        } else {
                            d.append(id, offset, piece).await
                        }
                    })
                    .await
            }
        }))
        .await;
        for r in results {
            r?;
        }
        self.active_len += piece.len() as u64;
        self.length += piece.len() as u64;
        Ok(())
    }

    /// Seals the active chunk (if it has data) and moves to the next spare, allocating more
    /// when none is left.
    async fn switch_chunk(&mut self) -> Result<()> {
        if self.active.is_some() && self.active_len > 0 {
            self.seal_active().await?;
        }
        let from = self.active.map_or(0, |i| i + 1);
        let next = (from..self.chunks.len())
            .find(|&i| !self.chunks[i].sealed && self.chunks[i].length == 0);
        let next = match next {
            Some(i) => i,
            None => {
                let req = pb::AllocateRequest {
                    path: self.path.clone(),
                    client_id: self.client.inner.client_id.clone(),
                    chunks: 1 + self.client.inner.opts.prefetch,
                };
                let r = self
                    .client
                    .inner
                    .masters
                    .send(req, |mut c, r| async move { c.allocate_chunks(r).await })
                    .await?;
                let f = self.client.absorb(r)?;
                let known = self.chunks.len();
                self.chunks = f.chunks;
                (known.min(self.chunks.len())..self.chunks.len())
                    .find(|&i| !self.chunks[i].sealed && self.chunks[i].length == 0)
                    .ok_or_else(|| MetaError::internal("allocation returned no chunk"))?
            }
        };
        self.active = Some(next);
        self.active_len = 0;
        Ok(())
    }

    /// Seals every replica of the active chunk and records its length at the masters.
    async fn seal_active(&mut self) -> Result<()> {
        let i = self.active.expect("active");
        let (id, servers) = (self.chunks[i].id, self.chunks[i].servers.clone());
        let results = join_all(servers.iter().map(|s| {
            let client = &self.client;
            async move { client.on(*s, |d| async move { d.seal(id).await }).await }
        }))
        .await;
        for r in results {
            r?;
        }
        self.chunks[i].length = self.active_len;
        self.chunks[i].sealed = true;
        let update = pb::ChunkUpdate {
            chunk_id: id,
            length: self.active_len,
            sealed: true,
        };
        self.commit(vec![update], false, false, false).await
    }

    async fn commit(
        &mut self,
        updates: Vec<pb::ChunkUpdate>,
        trim: bool,
        release: bool,
        seal: bool,
    ) -> Result<()> {
        let req = pb::CommitRequest {
            path: self.path.clone(),
            client_id: self.client.inner.client_id.clone(),
            updates,
            trim,
            release,
            seal,
        };
        let r = self
            .client
            .inner
            .masters
            .send(req, |mut c, r| async move { c.commit(r).await })
            .await?;
        let f = self.client.absorb(r)?;
        self.chunks = f.chunks;
        Ok(())
    }

    async fn finish(mut self, seal: bool) -> Result<u64> {
        self.check()?;
        if let Some(r) = self.renew.take() {
            r.abort();
        }
        // One master call: the chunk's final length (sealed in the stream meta), unused spares
        // trimmed, lease released. The replicas are not sealed here: sealing fences off an
        // *other* writer, and this writer is the one stopping; no writer appends to a chunk the
        // masters hold sealed, and a reader never reads past the masters' length.
        let mut updates = Vec::new();
        if let Some(i) = self.active
            && self.active_len > 0
        {
            let c = &mut self.chunks[i];
            c.length = self.active_len;
            c.sealed = true;
            updates.push(pb::ChunkUpdate {
                chunk_id: c.id,
                length: self.active_len,
                sealed: true,
            });
        }
        self.commit(updates, true, true, seal).await?;
        self.client.inner.cache.lock().pop(&self.path);
        Ok(self.length)
    }

    /// Seals the open chunk, gives the lease back and returns the file's length. The file
    /// stays appendable by the next [`Client::open_append`].
    ///
    /// # Errors
    /// A replica or the masters failed; the data acknowledged so far stays readable.
    pub async fn close(self) -> Result<u64> {
        self.finish(false).await
    }

    /// Like [`FlatLogFile::close`], and the file can never be appended to again.
    ///
    /// # Errors
    /// As [`FlatLogFile::close`].
    pub async fn seal(self) -> Result<u64> {
        self.finish(true).await
    }
}

impl Drop for FlatLogFile {
    fn drop(&mut self) {
        if let Some(r) = self.renew.take() {
            r.abort();
        }
    }
}
