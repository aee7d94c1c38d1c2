//! The writer of a FlatLogFile: replication by the client, chasing and non-stop write
//! (seeds/000 §3.3; docs/client.md).
//!
//! Each replica of the chunk being written has a *pipe*: a task that sends that replica the
//! file's pieces in order, one at a time, retrying through connection loss and timeouts. An
//! append hands its piece to every pipe and is acknowledged once MinCopy pipes made it durable;
//! the others chase. A replica still behind `chase_timeout` after the acknowledgement is waited
//! for while it is less than `chase_retry_bytes` behind, and otherwise dropped: sealed where it
//! is, named to the masters, who stop listing it and re-replicate the chunk once it is sealed.
//! When fewer than MinCopy replicas can go on, the chunk is sealed at the acknowledged length
//! and the append continues in the next chunk (non-stop write): the application sees latency,
//! not an error.

use crate::data::Error as DataError;
use crate::fs::{Client, Error, Replicas, Result};
use crate::health::Op;
use bytes::Bytes;
use cairn_proto::frame::Status;
use cairn_rpc::{ErrorKind, MetaError, pb};
use futures::future::join_all;
use parking_lot::Mutex;
use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, mpsc};

mod ec;

/// A piece of the file on its way to one replica: `data` at chunk offset `offset`.
#[derive(Clone)]
struct Piece {
    offset: u64,
    data: Bytes,
    /// CRC32C of `data`, computed once for every replica's frame.
    crc: u32,
}

impl Piece {
    fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }
}

/// What the pipes of the active chunk report.
#[derive(Default)]
struct Progress {
    state: Mutex<Vec<ReplicaState>>,
    changed: Notify,
    /// A replica refused the writer's capability: the writer's next commit brings fresh
    /// ones (a refusal is not a replica's failure: its key was rotated out, or the capability
    /// expired).
    refresh: AtomicBool,
}

#[derive(Default, Clone)]
struct ReplicaState {
    /// Bytes of the chunk this replica holds durably.
    durable: u64,
    /// The last error; `hard` when asking again would not help.
    error: Option<String>,
    hard: bool,
}

impl Progress {
    fn update(&self, i: usize, f: impl FnOnce(&mut ReplicaState)) {
        f(&mut self.state.lock()[i]);
        self.changed.notify_waiters();
    }
}

/// One replica of the active chunk.
struct Pipe {
    server: u64,
    tx: Option<mpsc::UnboundedSender<Piece>>,
    task: tokio::task::JoinHandle<()>,
    /// Since when the replica is behind the acknowledged length, and the length it was
    /// behind then. A replica seen to hold that length at a later acknowledgement caught up
    /// in between (the writer only looks at acknowledgements: a pause between appends says
    /// nothing about the replica), so its lag is counted afresh from then.
    behind_since: Option<(Instant, u64)>,
    dropped: bool,
}

/// The chunk being written.
struct Active {
    /// Index in the file's chunk list.
    idx: usize,
    id: u64,
    /// Bytes acknowledged (durable on MinCopy replicas).
    acked: u64,
    pipes: Vec<Pipe>,
    progress: Arc<Progress>,
    /// Bytes this writer counts in the client's chasing memory.
    held: u64,
    /// The pieces sent that some live replica may not hold yet, in order: what a rewrite can
    /// take from the client's memory when no replica holds the acknowledged length.
    unsettled: VecDeque<Piece>,
    /// Replicas that must hold a piece before it is acknowledged: the file's MinCopy, or
    /// every member of a chunk group (and every copy of an EC file's tail).
    min_copy: usize,
    /// User bytes per chunk byte: 1, or K for a chunk group (whose `acked` counts each
    /// member's bytes).
    scale: u64,
}

/// Marks `c` sealed at `length` in the writer's list; the update that tells the masters.
fn seal_update(c: &mut pb::ChunkMeta, length: u64) -> pb::ChunkUpdate {
    c.length = length;
    c.sealed = true;
    pb::ChunkUpdate {
        chunk_id: c.id,
        length,
        sealed: true,
    }
}

/// What sealing replicas at a length answered, per server.
type Sealed = Vec<(u64, Result<crate::data::ChunkInfo>)>;

/// Why an append could not finish in the active chunk.
enum Stuck {
    /// Fewer than MinCopy replicas can go on: seal the chunk and continue in a new one.
    Switch(String),
}

/// A file open for appending. Appends are ordered; each is acknowledged once MinCopy replicas
/// of its chunk hold it durably. Close (or seal) when done: otherwise the lease runs out and
/// the next writer recovers the open chunk.
pub struct FlatLogFile {
    client: Client,
    path: String,
    chunks: Vec<pb::ChunkMeta>,
    min_copy: usize,
    active: Option<Active>,
    /// Acknowledged bytes in the file.
    length: u64,
    failed: Option<String>,
    lease_lost: Arc<AtomicBool>,
    renew: Option<tokio::task::JoinHandle<()>>,
    /// Replicas given up on, not yet told to the masters.
    drops: Vec<pb::ReplicaDrop>,
    /// Tail chunks of an EC file folded into a group, not yet told to the masters.
    remove: Vec<u64>,
    /// For a file written as EC: its stripes, tail and parked chunks.
    ec: Option<ec::EcWriter>,
    /// Servers that failed this writer: avoided when chunks are allocated.
    bad: BTreeSet<u64>,
    /// Acknowledged bytes no replica of their chunk held when it was finished: written again
    /// at the head of the next chunk before any new byte (their file offsets do not change).
    rewrite: VecDeque<Bytes>,
    /// When a refused capability last made this writer ask the masters for fresh ones.
    refreshed: Option<Instant>,
    stats: WriterStats,
}

/// What a writer went through (for tests, benchmarks and metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Appends acknowledged before every replica had them.
    pub chased: u64,
    /// Replicas dropped (failed, or too far behind).
    pub dropped: u64,
    /// Chunks sealed early because too few replicas could go on (non-stop write).
    pub switches: u64,
    /// Appends that waited for every replica because the chasing memory was full.
    pub memory_waits: u64,
    /// Acknowledged bytes written again from the client's memory into a new chunk, because no
    /// replica of theirs could be sealed holding them.
    pub rewritten: u64,
}

impl FlatLogFile {
    pub(crate) fn new(client: Client, path: &str, file: pb::FileMeta) -> Self {
        let length = file
            .chunks
            .iter()
            .filter(|c| c.sealed)
            .map(|c| c.length)
            .sum();
        let min_copy = file.policy.as_ref().map_or(1, |p| p.min_copy.max(1)) as usize;
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
                    let r = client.inner.masters.commit(req).await;
                    // Each renewal brings the chunks signed afresh: a writer open for longer
                    // than a capability lives keeps valid ones.
                    if let Ok(reply) = &r
                        && let Some(f) = &reply.file
                    {
                        client.remember_caps(&f.chunks);
                    }
                    if let Err(e) = r
                        && matches!(
                            e.kind,
                            ErrorKind::LeaseLost | ErrorKind::NotFound | ErrorKind::Sealed
                        )
                    {
                        tracing::warn!(%path, error = %e, "write lease lost");
                        lost.store(true, Ordering::Release);
                        return;
                    }
                }
            })
        };
        let ec_policy = file
            .policy
            .as_ref()
            .filter(|p| p.ec_data > 0 && !p.then_ec)
            .map(|p| (p.ec_data, p.ec_parity));
        let ec = ec_policy.and_then(|(k, m)| ec::EcWriter::new(k, m, ec::CELL));
        // An EC file this client cannot encode is refused, never written another way.
        let failed = match (ec_policy, &ec) {
            (Some((k, m)), None) => Some(format!("cannot write ec:{k}+{m} files")),
            _ => None,
        };
        Self {
            client,
            path: path.to_owned(),
            ec,
            chunks: file.chunks,
            min_copy,
            active: None,
            length,
            failed,
            lease_lost,
            renew: Some(renew),
            drops: Vec::new(),
            remove: Vec::new(),
            bad: BTreeSet::new(),
            rewrite: VecDeque::new(),
            refreshed: None,
            stats: WriterStats::default(),
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

    /// Chasing and non-stop-write counters of this writer.
    pub fn stats(&self) -> &WriterStats {
        &self.stats
    }

    /// Seals chunks a previous writer left open, at the length MinCopy of their replicas hold
    /// (every acknowledged byte is there); replicas holding less are dropped.
    ///
    /// `continued`: the last chunk, which the masters opened again for this writer (0: none).
    /// It is continued when every replica answers, holding its length and not sealed;
    /// otherwise it is sealed as any chunk left open.
    pub(crate) async fn recover(&mut self, continued: u64) -> Result<()> {
        let mut updates = Vec::new();
        let min_copy = self.min_copy;
        let resume = match self.chunks.iter().position(|c| c.id == continued) {
            Some(i) if continued != 0 && self.can_continue(&self.chunks[i]).await => Some(i),
            _ => None,
        };
        for c in self
            .chunks
            .iter_mut()
            .enumerate()
            .filter(|(i, c)| !c.sealed && c.ec_data == 0 && Some(*i) != resume)
            .map(|(_, c)| c)
        {
            let r: Replicas = self.client.replicas(c).await;
            if !r.exists {
                continue; // never written: a spare, still usable
            }
            let Some(len) = r.quorum_length(min_copy) else {
                return Err(MetaError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "{}: chunk {} was left open and only {} of its replicas answer; {} are \
                         needed to know its length",
                        self.path,
                        c.id,
                        r.lengths.len(),
                        min_copy
                    ),
                )
                .into());
            };
            let len = len.max(c.length);
            let id = c.id;
            let sealed = join_all(r.lengths.iter().map(|(s, l)| {
                let client = &self.client;
                async move {
                    let res = if *l >= len {
                        client
                            .on(*s, |d| async move { d.seal_at(id, len).await })
                            .await
                            .map(|_| ())
                    } else {
                        Err(Error::Writer(format!("holds {l} of {len} bytes")))
                    };
                    (*s, res)
                }
            }))
            .await;
            for (s, res) in sealed {
                if let Err(e) = res {
                    tracing::warn!(chunk = id, server = s, error = %e, "replica dropped during recovery");
                    self.drops.push(pb::ReplicaDrop {
                        chunk_id: id,
                        server_id: s,
                    });
                }
            }
            updates.push(seal_update(c, len));
        }
        // Groups after the tails: whether a later chunk holds bytes decides their length.
        self.recover_groups(&mut updates).await?;
        if !updates.is_empty() || !self.drops.is_empty() {
            self.commit(updates, false, false, false).await?;
        }
        self.length = self
            .chunks
            .iter()
            .filter(|c| c.sealed)
            .map(|c| c.length)
            .sum();
        if let Some(i) = resume {
            let (id, len) = (self.chunks[i].id, self.chunks[i].length);
            // Found again by id: a commit above may have trimmed chunks before it.
            let idx = self.chunks.iter().position(|c| c.id == id).ok_or_else(|| {
                MetaError::internal(format!("chunk {id} left the file while opening it"))
            })?;
            self.activate(idx, len);
            self.length += len;
        }
        Ok(())
    }

    /// Whether `c`, opened again by the masters, can take appends at its length: every
    /// replica answers (the stat carries this writer's epoch, so from here on the chunkservers
    /// refuse any older writer), holds exactly that length and is not sealed.
    async fn can_continue(&self, c: &pb::ChunkMeta) -> bool {
        let id = c.id;
        let infos = join_all(c.servers.iter().map(|&s| {
            let client = &self.client;
            async move { client.on(s, |d| async move { d.stat(id).await }).await }
        }))
        .await;
        let ok = !c.servers.is_empty()
            && infos
                .iter()
                .all(|r| matches!(r, Ok(i) if i.length == c.length && !i.sealed));
        if !ok {
            tracing::info!(path = %self.path, chunk = id, "last chunk not continued: a replica is missing, sealed or of another length");
        }
        ok
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
    /// [`crate::ClientOptions::max_append`] or crossing a chunk boundary go as several pieces.
    /// A replica failing does not fail the append: it is dropped, or the chunk is sealed and
    /// the append goes on in a new chunk.
    ///
    /// # Errors
    /// No chunk could take the data within [`crate::ClientOptions::retry_for`] (too few
    /// chunkservers, masters unreachable), or the lease is lost; the writer is then unusable
    /// (reopen the file).
    pub async fn append(&mut self, data: &[u8]) -> Result<u64> {
        self.append_src(Src::Borrowed(data)).await
    }

    /// Like [`FlatLogFile::append`], without copying `data`: its pieces are slices of it,
    /// held until every replica has them.
    ///
    /// # Errors
    /// As [`FlatLogFile::append`].
    pub async fn append_bytes(&mut self, data: Bytes) -> Result<u64> {
        self.append_src(Src::Owned(data)).await
    }

    async fn append_src(&mut self, mut rest: Src<'_>) -> Result<u64> {
        self.check()?;
        let start = self.length;
        if self.ec.is_some() {
            let r = self.append_ec(&mut rest).await;
            if let Err(e) = r {
                self.failed = Some(e.to_string());
                return Err(e);
            }
        }
        while !rest.is_empty() {
            let r = self.append_piece(&mut rest).await;
            if let Err(e) = r {
                self.failed = Some(e.to_string());
                return Err(e);
            }
        }
        Ok(start)
    }

    /// Appends the head of `rest` that fits the active chunk, advancing `rest` past it. Bytes
    /// waiting to be rewritten go first.
    async fn append_piece(&mut self, rest: &mut Src<'_>) -> Result<()> {
        let opts = &self.client.inner.opts;
        let (chunk_size, max_append, retry_for) =
            (opts.chunk_size, opts.max_append, opts.retry_for);
        let give_up = Instant::now() + retry_for;
        loop {
            if self.active.as_ref().is_none_or(|a| a.acked >= chunk_size) {
                if self.active.is_some() {
                    self.finish_chunk(true).await?;
                }
                self.next_chunk().await?;
            }
            let a = self.active.as_ref().expect("a chunk is active");
            let room = (chunk_size - a.acked) as usize;
            let (data, again) = match self.rewrite.front() {
                Some(b) => (b.slice(..b.len().min(room).min(max_append)), true),
                None => {
                    let n = rest.len().min(room).min(max_append);
                    (rest.head(n), false)
                }
            };
            let n = data.len();
            let piece = Piece {
                offset: a.acked,
                crc: cairn_proto::frame::crc32c(&data),
                data,
            };
            match self.replicate(vec![piece]).await {
                Ok(()) if again => {
                    let b = self.rewrite.front_mut().expect("rewriting");
                    *b = b.slice(n..);
                    if b.is_empty() {
                        self.rewrite.pop_front();
                    }
                    self.stats.rewritten += n as u64;
                }
                Ok(()) => {
                    self.length += n as u64;
                    rest.advance(n);
                    return Ok(());
                }
                Err(Stuck::Switch(why)) => {
                    tracing::warn!(path = %self.path, %why, "sealing the chunk and going on in a new one");
                    self.stats.switches += 1;
                    metrics::counter!("cairn_client_chasing_total", "event" => "switch")
                        .increment(1);
                    self.finish_chunk(false).await?;
                    if Instant::now() >= give_up {
                        return Err(Error::Writer(format!(
                            "{}: no chunk took the append within {retry_for:?}: {why}",
                            self.path
                        )));
                    }
                }
            }
        }
    }

    /// Sends one piece to every replica and waits for MinCopy of them (or all, when the
    /// chasing memory is full). With several pieces (a stripe's cells), replica `i` gets
    /// `pieces[i]`; they start and end at the same chunk offsets.
    async fn replicate(&mut self, pieces: Vec<Piece>) -> std::result::Result<(), Stuck> {
        let inner = self.client.inner.clone();
        let opts = &inner.opts;
        let piece = pieces[0].clone();
        let n = piece.data.len() as u64;
        let all = inner.chasing.load(Ordering::Relaxed) + n > opts.chase_memory;
        if all {
            self.stats.memory_waits += 1;
            metrics::counter!("cairn_client_chasing_total", "event" => "memory_wait").increment(1);
        }
        let a = self.active.as_mut().expect("active");
        let min_copy = a.min_copy;
        let end = piece.end();
        for (i, p) in a.pipes.iter().enumerate().filter(|(_, p)| !p.dropped) {
            if let Some(tx) = &p.tx {
                let _ = tx.send(pieces.get(i).unwrap_or(&piece).clone());
            }
        }
        if pieces.len() == 1 {
            a.unsettled.push_back(piece);
        }
        let deadline = Instant::now() + opts.request_timeout;
        let tick = (opts.chase_timeout / 4).max(Duration::from_millis(10));
        loop {
            self.refresh_caps().await;
            let a = self.active.as_mut().expect("active");
            let progress = a.progress.clone();
            let changed = progress.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (live, done) = {
                let st = progress.state.lock();
                let live: Vec<usize> = (0..a.pipes.len())
                    .filter(|&i| !a.pipes[i].dropped && !st[i].hard)
                    .collect();
                let done = live.iter().filter(|&&i| st[i].durable >= end).count();
                (live.len(), done)
            };
            if live < min_copy {
                let st = progress.state.lock();
                let errors: Vec<String> = (0..a.pipes.len())
                    .filter_map(|i| {
                        let e = st[i].error.as_ref()?;
                        Some(format!("server {}: {e}", a.pipes[i].server))
                    })
                    .collect();
                return Err(Stuck::Switch(format!(
                    "{live} of the chunk's replicas can go on, {} are needed ({})",
                    min_copy,
                    errors.join("; ")
                )));
            }
            let need = if all { live } else { min_copy };
            if done >= need {
                a.acked = end;
                if done < live {
                    self.stats.chased += 1;
                    metrics::counter!("cairn_client_chasing_total", "event" => "chased")
                        .increment(1);
                }
                self.after_ack().await;
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                if done >= min_copy {
                    // Waiting for every replica (memory full): the laggards are given up.
                    self.drop_behind(end, "did not keep up while chasing memory was full");
                    continue;
                }
                return Err(Stuck::Switch(format!(
                    "only {done} replicas acknowledged within {:?}",
                    opts.request_timeout
                )));
            }
            if all && done >= min_copy {
                self.reap(end);
            }
            tokio::select! {
                () = &mut changed => {}
                () = tokio::time::sleep(tick.min(deadline - now)) => {}
            }
        }
    }

    /// When a replica refused the writer's capability: asks the masters for fresh ones (a
    /// commit without updates answers with every chunk signed again), at most every 100 ms.
    async fn refresh_caps(&mut self) {
        let Some(a) = self.active.as_ref() else {
            return;
        };
        let now = Instant::now();
        if self
            .refreshed
            .is_some_and(|t| now.duration_since(t) < Duration::from_millis(100))
            || !a.progress.refresh.swap(false, Ordering::AcqRel)
        {
            return;
        }
        self.refreshed = Some(now);
        self.fresh_caps().await;
    }

    /// Asks the masters for the file's chunks signed afresh (a commit without updates).
    /// Whether it succeeded.
    async fn fresh_caps(&mut self) -> bool {
        metrics::counter!("cairn_client_capability_refreshes_total").increment(1);
        let r = self.commit(Vec::new(), false, false, false).await;
        if let Err(e) = &r {
            tracing::warn!(path = %self.path, error = %e, "refreshing capabilities failed");
        }
        r.is_ok()
    }

    /// After an acknowledgement: note who is behind, give up on those too far behind, account
    /// the chasing memory, and tell the masters about dropped replicas.
    async fn after_ack(&mut self) {
        let a = self.active.as_mut().expect("active");
        let acked = a.acked;
        self.reap(acked);
        if !self.drops.is_empty() {
            // The masters learn about a dropped replica at once (it stops being a location).
            if let Err(e) = self.commit(Vec::new(), false, false, false).await {
                tracing::warn!(path = %self.path, error = %e, "reporting dropped replicas failed");
            }
        }
    }

    /// Applies the chasing rules to the replicas behind `acked`, then recounts the memory held
    /// for the laggards.
    fn reap(&mut self, acked: u64) {
        let opts = &self.client.inner.opts;
        let (t, k) = (opts.chase_timeout, opts.chase_retry_bytes);
        let now = Instant::now();
        let a = self.active.as_mut().expect("active");
        let st = a.progress.state.lock().clone();
        let mut give_up = Vec::new();
        for (i, p) in a.pipes.iter_mut().enumerate() {
            if p.dropped {
                continue;
            }
            let r = &st[i];
            if r.durable >= acked {
                p.behind_since = None;
                continue;
            }
            let since = match p.behind_since {
                Some((since, of)) if r.durable < of => since,
                _ => {
                    p.behind_since = Some((now, acked));
                    now
                }
            };
            let age = now.duration_since(since);
            let lag = acked - r.durable;
            if r.hard {
                give_up.push((i, r.error.clone().unwrap_or_default()));
            } else if age > t && (lag >= k || r.error.is_some()) {
                let why = format!("{lag} bytes behind after {age:?}");
                if r.error.is_none() {
                    // Answering, but slower than the others by more than chasing allows.
                    self.client.inner.health.lagged(p.server, &why, now);
                }
                give_up.push((i, why));
            } else if age > 4 * t {
                give_up.push((
                    i,
                    format!(
                        "behind for {age:?}{}",
                        r.error
                            .as_ref()
                            .map(|e| format!(" ({e})"))
                            .unwrap_or_default()
                    ),
                ));
            }
        }
        for (i, why) in give_up {
            self.drop_pipe(i, &why);
        }
        self.account();
    }

    /// Gives up on every live replica that does not hold `end` bytes yet.
    fn drop_behind(&mut self, end: u64, why: &str) {
        let a = self.active.as_ref().expect("active");
        let st = a.progress.state.lock().clone();
        let behind: Vec<usize> = (0..a.pipes.len())
            .filter(|&i| !a.pipes[i].dropped && st[i].durable < end)
            .collect();
        for i in behind {
            self.drop_pipe(i, why);
        }
        self.account();
    }

    /// Stops sending to a replica, seals it where it is (so no late append lands) and queues
    /// it for the masters.
    fn drop_pipe(&mut self, i: usize, why: &str) {
        let a = self.active.as_mut().expect("active");
        let p = &mut a.pipes[i];
        p.dropped = true;
        p.tx = None;
        p.task.abort();
        tracing::warn!(path = %self.path, chunk = a.id, server = p.server, %why, "replica dropped");
        self.stats.dropped += 1;
        metrics::counter!("cairn_client_chasing_total", "event" => "dropped").increment(1);
        self.bad.insert(p.server);
        self.drops.push(pb::ReplicaDrop {
            chunk_id: a.id,
            server_id: p.server,
        });
        let (client, server, id) = (self.client.clone(), p.server, a.id);
        tokio::spawn(async move {
            let _ = client.on(server, |d| async move { d.seal(id).await }).await;
        });
    }

    /// Recounts the bytes held for replicas behind the acknowledged length, and forgets the
    /// pieces every live replica holds.
    fn account(&mut self) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let st = a.progress.state.lock();
        let slowest = (0..a.pipes.len())
            .filter(|&i| !a.pipes[i].dropped)
            .map(|i| st[i].durable)
            .min()
            .unwrap_or(a.acked);
        drop(st);
        while a.unsettled.front().is_some_and(|p| p.end() <= slowest) {
            a.unsettled.pop_front();
        }
        let held = a.acked.saturating_sub(slowest);
        let chasing = &self.client.inner.chasing;
        if held > a.held {
            chasing.fetch_add(held - a.held, Ordering::Relaxed);
        } else {
            chasing.fetch_sub(a.held - held, Ordering::Relaxed);
        }
        a.held = held;
    }

    /// Ends the active chunk at its acknowledged length: seals every replica there (dropping
    /// the ones that hold less), records the length and the dropped replicas at the masters.
    /// With `wait`, replicas still chasing get up to `chase_timeout` to catch up first.
    ///
    /// When no replica can be sealed there (the ones that acknowledged are gone, the others
    /// still chase), the chunk ends shorter, where a replica that answers holds the bytes, and
    /// the rest is rewritten from the client's memory at the head of the next chunk; see
    /// [`FlatLogFile::seal_short`].
    async fn finish_chunk(&mut self, wait: bool) -> Result<()> {
        if wait {
            self.catch_up().await;
        }
        let Some(mut a) = self.active.take() else {
            return Ok(());
        };
        let (id, len) = (a.id, a.acked);
        for p in &mut a.pipes {
            p.tx = None;
            p.task.abort();
        }
        let live: Vec<u64> = a
            .pipes
            .iter()
            .filter(|p| !p.dropped)
            .map(|p| p.server)
            .collect();
        let mut sealed = self.seal_all(id, len, &live).await;
        let mut len = len;
        // A chunk group is never sealed short: its stripes wait in the EC writer's memory
        // until every member holds them, and are written again into the next group.
        if len > 0
            && a.scale == 1
            && !sealed.iter().any(|(_, r)| r.is_ok())
            && let Some((short, again)) = self.seal_short(&a, &live).await
        {
            for (s, r) in again {
                if let Some(x) = sealed.iter_mut().find(|x| x.0 == s) {
                    x.1 = r;
                }
            }
            // [short, len) from the memory, ahead of what waits to be rewritten already.
            for p in a.unsettled.iter().rev() {
                let (from, to) = (short.max(p.offset), len.min(p.end()));
                if from < to {
                    let at = (from - p.offset) as usize;
                    self.rewrite
                        .push_front(p.data.slice(at..at + (to - from) as usize));
                }
            }
            if short < len {
                tracing::warn!(
                    path = %self.path, chunk = id, acked = len, short,
                    "no replica holds the acknowledged length: sealed short, the rest is rewritten"
                );
                metrics::counter!("cairn_client_chasing_total", "event" => "rewrite").increment(1);
            }
            len = short;
        }
        for (s, r) in sealed {
            match r {
                Ok(_) => {}
                // A member keeps its place in the group (its position is its cell); one that
                // lacks stripes is rebuilt by EC repair.
                Err(e) if a.scale > 1 => {
                    tracing::warn!(chunk = id, server = s, error = %e, "group member not sealed");
                    self.bad.insert(s);
                }
                // It lacks acknowledged bytes, or refused: not a copy of this chunk.
                Err(Error::Data { source, .. }) if !source.is_transient() => {
                    tracing::warn!(chunk = id, server = s, error = %source, "replica dropped at seal");
                    self.stats.dropped += 1;
                    metrics::counter!("cairn_client_chasing_total", "event" => "dropped")
                        .increment(1);
                    self.bad.insert(s);
                    self.drops.push(pb::ReplicaDrop {
                        chunk_id: id,
                        server_id: s,
                    });
                }
                // Unreachable: it stays a location (it most likely holds the bytes; the
                // masters check its report before counting it as a copy).
                Err(e) => {
                    tracing::warn!(chunk = id, server = s, error = %e, "replica not sealed");
                    self.bad.insert(s);
                }
            }
        }
        let chasing = &self.client.inner.chasing;
        chasing.fetch_sub(a.held, Ordering::Relaxed);
        let update = seal_update(&mut self.chunks[a.idx], len * a.scale);
        self.commit(vec![update], false, false, false).await
    }

    /// Seals `servers`' replicas of chunk `id` at `len`. Those that refused the writer's
    /// capability are asked again once the masters have signed fresh ones.
    async fn seal_all(&mut self, id: u64, len: u64, servers: &[u64]) -> Sealed {
        let mut sealed = self.seal_at(id, len, servers).await;
        let refused: Vec<u64> = sealed
            .iter()
            .filter(|(_, r)| {
                matches!(r, Err(Error::Data { source, .. })
                if source.status() == Some(Status::Unauthorized))
            })
            .map(|(s, _)| *s)
            .collect();
        if refused.is_empty() || !self.fresh_caps().await {
            return sealed;
        }
        for (s, r) in self.seal_at(id, len, &refused).await {
            if let Some(x) = sealed.iter_mut().find(|x| x.0 == s) {
                x.1 = r;
            }
        }
        sealed
    }

    async fn seal_at(&self, id: u64, len: u64, servers: &[u64]) -> Sealed {
        join_all(servers.iter().map(|&s| {
            let client = &self.client;
            async move {
                (
                    s,
                    client
                        .on(s, |d| async move { d.seal_at(id, len).await })
                        .await,
                )
            }
        }))
        .await
    }

    /// No live replica of `a` could be sealed at the acknowledged length. Finds the longest
    /// prefix a replica that answers still holds and that the client's memory continues (it
    /// keeps every piece some live replica may lack), seals the replicas holding it there and
    /// returns its length with the seal results. When no replica answers with that much (or
    /// none can be sealed there), the chunk ends where the memory starts: every live replica
    /// acknowledged that prefix durably (a piece leaves the memory only then), so the ones
    /// that do not answer stay its locations holding it, and the rest is rewritten. `None`
    /// only when the memory holds nothing: every live replica acknowledged the whole length,
    /// and the ones that did not answer stay its locations (the masters copy them once they
    /// are back).
    ///
    /// (Keeping the acknowledged length with a live replica that had not acknowledged it —
    /// behind, its stat failing — left a location short of acknowledged bytes: nemesis seed
    /// 35, scenario 35.)
    async fn seal_short(&mut self, a: &Active, live: &[u64]) -> Option<(u64, Sealed)> {
        let kept = a.unsettled.front().map_or(a.acked, |p| p.offset);
        if kept >= a.acked {
            return None;
        }
        let id = a.id;
        let lengths = join_all(live.iter().map(|&s| {
            let client = &self.client;
            async move { (s, client.on(s, |d| async move { d.stat(id).await }).await) }
        }))
        .await;
        let holds: Vec<(u64, u64)> = lengths
            .into_iter()
            .filter_map(|(s, r)| Some((s, r.ok()?.length.min(a.acked))))
            .filter(|&(_, l)| l >= kept)
            .collect();
        let short = holds.iter().map(|&(_, l)| l).max().unwrap_or(0);
        if short >= kept {
            let with: Vec<u64> = holds
                .iter()
                .filter(|&&(_, l)| l >= short)
                .map(|&(s, _)| s)
                .collect();
            let again = self.seal_all(id, short, &with).await;
            if short == 0 || again.iter().any(|(_, r)| r.is_ok()) {
                return Some((short, again));
            }
        }
        Some((kept, self.seal_all(id, kept, live).await))
    }

    /// Waits up to `chase_timeout` for the replicas behind the acknowledged length, then gives
    /// up on the ones still behind.
    async fn catch_up(&mut self) {
        let t = self.client.inner.opts.chase_timeout;
        let deadline = Instant::now() + t;
        loop {
            let Some(a) = self.active.as_ref() else {
                return;
            };
            let progress = a.progress.clone();
            let changed = progress.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let behind = {
                let st = progress.state.lock();
                (0..a.pipes.len())
                    .any(|i| !a.pipes[i].dropped && !st[i].hard && st[i].durable < a.acked)
            };
            let now = Instant::now();
            if !behind || now >= deadline {
                let acked = a.acked;
                self.drop_behind(acked, "still behind when the chunk was finished");
                return;
            }
            tokio::select! {
                () = &mut changed => {}
                () = tokio::time::sleep(deadline - now) => {}
            }
        }
    }

    /// Makes the next spare chunk active (one on none of the servers that failed this writer
    /// or that the client blacklisted), allocating when there is none.
    async fn next_chunk(&mut self) -> Result<()> {
        let from = self
            .chunks
            .iter()
            .rposition(|c| c.sealed || c.length > 0)
            .map_or(0, |i| i + 1);
        self.next_chunk_from(from, None).await
    }

    /// Makes the first usable spare at or after index `from` active, allocating when there
    /// is none. `group`: any kind (`None`, replicated files), a chunk group (`Some(true)`) or
    /// a tail chunk (`Some(false)`) of an EC file.
    async fn next_chunk_from(&mut self, from: usize, group: Option<bool>) -> Result<()> {
        // Servers that failed this writer or are on the client's blacklists.
        let mut avoid = self.bad.clone();
        avoid.extend(self.client.blacklisted().iter().map(|l| l.server));
        let kind = |c: &pb::ChunkMeta| group.is_none_or(|g| (c.ec_data > 0) == g);
        let usable = |c: &pb::ChunkMeta| {
            !c.sealed && c.length == 0 && kind(c) && !c.servers.iter().any(|s| avoid.contains(s))
        };
        let mut next = (from..self.chunks.len()).find(|&i| usable(&self.chunks[i]));
        if next.is_none() {
            let tail = group == Some(false);
            let req = pb::AllocateRequest {
                path: self.path.clone(),
                client_id: self.client.inner.client_id.clone(),
                // Tails are short-lived: one at a time.
                chunks: if tail {
                    1
                } else {
                    1 + self.client.inner.opts.prefetch
                },
                exclude: avoid.iter().copied().collect(),
                tail,
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
            // The masters avoid the failed servers while enough others are up; when they
            // cannot, the fresh chunks are used anyway.
            next = (known.min(self.chunks.len())..self.chunks.len()).find(|&i| {
                let c = &self.chunks[i];
                !c.sealed && c.length == 0 && kind(c)
            });
        }
        let idx = next.ok_or_else(|| MetaError::internal("allocation returned no chunk"))?;
        // Spares passed over (on a failed server) are closed empty, so that no open chunk is
        // left in the middle of the file.
        let skipped: Vec<pb::ChunkUpdate> = (from..idx)
            .filter(|&i| {
                let c = &self.chunks[i];
                !c.sealed && c.length == 0 && kind(c)
            })
            .map(|i| pb::ChunkUpdate {
                chunk_id: self.chunks[i].id,
                length: 0,
                sealed: true,
            })
            .collect();
        if !skipped.is_empty() {
            self.commit(skipped, false, false, false).await?;
        }
        self.activate(idx, 0);
        Ok(())
    }

    /// Starts the pipes of chunk `idx`, whose replicas (or members) hold `acked` bytes.
    fn activate(&mut self, idx: usize, acked: u64) {
        let c = &self.chunks[idx];
        let progress = Arc::new(Progress {
            state: Mutex::new(vec![
                ReplicaState {
                    durable: acked,
                    ..ReplicaState::default()
                };
                c.servers.len()
            ]),
            changed: Notify::new(),
            refresh: AtomicBool::new(false),
        });
        let pipes = c
            .servers
            .iter()
            .enumerate()
            .map(|(i, &server)| {
                let (tx, rx) = mpsc::unbounded_channel();
                let task = tokio::spawn(pipe(
                    self.client.clone(),
                    server,
                    c.id,
                    c.version,
                    i,
                    rx,
                    progress.clone(),
                ));
                Pipe {
                    server,
                    tx: Some(tx),
                    task,
                    behind_since: None,
                    dropped: false,
                }
            })
            .collect();
        self.active = Some(Active {
            idx,
            id: c.id,
            acked,
            pipes,
            progress,
            held: 0,
            unsettled: VecDeque::new(),
            min_copy: if c.ec_data > 0 {
                c.servers.len()
            } else {
                self.min_copy
            },
            scale: u64::from(c.ec_data.max(1)),
        });
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
            drops: std::mem::take(&mut self.drops),
            remove: std::mem::take(&mut self.remove),
        };
        let r = self.client.inner.masters.commit(req.clone()).await;
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                self.drops = req.drops;
                self.remove = req.remove;
                return Err(e.into());
            }
        };
        let f = self.client.absorb(r)?;
        self.chunks = f.chunks;
        // The masters' list has the same chunks in the same order, less the tails a commit
        // removed (always after the active chunk): find the active one again by id.
        if let Some(a) = self.active.as_mut() {
            a.idx = self
                .chunks
                .iter()
                .position(|c| c.id == a.id)
                .ok_or_else(|| MetaError::internal(format!("chunk {} left the file", a.id)))?;
        }
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
        // masters hold sealed, and a reader never reads past the masters' length. Replicas
        // still chasing get `chase_timeout` to catch up, else they are dropped.
        self.catch_up().await;
        let mut updates = self.close_parked();
        if let Some(mut a) = self.active.take() {
            for p in &mut a.pipes {
                p.tx = None;
                p.task.abort();
            }
            self.client
                .inner
                .chasing
                .fetch_sub(a.held, Ordering::Relaxed);
            if a.acked > 0 {
                updates.push(seal_update(&mut self.chunks[a.idx], a.acked * a.scale));
            }
        }
        if self.ec.is_some() {
            // Spare groups passed over for tails after them: closed empty, so that no open
            // chunk stays in the middle of a closed file.
            let last = self.chunks.iter().rposition(|c| c.length > 0).unwrap_or(0);
            for c in &mut self.chunks[..last] {
                if !c.sealed && c.length == 0 {
                    updates.push(seal_update(c, 0));
                }
            }
        }
        let r = self.commit(updates, true, true, seal).await;
        self.client.inner.cache.lock().pop(&self.path);
        match r {
            Ok(()) => Ok(self.length),
            // A master that died while answering may have applied the commit, and its retry
            // then finds the lease released (or the file sealed): the file says whether it did.
            Err(Error::Meta(e)) if matches!(e.kind, ErrorKind::LeaseLost | ErrorKind::Sealed) => {
                let st = self.client.stat(&self.path).await?;
                let mine = st.writer.as_deref() == Some(self.client.client_id());
                if !mine && st.length == self.length && (st.sealed || !seal) {
                    Ok(self.length)
                } else {
                    Err(Error::Meta(e))
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Ends the open chunk, gives the lease back and returns the file's length. The file
    /// stays appendable by the next [`Client::open_append`].
    ///
    /// # Errors
    /// The masters failed; the data acknowledged so far stays readable.
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

/// The bytes an append has still to place: the caller's slice (each piece copied once), or
/// an owned buffer (each piece a slice of it).
enum Src<'a> {
    Borrowed(&'a [u8]),
    Owned(Bytes),
}

impl Src<'_> {
    fn len(&self) -> usize {
        match self {
            Src::Borrowed(b) => b.len(),
            Src::Owned(b) => b.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first `n` bytes, as a piece's payload.
    fn head(&self, n: usize) -> Bytes {
        match self {
            Src::Borrowed(b) => Bytes::copy_from_slice(&b[..n]),
            Src::Owned(b) => b.slice(..n),
        }
    }

    fn advance(&mut self, n: usize) {
        match self {
            Src::Borrowed(b) => *b = &b[n..],
            Src::Owned(b) => *b = b.slice(n..),
        }
    }
}

impl Drop for FlatLogFile {
    fn drop(&mut self) {
        if let Some(r) = self.renew.take() {
            r.abort();
        }
        if let Some(a) = self.active.take() {
            for p in &a.pipes {
                p.task.abort();
            }
            self.client
                .inner
                .chasing
                .fetch_sub(a.held, Ordering::Relaxed);
        }
    }
}

/// Sends one replica its pieces in order, one at a time. Connection loss and timeouts are
/// retried (after checking what the replica holds) until the writer drops the replica; any
/// other error ends the pipe.
async fn pipe(
    client: Client,
    server: u64,
    chunk: u64,
    version: u64,
    i: usize,
    mut rx: mpsc::UnboundedReceiver<Piece>,
    progress: Arc<Progress>,
) {
    while let Some(p) = rx.recv().await {
        let mut attempt = 0u32;
        loop {
            let r = send(&client, server, chunk, version, &p, attempt > 0).await;
            match r {
                Ok(()) => {
                    progress.update(i, |s| {
                        s.durable = p.end();
                        s.error = None;
                    });
                    break;
                }
                Err(e) => {
                    // A refused capability is retried once the writer has a fresh one.
                    let refused = matches!(&e, Error::Data { source, .. }
                        if source.status() == Some(Status::Unauthorized));
                    if refused {
                        progress.refresh.store(true, Ordering::Release);
                    }
                    let transient = refused
                        || matches!(&e, Error::Data { source, .. } if source.is_transient());
                    progress.update(i, |s| {
                        s.error = Some(e.to_string());
                        s.hard = !transient;
                    });
                    if !transient {
                        return;
                    }
                    attempt += 1;
                    let backoff = Duration::from_millis(10 << attempt.min(6));
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }
}

/// One piece to one replica. A retry first asks the replica what it holds: the earlier try
/// may have landed.
async fn send(
    client: &Client,
    server: u64,
    chunk: u64,
    version: u64,
    p: &Piece,
    retry: bool,
) -> Result<()> {
    let (offset, end) = (p.offset, p.end());
    // The first piece creates the chunk (piggybacked), unless a retry finds it there.
    let mut create = offset == 0;
    if retry {
        let st = client
            .on(server, |d| async move { d.stat(chunk).await })
            .await;
        match st {
            Ok(info) if info.length == end => return Ok(()),
            Ok(info) if info.length == offset => create = false,
            Ok(info) => {
                return Err(Error::Data {
                    server,
                    addr: String::new(),
                    source: DataError::Status {
                        status: Status::WrongOffset,
                        offset: info.length,
                        message: format!(
                            "replica holds {} bytes; the next piece starts at {offset}",
                            info.length
                        ),
                    },
                });
            }
            Err(Error::Data {
                source:
                    DataError::Status {
                        status: Status::NotFound,
                        ..
                    },
                ..
            }) if offset == 0 => {}
            Err(e) => return Err(e),
        }
    }
    let (data, crc) = (p.data.clone(), p.crc);
    let r = client
        .on_timed(server, Op::Write, data.len(), |d| async move {
            if create {
                d.create_with_crc(chunk, version, data, crc).await
            } else {
                d.append_with_crc(chunk, offset, data, crc).await
            }
        })
        .await;
    match r {
        Ok(_) => Ok(()),
        // An earlier try that timed out can land after the stat of a retry looked: the
        // replica then already ends where this piece does (only this writer appends to it,
        // one piece at a time), and the piece is there.
        Err(Error::Data {
            source:
                DataError::Status {
                    status: Status::WrongOffset,
                    offset: held,
                    ..
                },
            ..
        }) if retry && held == end => Ok(()),
        Err(e) => Err(e),
    }
}
