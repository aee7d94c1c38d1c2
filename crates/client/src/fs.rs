//! The FlatLogFile API: the client that replicates appends itself.

use crate::data::{DataConn, Error as DataError};
use crate::health::{Health, HealthCounts, HealthOptions, ListKind, Listed, Op};
use crate::policy;
pub use crate::writer::FlatLogFile;
use cairn_proto::frame::Status;
use cairn_rpc::{Masters, MetaError, pb};
use futures::StreamExt;
use futures::future::join_all;
use futures::stream::FuturesUnordered;
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
    /// How long metadata calls keep trying while no master answers at all (none:
    /// `retry_for`); command-line tools set a few seconds.
    pub unreachable_for: Option<Duration>,
    /// How often a writer renews its lease.
    pub renew_every: Duration,
    /// A data-plane request without a reply after this long has failed (the replica is then
    /// retried or given up; see the chasing settings).
    pub request_timeout: Duration,
    /// Chasing: how long a replica may stay behind the acknowledged length (`t`).
    pub chase_timeout: Duration,
    /// Chasing: a replica behind by less than this after `chase_timeout` is still waited for
    /// (`k`); one further behind is sealed and dropped, and the masters re-replicate the chunk.
    pub chase_retry_bytes: u64,
    /// Chasing: bytes of acknowledged appends this client keeps for lagging replicas, over all
    /// its writers. When full, appends wait for every replica instead.
    pub chase_memory: u64,
    /// Backup reads and blacklisting.
    pub health: HealthOptions,
    /// Metadata batching: `Batch` calls in flight at once. Creates, commits and deletes of
    /// concurrent callers that arrive while they all are share the next call and one Raft
    /// entry on the leader; a lone caller's call goes out at once. 0 = one call each.
    pub meta_batch_in_flight: usize,
    /// What every call to the masters proves (docs/security.md): a user's keys, or the
    /// cluster secret for servers. `None` works only with masters run `--insecure`.
    pub credential: Option<cairn_rpc::auth::Credential>,
    /// TLS to the masters, checking them with the cluster's CA (`cairn_rpc::tls`).
    pub tls: Option<cairn_rpc::tls::ClientTlsConfig>,
    /// TLS to the chunkservers (run `--data-tls`), checking them with the cluster's CA
    /// (`cairn_rpc::tls::data::connector`). `None`: frames go in plain TCP (capabilities
    /// still hold).
    pub data_tls: Option<cairn_rpc::tls::data::TlsConnector>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            chunk_size: 64 << 20,
            max_append: 4 << 20,
            prefetch: 1,
            cache_entries: 4096,
            retry_for: Duration::from_secs(15),
            unreachable_for: None,
            renew_every: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            chase_timeout: Duration::from_millis(500),
            chase_retry_bytes: 1 << 20,
            chase_memory: 64 << 20,
            health: HealthOptions::default(),
            meta_batch_in_flight: 1,
            credential: None,
            tls: None,
            data_tls: None,
        }
    }
}

/// How a new file is made.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// The file's redundancy policy; `None` is the nearest ancestor directory's default
    /// (`mkdir --policy`), else `replicas:3`.
    pub policy: Option<cairn_ec::Policy>,
    /// Copies durable before an append is acknowledged (a majority of the replicas); `None`
    /// is the least majority (2 of 3).
    pub min_copy: Option<u32>,
    /// Create missing parent directories.
    pub parents: bool,
    /// Permission bits (`None`: 0o644); the file belongs to the user the client signs as.
    pub mode: Option<u32>,
}

impl Default for CreateOptions {
    fn default() -> Self {
        Self {
            policy: None,
            min_copy: None,
            parents: true,
            mode: None,
        }
    }
}

impl CreateOptions {
    /// `replicas:n`, everything else default.
    pub fn replicas(n: u8) -> Self {
        Self {
            policy: Some(cairn_ec::Policy {
                write: cairn_ec::Redundancy::Replicas(n),
                then: None,
                lz4: false,
            }),
            ..Self::default()
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
    /// A file's policy; a directory's default for new files below it (its own or an
    /// ancestor's), if any.
    pub policy: Option<String>,
    /// Copies of each chunk of a replicated file (of a `then:` policy's files, while written);
    /// 0 for an erasure-coded file, whose `policy` says how it is stored.
    pub replicas: u32,
    pub min_copy: u32,
    pub ctime_ms: u64,
    pub mtime_ms: u64,
    /// Who holds the write lease, if anyone.
    pub writer: Option<String>,
    /// The owning user (empty: the cluster itself) and the permission bits.
    pub owner: String,
    pub mode: u32,
}

/// What [`Client::traffic`] counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Traffic {
    pub sent: u64,
    pub received: u64,
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
    pub owner: String,
    pub mode: u32,
}

/// A file's chunk list as the client caches it.
#[derive(Debug, Clone)]
pub(crate) struct View {
    chunks: Vec<pb::ChunkMeta>,
    /// Copies that make a byte readable (the file's MinCopy).
    min_copy: usize,
}

impl View {
    fn of(f: &pb::FileMeta) -> Self {
        Self {
            chunks: f.chunks.clone(),
            min_copy: f.policy.as_ref().map_or(1, |p| p.min_copy.max(1)) as usize,
        }
    }
}

/// A handle on the cluster. Cheap to clone; clones share connections and caches.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) masters: Masters,
    pub(crate) opts: ClientOptions,
    pub(crate) client_id: String,
    /// Bytes held for lagging replicas by all writers (chasing memory).
    pub(crate) chasing: std::sync::atomic::AtomicU64,
    /// Payload bytes sent to chunkservers in appends and received in reads (retries too).
    sent: std::sync::atomic::AtomicU64,
    received: std::sync::atomic::AtomicU64,
    addrs: Mutex<HashMap<u64, String>>,
    conns: Mutex<HashMap<u64, Arc<DataConn>>>,
    /// The capabilities the masters signed into the chunks they described, by chunk.
    pub(crate) caps: Arc<crate::caps::Caps>,
    /// Latency per server, the blacklists and the backup-read budget.
    pub(crate) health: Health,
    pub(crate) cache: Mutex<LruCache<String, Arc<View>>>,
    /// Block indexes of compressed groups (their blocks' offsets in the stream), by chunk.
    pub(crate) block_indexes: Mutex<LruCache<u64, Arc<Vec<u64>>>>,
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
        let m = Masters::new(masters)?
            .retry_for(opts.retry_for)
            .unreachable_for(opts.unreachable_for)
            .batch_in_flight(opts.meta_batch_in_flight)
            .credential(opts.credential.clone())
            .tls(opts.tls.clone());
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        let client_id = format!(
            "{}-{}-{:08x}",
            host.trim(),
            std::process::id(),
            rand::random::<u32>()
        );
        let cache = NonZeroUsize::new(opts.cache_entries.max(1)).expect("non-zero");
        let c = Self {
            inner: Arc::new(Inner {
                masters: m,
                client_id,
                addrs: Mutex::new(HashMap::new()),
                conns: Mutex::new(HashMap::new()),
                caps: Arc::default(),
                health: Health::new(opts.health.clone()),
                cache: Mutex::new(LruCache::new(cache)),
                block_indexes: Mutex::new(LruCache::new(cache)),
                locate: Locator::default(),
                chasing: std::sync::atomic::AtomicU64::new(0),
                sent: std::sync::atomic::AtomicU64::new(0),
                received: std::sync::atomic::AtomicU64::new(0),
                opts,
            }),
        };
        tokio::spawn(watch_health(Arc::downgrade(&c.inner)));
        Ok(c)
    }

    /// `Batch` calls this client sent and the creates, commits and deletes they carried
    /// (see [`ClientOptions::meta_batch_in_flight`]).
    pub fn meta_batch_stats(&self) -> cairn_rpc::BatchStats {
        self.inner.masters.batch_stats()
    }

    /// Data-plane payload bytes this client sent in appends and received in reads, retries
    /// and every replica or member included: the network cost of what it wrote and read.
    pub fn traffic(&self) -> Traffic {
        Traffic {
            sent: self.inner.sent.load(Ordering::Relaxed),
            received: self.inner.received.load(Ordering::Relaxed),
        }
    }

    /// Backup-read and blacklist counters.
    pub fn health_stats(&self) -> HealthCounts {
        self.inner.health.stats.snapshot()
    }

    /// The servers this client has blacklisted now.
    pub fn blacklisted(&self) -> Vec<Listed> {
        self.inner.health.listed(Instant::now())
    }

    /// Whether `server` is on one of this client's blacklists.
    pub fn is_blacklisted(&self, server: u64) -> bool {
        self.inner.health.is_listed(server)
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
        self.mkdir_with_policy(path, parents, None).await
    }

    /// [`Client::mkdir`] that gives the new directory a default policy for files created
    /// below it. With `parents` and an existing directory, sets that directory's default.
    ///
    /// # Errors
    /// As [`Client::mkdir`]; a policy the masters refuse (`InvalidArgument`).
    pub async fn mkdir_with_policy(
        &self,
        path: &str,
        parents: bool,
        policy: Option<&cairn_ec::Policy>,
    ) -> Result<()> {
        self.mkdir_with(path, parents, policy, None).await
    }

    /// [`Client::mkdir_with_policy`] with the new directory's permission bits (`None`:
    /// 0o755; directories `parents` makes on the way get 0o755).
    ///
    /// # Errors
    /// As [`Client::mkdir_with_policy`].
    pub async fn mkdir_with(
        &self,
        path: &str,
        parents: bool,
        policy: Option<&cairn_ec::Policy>,
        mode: Option<u32>,
    ) -> Result<()> {
        let req = pb::MkdirRequest {
            path: path.into(),
            parents,
            policy: policy.map(|p| policy::to_pb(p, 0)),
            mode,
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
            policy: match (&opts.policy, opts.min_copy) {
                (Some(p), m) => Some(policy::to_pb(p, m.unwrap_or(0))),
                (None, None) => None,
                (None, Some(m)) => Some(policy::to_pb(&cairn_ec::Policy::default(), m)),
            },
            client_id: self.inner.client_id.clone(),
            chunks: 1 + self.inner.opts.prefetch,
            parents: opts.parents,
            mode: opts.mode,
        };
        let reply = self.inner.masters.create(req).await?;
        let file = self.absorb(reply)?;
        Ok(FlatLogFile::new(self.clone(), path, file))
    }

    /// Opens an existing file for appending. When the previous writer closed the file
    /// cleanly, appends continue its last chunk (a replicated chunk not yet full), so that
    /// many short-lived writers do not leave a short chunk each. Chunks a previous writer
    /// left open (it crashed, or its lease ran out) are sealed at the length MinCopy of their
    /// replicas hold, and appends go on in a new chunk.
    ///
    /// # Errors
    /// The file does not exist, is sealed, or another writer holds its lease.
    pub async fn open_append(&self, path: &str) -> Result<FlatLogFile> {
        let req = pb::OpenWriteRequest {
            path: path.into(),
            client_id: self.inner.client_id.clone(),
            chunks: 0,
            continue_below: self.inner.opts.chunk_size,
        };
        let reply = self
            .inner
            .masters
            .send(req, |mut c, r| async move { c.open_write(r).await })
            .await?;
        let continued = reply.continued_chunk;
        let file = self.absorb(reply)?;
        let mut w = FlatLogFile::new(self.clone(), path, file);
        w.recover(continued).await?;
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
        if let Some(f) = &r.file {
            self.remember_caps(&f.chunks);
        }
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
                policy: r
                    .dir_policy
                    .as_ref()
                    .map(|p| policy::from_pb(p).to_string()),
                replicas: 0,
                min_copy: 0,
                ctime_ms: r.ctime_ms,
                mtime_ms: r.mtime_ms,
                writer: None,
                owner: r.owner,
                mode: r.mode,
            });
        };
        let view = View::of(&f);
        let length = self.live_length(&view).await;
        self.inner.cache.lock().put(r.path.clone(), Arc::new(view));
        Ok(FileStat {
            path: r.path,
            is_dir: false,
            length,
            chunks: f.chunks.len(),
            sealed: f.sealed,
            policy: f.policy.as_ref().map(|p| policy::from_pb(p).to_string()),
            replicas: f
                .policy
                .filter(|p| p.ec_data == 0 || p.then_ec)
                .map_or(0, |p| p.replicas),
            min_copy: f.policy.map_or(0, |p| p.min_copy),
            ctime_ms: f.ctime_ms,
            mtime_ms: f.mtime_ms,
            writer: f.lease.map(|l| l.holder),
            owner: r.owner,
            mode: r.mode,
        })
    }

    /// # Errors
    /// The path does not exist or is a file.
    pub async fn list(&self, path: &str) -> Result<Vec<DirEntry>> {
        let mut all = Vec::new();
        let mut after = String::new();
        loop {
            let (page, more) = self.list_page(path, &after, cairn_rpc::LIST_PAGE).await?;
            match page.last() {
                Some(last) if more => after = last.name.clone(),
                _ => {
                    all.extend(page);
                    return Ok(all);
                }
            }
            all.extend(page);
        }
    }

    /// Up to `limit` entries of the directory at `path` after the name `after` (from the
    /// first when empty), in name order, and whether more follow: ask again after the last
    /// name. A name is a cursor that stays valid while entries come and go (as S3's
    /// StartAfter): an entry added behind it is not seen, one added ahead of it is.
    ///
    /// # Errors
    /// As the `List` call (`limit` 0 asks for the whole directory, refused past
    /// [`cairn_rpc::LIST_WHOLE_MAX`] entries).
    pub async fn list_page(
        &self,
        path: &str,
        after: &str,
        limit: u32,
    ) -> Result<(Vec<DirEntry>, bool)> {
        let req = pb::ListRequest {
            path: path.into(),
            after: after.into(),
            limit,
        };
        let r = self
            .inner
            .masters
            .send(req, |mut c, r| async move { c.list(r).await })
            .await?;
        let page = r
            .entries
            .into_iter()
            .map(|e| DirEntry {
                name: e.name,
                is_dir: e.is_dir,
                length: e.length,
                chunks: e.chunks,
                sealed: e.sealed,
                mtime_ms: e.mtime_ms,
                owner: e.owner,
                mode: e.mode,
            })
            .collect();
        Ok((page, r.more))
    }

    /// Changes the permission bits (the owner or an admin may) and/or the owner (an admin
    /// may) of a file or directory.
    ///
    /// # Errors
    /// The path does not exist, `PermissionDenied`, or bits past 0o7777.
    pub async fn set_attr(&self, path: &str, mode: Option<u32>, owner: Option<&str>) -> Result<()> {
        let req = pb::SetAttrRequest {
            path: path.into(),
            mode,
            owner: owner.map(str::to_owned),
        };
        self.inner
            .masters
            .send(req, |mut c, r| async move { c.set_attr(r).await })
            .await?;
        Ok(())
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
        self.inner.masters.delete(req).await?;
        self.inner.cache.lock().clear();
        Ok(())
    }

    /// Reads `len` bytes at `offset`. Bytes are readable once MinCopy replicas hold them
    /// durably (an append may be readable a moment before its writer hears so).
    ///
    /// # Errors
    /// The range is past the readable end, the file is missing, or no replica can serve it.
    pub async fn read(&self, path: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
        // Sealed chunks never change their bytes: a cached list whose chunks are all sealed
        // serves any range inside them without asking the masters (a file that grew is asked
        // again).
        let cached = self.inner.cache.lock().get(path).cloned();
        let view = match cached {
            Some(v)
                if v.chunks.iter().all(|c| c.sealed) && known_length(&v) >= offset + len as u64 =>
            {
                v
            }
            _ => self.refresh(path).await?,
        };
        match self.read_view(path, view.clone(), offset, len).await {
            // A sealed chunk converted to a chunk group since the list was fetched has a new
            // id, and its replicas go: the fresh list has the group.
            Err(e @ Error::NoReplica { .. }) => {
                let fresh = self.refresh(path).await?;
                let ids = |v: &View| v.chunks.iter().map(|c| c.id).collect::<Vec<_>>();
                if ids(&fresh) == ids(&view) {
                    return Err(e);
                }
                self.read_view(path, fresh, offset, len).await
            }
            r => r,
        }
    }

    /// Reads `len` bytes at `offset` that the caller knows are acknowledged — its own
    /// appends, or ranges an index it keeps points at (the block service's segments). Served
    /// from the cached chunk list when it names the chunk holding them, an open chunk too,
    /// without asking the masters or the replicas for lengths (a lagging replica hands over
    /// to the next); anything else, or a failure, takes [`Client::read`]'s path.
    ///
    /// # Errors
    /// As [`Client::read`].
    pub async fn read_acknowledged(&self, path: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
        let cached = self.inner.cache.lock().get(path).cloned();
        let view = match cached {
            Some(v) => v,
            None => self.refresh(path).await?,
        };
        if let Some(Ok(data)) = self.read_known(&view, offset, len).await {
            return Ok(data);
        }
        self.read(path, offset, len).await
    }

    /// [`Client::read_acknowledged`] within `view`: `None` when the view cannot say where the
    /// range is (past its last chunk, an open chunk not last, a chunk group).
    async fn read_known(&self, view: &View, offset: u64, len: usize) -> Option<Result<Vec<u8>>> {
        let end = offset + len as u64;
        let last = view.chunks.len().checked_sub(1)?;
        let mut out = Vec::new();
        let mut start = 0u64;
        for (i, c) in view.chunks.iter().enumerate() {
            if c.ec_data > 0 || (!c.sealed && i != last) {
                return None;
            }
            // The open last chunk holds everything past the sealed ones.
            let stop = if c.sealed { start + c.length } else { u64::MAX };
            let (lo, hi) = (offset.max(start), end.min(stop));
            if lo < hi {
                match self.read_chunk(c, lo - start, (hi - lo) as usize).await {
                    // The first chunk's bytes are the answer's start: kept, not copied.
                    Ok(b) if out.is_empty() => out = b,
                    Ok(b) => out.extend(b),
                    Err(e) => return Some(Err(e)),
                }
            }
            if stop >= end {
                return Some(Ok(out));
            }
            start = stop;
        }
        None
    }

    async fn read_view(
        &self,
        path: &str,
        mut view: Arc<View>,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        // An open chunk whose replicas did not all answer has an uncertain length: the ones
        // that hold the acknowledged bytes may be the ones that did not answer. Such a range
        // is asked again (fresh locations, the writer may have sealed and moved on) for up to
        // about 3 s before it is called out of range; a certain length answers at once.
        let mut tries = 0;
        let lengths = loop {
            let (lengths, uncertain) = self.lengths_checked(&view).await;
            let length: u64 = lengths.iter().sum();
            if offset + len as u64 <= length {
                break lengths;
            }
            if !uncertain || tries == 9 {
                return Err(Error::OutOfRange {
                    path: path.into(),
                    offset,
                    len: len as u64,
                    length,
                });
            }
            tokio::time::sleep(Duration::from_millis(50 << tries.min(3))).await;
            tries += 1;
            view = self.refresh(path).await?;
        };
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
        let v = Arc::new(View::of(&f));
        self.inner.cache.lock().put(path.to_owned(), v.clone());
        Ok(v)
    }

    pub(crate) fn remember_addrs(&self, servers: &[pb::ServerAddr]) {
        let mut a = self.inner.addrs.lock();
        for s in servers {
            if a.get(&s.id) != Some(&s.addr) {
                a.insert(s.id, s.addr.clone());
                self.inner.conns.lock().remove(&s.id);
            }
        }
        self.inner.health.set_known(a.len());
    }

    /// Keeps the capabilities signed into `chunks` for the data-plane requests on them.
    pub(crate) fn remember_caps(&self, chunks: &[pb::ChunkMeta]) {
        for c in chunks {
            if !c.cap.is_empty() {
                self.inner.caps.remember(&c.cap);
            }
        }
    }

    pub(crate) fn absorb(&self, r: pb::FileReply) -> Result<pb::FileMeta> {
        self.remember_addrs(&r.servers);
        if let Some(f) = &r.file {
            self.remember_caps(&f.chunks);
        }
        r.file
            .ok_or_else(|| MetaError::internal("reply without a file").into())
    }

    async fn conn(&self, server: u64) -> Result<Arc<DataConn>> {
        // A connection the server closed (idle past its timeout) is replaced before it is
        // used, rather than failing the call that finds it closed.
        if let Some(c) = self.inner.conns.lock().get(&server)
            && !c.is_closed()
        {
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
        let c = Arc::new(
            DataConn::connect_with(
                sock,
                self.inner.opts.request_timeout,
                Some(self.inner.caps.clone()),
                self.inner.opts.data_tls.as_ref(),
            )
            .await
            .map_err(|e| Error::Data {
                server,
                addr: addr.clone(),
                source: e,
            })?,
        );
        // Another caller may have connected meanwhile: keep its connection if it is open.
        let mut conns = self.inner.conns.lock();
        match conns.get(&server) {
            Some(other) if !other.is_closed() => Ok(other.clone()),
            _ => {
                conns.insert(server, c.clone());
                Ok(c)
            }
        }
    }

    /// Runs one data-plane call; a dead connection is dropped so the next call reconnects.
    pub(crate) async fn on<T, F, Fut>(&self, server: u64, f: F) -> Result<T>
    where
        F: FnOnce(Arc<DataConn>) -> Fut,
        Fut: std::future::Future<Output = crate::data::Result<T>>,
    {
        let conn = match self.conn(server).await {
            Ok(c) => c,
            Err(e) => {
                if let Error::Data { source, .. } = &e {
                    self.inner.health.failure(server, source, Instant::now());
                }
                return Err(e);
            }
        };
        match f(conn.clone()).await {
            Ok(v) => Ok(v),
            Err(e) => {
                self.inner.health.failure(server, &e, Instant::now());
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

    /// Asks every replica of a chunk for its length.
    pub(crate) async fn replicas(&self, c: &pb::ChunkMeta) -> Replicas {
        let stats = join_all(
            c.servers
                .iter()
                .map(|s| self.on(*s, |d| async move { d.stat(c.id).await })),
        )
        .await;
        let mut r = Replicas {
            exists: false,
            lengths: Vec::new(),
        };
        for (s, server) in stats.into_iter().zip(&c.servers) {
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
            r.lengths.push((*server, l));
        }
        r
    }

    /// Readable bytes of each chunk: a sealed chunk's length; for an open chunk, what MinCopy
    /// replicas hold (the master's committed length if fewer answer).
    async fn lengths(&self, v: &View) -> Vec<u64> {
        self.lengths_checked(v).await.0
    }

    /// [`Self::lengths`], and whether an open chunk's length is uncertain (some of its
    /// replicas did not answer).
    async fn lengths_checked(&self, v: &View) -> (Vec<u64>, bool) {
        let mut each = join_all(v.chunks.iter().map(|c| async move {
            if c.sealed {
                (c.length, false)
            } else if let Some(l) = crate::group::layout(c) {
                let (len, uncertain) = self.group_length(c, &l).await;
                (len.unwrap_or(c.length).max(c.length), uncertain)
            } else {
                let r = self.replicas(c).await;
                let uncertain = r.lengths.len() < c.servers.len();
                let l = r
                    .quorum_length(v.min_copy)
                    .unwrap_or(c.length)
                    .max(c.length);
                (l, uncertain)
            }
        }))
        .await;
        // A group's stripes past its committed length count only while nothing after it in
        // the file holds bytes (they may be a tail's bytes folded in, not yet committed:
        // docs/erasure-coding.md §3).
        for i in 0..each.len() {
            let c = &v.chunks[i];
            if !c.sealed && c.ec_data > 0 && each[i + 1..].iter().any(|x| x.0 > 0) {
                each[i].0 = c.length;
            }
        }
        let uncertain = each.iter().any(|x| x.1);
        (each.into_iter().map(|x| x.0).collect(), uncertain)
    }

    async fn live_length(&self, v: &View) -> u64 {
        self.lengths(v).await.iter().sum()
    }

    /// Runs a data-plane call of `op` moving `bytes`, recording its latency for the server's
    /// health.
    pub(crate) async fn on_timed<T, F, Fut>(
        &self,
        server: u64,
        op: Op,
        bytes: usize,
        f: F,
    ) -> Result<T>
    where
        F: FnOnce(Arc<DataConn>) -> Fut,
        Fut: std::future::Future<Output = crate::data::Result<T>>,
    {
        let t = Instant::now();
        // Bytes sent count with every try; bytes received once they arrived.
        if op == Op::Write {
            self.inner.sent.fetch_add(bytes as u64, Ordering::Relaxed);
        }
        let r = self.on(server, f).await;
        if op == Op::Read && r.is_ok() {
            self.inner
                .received
                .fetch_add(bytes as u64, Ordering::Relaxed);
        }
        if r.is_ok() {
            let now = Instant::now();
            self.inner.health.sample(server, op, bytes, now - t, now);
        }
        r
    }

    /// Reads from the replicas in health order (fastest first, blacklisted last), falling
    /// over to fresh locations from the masters when all fail.
    async fn read_chunk(&self, c: &pb::ChunkMeta, offset: u64, len: usize) -> Result<Vec<u8>> {
        if let Some(l) = crate::group::layout(c) {
            if c.lz4_stream > 0 {
                return self.read_compressed(c, &l, offset, len).await;
            }
            return self.read_group(c, &l, offset, len).await;
        }
        let mut last = String::from("no replicas");
        for attempt in 0..2 {
            let servers = if attempt == 0 {
                c.servers.clone()
            } else {
                self.locate(c.id).await?.servers
            };
            let order = self.inner.health.order(&servers, Op::Read, len);
            match self.read_hedged(c.id, &order, offset, len).await {
                Ok(data) => return Ok(data),
                Err(e) => last = e,
            }
        }
        Err(Error::NoReplica { chunk: c.id, last })
    }

    /// One read over `order`: the first replica is asked; if it has not answered after its
    /// backup delay (its p95 for reads of this size) and the backup bucket has a token, the
    /// next one is asked too, and the first good answer wins. A replica that fails hands over
    /// to the next at once.
    async fn read_hedged(
        &self,
        chunk: u64,
        order: &[u64],
        offset: u64,
        len: usize,
    ) -> std::result::Result<Vec<u8>, String> {
        let health = &self.inner.health;
        health.read_started();
        let launch = |s: u64| async move {
            let r = self
                .on(s, |d| async move { d.read(chunk, offset, len).await })
                .await;
            if r.is_ok() {
                self.inner.received.fetch_add(len as u64, Ordering::Relaxed);
            }
            (s, r)
        };
        let mut inflight = FuturesUnordered::new();
        // (server, started) of the requests in flight.
        let mut started: Vec<(u64, Instant)> = Vec::new();
        let mut failed: Vec<u64> = Vec::new();
        let mut next = 0usize;
        let mut last = String::from("no replicas");
        let mut hedge = health.options().backup_reads;
        loop {
            if inflight.is_empty() {
                let Some(&s) = order.get(next) else {
                    return Err(last);
                };
                next += 1;
                started.push((s, Instant::now()));
                inflight.push(launch(s));
            }
            let newest = started.last().copied().expect("a request was started");
            let wait = if hedge && next < order.len() {
                Some(
                    health
                        .backup_delay(newest.0, len)
                        .saturating_sub(newest.1.elapsed()),
                )
            } else {
                None
            };
            tokio::select! {
                Some((s, r)) = inflight.next() => {
                    let now = Instant::now();
                    let t0 = started.iter().find(|x| x.0 == s).map_or(now, |x| x.1);
                    match r {
                        Ok(data) => {
                            health.sample(s, Op::Read, len, now - t0, now);
                            if s != started[0].0 {
                                health.stats.backups_won.fetch_add(1, Ordering::Relaxed);
                                metrics::counter!(
                                    "cairn_client_backup_reads_total",
                                    "result" => "won"
                                )
                                .increment(1);
                            }
                            // The replicas still asked were at least this slow: let their
                            // latency know.
                            for &(o, t) in &started {
                                if o != s && !failed.contains(&o) {
                                    health.sample(o, Op::Read, len, now - t, now);
                                }
                            }
                            return Ok(data);
                        }
                        Err(e) => {
                            failed.push(s);
                            last = e.to_string();
                        }
                    }
                }
                () = sleep_or_never(wait) => {
                    if health.take_backup() {
                        let s = order[next];
                        next += 1;
                        started.push((s, Instant::now()));
                        inflight.push(launch(s));
                    } else {
                        // No budget: this read waits for the replicas it asked.
                        hedge = false;
                    }
                }
            }
        }
    }
}

async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// The client's health task: every `probe_every`, pings the blacklisted servers whose grace
/// has run out (and the others, for the median), and every `report_every`, if the client was
/// busy or lists a server, tells the masters what it sees. Ends with the client.
async fn watch_health(inner: std::sync::Weak<Inner>) {
    let probe_every = match inner.upgrade() {
        Some(i) => i.opts.health.probe_every,
        None => return,
    };
    let mut last_report = Instant::now();
    loop {
        tokio::time::sleep(probe_every).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let client = Client { inner };
        let now = Instant::now();
        let due = client.inner.health.due(now);
        if !due.is_empty() {
            client.probe(&due).await;
        }
        if last_report.elapsed() >= client.inner.opts.health.report_every {
            last_report = Instant::now();
            // Busy clients report even with nothing listed: the masters weigh a server's
            // reporters against every client that reported.
            if let Some(report) = client.inner.health.take_report() {
                client.report(report).await;
            }
        }
    }
}

impl Client {
    /// Pings every known server; releases the `due` ones that answer well.
    async fn probe(&self, due: &[(u64, ListKind)]) {
        let ids: Vec<u64> = self.inner.addrs.lock().keys().copied().collect();
        let timeout = self.inner.opts.health.probe_every;
        let pings = join_all(ids.iter().map(|&s| async move {
            let t = Instant::now();
            let r = tokio::time::timeout(timeout, async {
                let conn = self.conn(s).await?;
                conn.ping().await.map_err(|e| Error::Data {
                    server: s,
                    addr: conn.addr().to_string(),
                    source: e,
                })
            })
            .await;
            match r {
                Ok(Ok(())) => Some(t.elapsed()),
                Ok(Err(_)) | Err(_) => None,
            }
        }))
        .await;
        let mut answered: Vec<Duration> = pings.iter().flatten().copied().collect();
        answered.sort_unstable();
        let median = answered.get(answered.len() / 2).copied();
        let now = Instant::now();
        for &(s, _) in due {
            let took = ids.iter().position(|&x| x == s).and_then(|i| pings[i]);
            self.inner.health.probed(s, took, median, now);
        }
    }

    /// Tells the masters which servers this client has listed (seeds/004 §6.2).
    async fn report(&self, report: Vec<(u64, Option<ListKind>, u64)>) {
        let req = pb::ClientReport {
            client_id: self.inner.client_id.clone(),
            servers: report
                .into_iter()
                .map(|(server_id, kind, errors)| pb::ServerReport {
                    server_id,
                    failed: kind == Some(ListKind::Failed),
                    slow: kind == Some(ListKind::Slow),
                    errors,
                })
                .collect(),
        };
        // Best effort, and never for long: the probes share this task.
        let r = tokio::time::timeout(
            self.inner.opts.health.report_every,
            self.inner
                .masters
                .send(req, |mut c, r| async move { c.report(r).await }),
        )
        .await;
        match r {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "health report to the masters failed"),
            Err(_) => tracing::debug!("health report to the masters timed out"),
        }
    }
}

fn known_length(v: &View) -> u64 {
    v.chunks.iter().map(|c| c.length).sum()
}

/// What the replicas of a chunk said: whether any has it, and the length of each that
/// answered (a replica without the chunk counts as 0).
pub(crate) struct Replicas {
    pub exists: bool,
    pub lengths: Vec<(u64, u64)>,
}

impl Replicas {
    /// The length at least `min_copy` of the answering replicas hold: every byte below it is
    /// durable on a quorum. `None` when fewer than `min_copy` answered.
    pub fn quorum_length(&self, min_copy: usize) -> Option<u64> {
        let mut l: Vec<u64> = self.lengths.iter().map(|x| x.1).collect();
        l.sort_unstable_by(|a, b| b.cmp(a));
        l.get(min_copy.max(1) - 1).copied()
    }
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
                            client.remember_caps(&reply.chunks);
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
