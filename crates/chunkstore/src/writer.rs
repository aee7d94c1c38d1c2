//! The device thread: every mutation of a store runs here, in batches (group commit), or on
//! the thread of a blocking caller that finds it idle ([`Writer::run_alone`]), which runs the
//! same code under the same lock.
//!
//! One loop per device: take every queued request (up to a batch limit), check each against
//! the chunk table, build the sector units of all appends and at most one operation-log block,
//! hand all writes to the device at once, flush once, then commit the new state to the index
//! and answer every request. The units' data and CRCs were laid out by the callers
//! (`prepare`); appends to the same chunk in one batch are chained (see `build`). A seal
//! or delete of a chunk that has other work in the batch waits for the next batch, so that a
//! logged seal never names bytes whose write could still fail.

use crate::buf::AlignedBuf;
use crate::checksum;
use crate::disk::{Disk, Wait, WriteTicket};
use crate::error::{ChunkId, Error, Result};
use crate::format::checkpoint::{Checkpoint, ChunkRecord};
use crate::format::footer::{self, FLAG_APPEND_END, Footer};
use crate::format::log::{self, LogEntry};
use crate::format::segment::SegHeader;
use crate::index::{Allocator, ChunkEntry};
use crate::prepare::Prepared;
use crate::store::{ChunkStat, Durability, Shared};
use parking_lot::MutexGuard;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

type Reply<T> = oneshot::Sender<Result<T>>;

/// A request to the device thread.
pub(crate) enum Request {
    /// With `first`, the chunk's first append goes into the same batch as its creation (one
    /// flush for both); it is answered on its own reply, and refused when the create is.
    Create {
        chunk_id: ChunkId,
        version: u64,
        reply: Reply<()>,
        first: Option<(Prepared, Reply<u64>)>,
    },
    /// With `sync: false` the append is acknowledged when written, before a flush (see
    /// [`crate::ChunkStore::append_unsynced_async`]).
    Append {
        chunk_id: ChunkId,
        data: Prepared,
        sync: bool,
        reply: Reply<u64>,
    },
    /// Seal at the current length, or at `at = (length, crc of [0, length))`, which may be
    /// shorter than the chunk (the bytes past it are dropped).
    Seal {
        chunk_id: ChunkId,
        at: Option<(u64, u32)>,
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
    /// Checkpoint, shutdown and abandon run only when no other batch is in flight.
    fn is_control(&self) -> bool {
        matches!(
            self,
            Request::Checkpoint { .. } | Request::Shutdown { .. } | Request::Abandon { .. }
        )
    }

    /// Requests that write an operation-log entry.
    fn needs_log(&self) -> bool {
        matches!(
            self,
            Request::Create { .. } | Request::Seal { .. } | Request::Delete { .. }
        )
    }

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
    /// Chunks with acknowledged unsynced appends that no flush has covered yet. Sealing one
    /// flushes first, so that the seal's log entry never names bytes a power cut could lose.
    unsynced: HashSet<ChunkId>,
    /// The device thread has returned (or panicked): nobody runs requests any more.
    pub stopped: bool,
}

/// Appends up to this size extend the chunk's running CRC over their bytes; larger ones
/// combine it with the CRC their caller computed (one table-driven combine).
const COMBINE_CRC_FROM: usize = 64 << 10;

/// Most batches in flight at once (writing, or waiting for their flush).
const MAX_IN_FLIGHT: usize = 8;

/// The appends of one chunk in one batch.
struct ChunkPlan {
    epoch: u64,
    base_len: u64,
    base_crc: u32,
    pieces: Vec<Prepared>,
    ends: Vec<u64>,
    replies: Vec<(Reply<u64>, u64)>,
    /// Extents allocated by this batch (released again if the write fails).
    new_extents: Vec<u32>,
    new_tail: Option<Tail>,
    new_crc: u32,
    /// Indexes into the batch's write list.
    writes: Vec<usize>,
    /// Large appends written, as `(offset, length)`.
    large_refs: Vec<(u64, u32)>,
    error: Option<Error>,
}

impl ChunkPlan {
    fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(self.base_len)
    }
}

/// One write of a batch: bytes `range` of one of an append's buffers.
struct WriteRef {
    dev_offset: u64,
    chunk_id: ChunkId,
    piece: usize,
    src: WSrc,
    range: std::ops::Range<usize>,
}

/// Which buffer of an append a write comes from.
#[derive(Clone, Copy)]
enum WSrc {
    /// Its sector units.
    Units,
    /// A large append's segment headers.
    Headers,
    /// A large append's data: the caller's own buffer.
    Data,
}

/// A batch whose writes are done, waiting for its group's flush.
struct Finished {
    b: Batch,
    wrote: bool,
    /// It wrote a log block or a synced append: it is acknowledged after a flush.
    needs_flush: bool,
    wrote_log: bool,
    /// The batch failed the store (its log write failed).
    error: Option<Error>,
}

/// Consecutive batches whose writes are done, and the flush they share (none when no batch
/// wrote, durability is off, or a batch already failed the store).
struct Group {
    batches: Vec<Finished>,
    flush: Option<WriteTicket>,
}

/// A batch whose writes are started and not yet finished, with the buffers they write from.
struct InFlight {
    b: Batch,
    log_buf: Option<(u64, AlignedBuf, usize)>,
    log_index: Option<usize>,
    ticket: Option<WriteTicket>,
}

#[derive(Default)]
struct Batch {
    /// When it was started, and when its writes were taken as done.
    started: Option<Instant>,
    written: Option<Instant>,
    order: Vec<ChunkId>,
    chunks: HashMap<ChunkId, ChunkPlan>,
    log: Vec<LogEntry>,
    log_bytes: usize,
    creates: Vec<(ChunkId, u64, u64, Reply<()>)>,
    created: HashMap<ChunkId, u64>,
    seals: Vec<(ChunkId, (u64, u32), Reply<ChunkStat>)>,
    deletes: Vec<(ChunkId, Reply<()>)>,
    touched: HashSet<ChunkId>,
    deferred: HashSet<ChunkId>,
    checkpoints: Vec<Reply<()>>,
    shutdown: Option<Reply<()>>,
    abandon: Option<Reply<()>>,
    /// It holds an append acknowledged only after a flush.
    synced_appends: bool,
    /// The flush before its writes (a seal of a chunk with unsynced bytes) failed.
    pre_flush_error: Option<Error>,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.order.is_empty()
            && self.log.is_empty()
            && self.creates.is_empty()
            && self.seals.is_empty()
            && self.deletes.is_empty()
            && !self.is_barrier()
    }

    /// Holds a checkpoint, shutdown or abandon: nothing starts beside it.
    fn is_barrier(&self) -> bool {
        !self.checkpoints.is_empty() || self.shutdown.is_some() || self.abandon.is_some()
    }
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
            unsynced: HashSet::new(),
            stopped: false,
        }
    }

    /// The device thread's loop.
    ///
    /// Up to [`MAX_IN_FLIGHT`] batches overlap. A batch is planned and its writes started as
    /// soon as requests are queued, without waiting for the batches before it. When the
    /// oldest batch's writes are done, it and every later batch whose writes are also done
    /// form a group that shares one flush (group commit across batches); the flush is started
    /// and the thread goes on starting batches while it runs. Groups are committed in order
    /// when their flush completes. While anything is in flight the thread waits on the device
    /// and on the doorbell together, so a new request starts at once.
    ///
    /// A batch never depends on the outcome of one in flight: requests for a chunk a batch
    /// in flight touches are carried to a later batch, as are metadata operations while a
    /// batch in flight writes a log block, and control requests (checkpoint, shutdown,
    /// abandon) wait until nothing is in flight.
    ///
    /// The thread holds the writer's lock throughout, except while it waits for a request
    /// with nothing in flight and nothing carried: then a caller of a blocking method may
    /// take the lock and run its request itself ([`Writer::run_alone`]). A request received
    /// is counted off `Shared::queued` only once the lock is held again, so no caller runs
    /// alone ahead of a request queued before it.
    pub(crate) fn run(w: &mut MutexGuard<'_, Writer>, mut rx: mpsc::Receiver<Request>) {
        let mut writing: VecDeque<InFlight> = VecDeque::new();
        let mut flushing: VecDeque<Group> = VecDeque::new();
        let mut closed = false;
        // Every carried request was carried because of a batch in flight: retrying it before
        // one commits would only carry it again.
        let mut carry_stuck = false;
        loop {
            let in_flight = writing.len() + flushing.iter().map(|g| g.batches.len()).sum::<usize>();
            let barrier_in_flight = writing.iter().any(|f| f.b.is_barrier())
                || flushing
                    .iter()
                    .flat_map(|g| &g.batches)
                    .any(|f| f.b.is_barrier());
            let control_waiting = w.carry.iter().any(Request::is_control);
            let room = !barrier_in_flight && in_flight < MAX_IN_FLIGHT;
            if room {
                let mut fresh: Vec<Request> = Vec::new();
                if !control_waiting && !closed {
                    if in_flight == 0 && w.carry.is_empty() {
                        match MutexGuard::unlocked(w, || rx.blocking_recv()) {
                            Some(r) => {
                                w.shared.queued.fetch_sub(1, Ordering::SeqCst);
                                fresh.push(r);
                            }
                            None => closed = true,
                        }
                    }
                    let mut count = w.carry.len() + fresh.len();
                    let mut bytes: usize = w.carry.iter().chain(&fresh).map(req_bytes).sum();
                    while !closed
                        && count < w.limits.max_batch_requests
                        && bytes < w.limits.max_batch_bytes
                    {
                        match rx.try_recv() {
                            Ok(r) => {
                                w.shared.queued.fetch_sub(1, Ordering::SeqCst);
                                bytes += req_bytes(&r);
                                count += 1;
                                fresh.push(r);
                            }
                            Err(mpsc::error::TryRecvError::Empty) => break,
                            Err(mpsc::error::TryRecvError::Disconnected) => closed = true,
                        }
                    }
                }
                if closed && fresh.is_empty() && in_flight == 0 && w.carry.is_empty() {
                    let _ = w.shutdown_checkpoint();
                    return;
                }
                if !fresh.is_empty() || (!w.carry.is_empty() && !carry_stuck) {
                    // Carried requests go first: they were queued before the fresh ones.
                    let reqs: Vec<Request> = w.carry.drain(..).chain(fresh).collect();
                    let busy: Vec<&Batch> = writing
                        .iter()
                        .map(|f| &f.b)
                        .chain(flushing.iter().flat_map(|g| g.batches.iter().map(|f| &f.b)))
                        .collect();
                    let overlapped = !busy.is_empty();
                    let f = w.start_batch(reqs, &busy);
                    carry_stuck = !w.carry.is_empty();
                    if !f.b.is_empty() {
                        if overlapped {
                            w.shared
                                .stats
                                .overlapped_batches
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        writing.push_back(f);
                    }
                    continue;
                }
            }
            if in_flight == 0 {
                // Nothing in flight: carried requests can go now.
                carry_stuck = false;
                continue;
            }
            // A group needing no flush, or a batch with no writes, is done already.
            let mut tickets: Vec<&WriteTicket> = Vec::with_capacity(2);
            let group_ticket = flushing.front().map(|g| g.flush.as_ref());
            let batch_ticket = writing.front().map(|f| f.ticket.as_ref());
            let ready = match (group_ticket, batch_ticket) {
                (Some(None), _) => Some(0),
                (_, Some(None)) => Some(1),
                (g, b) => {
                    let g = g.flatten();
                    tickets.extend(g);
                    tickets.extend(b.flatten());
                    let mut got = w.shared.disk.wait_writes(&tickets, Wait::Poll);
                    if got.is_none() {
                        let doorbell = if room && !control_waiting && !closed {
                            w.shared.doorbell.park()
                        } else {
                            None
                        };
                        match doorbell {
                            Some(fd) => {
                                if rx.is_empty() {
                                    got = w.shared.disk.wait_writes(&tickets, Wait::Doorbell(fd));
                                }
                                w.shared.doorbell.unpark();
                            }
                            None => got = w.shared.disk.wait_writes(&tickets, Wait::Block),
                        }
                    }
                    // Map the position in `tickets` back to which queue it came from.
                    got.map(|i| if g.is_some() && i == 0 { 0 } else { 1 })
                }
            };
            match ready {
                Some(0) => {
                    let g = flushing.pop_front().expect("group");
                    carry_stuck = false;
                    if w.commit_group(g) {
                        debug_assert!(writing.is_empty() && flushing.is_empty());
                        return;
                    }
                }
                Some(_) => {
                    let mut done = vec![writing.pop_front().expect("batch")];
                    while let Some(f) = writing.front()
                        && !f.b.is_barrier()
                        && f.ticket
                            .as_ref()
                            .is_none_or(|t| w.shared.disk.wait_writes(&[t], Wait::Poll).is_some())
                    {
                        done.push(writing.pop_front().expect("front"));
                    }
                    let alone = writing.is_empty() && flushing.is_empty();
                    flushing.push_back(w.writes_done(done, alone));
                }
                None => {}
            }
        }
    }

    /// Runs one request on the caller's thread, as the device thread would run it alone:
    /// plan, write, flush, commit (a lone 4 KiB append saves the two thread switches of a
    /// trip through the device thread, about a fifth of its latency on the development VM).
    /// The caller holds the lock, found the device thread idle and no request queued
    /// (`Shared::queued` is 0) and the thread not stopped; nothing is in flight, so this is
    /// the device thread's own path with `busy` empty.
    pub(crate) fn run_alone(&mut self, r: Request) {
        debug_assert!(!r.is_control() && self.carry.is_empty() && !self.stopped);
        // A panic here leaves the writer's state half updated on a thread that goes on: the
        // store fails (refuses writes until reopened), as when the device thread dies.
        struct FailOnPanic<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for FailOnPanic<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.store(true, Ordering::Release);
                }
            }
        }
        let shared = self.shared.clone();
        let _fail = FailOnPanic(&shared.failed);
        self.shared
            .stats
            .alone_batches
            .fetch_add(1, Ordering::Relaxed);
        let mut next = Some(r);
        // A request of a batch of one is never carried; should one be, it runs next.
        while let Some(r) = next.take().or_else(|| self.carry.pop_front()) {
            let f = self.start_batch(vec![r], &[]);
            if f.b.is_empty() {
                continue;
            }
            if let Some(t) = &f.ticket {
                self.shared.disk.wait_writes(&[t], Wait::Block);
            }
            let g = self.writes_done(vec![f], true);
            let stop = self.commit_group(g);
            debug_assert!(!stop, "only control requests stop the device thread");
        }
    }

    /// Takes the results of batches whose writes are done and starts the flush they share
    /// (a synchronous one when nothing else is in flight: there is nothing to overlap).
    fn writes_done(&mut self, batches: Vec<InFlight>, alone: bool) -> Group {
        let mut finished = Vec::with_capacity(batches.len());
        let pool = &self.shared.pool;
        for f in batches {
            let InFlight {
                mut b,
                log_buf,
                log_index,
                ticket,
            } = f;
            let wrote = ticket.is_some();
            let results = match ticket {
                Some(t) => self.shared.disk.finish_writes(t),
                None => Vec::new(),
            };
            b.written = Some(Instant::now());
            let mut error = b.pre_flush_error.take();
            if let Some(i) = log_index
                && let Err(e) = &results[i]
            {
                error = Some(Error::io("log write", clone_io(e)));
            }
            for id in &b.order {
                let plan = b.chunks.get_mut(id).expect("planned chunk");
                if plan.error.is_none()
                    && let Some(e) = plan.writes.iter().find_map(|&w| results[w].as_ref().err())
                {
                    plan.error = Some(Error::io("chunk write", clone_io(e)));
                }
                for p in &mut plan.pieces {
                    p.release(pool);
                }
            }
            if let Some((_, buf, _)) = log_buf {
                pool.give(buf);
            }
            let needs_flush = wrote && (log_index.is_some() || b.synced_appends);
            finished.push(Finished {
                b,
                wrote,
                needs_flush,
                wrote_log: log_index.is_some(),
                error,
            });
        }
        // One flush makes every write of the group durable. It is skipped when no batch
        // needs it (only unsynced appends), or when a batch failed the store (the ones after
        // it fail too, at commit).
        let flush = if finished.iter().any(|f| f.needs_flush)
            && self.durability == Durability::Sync
            && finished.iter().all(|f| f.error.is_none())
            && !self.shared.failed.load(Ordering::Acquire)
        {
            self.shared.stats.flushes.fetch_add(1, Ordering::Relaxed);
            Some(if alone {
                WriteTicket::Done(vec![self.shared.disk.sync()])
            } else {
                self.shared.disk.start_sync()
            })
        } else {
            None
        };
        Group {
            batches: finished,
            flush,
        }
    }

    /// Commits (or fails) each batch of a group whose flush is done, in order. Returns true
    /// when the thread must stop.
    fn commit_group(&mut self, g: Group) -> bool {
        let had_flush = g.flush.is_some();
        let flush_error = g.flush.and_then(|t| {
            let r = self.shared.disk.finish_writes(t);
            r.into_iter()
                .next()
                .expect("a flush has one result")
                .err()
                .map(|e| Error::io("flush", e))
        });
        let flushed = had_flush && flush_error.is_none();
        for f in g.batches {
            let mut error = f.error;
            if error.is_none() && f.wrote {
                error = flush_error.clone();
            }
            // A batch planned before the store failed (in this group or earlier) must not be
            // acknowledged.
            if error.is_none() && f.wrote && self.shared.failed.load(Ordering::Acquire) {
                error = Some(Error::StoreFailed);
            }
            if f.wrote {
                self.shared.stats.batches.fetch_add(1, Ordering::Relaxed);
            }
            let stop = match error {
                Some(e) => self.fail_batch(f.b, e),
                None => self.commit(f.b, f.wrote_log, flushed),
            };
            if stop {
                return true;
            }
        }
        // The flush started after every write of this group and of the groups committed
        // before it was done: all of them are durable now.
        if flushed {
            self.unsynced.clear();
        }
        false
    }

    /// Plans a batch and starts its writes.
    fn start_batch(&mut self, reqs: Vec<Request>, busy: &[&Batch]) -> InFlight {
        self.poll_checkpoint();
        let mut b = Batch {
            started: Some(Instant::now()),
            ..Batch::default()
        };
        for r in reqs {
            self.plan(&mut b, r, busy);
        }
        // Unsynced bytes (all written: they are committed) are flushed before the batch when
        // it would otherwise put them at risk:
        // - a seal's log entry must not reach the device before the bytes it names;
        // - an append that continues a partly filled unit rewrites it with the new footer in
        //   the slot that does not hold the current one, which after an unsynced append is
        //   the slot of the last durable footer: a torn rewrite could then lose bytes an
        //   earlier synced append made durable. Flushed first, the current footer is durable
        //   and the rewrite keeps it, as always. (Appends that end on unit boundaries, as
        //   re-replication's pieces do, never get here.)
        let d = self.shared.geo.data as u64;
        if self.durability == Durability::Sync
            && !self.unsynced.is_empty()
            && (b.seals.iter().any(|s| self.unsynced.contains(&s.0))
                || b.order.iter().any(|id| {
                    self.unsynced.contains(id) && !b.chunks[id].base_len.is_multiple_of(d)
                }))
        {
            self.shared.stats.flushes.fetch_add(1, Ordering::Relaxed);
            match self.shared.disk.sync() {
                Ok(()) => self.unsynced.clear(),
                Err(e) => {
                    // Nothing of the batch is written; it fails, and the store with it, as
                    // after any failed flush.
                    b.pre_flush_error = Some(Error::io("flush", e));
                    return InFlight {
                        b,
                        log_buf: None,
                        log_index: None,
                        ticket: None,
                    };
                }
            }
        }
        let mut refs: Vec<WriteRef> = Vec::new();
        for id in b.order.clone() {
            let plan = b.chunks.get_mut(&id).expect("planned chunk");
            if let Err(e) = self.build(id, plan, &mut refs) {
                plan.error = Some(e);
            }
        }
        let log_buf = if b.log.is_empty() {
            None
        } else {
            let block = log::encode_block(
                self.shared.geo.salt,
                self.next_lsn,
                &b.log,
                self.shared.geo.unit,
            );
            let mut buf = self.shared.pool.take(block.len());
            buf[..block.len()].copy_from_slice(&block);
            Some((
                self.shared.geo.log_block_offset(self.next_lsn),
                buf,
                block.len(),
            ))
        };
        let log_index = log_buf.as_ref().map(|_| refs.len());
        let writes: Vec<(u64, &[u8])> = refs
            .iter()
            .map(|w| {
                let p = &b.chunks[&w.chunk_id].pieces[w.piece];
                let buf: &[u8] = match (w.src, &p.large) {
                    (WSrc::Units, _) => &p.buf,
                    (WSrc::Headers, Some(l)) => &l.headers,
                    (WSrc::Data, Some(l)) => &l.data,
                    _ => unreachable!("a large append's write without its buffers"),
                };
                (w.dev_offset, &buf[w.range.clone()])
            })
            .chain(log_buf.as_ref().map(|(o, buf, n)| (*o, &buf[..*n])))
            .collect();
        let wrote = !writes.is_empty();
        // With nothing else in flight there is nothing to overlap: a lone write goes straight
        // to the device (a synchronous pwrite is cheaper than a trip through the ring).
        let ticket = if !wrote {
            None
        } else if busy.is_empty() && writes.len() == 1 {
            Some(WriteTicket::Done(self.shared.disk.write_batch(&writes)))
        } else {
            // SAFETY: the buffers are owned by `b` (the appends' units) and `log_buf`, which
            // the returned InFlight keeps, untouched, until `finish_batch` finishes the ticket.
            Some(unsafe { self.shared.disk.start_writes(&writes) })
        };
        drop(writes);
        InFlight {
            b,
            log_buf,
            log_index,
            ticket,
        }
    }

    /// Adds a request to batch `b`, or answers it at once (an error), or carries it to a
    /// later batch. `busy` are the batches in flight beside this one.
    fn plan(&mut self, b: &mut Batch, r: Request, busy: &[&Batch]) {
        if let Some(id) = r.chunk_id()
            && b.deferred.contains(&id)
        {
            self.carry.push_back(r);
            return;
        }
        if !busy.is_empty() {
            let chunk_busy = r
                .chunk_id()
                .is_some_and(|id| busy.iter().any(|x| x.touched.contains(&id)));
            let log_busy = r.needs_log() && busy.iter().any(|x| !x.log.is_empty());
            if r.is_control() {
                self.carry.push_back(r);
                return;
            }
            if chunk_busy || log_busy {
                let id = r.chunk_id().expect("chunk requests only");
                return self.defer(b, id, r);
            }
        }
        let pending_creates: usize = busy.iter().map(|x| x.creates.len()).sum();
        let failed = self.shared.failed.load(Ordering::Acquire);
        match r {
            Request::Create {
                chunk_id,
                version,
                reply,
                first,
            } => {
                if failed {
                    return refuse_create(&self.shared.pool, reply, first, Error::StoreFailed);
                }
                if b.touched.contains(&chunk_id) || !self.log_has_room(b, 25) {
                    return self.defer(
                        b,
                        chunk_id,
                        Request::Create {
                            chunk_id,
                            version,
                            reply,
                            first,
                        },
                    );
                }
                let index = self.shared.index.read();
                if index.chunks.contains_key(&chunk_id) {
                    let e = Error::AlreadyExists { chunk_id };
                    return refuse_create(&self.shared.pool, reply, first, e);
                }
                if index.chunks.len() + b.creates.len() + pending_creates
                    >= self.shared.geo.sb.max_chunks as usize
                {
                    let max_chunks = self.shared.geo.sb.max_chunks;
                    let e = Error::TooManyChunks { max_chunks };
                    return refuse_create(&self.shared.pool, reply, first, e);
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
                // The first append joins this batch: it finds the chunk in `b.created`.
                if let Some((data, reply)) = first {
                    self.plan(
                        b,
                        Request::Append {
                            chunk_id,
                            data,
                            sync: true,
                            reply,
                        },
                        busy,
                    );
                }
            }
            Request::Append {
                chunk_id,
                data,
                sync,
                reply,
            } => {
                let offset = data.offset;
                let refuse = |reply: Reply<u64>, mut data: Prepared, e: Error| {
                    data.release(&self.shared.pool);
                    send(reply, Err(e));
                };
                if failed {
                    return refuse(reply, data, Error::StoreFailed);
                }
                if data.len == 0 || data.len > self.limits.max_append_bytes {
                    let max_append_bytes = self.limits.max_append_bytes as u64;
                    let append_bytes = data.len as u64;
                    return refuse(
                        reply,
                        data,
                        Error::BadAppendSize {
                            append_bytes,
                            max_append_bytes,
                        },
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
                    return refuse(reply, data, Error::Sealed { chunk_id, length });
                }
                if b.deletes.iter().any(|s| s.0 == chunk_id) {
                    return refuse(reply, data, Error::NotFound { chunk_id });
                }
                // The chunk's first append in this batch opens its plan, but only once the
                // append is known to be valid: a batch never carries a plan with no appends.
                let new_plan = if b.chunks.contains_key(&chunk_id) {
                    None
                } else {
                    match self.open_plan(b, chunk_id) {
                        Ok(p) => Some(p),
                        Err(e) => return refuse(reply, data, e),
                    }
                };
                let length = new_plan
                    .as_ref()
                    .map_or_else(|| b.chunks[&chunk_id].len(), ChunkPlan::len);
                if offset != length {
                    return refuse(
                        reply,
                        data,
                        Error::OffsetMismatch {
                            chunk_id,
                            offset,
                            length,
                        },
                    );
                }
                let max = self.shared.geo.sb.max_chunk_bytes;
                let append_bytes = data.len as u64;
                if length + append_bytes > max {
                    return refuse(
                        reply,
                        data,
                        Error::ChunkFull {
                            chunk_id,
                            length,
                            append_bytes,
                            max_chunk_bytes: max,
                        },
                    );
                }
                let end = length + append_bytes;
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
                b.synced_appends |= sync;
            }
            Request::Seal {
                chunk_id,
                at,
                reply,
            } => {
                if failed {
                    return send(reply, Err(Error::StoreFailed));
                }
                if b.touched.contains(&chunk_id) || !self.log_has_room(b, 29) {
                    return self.defer(
                        b,
                        chunk_id,
                        Request::Seal {
                            chunk_id,
                            at,
                            reply,
                        },
                    );
                }
                let index = self.shared.index.read();
                let Some(c) = index.chunks.get(&chunk_id) else {
                    return send(reply, Err(Error::NotFound { chunk_id }));
                };
                let (length, crc) = match at {
                    Some((len, _)) if len > c.length => {
                        let length = c.length;
                        return send(
                            reply,
                            Err(Error::OutOfRange {
                                chunk_id,
                                offset: 0,
                                len,
                                length,
                            }),
                        );
                    }
                    Some((len, crc)) if len < c.length => (len, crc),
                    _ => (c.length, c.crc),
                };
                if c.sealed {
                    if length != c.length {
                        let length = c.length;
                        return send(reply, Err(Error::Sealed { chunk_id, length }));
                    }
                    let stat = ChunkStat::of(chunk_id, c);
                    return send(reply, Ok(stat));
                }
                let entry = LogEntry::Seal {
                    chunk_id,
                    epoch: c.epoch,
                    length,
                    crc,
                };
                drop(index);
                self.push_log(b, entry);
                b.seals.push((chunk_id, (length, crc), reply));
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
            large_refs: Vec::new(),
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

    /// Completes the sector units of a chunk's appends — the bytes of a partly filled first
    /// unit, the footers — and lists the writes (one per append, two when it crosses into an
    /// extent not physically next to the one before), allocating extents as needed.
    ///
    /// Appends to one chunk in one batch are chained: an append that starts inside a unit
    /// the previous one left partly filled carries that whole unit (so the previous append's
    /// copy of it is not written), with the footer of the unit's durable state kept in its
    /// slot and the new footer in the other, as for a tail unit across batches.
    fn build(
        &mut self,
        chunk_id: ChunkId,
        plan: &mut ChunkPlan,
        writes: &mut Vec<WriteRef>,
    ) -> Result<()> {
        let shared = self.shared.clone();
        let geo = &shared.geo;
        let (s, d, upe) = (geo.unit, geo.data as u64, geo.units_per_extent);
        let end = plan.len();
        debug_assert!(end > plan.base_len);
        let mut extents: Vec<u32> = shared
            .index
            .read()
            .chunks
            .get(&chunk_id)
            .map(|c| c.extents.clone())
            .unwrap_or_default();
        let need = (geo.unit_of(end - 1) / upe) as usize + 1;
        while extents.len() < need {
            match self.alloc.allocate(extents.last().copied()) {
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

        /// Where the bytes of the partly filled unit the next append continues in are.
        enum Src {
            Tail,
            Piece(usize),
        }
        struct Open {
            unit: u32,
            /// The slot of the footer that is durable on the device, if the unit is.
            durable_slot: Option<usize>,
            /// CRC32C of the unit's bytes so far.
            crc: u32,
            src: Src,
        }
        let mut open = if !plan.base_len.is_multiple_of(d) {
            let t = self
                .tails
                .get(&chunk_id)
                .expect("open chunk with a partial unit has a cached tail");
            assert_eq!(
                t.unit,
                geo.unit_of(plan.base_len),
                "tail cache of chunk {chunk_id} is for the wrong unit"
            );
            Some(Open {
                unit: t.unit,
                durable_slot: Some(t.cur_slot),
                crc: t.data_crc,
                src: Src::Tail,
            })
        } else {
            None
        };
        let mut crc = plan.base_crc;
        let count = plan.pieces.len();
        for k in 0..count {
            let (before, rest) = plan.pieces.split_at_mut(k);
            let p = &mut rest[0];
            let (u0, n) = (p.first_unit, p.units());
            let from0 = (p.offset - u0 as u64 * d) as usize;
            let pend = p.offset + p.len as u64;
            // Unit i of the append's buffer: u0 + i, or for a large append u0 and then u1.
            let u1_of_large = p.large.as_ref().map(|l| l.plan.u1);
            let unit_no = move |i: usize| match u1_of_large {
                Some(u1) if i == 1 => u1,
                _ => u0 + i as u32,
            };
            let unit_to = |i: usize| {
                let ustart = unit_no(i) as u64 * d;
                (pend.min(ustart + d) - ustart) as usize
            };
            let mut first_slot = 0;
            let mut first_durable = None;
            let mut first_crc = p.unit_crcs[0];
            if from0 != 0 {
                let o = open
                    .take()
                    .expect("an append that starts inside a unit continues an open unit");
                debug_assert_eq!(o.unit, u0);
                let src: &[u8] = match o.src {
                    Src::Tail => &self.tails[&chunk_id].buf,
                    Src::Piece(j) => {
                        shared.stats.chained_appends.fetch_add(1, Ordering::Relaxed);
                        let q = &before[j];
                        &q.buf[(q.units() - 1) * s..][..s]
                    }
                };
                let unit = &mut p.buf[..s];
                unit[..from0].copy_from_slice(&src[..from0]);
                if let Some(c) = o.durable_slot {
                    let fo = footer::slot_offset(s, c);
                    unit[fo..fo + footer::FOOTER_BYTES]
                        .copy_from_slice(&src[fo..fo + footer::FOOTER_BYTES]);
                    first_slot = 1 - c;
                }
                first_durable = o.durable_slot;
                first_crc = checksum::crc32c_append(o.crc, &unit[from0..unit_to(0)]);
            }
            let mut last_crc = first_crc;
            for i in 0..n {
                let (slot, data_crc) = if i == 0 {
                    (first_slot, first_crc)
                } else {
                    (0, p.unit_crcs[i])
                };
                last_crc = data_crc;
                let f = Footer {
                    flags: if i == n - 1 { FLAG_APPEND_END } else { 0 },
                    chunk_id,
                    epoch: plan.epoch,
                    unit_index: unit_no(i),
                    mount_gen: self.mount_gen,
                    valid_len: unit_to(i) as u16,
                    data_crc,
                };
                let fo = i * s + footer::slot_offset(s, slot);
                f.encode(geo.salt, &mut p.buf[fo..fo + footer::FOOTER_BYTES]);
            }
            crc = if p.len < COMBINE_CRC_FROM {
                (0..n).fold(crc, |c, i| {
                    let from = if i == 0 { from0 } else { 0 };
                    checksum::crc32c_append(c, &p.buf[i * s + from..i * s + unit_to(i)])
                })
            } else {
                checksum::crc32c_combine(crc, p.crc, p.len)
            };
            let last_to = unit_to(n - 1);
            if (last_to as u64) < d {
                open = Some(Open {
                    unit: unit_no(n - 1),
                    durable_slot: if n == 1 { first_durable } else { None },
                    crc: last_crc,
                    src: Src::Piece(k),
                });
                if k == count - 1 {
                    let last_slot = if n == 1 { first_slot } else { 0 };
                    plan.new_tail = Some(Tail {
                        unit: unit_no(n - 1),
                        buf: AlignedBuf::copy_of(&p.buf[(n - 1) * s..n * s]),
                        cur_slot: last_slot,
                        data_crc: last_crc,
                    });
                }
            }
            // The last unit is left to the next append when that one continues in it.
            let written = if k + 1 < count && (last_to as u64) < d {
                n - 1
            } else {
                n
            };
            let dev = |u: u32| geo.unit_offset(extents[(u / upe) as usize], u);
            let mut push = |src: WSrc, u: u32, range: std::ops::Range<usize>| {
                plan.writes.push(writes.len());
                writes.push(WriteRef {
                    dev_offset: dev(u),
                    chunk_id,
                    piece: k,
                    src,
                    range,
                });
            };
            if let Some(l) = p.large.as_mut() {
                // Unit u0, then every segment (header, data), then unit u1.
                plan.large_refs.push((p.offset, p.len as u32));
                push(WSrc::Units, u0, 0..s);
                for (i, seg) in l.plan.segs.iter().enumerate() {
                    let first = seg.data_off as usize / s;
                    let slots = seg.data_slots(s) as usize;
                    SegHeader {
                        chunk_id,
                        epoch: plan.epoch,
                        unit_index: seg.slot,
                        mount_gen: self.mount_gen,
                        append_offset: p.offset,
                        append_len: p.len as u32,
                        data_off: seg.data_off,
                        data_len: seg.data_len,
                        slot_crcs: l.slot_crcs[first..first + slots].to_vec(),
                    }
                    .encode(geo.salt, &mut l.headers[i * s..(i + 1) * s]);
                    push(WSrc::Headers, seg.slot, i * s..(i + 1) * s);
                    if slots > 0 {
                        let at = seg.data_off as usize;
                        push(WSrc::Data, seg.slot + 1, at..at + slots * s);
                    }
                }
                if written == n {
                    push(WSrc::Units, l.plan.u1, s..2 * s);
                }
                continue;
            }
            let mut i = 0;
            while i < written {
                let ua = u0 + i as u32;
                let ub = (u0 + written as u32 - 1).min(contiguous_end(&extents, ua, upe));
                let units = (ub - ua + 1) as usize;
                push(WSrc::Units, ua, i * s..(i + units) * s);
                i += units;
            }
        }
        plan.new_crc = crc;
        Ok(())
    }

    /// Applies a durable batch to the index and answers every request.
    /// `flushed`: a flush covered its writes (otherwise they are unsynced appends).
    fn commit(&mut self, mut b: Batch, wrote_log: bool, flushed: bool) -> bool {
        if wrote_log {
            self.next_lsn += 1;
        }
        let mut replies_ok: Vec<(Reply<u64>, u64)> = Vec::new();
        let mut replies_err: Vec<(Reply<u64>, Error)> = Vec::new();
        let phases = b
            .started
            .zip(b.written)
            .map(|(s, w)| (s, w, Instant::now()));
        {
            let mut index = self.shared.index.write();
            for (id, epoch, version, _) in &b.creates {
                index
                    .chunks
                    .insert(*id, ChunkEntry::empty(*epoch, *version));
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
                if !flushed && self.durability == Durability::Sync {
                    self.unsynced.insert(*id);
                }
                entry.extents.extend_from_slice(&plan.new_extents);
                entry.large.extend_from_slice(&plan.large_refs);
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
                    .large_appends
                    .fetch_add(plan.large_refs.len() as u64, Ordering::Relaxed);
                self.shared
                    .stats
                    .append_bytes
                    .fetch_add(plan.len() - plan.base_len, Ordering::Relaxed);
                if let Some((started, written, now)) = phases {
                    let stats = &self.shared.stats;
                    let n = plan.pieces.len() as u32;
                    let queued: u64 = plan
                        .pieces
                        .iter()
                        .map(|p| nanos(started.saturating_duration_since(p.ready)))
                        .sum();
                    stats.append_queue_ns.fetch_add(queued, Ordering::Relaxed);
                    stats
                        .append_write_ns
                        .fetch_add(nanos((written - started) * n), Ordering::Relaxed);
                    stats
                        .append_flush_ns
                        .fetch_add(nanos((now - written) * n), Ordering::Relaxed);
                }
                replies_ok.extend(plan.replies);
            }
            let mut seal_replies = Vec::new();
            for (id, (length, crc), reply) in b.seals.drain(..) {
                let entry = index
                    .chunks
                    .get_mut(&id)
                    .expect("sealed chunk is in the index");
                // A seal below the length drops the bytes past it. Its extents stay with the
                // chunk until it is deleted (recovery releases them at the next mount).
                entry.length = length;
                entry.crc = crc;
                entry.sealed = true;
                entry.large.retain(|&(o, _)| o < length);
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
                self.unsynced.remove(&id);
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
        for (_, _, reply) in b.seals {
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

/// The last unit of the physically contiguous run of a chunk's extents that unit `u` is in.
pub(crate) fn contiguous_end(extents: &[u32], u: u32, upe: u32) -> u32 {
    let mut x = (u / upe) as usize;
    while x + 1 < extents.len() && extents[x + 1] == extents[x] + 1 {
        x += 1;
    }
    (x as u32 + 1) * upe - 1
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn send<T>(reply: Reply<T>, r: Result<T>) {
    // The caller may have stopped waiting; that is its business.
    let _ = reply.send(r);
}

/// Answers a refused create; its first append, if any, is not made (its caller waits for the
/// create's answer first and stops there).
fn refuse_create(
    pool: &crate::buf::BufPool,
    reply: Reply<()>,
    first: Option<(Prepared, Reply<u64>)>,
    e: Error,
) {
    if let Some((mut data, _)) = first {
        data.release(pool);
    }
    send(reply, Err(e));
}

fn clone_io(e: &std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::new(e.kind(), e.to_string()),
    }
}

fn req_bytes(r: &Request) -> usize {
    match r {
        Request::Append { data, .. }
        | Request::Create {
            first: Some((data, _)),
            ..
        } => data.len,
        _ => 0,
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
        .map(|(&chunk_id, c)| c.record(chunk_id))
        .collect();
    chunks.sort_by_key(|c| c.chunk_id);
    chunks
}

/// Flushes, writes a checkpoint to its slot and flushes again.
///
/// The first flush makes durable every byte the checkpoint names before the checkpoint can
/// reach the device: unsynced appends (whose writes were done when the snapshot was taken),
/// and at mount the bytes recovery found written but never flushed by the previous run.
pub(crate) fn write_checkpoint(
    disk: &dyn Disk,
    geo: &crate::layout::Geometry,
    c: &Checkpoint,
) -> Result<()> {
    disk.sync().map_err(|e| Error::io("checkpoint flush", e))?;
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
