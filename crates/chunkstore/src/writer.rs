//! The device thread: every mutation of a store runs here, in batches (group commit).
//!
//! One loop per device: take every queued request (up to a batch limit), check each against
//! the chunk table, build the sector units of all appends and at most one operation-log block,
//! hand all writes to the device at once, flush once, then commit the new state to the index
//! and answer every request. Appends to the same chunk in one batch become one write. A seal
//! or delete of a chunk that has other work in the batch waits for the next batch, so that a
//! logged seal never names bytes whose write could still fail.

use crate::buf::AlignedBuf;
use crate::checksum;
use crate::disk::Disk;
use crate::error::{ChunkId, Error, Result};
use crate::format::checkpoint::{Checkpoint, ChunkRecord};
use crate::format::footer::{self, FLAG_APPEND_END, Footer};
use crate::format::log::{self, LogEntry};
use crate::index::{Allocator, ChunkEntry};
use crate::store::{ChunkStat, Durability, Shared};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::{mpsc, oneshot};

type Reply<T> = oneshot::Sender<Result<T>>;

/// A request to the device thread.
pub(crate) enum Request {
    Create {
        chunk_id: ChunkId,
        version: u64,
        reply: Reply<()>,
    },
    Append {
        chunk_id: ChunkId,
        offset: u64,
        data: Vec<u8>,
        reply: Reply<u64>,
    },
    Seal {
        chunk_id: ChunkId,
        reply: Reply<ChunkStat>,
    },
    Delete {
        chunk_id: ChunkId,
        reply: Reply<()>,
    },
    Checkpoint {
        reply: Reply<()>,
    },
    Shutdown {
        reply: Reply<()>,
    },
    /// Stop at once, without a final checkpoint, as a crash would.
    Abandon {
        reply: Reply<()>,
    },
}

impl Request {
    fn chunk_id(&self) -> Option<ChunkId> {
        match self {
            Request::Create { chunk_id, .. }
            | Request::Append { chunk_id, .. }
            | Request::Seal { chunk_id, .. }
            | Request::Delete { chunk_id, .. } => Some(*chunk_id),
            Request::Checkpoint { .. } | Request::Shutdown { .. } | Request::Abandon { .. } => None,
        }
    }
}

/// The cached last, partly filled unit of an open chunk, exactly as it is on the device.
pub(crate) struct Tail {
    pub unit: u32,
    pub buf: AlignedBuf,
    /// The slot holding the footer that describes the acknowledged bytes.
    pub cur_slot: usize,
    /// That footer's data CRC: CRC32C of the unit's acknowledged bytes.
    pub data_crc: u32,
}

/// Limits of the device thread.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub max_batch_requests: usize,
    pub max_batch_bytes: usize,
    pub max_append_bytes: usize,
}

/// State owned by the device thread alone.
pub(crate) struct Writer {
    pub shared: Arc<Shared>,
    pub durability: Durability,
    pub limits: Limits,
    pub mount_gen: u32,
    pub next_epoch: u64,
    pub next_lsn: u64,
    pub alloc: Allocator,
    pub tails: HashMap<ChunkId, Tail>,
    pub failed_chunks: HashSet<ChunkId>,
    pub ckpt_seq: u64,
    pub ckpt_durable_lsn: u64,
    pub ckpt_in_flight: Option<(u64, std::thread::JoinHandle<Result<()>>)>,
    carry: VecDeque<Request>,
    /// Write buffers of earlier batches, reused (fresh zeroed memory costs a page fault per
    /// 4 KiB on first touch).
    pool: Vec<AlignedBuf>,
}

/// Buffers kept in the pool, at most.
const POOL_BUFFERS: usize = 64;

/// The appends of one chunk in one batch.
struct ChunkPlan {
    epoch: u64,
    base_len: u64,
    base_crc: u32,
    pieces: Vec<Vec<u8>>,
    ends: Vec<u64>,
    replies: Vec<(Reply<u64>, u64)>,
    /// Extents allocated by this batch (released again if the write fails).
    new_extents: Vec<u32>,
    new_tail: Option<Tail>,
    new_crc: u32,
    /// Indexes into the batch's write list.
    writes: Vec<usize>,
    error: Option<Error>,
}

impl ChunkPlan {
    fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(self.base_len)
    }
}

#[derive(Default)]
struct Batch {
    order: Vec<ChunkId>,
    chunks: HashMap<ChunkId, ChunkPlan>,
    log: Vec<LogEntry>,
    log_bytes: usize,
    creates: Vec<(ChunkId, u64, u64, Reply<()>)>,
    created: HashMap<ChunkId, u64>,
    seals: Vec<(ChunkId, Reply<ChunkStat>)>,
    deletes: Vec<(ChunkId, Reply<()>)>,
    touched: HashSet<ChunkId>,
    deferred: HashSet<ChunkId>,
    checkpoints: Vec<Reply<()>>,
    shutdown: Option<Reply<()>>,
    abandon: Option<Reply<()>>,
}

impl Writer {
    pub(crate) fn new(
        shared: Arc<Shared>,
        durability: Durability,
        limits: Limits,
        rec: crate::recovery::Recovered,
    ) -> Self {
        Self {
            shared,
            durability,
            limits,
            mount_gen: rec.mount_gen,
            next_epoch: rec.next_epoch,
            next_lsn: rec.next_lsn,
            alloc: rec.alloc,
            tails: rec.tails,
            failed_chunks: rec.damaged,
            ckpt_seq: rec.ckpt_seq,
            ckpt_durable_lsn: rec.ckpt_lsn,
            ckpt_in_flight: None,
            carry: VecDeque::new(),
            pool: Vec::new(),
        }
    }

    /// The loop of the device thread. Returns when asked to shut down or when every sender
    /// is gone.
    pub(crate) fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        loop {
            let mut reqs: Vec<Request> = self.carry.drain(..).collect();
            if reqs.is_empty() {
                match rx.blocking_recv() {
                    Some(r) => reqs.push(r),
                    None => {
                        let _ = self.shutdown_checkpoint();
                        return;
                    }
                }
            }
            let mut bytes: usize = reqs.iter().map(req_bytes).sum();
            while reqs.len() < self.limits.max_batch_requests && bytes < self.limits.max_batch_bytes
            {
                match rx.try_recv() {
                    Ok(r) => {
                        bytes += req_bytes(&r);
                        reqs.push(r);
                    }
                    Err(_) => break,
                }
            }
            if self.run_batch(reqs) {
                return;
            }
        }
    }

    /// Plans, writes, flushes and commits one batch. Returns true when the thread must stop.
    fn run_batch(&mut self, reqs: Vec<Request>) -> bool {
        self.poll_checkpoint();
        let mut b = Batch::default();
        for r in reqs {
            self.plan(&mut b, r);
        }
        let mut bufs: Vec<(u64, AlignedBuf, usize)> = Vec::new();
        for id in b.order.clone() {
            let plan = b.chunks.get_mut(&id).expect("planned chunk");
            if let Err(e) = self.build(id, plan, &mut bufs) {
                plan.error = Some(e);
            }
        }
        let log_index = if b.log.is_empty() {
            None
        } else {
            let block = log::encode_block(
                self.shared.geo.salt,
                self.next_lsn,
                &b.log,
                self.shared.geo.unit,
            );
            let mut buf = self.take_buf(block.len());
            buf[..block.len()].copy_from_slice(&block);
            bufs.push((
                self.shared.geo.log_block_offset(self.next_lsn),
                buf,
                block.len(),
            ));
            Some(bufs.len() - 1)
        };
        let writes: Vec<(u64, &[u8])> = bufs.iter().map(|(o, b, n)| (*o, &b[..*n])).collect();
        let results = if writes.is_empty() {
            Vec::new()
        } else {
            self.shared.disk.write_batch(&writes)
        };
        let mut store_error: Option<Error> = None;
        if let Some(i) = log_index
            && let Err(e) = &results[i]
        {
            store_error = Some(Error::io("log write", clone_io(e)));
        }
        for id in &b.order {
            let plan = b.chunks.get_mut(id).expect("planned chunk");
            if plan.error.is_none()
                && let Some(e) = plan.writes.iter().find_map(|&w| results[w].as_ref().err())
            {
                plan.error = Some(Error::io("chunk write", clone_io(e)));
            }
        }
        if store_error.is_none() && !writes.is_empty() && self.durability == Durability::Sync {
            if let Err(e) = self.shared.disk.sync() {
                store_error = Some(Error::io("flush", e));
            }
            self.shared.stats.flushes.fetch_add(1, Ordering::Relaxed);
        }
        if !writes.is_empty() {
            self.shared.stats.batches.fetch_add(1, Ordering::Relaxed);
        }
        drop(writes);
        for (_, buf, _) in bufs {
            if self.pool.len() < POOL_BUFFERS {
                self.pool.push(buf);
            }
        }
        match store_error {
            Some(e) => self.fail_batch(b, e),
            None => self.commit(b, log_index.is_some()),
        }
    }

    fn plan(&mut self, b: &mut Batch, r: Request) {
        if let Some(id) = r.chunk_id()
            && b.deferred.contains(&id)
        {
            self.carry.push_back(r);
            return;
        }
        let failed = self.shared.failed.load(Ordering::Acquire);
        match r {
            Request::Create {
                chunk_id,
                version,
                reply,
            } => {
                if failed {
                    return send(reply, Err(Error::StoreFailed));
                }
                if b.touched.contains(&chunk_id) || !self.log_has_room(b, 25) {
                    return self.defer(
                        b,
                        chunk_id,
                        Request::Create {
                            chunk_id,
                            version,
                            reply,
                        },
                    );
                }
                let index = self.shared.index.read();
                if index.chunks.contains_key(&chunk_id) {
                    return send(reply, Err(Error::AlreadyExists { chunk_id }));
                }
                if index.chunks.len() + b.creates.len() >= self.shared.geo.sb.max_chunks as usize {
                    return send(
                        reply,
                        Err(Error::TooManyChunks {
                            max_chunks: self.shared.geo.sb.max_chunks,
                        }),
                    );
                }
                drop(index);
                let epoch = self.next_epoch;
                self.next_epoch += 1;
                self.push_log(
                    b,
                    LogEntry::Create {
                        chunk_id,
                        epoch,
                        version,
                    },
                );
                b.creates.push((chunk_id, epoch, version, reply));
                b.created.insert(chunk_id, epoch);
                b.touched.insert(chunk_id);
            }
            Request::Append {
                chunk_id,
                offset,
                data,
                reply,
            } => {
                if failed {
                    return send(reply, Err(Error::StoreFailed));
                }
                if data.is_empty() || data.len() > self.limits.max_append_bytes {
                    let max_append_bytes = self.limits.max_append_bytes as u64;
                    return send(
                        reply,
                        Err(Error::BadAppendSize {
                            append_bytes: data.len() as u64,
                            max_append_bytes,
                        }),
                    );
                }
                if b.seals.iter().any(|s| s.0 == chunk_id) {
                    let length = self
                        .shared
                        .index
                        .read()
                        .chunks
                        .get(&chunk_id)
                        .map_or(0, |c| c.length);
                    return send(reply, Err(Error::Sealed { chunk_id, length }));
                }
                if b.deletes.iter().any(|s| s.0 == chunk_id) {
                    return send(reply, Err(Error::NotFound { chunk_id }));
                }
                // The chunk's first append in this batch opens its plan, but only once the
                // append is known to be valid: a batch never carries a plan with no appends.
                let new_plan = if b.chunks.contains_key(&chunk_id) {
                    None
                } else {
                    match self.open_plan(b, chunk_id) {
                        Ok(p) => Some(p),
                        Err(e) => return send(reply, Err(e)),
                    }
                };
                let length = new_plan
                    .as_ref()
                    .map_or_else(|| b.chunks[&chunk_id].len(), ChunkPlan::len);
                if offset != length {
                    return send(
                        reply,
                        Err(Error::OffsetMismatch {
                            chunk_id,
                            offset,
                            length,
                        }),
                    );
                }
                let max = self.shared.geo.sb.max_chunk_bytes;
                if length + data.len() as u64 > max {
                    let append_bytes = data.len() as u64;
                    return send(
                        reply,
                        Err(Error::ChunkFull {
                            chunk_id,
                            length,
                            append_bytes,
                            max_chunk_bytes: max,
                        }),
                    );
                }
                let end = length + data.len() as u64;
                let plan = match new_plan {
                    Some(p) => {
                        b.order.push(chunk_id);
                        b.chunks.entry(chunk_id).or_insert(p)
                    }
                    None => b.chunks.get_mut(&chunk_id).expect("planned chunk"),
                };
                plan.pieces.push(data);
                plan.ends.push(end);
                plan.replies.push((reply, end));
                b.touched.insert(chunk_id);
            }
            Request::Seal { chunk_id, reply } => {
                if failed {
                    return send(reply, Err(Error::StoreFailed));
                }
                if b.touched.contains(&chunk_id) || !self.log_has_room(b, 29) {
                    return self.defer(b, chunk_id, Request::Seal { chunk_id, reply });
                }
                let index = self.shared.index.read();
                let Some(c) = index.chunks.get(&chunk_id) else {
                    return send(reply, Err(Error::NotFound { chunk_id }));
                };
                if c.sealed {
                    let stat = ChunkStat::of(chunk_id, c);
                    return send(reply, Ok(stat));
                }
                let entry = LogEntry::Seal {
                    chunk_id,
                    epoch: c.epoch,
                    length: c.length,
                    crc: c.crc,
                };
                drop(index);
                self.push_log(b, entry);
                b.seals.push((chunk_id, reply));
                b.touched.insert(chunk_id);
            }
            Request::Delete { chunk_id, reply } => {
                if failed {
                    return send(reply, Err(Error::StoreFailed));
                }
                if b.touched.contains(&chunk_id) || !self.log_has_room(b, 17) {
                    return self.defer(b, chunk_id, Request::Delete { chunk_id, reply });
                }
                let Some(epoch) = self
                    .shared
                    .index
                    .read()
                    .chunks
                    .get(&chunk_id)
                    .map(|c| c.epoch)
                else {
                    return send(reply, Err(Error::NotFound { chunk_id }));
                };
                self.push_log(b, LogEntry::Delete { chunk_id, epoch });
                b.deletes.push((chunk_id, reply));
                b.touched.insert(chunk_id);
            }
            Request::Checkpoint { reply } => b.checkpoints.push(reply),
            Request::Shutdown { reply } => b.shutdown = Some(reply),
            Request::Abandon { reply } => b.abandon = Some(reply),
        }
    }

    fn defer(&mut self, b: &mut Batch, chunk_id: ChunkId, r: Request) {
        b.deferred.insert(chunk_id);
        self.carry.push_back(r);
    }

    /// Room for one more entry in this batch's log block, and in the log ring.
    fn log_has_room(&mut self, b: &Batch, entry_bytes: usize) -> bool {
        if b.log_bytes + entry_bytes > log::capacity(self.shared.geo.unit) {
            return false;
        }
        // This batch would write block next_lsn; it must not overwrite a block that the newest
        // durable checkpoint still needs.
        !b.log.is_empty() || self.ensure_log_room()
    }

    fn push_log(&mut self, b: &mut Batch, e: LogEntry) {
        b.log_bytes += e.encoded_len();
        b.log.push(e);
    }

    /// A plan for the first append of this batch to `chunk_id`.
    fn open_plan(&self, b: &Batch, chunk_id: ChunkId) -> Result<ChunkPlan> {
        let fresh = |epoch, base_len, base_crc| ChunkPlan {
            epoch,
            base_len,
            base_crc,
            pieces: Vec::new(),
            ends: Vec::new(),
            replies: Vec::new(),
            new_extents: Vec::new(),
            new_tail: None,
            new_crc: base_crc,
            writes: Vec::new(),
            error: None,
        };
        if let Some(&epoch) = b.created.get(&chunk_id) {
            return Ok(fresh(epoch, 0, 0));
        }
        let index = self.shared.index.read();
        let c = index
            .chunks
            .get(&chunk_id)
            .ok_or(Error::NotFound { chunk_id })?;
        if c.sealed {
            return Err(Error::Sealed {
                chunk_id,
                length: c.length,
            });
        }
        if self.failed_chunks.contains(&chunk_id) {
            return Err(Error::ChunkFailed { chunk_id });
        }
        Ok(fresh(c.epoch, c.length, c.crc))
    }

    /// Builds the sector units of a chunk's appends into aligned write buffers (one per extent
    /// run), allocating extents as needed.
    /// A buffer of at least `len` bytes from the pool (contents arbitrary).
    fn take_buf(&mut self, len: usize) -> AlignedBuf {
        match self.pool.iter().position(|b| b.len() >= len) {
            Some(i) => self.pool.swap_remove(i),
            None => AlignedBuf::zeroed(len.next_power_of_two()),
        }
    }

    fn build(
        &mut self,
        chunk_id: ChunkId,
        plan: &mut ChunkPlan,
        bufs: &mut Vec<(u64, AlignedBuf, usize)>,
    ) -> Result<()> {
        let geo = self.shared.geo.clone();
        let (s, d, upe) = (geo.unit, geo.data as u64, geo.units_per_extent);
        let start = plan.base_len;
        let end = plan.len();
        debug_assert!(end > start);
        let (u0, u1) = (geo.unit_of(start), geo.unit_of(end - 1));
        let mut extents: Vec<u32> = self
            .shared
            .index
            .read()
            .chunks
            .get(&chunk_id)
            .map(|c| c.extents.clone())
            .unwrap_or_default();
        let need = (u1 / upe) as usize + 1;
        while extents.len() < need {
            match self.alloc.allocate() {
                Some(e) => {
                    extents.push(e);
                    plan.new_extents.push(e);
                }
                None => {
                    for e in plan.new_extents.drain(..) {
                        self.alloc.release(e);
                    }
                    return Err(Error::NoSpace);
                }
            }
        }
        let mut crc = plan.base_crc;
        let mut src = PieceCursor::new(&plan.pieces);
        let mut ua = u0;
        while ua <= u1 {
            let ub = u1.min((ua / upe + 1) * upe - 1);
            let run = (ub - ua + 1) as usize * s;
            let mut buf = self.take_buf(run);
            for u in ua..=ub {
                let unit = &mut buf[(u - ua) as usize * s..][..s];
                let ustart = u as u64 * d;
                let from = (start.max(ustart) - ustart) as usize;
                let to = (end.min(ustart + d) - ustart) as usize;
                let mut cur_slot = None;
                let mut old_crc = 0;
                if u == u0 && !start.is_multiple_of(d) {
                    let tail = self
                        .tails
                        .get(&chunk_id)
                        .expect("open chunk with a partial unit has a cached tail");
                    assert_eq!(
                        tail.unit, u0,
                        "tail cache of chunk {chunk_id} is for the wrong unit"
                    );
                    unit.copy_from_slice(&tail.buf);
                    cur_slot = Some(tail.cur_slot);
                    old_crc = tail.data_crc;
                } else {
                    unit[to..].fill(0);
                }
                src.copy_to(&mut unit[from..to]);
                // The tail unit's CRC extends the CRC of its acknowledged bytes; the chunk's
                // running CRC extends over the new bytes only.
                let data_crc = checksum::crc32c_append(old_crc, &unit[from..to]);
                crc = checksum::crc32c_append(crc, &unit[from..to]);
                debug_assert_eq!(data_crc, checksum::crc32c(&unit[..to]));
                let append_end = plan.ends.binary_search(&(ustart + to as u64)).is_ok();
                let f = Footer {
                    flags: if append_end { FLAG_APPEND_END } else { 0 },
                    chunk_id,
                    epoch: plan.epoch,
                    unit_index: u,
                    mount_gen: self.mount_gen,
                    valid_len: to as u16,
                    data_crc,
                };
                let new_slot = cur_slot.map_or(0, |c| 1 - c);
                let off = footer::slot_offset(s, new_slot);
                f.encode(geo.salt, &mut unit[off..off + footer::FOOTER_BYTES]);
                if u == u1 && (to as u64) < d {
                    let tb = AlignedBuf::copy_of(unit);
                    plan.new_tail = Some(Tail {
                        unit: u,
                        buf: tb,
                        cur_slot: new_slot,
                        data_crc,
                    });
                }
            }
            let extent = extents[(ua / upe) as usize];
            plan.writes.push(bufs.len());
            bufs.push((geo.unit_offset(extent, ua), buf, run));
            ua = ub + 1;
        }
        plan.new_crc = crc;
        Ok(())
    }

    /// Applies a durable batch to the index and answers every request.
    fn commit(&mut self, mut b: Batch, wrote_log: bool) -> bool {
        if wrote_log {
            self.next_lsn += 1;
        }
        let mut replies_ok: Vec<(Reply<u64>, u64)> = Vec::new();
        let mut replies_err: Vec<(Reply<u64>, Error)> = Vec::new();
        {
            let mut index = self.shared.index.write();
            for (id, epoch, version, _) in &b.creates {
                let entry = ChunkEntry {
                    epoch: *epoch,
                    version: *version,
                    length: 0,
                    crc: 0,
                    sealed: false,
                    extents: Vec::new(),
                };
                index.chunks.insert(*id, entry);
            }
            for id in &b.order {
                let mut plan = b.chunks.remove(id).expect("planned chunk");
                if let Some(e) = plan.error.take() {
                    // The chunk's bytes on the device are now unknown past its durable length:
                    // no more appends until it is sealed (the client goes on in a new chunk).
                    for ext in plan.new_extents.drain(..) {
                        self.alloc.release(ext);
                    }
                    if !matches!(e, Error::NoSpace) {
                        self.failed_chunks.insert(*id);
                    }
                    replies_err.extend(plan.replies.into_iter().map(|(r, _)| (r, e.clone())));
                    continue;
                }
                let entry = index
                    .chunks
                    .get_mut(id)
                    .expect("appended chunk is in the index");
                entry.length = plan.len();
                entry.crc = plan.new_crc;
                entry.extents.extend_from_slice(&plan.new_extents);
                match plan.new_tail.take() {
                    Some(t) => {
                        self.tails.insert(*id, t);
                    }
                    None => {
                        self.tails.remove(id);
                    }
                }
                self.shared
                    .stats
                    .appends
                    .fetch_add(plan.replies.len() as u64, Ordering::Relaxed);
                self.shared
                    .stats
                    .append_bytes
                    .fetch_add(plan.len() - plan.base_len, Ordering::Relaxed);
                replies_ok.extend(plan.replies);
            }
            let mut seal_replies = Vec::new();
            for (id, reply) in b.seals.drain(..) {
                let entry = index
                    .chunks
                    .get_mut(&id)
                    .expect("sealed chunk is in the index");
                entry.sealed = true;
                self.tails.remove(&id);
                seal_replies.push((reply, ChunkStat::of(id, entry)));
            }
            let mut delete_replies = Vec::new();
            for (id, reply) in b.deletes.drain(..) {
                let entry = index
                    .chunks
                    .remove(&id)
                    .expect("deleted chunk is in the index");
                for e in entry.extents {
                    self.alloc.release(e);
                }
                self.tails.remove(&id);
                self.failed_chunks.remove(&id);
                delete_replies.push(reply);
            }
            self.shared
                .free_extents
                .store(self.alloc.free_count(), Ordering::Relaxed);
            drop(index);
            for (reply, stat) in seal_replies {
                send(reply, Ok(stat));
            }
            for reply in delete_replies {
                send(reply, Ok(()));
            }
        }
        for (_, _, _, reply) in b.creates.drain(..) {
            send(reply, Ok(()));
        }
        for (reply, end) in replies_ok {
            send(reply, Ok(end));
        }
        for (reply, e) in replies_err {
            send(reply, Err(e));
        }
        if let Some(reply) = b.abandon {
            send(reply, Ok(()));
            return true;
        }
        self.after_batch(b.checkpoints, b.shutdown)
    }

    /// A flush or log write failed: nothing of this batch is known to be durable, and the
    /// device's state is uncertain. Fail every request and refuse writes from now on.
    fn fail_batch(&mut self, mut b: Batch, e: Error) -> bool {
        tracing::error!(error = %e, "chunk store failed; refusing writes until reopened");
        self.shared.failed.store(true, Ordering::Release);
        for id in &b.order {
            let plan = b.chunks.remove(id).expect("planned chunk");
            for ext in plan.new_extents {
                // The extents are not in the index; keeping them allocated would leak them.
                self.alloc.release(ext);
            }
            for (reply, _) in plan.replies {
                send(reply, Err(e.clone()));
            }
        }
        for (_, _, _, reply) in b.creates {
            send(reply, Err(e.clone()));
        }
        for (_, reply) in b.seals {
            send(reply, Err(e.clone()));
        }
        for (_, reply) in b.deletes {
            send(reply, Err(e.clone()));
        }
        if let Some(reply) = b.abandon {
            send(reply, Ok(()));
            return true;
        }
        self.after_batch(b.checkpoints, b.shutdown)
    }

    /// Explicit checkpoints, the background-checkpoint trigger, and shutdown.
    fn after_batch(&mut self, checkpoints: Vec<Reply<()>>, shutdown: Option<Reply<()>>) -> bool {
        if !checkpoints.is_empty() {
            let r = self.checkpoint_now();
            for reply in checkpoints {
                send(reply, r.clone());
            }
        } else if self.next_lsn - self.ckpt_durable_lsn >= self.shared.geo.log_blocks / 2
            && self.ckpt_in_flight.is_none()
        {
            self.start_checkpoint();
        }
        if let Some(reply) = shutdown {
            send(reply, self.shutdown_checkpoint());
            return true;
        }
        false
    }

    /// Starts a checkpoint of the current state on a background thread.
    fn start_checkpoint(&mut self) {
        if self.shared.failed.load(Ordering::Acquire) {
            return;
        }
        self.ckpt_seq += 1;
        let c = snapshot(
            &self.shared,
            self.ckpt_seq,
            self.next_lsn,
            self.next_epoch,
            self.mount_gen,
        );
        let shared = self.shared.clone();
        let lsn = c.lsn;
        let handle = std::thread::Builder::new()
            .name("cairn-checkpoint".into())
            .spawn(move || write_checkpoint(&*shared.disk, &shared.geo, &c))
            .expect("spawn checkpoint thread");
        self.ckpt_in_flight = Some((lsn, handle));
    }

    /// Collects a finished background checkpoint; with `wait`, waits for it.
    fn finish_checkpoint(&mut self, wait: bool) -> Result<()> {
        let Some((lsn, handle)) = self.ckpt_in_flight.take() else {
            return Ok(());
        };
        if !wait && !handle.is_finished() {
            self.ckpt_in_flight = Some((lsn, handle));
            return Ok(());
        }
        let r = handle.join().expect("checkpoint thread panicked");
        match &r {
            Ok(()) => {
                self.ckpt_durable_lsn = lsn;
                self.shared
                    .stats
                    .checkpoints
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(error = %e, "checkpoint failed; the previous one stays in force")
            }
        }
        r
    }

    fn poll_checkpoint(&mut self) {
        let _ = self.finish_checkpoint(false);
    }

    /// Writes a checkpoint of the current state and waits for it.
    fn checkpoint_now(&mut self) -> Result<()> {
        if self.shared.failed.load(Ordering::Acquire) {
            return Err(Error::StoreFailed);
        }
        let _ = self.finish_checkpoint(true);
        self.start_checkpoint();
        self.finish_checkpoint(true)
    }

    /// The log ring must not wrap onto blocks the newest durable checkpoint still needs. When
    /// it is full, metadata operations wait here for a checkpoint (rare: the background
    /// checkpoint starts at half full).
    fn ensure_log_room(&mut self) -> bool {
        if self.next_lsn + 1 - self.ckpt_durable_lsn < self.shared.geo.log_blocks {
            return true;
        }
        if self.checkpoint_now().is_err()
            || self.next_lsn + 1 - self.ckpt_durable_lsn >= self.shared.geo.log_blocks
        {
            tracing::error!("operation log full and no checkpoint could be written");
            self.shared.failed.store(true, Ordering::Release);
            return false;
        }
        true
    }

    fn shutdown_checkpoint(&mut self) -> Result<()> {
        let _ = self.finish_checkpoint(true);
        if self.shared.failed.load(Ordering::Acquire) {
            return Err(Error::StoreFailed);
        }
        self.checkpoint_now()
    }
}

fn send<T>(reply: Reply<T>, r: Result<T>) {
    // The caller may have stopped waiting; that is its business.
    let _ = reply.send(r);
}

fn clone_io(e: &std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::new(e.kind(), e.to_string()),
    }
}

fn req_bytes(r: &Request) -> usize {
    match r {
        Request::Append { data, .. } => data.len(),
        _ => 0,
    }
}

/// Reads the concatenation of several byte vectors in order.
struct PieceCursor<'a> {
    pieces: &'a [Vec<u8>],
    i: usize,
    off: usize,
}

impl<'a> PieceCursor<'a> {
    fn new(pieces: &'a [Vec<u8>]) -> Self {
        Self {
            pieces,
            i: 0,
            off: 0,
        }
    }

    fn copy_to(&mut self, mut out: &mut [u8]) {
        while !out.is_empty() {
            let p = &self.pieces[self.i][self.off..];
            let n = p.len().min(out.len());
            out[..n].copy_from_slice(&p[..n]);
            out = &mut out[n..];
            self.off += n;
            if self.off == self.pieces[self.i].len() {
                self.i += 1;
                self.off = 0;
            }
        }
    }
}

/// The checkpoint of the current durable state (taken at a batch boundary).
pub(crate) fn snapshot(
    shared: &Shared,
    seq: u64,
    lsn: u64,
    next_epoch: u64,
    mount_gen: u32,
) -> Checkpoint {
    let chunks = records(&shared.index.read());
    Checkpoint {
        seq,
        lsn,
        next_epoch,
        mount_gen,
        chunks,
    }
}

/// The chunk table as checkpoint records, sorted by chunk id.
pub(crate) fn records(index: &crate::index::Index) -> Vec<ChunkRecord> {
    let mut chunks: Vec<ChunkRecord> = index
        .chunks
        .iter()
        .map(|(&chunk_id, c)| ChunkRecord {
            chunk_id,
            epoch: c.epoch,
            version: c.version,
            length: c.length,
            crc: c.crc,
            sealed: c.sealed,
            extents: c.extents.clone(),
        })
        .collect();
    chunks.sort_by_key(|c| c.chunk_id);
    chunks
}

/// Writes a checkpoint to its slot and flushes.
pub(crate) fn write_checkpoint(
    disk: &dyn Disk,
    geo: &crate::layout::Geometry,
    c: &Checkpoint,
) -> Result<()> {
    let bytes = c.encode(geo.salt, disk.alignment().max(4096));
    assert!(
        bytes.len() as u64 <= geo.sb.ckpt_slot_bytes,
        "checkpoint larger than its slot"
    );
    let base = geo.sb.ckpt_offsets[(c.seq % 2) as usize];
    let step = 8 << 20;
    let mut buf = AlignedBuf::zeroed(step.min(bytes.len()));
    for (i, piece) in bytes.chunks(step).enumerate() {
        buf[..piece.len()].copy_from_slice(piece);
        disk.write_at(&buf[..piece.len()], base + (i * step) as u64)
            .map_err(|e| Error::io("checkpoint write", e))?;
    }
    disk.sync().map_err(|e| Error::io("checkpoint flush", e))
}
