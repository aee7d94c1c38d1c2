//! The public face of a chunk store: format, open (recover), and the chunk operations.

use crate::buf::AlignedBuf;
use crate::buf::BufPool;
use crate::disk::Disk;
use crate::error::{ChunkId, Error, Result};
use crate::format::checkpoint::Checkpoint;
use crate::index::{ChunkEntry, Index};
use crate::layout::{self, FormatOptions, Geometry};
use crate::prepare::Prepared;
use crate::read::ReadBuf;
use crate::recovery::{self, RecoveryReport};
use crate::writer::{self, Limits, Request, Writer};
use parking_lot::{Mutex, RwLock};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use tokio::sync::{mpsc, oneshot};

/// When an acknowledged write is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every batch is flushed (`fdatasync`) before any of it is acknowledged. The default.
    #[default]
    Sync,
    /// Writes are O_DIRECT but never flushed: a power cut can lose acknowledged appends.
    /// **For benchmarks only** (it measures the store without the device's flush cost).
    None,
}

/// Run-time options of [`ChunkStore::open`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    pub durability: Durability,
    /// Requests queued for the device thread before callers wait (backpressure).
    pub queue_depth: usize,
    /// Most requests in one group commit.
    pub max_batch_requests: usize,
    /// Most appended bytes in one group commit.
    pub max_batch_bytes: usize,
    /// Largest single append. Queue memory is bounded by `queue_depth × max_append_bytes`.
    pub max_append_bytes: usize,
    /// Verified segment headers of large appends kept for reads (about 1 KiB each with
    /// 1 MiB extents). A sequential reader then reads each header once, with the range
    /// that holds it, instead of once more per read that starts after it. 0 turns it off.
    pub header_cache_entries: usize,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Sync,
            queue_depth: 256,
            max_batch_requests: 256,
            max_batch_bytes: 32 << 20,
            max_append_bytes: 4 << 20,
            header_cache_entries: 4096,
        }
    }
}

/// What [`ChunkStore::stat`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkStat {
    pub chunk_id: ChunkId,
    /// Acknowledged (durable) length.
    pub length: u64,
    pub sealed: bool,
    /// The version given at create.
    pub version: u64,
    /// This store's incarnation number of the chunk.
    pub epoch: u64,
    /// CRC32C of bytes `[0, length)`; for a sealed chunk, the CRC of the whole chunk.
    pub crc32c: u32,
}

impl ChunkStat {
    pub(crate) fn of(chunk_id: ChunkId, c: &ChunkEntry) -> Self {
        Self {
            chunk_id,
            length: c.length,
            sealed: c.sealed,
            version: c.version,
            epoch: c.epoch,
            crc32c: c.crc,
        }
    }
}

/// Space accounting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpaceStat {
    pub extent_bytes: u64,
    pub extents_total: u32,
    pub extents_free: u32,
    pub chunks: usize,
    pub max_chunks: u32,
}

/// Counters since open.
#[derive(Debug, Default)]
pub struct Stats {
    pub batches: AtomicU64,
    pub flushes: AtomicU64,
    pub appends: AtomicU64,
    pub append_bytes: AtomicU64,
    pub checkpoints: AtomicU64,
    /// Appends that continued a unit an earlier append of the same batch left partly filled.
    pub chained_appends: AtomicU64,
    /// Batches started while another batch was in flight.
    pub overlapped_batches: AtomicU64,
    /// Requests a blocking caller ran itself, the device thread being idle
    /// (docs/formats/chunk-store.md §3, the write path).
    pub alone_batches: AtomicU64,
    /// Appends laid out as large appends (their bytes written from the caller's buffer when
    /// it came through `append_aligned`).
    pub large_appends: AtomicU64,
    /// Segment headers a read took from the header cache instead of the device.
    pub header_cache_hits: AtomicU64,
    /// Where acknowledged appends spent their time, summed over them in nanoseconds (divide
    /// by `appends` for a mean): queued, from the caller's CRCs done until the device thread
    /// started its batch; writing, until the device thread took the batch's writes as done
    /// (batches are taken in order); flushing, from then until acknowledged (the group's
    /// flush, or none, and the commit).
    pub append_queue_ns: AtomicU64,
    pub append_write_ns: AtomicU64,
    pub append_flush_ns: AtomicU64,
}

/// Read buffers kept for reuse (each the next power of two above a read's device bytes: 2 MiB
/// for a 1 MiB read).
const READ_BUFFERS: usize = 16;

/// State shared by the device thread and readers.
pub(crate) struct Shared {
    pub disk: Arc<dyn Disk>,
    pub geo: Geometry,
    pub index: RwLock<Index>,
    pub failed: AtomicBool,
    pub free_extents: AtomicU32,
    pub stats: Stats,
    pub pool: BufPool,
    /// Wakes the device thread from a wait on the device when a request is queued.
    pub doorbell: crate::doorbell::Doorbell,
    pub headers: crate::read::HeaderCache,
    /// Read buffers, handed out inside [`crate::ReadBuf`]s and returned when they drop.
    pub read_pool: Arc<BufPool>,
    /// Requests queued to the device thread that it has not yet taken under the writer's
    /// lock (raised before a send, lowered by the thread).
    pub queued: AtomicUsize,
}

/// An append-only chunk store on one device.
///
/// All methods take `&self` and may be called from many threads. Blocking methods (`append`,
/// `create`, …) must not be called from inside an async runtime; use the `*_async` forms
/// there. Reads never go through the device thread: they `pread` from the caller's thread.
pub struct ChunkStore {
    shared: Arc<Shared>,
    /// The device thread's state; a blocking caller takes it when the thread is idle.
    writer: Arc<Mutex<Writer>>,
    tx: mpsc::Sender<Request>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ChunkStore {
    /// Formats `disk`: writes the superblock and an empty checkpoint. Everything on the
    /// device before is forgotten (and cannot be mistaken for data: every structure's CRC is
    /// salted with the new store id).
    ///
    /// # Errors
    /// `Config` when the options do not fit the device, `Io` on write errors.
    pub fn format(disk: &dyn Disk, opts: &FormatOptions) -> Result<()> {
        let mut store_id = [0u8; 16];
        rand::fill(&mut store_id);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let sb = layout::plan(opts, disk.capacity(), disk.alignment(), store_id, now_ms)
            .map_err(Error::Config)?;
        let geo = Geometry::new(sb);
        // An invalid slot 1 header, then checkpoint 0 in slot 0.
        let zero = crate::buf::AlignedBuf::zeroed(4096.max(disk.alignment()));
        disk.write_at(&zero, geo.sb.ckpt_offsets[1])
            .map_err(|e| Error::io("format", e))?;
        let empty = Checkpoint {
            seq: 0,
            lsn: 0,
            next_epoch: 1,
            mount_gen: 0,
            chunks: Vec::new(),
        };
        writer::write_checkpoint(disk, &geo, &empty)?;
        let sb_bytes = geo.sb.encode();
        let buf = crate::buf::AlignedBuf::copy_of(&sb_bytes);
        disk.write_at(&buf, 0).map_err(|e| Error::io("format", e))?;
        disk.sync().map_err(|e| Error::io("format", e))
    }

    /// Opens a formatted store, recovering from whatever state a crash left it in.
    ///
    /// # Errors
    /// `Format` when the superblock or every checkpoint is unreadable; `Io` on read errors.
    pub fn open(disk: Arc<dyn Disk>, opts: OpenOptions) -> Result<(Self, RecoveryReport)> {
        let (geo, mut rec, report) = recovery::recover(&*disk)?;
        let shared = Arc::new(Shared {
            disk,
            geo,
            index: RwLock::new(Index::default()),
            failed: AtomicBool::new(false),
            free_extents: AtomicU32::new(rec.alloc.free_count()),
            stats: Stats::default(),
            pool: BufPool::default(),
            doorbell: crate::doorbell::Doorbell::new(),
            headers: crate::read::HeaderCache::new(opts.header_cache_entries),
            read_pool: Arc::new(BufPool::new(READ_BUFFERS)),
            queued: AtomicUsize::new(0),
        });
        *shared.index.write() = std::mem::take(&mut rec.index);
        let limits = Limits {
            max_batch_requests: opts.max_batch_requests.max(1),
            max_batch_bytes: opts.max_batch_bytes.max(1),
            max_append_bytes: opts.max_append_bytes.max(1),
        };
        let writer = Arc::new(Mutex::new(Writer::new(
            shared.clone(),
            opts.durability,
            limits,
            rec,
        )));
        let (tx, rx) = mpsc::channel(opts.queue_depth.max(1));
        let core = writer.clone();
        let thread = std::thread::Builder::new()
            .name("cairn-device".into())
            .spawn(move || {
                let mut w = core.lock();
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    Writer::run(&mut w, rx)
                }));
                w.stopped = true;
                drop(w);
                if let Err(panic) = r {
                    std::panic::resume_unwind(panic);
                }
            })
            .map_err(|e| Error::io("spawn device thread", e))?;
        Ok((
            Self {
                shared,
                writer,
                tx,
                thread: Some(thread),
            },
            report,
        ))
    }

    fn submit<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Request,
    ) -> Result<oneshot::Receiver<Result<T>>> {
        let (reply, rx) = oneshot::channel();
        self.queue(make(reply))?;
        Ok(rx)
    }

    /// Queues a request to the device thread.
    fn queue(&self, r: Request) -> Result<()> {
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        if self.tx.blocking_send(r).is_err() {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::Closed);
        }
        self.shared.doorbell.ring();
        Ok(())
    }

    /// Runs a request and waits for its answer. When the device thread is idle and nothing is
    /// queued, the caller runs the request itself (LevelDB's writer that finds no group
    /// leader leads its own): the same plan, write, flush and commit, without the two thread
    /// switches of a trip through the device thread. Otherwise it queues the request.
    fn call<T>(&self, make: impl FnOnce(oneshot::Sender<Result<T>>) -> Request) -> Result<T> {
        let (reply, rx) = oneshot::channel();
        let r = make(reply);
        // The lock is released before queueing: a caller blocked on a full queue while holding
        // it would keep the device thread from taking requests off the queue.
        let queued = match self.writer.try_lock() {
            Some(mut w) if !w.stopped && self.shared.queued.load(Ordering::SeqCst) == 0 => {
                w.run_alone(r);
                None
            }
            _ => Some(r),
        };
        if let Some(r) = queued {
            self.queue(r)?;
        }
        Self::wait(rx)
    }

    async fn submit_async<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Request,
    ) -> Result<T> {
        let (reply, rx) = oneshot::channel();
        // Room first, then count and send with no await between: a future dropped while it
        // waits for room must not leave the count raised.
        let permit = self.tx.reserve().await.map_err(|_| Error::Closed)?;
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        permit.send(make(reply));
        self.shared.doorbell.ring();
        rx.await.map_err(|_| Error::Closed)?
    }

    fn submit_append(
        &self,
        chunk_id: ChunkId,
        data: Prepared,
        sync: bool,
    ) -> Result<oneshot::Receiver<Result<u64>>> {
        self.submit(|reply| Request::Append {
            chunk_id,
            data,
            sync,
            reply,
        })
    }

    fn wait<T>(rx: oneshot::Receiver<Result<T>>) -> Result<T> {
        rx.blocking_recv().map_err(|_| Error::Closed)?
    }

    /// Creates an empty chunk. Durable when it returns.
    ///
    /// # Errors
    /// `AlreadyExists`, `TooManyChunks`, `StoreFailed`, `Io`.
    pub fn create(&self, chunk_id: ChunkId, version: u64) -> Result<()> {
        self.call(|reply| Request::Create {
            chunk_id,
            version,
            reply,
            first: None,
        })
    }

    /// Appends `data` at `offset`, which must equal the chunk's current length. Returns the
    /// new length once the bytes are durable.
    ///
    /// # Errors
    /// `OffsetMismatch { length }` when `offset` is not the current length; `NotFound`,
    /// `Sealed`, `ChunkFull`, `BadAppendSize`, `NoSpace`, `ChunkFailed`, `StoreFailed`, `Io`.
    pub fn append(&self, chunk_id: ChunkId, offset: u64, data: &[u8]) -> Result<u64> {
        self.append_with(chunk_id, offset, data, true)
    }

    /// An append acknowledged once durable (`sync`) or once written.
    fn append_with(&self, chunk_id: ChunkId, offset: u64, data: &[u8], sync: bool) -> Result<u64> {
        let data = self.prepare(offset, data);
        self.call(|reply| Request::Append {
            chunk_id,
            data,
            sync,
            reply,
        })
    }

    /// Async form of [`ChunkStore::append_with`].
    fn append_async_with(
        &self,
        chunk_id: ChunkId,
        offset: u64,
        data: &[u8],
        sync: bool,
    ) -> impl Future<Output = Result<u64>> + '_ {
        let data = self.prepare(offset, data);
        self.submit_async(move |reply| Request::Append {
            chunk_id,
            data,
            sync,
            reply,
        })
    }

    /// Lays the append out in sector units and checksums it, on the caller's thread.
    fn prepare(&self, offset: u64, data: &[u8]) -> Prepared {
        Prepared::new(&self.shared.geo, &self.shared.pool, offset, data)
    }

    /// Appends `buf[..len]` at `offset` without copying it when it is laid out as a large
    /// append (docs/formats/chunk-store.md §3.2: at least 512 KiB and `buf` holds `len`
    /// rounded up to the store's unit; [`AlignedBuf`] is aligned enough): the device writes
    /// the bytes from `buf` itself. Other appends are copied as by [`ChunkStore::append`].
    /// The store keeps its clone of `buf` until the write is done, never longer than the
    /// call.
    ///
    /// # Errors
    /// As [`ChunkStore::append`]; `BadAppendSize` when `len` exceeds `buf`.
    pub fn append_aligned(
        &self,
        chunk_id: ChunkId,
        offset: u64,
        buf: Arc<AlignedBuf>,
        len: usize,
    ) -> Result<u64> {
        let data = self.prepare_aligned(offset, buf, len)?;
        self.call(|reply| Request::Append {
            chunk_id,
            data,
            sync: true,
            reply,
        })
    }

    /// [`ChunkStore::append_aligned`] that returns at once, like
    /// [`ChunkStore::append_pipelined`].
    ///
    /// # Errors
    /// As [`ChunkStore::append_pipelined`].
    pub fn append_aligned_pipelined(
        &self,
        chunk_id: ChunkId,
        offset: u64,
        buf: Arc<AlignedBuf>,
        len: usize,
    ) -> Result<Pending<u64>> {
        let data = self.prepare_aligned(offset, buf, len)?;
        Ok(Pending(self.submit_append(chunk_id, data, true)?))
    }

    /// Async form of [`ChunkStore::append_aligned`] (`sync: false` as
    /// [`ChunkStore::append_unsynced`]).
    pub fn append_aligned_async(
        &self,
        chunk_id: ChunkId,
        offset: u64,
        buf: Arc<AlignedBuf>,
        len: usize,
        sync: bool,
    ) -> impl Future<Output = Result<u64>> + '_ {
        let data = self.prepare_aligned(offset, buf, len);
        async move {
            let data = data?;
            self.submit_async(move |reply| Request::Append {
                chunk_id,
                data,
                sync,
                reply,
            })
            .await
        }
    }

    fn prepare_aligned(&self, offset: u64, buf: Arc<AlignedBuf>, len: usize) -> Result<Prepared> {
        if len > buf.len() {
            return Err(Error::BadAppendSize {
                append_bytes: len as u64,
                max_append_bytes: buf.len() as u64,
            });
        }
        Ok(Prepared::new_aligned(
            &self.shared.geo,
            &self.shared.pool,
            offset,
            buf,
            len,
            false,
        ))
    }

    /// Queues an append and returns at once; the returned [`Pending`] resolves when it is
    /// durable. Lets one thread keep many appends in flight (they share flushes).
    ///
    /// # Errors
    /// `Closed` if the store is closed; the append's own errors come from [`Pending::wait`].
    pub fn append_pipelined(
        &self,
        chunk_id: ChunkId,
        offset: u64,
        data: &[u8],
    ) -> Result<Pending<u64>> {
        let data = self.prepare(offset, data);
        Ok(Pending(self.submit_append(chunk_id, data, true)?))
    }

    /// Async form of [`ChunkStore::append`]. The bytes are laid out and checksummed when it
    /// is called, not when the future is first polled.
    pub fn append_async(
        &self,
        chunk_id: ChunkId,
        offset: u64,
        data: &[u8],
    ) -> impl Future<Output = Result<u64>> + '_ {
        self.append_async_with(chunk_id, offset, data, true)
    }

    /// An append acknowledged as soon as it is written, before any flush: for copies whose
    /// loss in a power cut costs only a retry (re-replication), which should not pay for, or
    /// make foreground appends wait behind, a flush of their own.
    ///
    /// Until a later flush of the store covers it — any synced append's or create's, a
    /// checkpoint's, or the one [`ChunkStore::seal`] of such a chunk runs before writing its
    /// log entry — a power cut may lose it and any later bytes of the chunk (the chunk
    /// recovers to a prefix of its appends, as after an unacknowledged append, never to a
    /// damaged chunk). An append that continues the partly filled last unit an unsynced
    /// append left flushes first; keep unsynced appends on multiples of
    /// [`ChunkStore::unit_data_bytes`] to avoid that. Reads see it at once. With
    /// `durability = none` it is the same as [`ChunkStore::append`].
    ///
    /// # Errors
    /// As [`ChunkStore::append`].
    pub fn append_unsynced(&self, chunk_id: ChunkId, offset: u64, data: &[u8]) -> Result<u64> {
        self.append_with(chunk_id, offset, data, false)
    }

    /// Async form of [`ChunkStore::append_unsynced`].
    pub fn append_unsynced_async(
        &self,
        chunk_id: ChunkId,
        offset: u64,
        data: &[u8],
    ) -> impl Future<Output = Result<u64>> + '_ {
        self.append_async_with(chunk_id, offset, data, false)
    }

    /// Async form of [`ChunkStore::create`].
    pub fn create_async(
        &self,
        chunk_id: ChunkId,
        version: u64,
    ) -> impl Future<Output = Result<()>> + '_ {
        self.submit_async(move |reply| Request::Create {
            chunk_id,
            version,
            reply,
            first: None,
        })
    }

    /// Creates a chunk with its first append (the data plane's create with a piggybacked
    /// append): both go into one batch, so they share one flush. Returns the new length once
    /// both are durable. A refused create makes no append; a refused append leaves the chunk
    /// created and empty, as [`ChunkStore::create`] followed by [`ChunkStore::append`] would.
    ///
    /// # Errors
    /// As [`ChunkStore::create`], then as [`ChunkStore::append`].
    pub fn create_with_append(&self, chunk_id: ChunkId, version: u64, data: &[u8]) -> Result<u64> {
        let data = self.prepare(0, data);
        let (areply, arx) = oneshot::channel();
        self.call(|reply| Request::Create {
            chunk_id,
            version,
            reply,
            first: Some((data, areply)),
        })?;
        Self::wait(arx)
    }

    /// Async form of [`ChunkStore::create_with_append`].
    pub fn create_with_append_async(
        &self,
        chunk_id: ChunkId,
        version: u64,
        data: &[u8],
    ) -> impl Future<Output = Result<u64>> + '_ {
        let data = self.prepare(0, data);
        self.create_with_prepared(chunk_id, version, Ok(data))
    }

    /// [`ChunkStore::create_with_append_async`] of an aligned buffer, written without a copy
    /// when it makes a large append (as [`ChunkStore::append_aligned`]).
    pub fn create_with_append_aligned_async(
        &self,
        chunk_id: ChunkId,
        version: u64,
        buf: Arc<AlignedBuf>,
        len: usize,
    ) -> impl Future<Output = Result<u64>> + '_ {
        let data = self.prepare_aligned(0, buf, len);
        self.create_with_prepared(chunk_id, version, data)
    }

    async fn create_with_prepared(
        &self,
        chunk_id: ChunkId,
        version: u64,
        data: Result<Prepared>,
    ) -> Result<u64> {
        let data = data?;
        let (areply, arx) = oneshot::channel();
        self.submit_async(move |reply| Request::Create {
            chunk_id,
            version,
            reply,
            first: Some((data, areply)),
        })
        .await?;
        arx.await.map_err(|_| Error::Closed)?
    }

    /// Seals the chunk at its current length: no more appends. Idempotent. Returns its stat,
    /// whose `crc32c` is the CRC of the whole chunk.
    ///
    /// # Errors
    /// `NotFound`, `StoreFailed`, `Io`.
    pub fn seal(&self, chunk_id: ChunkId) -> Result<ChunkStat> {
        self.call(|reply| Request::Seal {
            chunk_id,
            at: None,
            reply,
        })
    }

    /// Async form of [`ChunkStore::seal`].
    pub fn seal_async(&self, chunk_id: ChunkId) -> impl Future<Output = Result<ChunkStat>> + '_ {
        self.submit_async(move |reply| Request::Seal {
            chunk_id,
            at: None,
            reply,
        })
    }

    /// Seals the chunk at `length`, which may be below its current length: the bytes past it
    /// are dropped (a replicated writer seals every replica at the length a quorum holds).
    /// Reads the kept bytes to compute their CRC, so it blocks; call it off the async runtime.
    /// Idempotent at the same length.
    ///
    /// # Errors
    /// `OutOfRange { length }` when the chunk is shorter than `length`; `Sealed { length }` when
    /// it is already sealed at another length; `NotFound`, `Corruption`, `StoreFailed`, `Io`.
    pub fn seal_at(&self, chunk_id: ChunkId, length: u64) -> Result<ChunkStat> {
        let st = self.stat(chunk_id)?;
        if st.sealed && length != st.length {
            let length = st.length;
            return Err(Error::Sealed { chunk_id, length });
        }
        if length > st.length {
            return Err(Error::OutOfRange {
                chunk_id,
                offset: 0,
                len: length,
                length: st.length,
            });
        }
        if length == st.length {
            // The CRC of [0, length) never changes, even if appends land meanwhile.
            return self.call(|reply| Request::Seal {
                chunk_id,
                at: Some((length, st.crc32c)),
                reply,
            });
        }
        let mut crc = 0u32;
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0u64;
        while off < length {
            let n = ((length - off) as usize).min(buf.len());
            self.read_into(chunk_id, off, &mut buf[..n])?;
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            off += n as u64;
        }
        self.call(|reply| Request::Seal {
            chunk_id,
            at: Some((length, crc)),
            reply,
        })
    }

    /// Deletes the chunk; its extents are reused once the delete is durable.
    ///
    /// # Errors
    /// `NotFound`, `StoreFailed`, `Io`.
    pub fn delete(&self, chunk_id: ChunkId) -> Result<()> {
        self.call(|reply| Request::Delete { chunk_id, reply })
    }

    /// Async form of [`ChunkStore::delete`].
    pub fn delete_async(&self, chunk_id: ChunkId) -> impl Future<Output = Result<()>> + '_ {
        self.submit_async(move |reply| Request::Delete { chunk_id, reply })
    }

    /// Reads `len` bytes at `offset`, verifying the CRC of every unit touched.
    ///
    /// # Errors
    /// `OutOfRange { length }` past the durable length; `Corruption { chunk_id, offset }`
    /// when the device returns bytes that do not match their CRC; `NotFound`; `Io`.
    pub fn read(&self, chunk_id: ChunkId, offset: u64, len: usize) -> Result<Vec<u8>> {
        Ok(self.read_buf(chunk_id, offset, len)?.to_vec())
    }

    /// [`ChunkStore::read`] into a caller's buffer.
    pub fn read_into(&self, chunk_id: ChunkId, offset: u64, out: &mut [u8]) -> Result<()> {
        self.read_buf(chunk_id, offset, out.len())?.copy_to(out);
        Ok(())
    }

    /// [`ChunkStore::read`] without the copy: the verified bytes where the device put them,
    /// with their CRC32C (see [`ReadBuf`]).
    ///
    /// # Errors
    /// As [`ChunkStore::read`].
    pub fn read_buf(&self, chunk_id: ChunkId, offset: u64, len: usize) -> Result<ReadBuf> {
        crate::read::read_buf(&self.shared, chunk_id, offset, len)
    }

    /// The chunk's durable state.
    ///
    /// # Errors
    /// `NotFound`.
    pub fn stat(&self, chunk_id: ChunkId) -> Result<ChunkStat> {
        let index = self.shared.index.read();
        index
            .chunks
            .get(&chunk_id)
            .map(|c| ChunkStat::of(chunk_id, c))
            .ok_or(Error::NotFound { chunk_id })
    }

    /// Every chunk id, sorted.
    pub fn list(&self) -> Vec<ChunkId> {
        let mut ids: Vec<ChunkId> = self.shared.index.read().chunks.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Space and table usage.
    pub fn space(&self) -> SpaceStat {
        SpaceStat {
            extent_bytes: self.shared.geo.extent_bytes,
            extents_total: self.shared.geo.sb.extent_count,
            extents_free: self.shared.free_extents.load(Ordering::Relaxed),
            chunks: self.shared.index.read().chunks.len(),
            max_chunks: self.shared.geo.sb.max_chunks,
        }
    }

    /// Counters since open.
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Whether a flush or log error has made the store refuse writes.
    pub fn is_failed(&self) -> bool {
        self.shared.failed.load(Ordering::Acquire)
    }

    /// Device offset of the data region (extent 0); benchmarks read the raw floor there.
    pub fn data_offset(&self) -> u64 {
        self.shared.geo.sb.data_offset
    }

    /// Data bytes per sector unit. Unsynced appends that end on a multiple of it never need
    /// a flush of their own (see [`ChunkStore::append_unsynced`]).
    pub fn unit_data_bytes(&self) -> u64 {
        self.shared.geo.data as u64
    }

    /// Largest chunk this store accepts.
    pub fn max_chunk_bytes(&self) -> u64 {
        self.shared.geo.sb.max_chunk_bytes
    }

    /// Writes a checkpoint now and waits for it (normally they happen in the background).
    ///
    /// # Errors
    /// `StoreFailed`, `Io`.
    pub fn checkpoint(&self) -> Result<()> {
        Self::wait(self.submit(|reply| Request::Checkpoint { reply })?)
    }

    /// Stops the device thread without a final checkpoint (in-flight work is finished first),
    /// leaving the device as a crash after the last acknowledgement would. For tests and the
    /// recovery benchmark.
    pub fn abandon(mut self) {
        if let Ok(rx) = self.submit(|reply| Request::Abandon { reply }) {
            let _ = Self::wait(rx);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Writes a final checkpoint and stops the device thread.
    ///
    /// # Errors
    /// As [`ChunkStore::checkpoint`]; the store is closed either way.
    pub fn close(mut self) -> Result<()> {
        let r = self
            .submit(|reply| Request::Shutdown { reply })
            .and_then(Self::wait);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        r
    }
}

impl Drop for ChunkStore {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let (reply, _rx) = oneshot::channel();
            // If the queue is full or the thread is gone, dropping the sender ends the loop.
            self.shared.queued.fetch_add(1, Ordering::SeqCst);
            let _ = self.tx.try_send(Request::Shutdown { reply });
            self.shared.doorbell.ring();
            let (dead_tx, _) = mpsc::channel(1);
            drop(std::mem::replace(&mut self.tx, dead_tx));
            let _ = t.join();
        }
    }
}

/// An append in flight (see [`ChunkStore::append_pipelined`]).
pub struct Pending<T>(oneshot::Receiver<Result<T>>);

impl<T> Pending<T> {
    /// Blocks until the operation completes.
    ///
    /// # Errors
    /// The operation's error, or `Closed`.
    pub fn wait(self) -> Result<T> {
        self.0.blocking_recv().map_err(|_| Error::Closed)?
    }
}
