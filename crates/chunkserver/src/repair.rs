//! Repairs (docs/masters.md, "Repair"): the masters name a sealed chunk and the servers that
//! hold good copies; this server pulls the bytes from one of them over the data plane (CRC
//! checked end to end), writes its own copy, seals it and reports the result with its next
//! heartbeat. Copies run under this server's share of the cluster's repair bandwidth cap.

use crate::Chunkserver;
use cairn_chunkstore::ChunkStore;
use cairn_client::DataConn;
use cairn_ec::{Codec, ReedSolomon};
use cairn_rpc::pb;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// Bytes read from the source per request. Small, so that a foreground append on the source
/// or target disk that lands behind a piece's read or write waits little longer than it would
/// behind another client's append.
const PIECE: u64 = 256 << 10;
/// Copies running at once.
const CONCURRENT: usize = 4;
/// A source request without a reply after this long fails over to the next source.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Stripes a group member's rebuild reads and decodes per step (shards of 4 cells: the
/// decoder's fixed cost per call is amortised, docs/erasure-coding.md §6).
const REBUILD_STRIPES: u64 = 4;

/// How long a step of a repair or conversion waits at most while foreground requests are
/// being served (then it goes on: repairs must progress under a constant load).
const FOREGROUND_FIRST: Duration = Duration::from_millis(20);

/// Stripes a conversion encodes and writes per step.
const CONVERT_STRIPES: u64 = 4;

/// A stage of a repair that lasts longer than this is logged (once per stage).
const SLOW_STAGE: Duration = Duration::from_secs(30);

/// Where a running repair is, for the log when it takes long.
struct Stage {
    what: &'static str,
    offset: u64,
    since: Instant,
    logged: bool,
}

impl Stage {
    fn at(what: &'static str, offset: u64) -> Self {
        Self {
            what,
            offset,
            since: Instant::now(),
            logged: false,
        }
    }
}

/// The repairs of one chunkserver.
pub struct Repairer {
    cs: Arc<Chunkserver>,
    running: Mutex<HashMap<u64, Stage>>,
    done: Mutex<Vec<pb::RepairDone>>,
    bucket: Bucket,
    slots: Arc<Semaphore>,
    /// Bytes copied since start (for metrics).
    pub copied: AtomicU64,
    /// User bytes converted to chunk groups since start (for metrics).
    pub converted: AtomicU64,
    /// Background traffic since start, indexed by the `TRAFFIC_*` constants.
    pub traffic: [AtomicU64; 5],
    /// This server's id (0 until known): members on it are written without a network hop.
    me: AtomicU64,
}

/// Conversion: user bytes converted.
pub const TRAFFIC_CONVERT_USER: usize = 0;
/// Conversion: member bytes sent to other servers.
pub const TRAFFIC_CONVERT_NETWORK: usize = 1;
/// Conversion: member bytes written (on every member).
pub const TRAFFIC_CONVERT_DEVICE: usize = 2;
/// Repair: bytes read from other servers.
pub const TRAFFIC_REPAIR_NETWORK: usize = 3;
/// Repair: bytes written here.
pub const TRAFFIC_REPAIR_DEVICE: usize = 4;

impl Repairer {
    /// How this server dials its peers: over TLS when it serves over TLS.
    fn tls(&self) -> Option<&cairn_rpc::tls::data::TlsConnector> {
        self.cs.opts.data_tls.as_ref().map(|t| &t.connector)
    }

    pub fn new(cs: Arc<Chunkserver>) -> Arc<Self> {
        Arc::new(Self {
            cs,
            running: Mutex::new(HashMap::new()),
            done: Mutex::new(Vec::new()),
            bucket: Bucket::new(64 << 20),
            slots: Arc::new(Semaphore::new(CONCURRENT)),
            copied: AtomicU64::new(0),
            converted: AtomicU64::new(0),
            traffic: Default::default(),
            me: AtomicU64::new(0),
        })
    }

    /// Tells the repairer this server's id.
    pub fn set_server_id(&self, id: u64) {
        self.me.store(id, Ordering::Relaxed);
    }

    /// Background traffic counters, in `TRAFFIC_*` order.
    pub fn traffic(&self) -> [u64; 5] {
        std::array::from_fn(|i| self.traffic[i].load(Ordering::Relaxed))
    }

    fn count(&self, what: usize, n: u64) {
        self.traffic[what].fetch_add(n, Ordering::Relaxed);
        let name = [
            "cairn_chunkserver_convert_user_bytes_total",
            "cairn_chunkserver_convert_network_bytes_total",
            "cairn_chunkserver_convert_device_bytes_total",
            "cairn_chunkserver_repair_network_bytes_total",
            "cairn_chunkserver_repair_device_bytes_total",
        ][what];
        metrics::counter!(name).increment(n);
    }

    /// This server's share of the repair bandwidth cap, from the leader.
    pub fn set_rate(&self, bytes_per_sec: u64) {
        if bytes_per_sec > 0 {
            self.bucket.rate.store(bytes_per_sec, Ordering::Relaxed);
        }
    }

    /// Repairs running now.
    pub fn running(&self) -> Vec<u64> {
        self.running.lock().keys().copied().collect()
    }

    /// Notes the stage a repair is in.
    fn stage(&self, id: u64, what: &'static str, offset: u64) {
        if let Some(s) = self.running.lock().get_mut(&id) {
            *s = Stage::at(what, offset);
        }
    }

    /// Logs, once per stage, the repairs stuck in one stage for longer than [`SLOW_STAGE`].
    pub fn log_slow(&self) {
        for (id, s) in self.running.lock().iter_mut() {
            let age = s.since.elapsed();
            if !s.logged && age > SLOW_STAGE {
                s.logged = true;
                tracing::warn!(
                    chunk = *id,
                    stage = s.what,
                    offset = s.offset,
                    ?age,
                    "repair slow"
                );
            }
        }
    }

    /// Finished repairs not yet reported.
    pub fn take_done(&self) -> Vec<pb::RepairDone> {
        std::mem::take(&mut *self.done.lock())
    }

    /// Puts back results a failed heartbeat did not deliver.
    pub fn put_back(&self, done: Vec<pb::RepairDone>) {
        self.done.lock().extend(done);
    }

    /// Starts a repair unless the same chunk is being repaired already.
    pub fn start(self: &Arc<Self>, task: pb::RepairTask) {
        match self.running.lock().entry(task.chunk_id) {
            Entry::Occupied(_) => return,
            Entry::Vacant(v) => {
                v.insert(Stage::at("waiting for a slot", 0));
            }
        }
        let this = self.clone();
        tokio::spawn(async move {
            let _slot = this.slots.clone().acquire_owned().await;
            let t0 = Instant::now();
            let id = task.chunk_id;
            let r = match task.convert_from {
                0 => this.copy(&task).await.map(|(l, crc)| (l, crc, 0)),
                _ => this.convert(&task).await.map(|(l, stream)| (l, 0, stream)),
            };
            let done = match r {
                Ok((length, crc32c, stream_length)) if task.convert_from != 0 => {
                    tracing::info!(group = id, chunk = task.convert_from, elapsed = ?t0.elapsed(), "chunk converted");
                    metrics::counter!("cairn_chunkserver_conversions_total", "result" => "ok")
                        .increment(1);
                    metrics::counter!("cairn_chunkserver_converted_bytes_total")
                        .increment(task.length);
                    pb::RepairDone {
                        chunk_id: id,
                        ok: true,
                        length,
                        crc32c,
                        error: String::new(),
                        stream_length,
                    }
                }
                Ok((length, crc32c, _)) => {
                    tracing::info!(chunk = id, length, elapsed = ?t0.elapsed(), "chunk repaired");
                    metrics::counter!("cairn_chunkserver_repairs_total", "result" => "ok")
                        .increment(1);
                    metrics::counter!("cairn_chunkserver_repair_bytes_total").increment(length);
                    pb::RepairDone {
                        chunk_id: id,
                        ok: true,
                        length,
                        crc32c,
                        error: String::new(),
                        stream_length: 0,
                    }
                }
                Err(error) => {
                    tracing::warn!(chunk = id, %error, "repair failed");
                    metrics::counter!("cairn_chunkserver_repairs_total", "result" => "failed")
                        .increment(1);
                    if let Ok(store) = this.cs.disks().find(id)
                        && store.delete_async(id).await.is_ok()
                    {
                        this.cs.disks().unplace(id);
                    }
                    pb::RepairDone {
                        chunk_id: id,
                        ok: false,
                        length: 0,
                        crc32c: 0,
                        error,
                        stream_length: 0,
                    }
                }
            };
            this.done.lock().push(done);
            this.running.lock().remove(&id);
        });
    }

    /// Makes this server's copy of the task's chunk (a replica pulled from a source, or a
    /// group member rebuilt from the others); returns the sealed copy's length and CRC.
    async fn copy(&self, task: &pb::RepairTask) -> Result<(u64, u32), String> {
        let (id, length) = (task.chunk_id, task.length);
        let disks = self.cs.disks();
        self.stage(id, "replacing the old copy", 0);
        if let Ok(store) = disks.find(id) {
            let st = store.stat(id).map_err(|e| e.to_string())?;
            let bad = self.cs.corrupt_mut().contains(&id);
            if st.sealed && st.length == length && !bad {
                return Ok((st.length, st.crc32c)); // an earlier try finished
            }
            // A copy the scrubber found bad is replaced here when no other server could
            // take the chunk.
            store.delete_async(id).await.map_err(|e| e.to_string())?;
            disks.unplace(id);
            self.cs.corrupt_mut().remove(&id);
        }
        self.stage(id, "creating the copy", 0);
        let store = disks.place(id).map_err(|e| e.to_string())?;
        if let Err(e) = store.create_async(id, task.version).await {
            disks.unplace(id);
            return Err(e.to_string());
        }
        if task.ec_data > 0 {
            self.rebuild(task, &store).await
        } else {
            self.pull(task, &store).await
        }
    }

    /// Copies a replicated chunk from the first source that serves it.
    async fn pull(&self, task: &pb::RepairTask, store: &ChunkStore) -> Result<(u64, u32), String> {
        let (id, length) = (task.chunk_id, task.length);
        let mut sources = Vec::new();
        for s in &task.sources {
            match s.addr.parse() {
                Ok(a) => sources.push((s.id, a)),
                Err(_) => tracing::warn!(addr = %s.addr, "bad source address"),
            }
        }
        let mut conns: Vec<Option<DataConn>> = sources.iter().map(|_| None).collect();
        // Sources in the order they are asked: one that failed goes last, so that a source
        // that stopped answering (frozen, or dead since the task was made) costs one timeout
        // per task, not one per piece.
        let mut order: Vec<usize> = (0..sources.len()).collect();
        let mut off = 0u64;
        let mut source_crc = None;
        // Pieces of whole units: an unsynced append that continued a unit the previous one
        // left open would have to flush first.
        let d = store.unit_data_bytes();
        let piece = (PIECE / d).max(1) * d;
        while off < length {
            let n = (length - off).min(piece);
            self.stage(id, "waiting for the bandwidth cap", off);
            self.bucket.take(n).await;
            self.cs.background(n, FOREGROUND_FIRST).await;
            self.stage(id, "reading from a source", off);
            let mut last = String::from("no source");
            let mut data = None;
            let mut failed = Vec::new();
            for &i in &order {
                let (sid, addr) = sources[i];
                if conns[i].is_none() {
                    match DataConn::connect_with(addr, TIMEOUT, task_caps(task), self.tls()).await {
                        Ok(c) => conns[i] = Some(c),
                        Err(e) => {
                            last = format!("source {sid}: {e}");
                            failed.push(i);
                            continue;
                        }
                    }
                }
                let c = conns[i].as_ref().expect("connected");
                if off == 0
                    && let Ok(info) = c.stat(id).await
                    && info.sealed
                    && info.length == length
                {
                    source_crc = Some(info.crc32c);
                }
                match c.read(id, off, n as usize).await {
                    Ok(d) => {
                        data = Some(d);
                        break;
                    }
                    Err(e) => {
                        last = format!("source {sid}: {e}");
                        conns[i] = None;
                        failed.push(i);
                    }
                }
            }
            if !failed.is_empty() {
                tracing::warn!(chunk = id, offset = off, error = %last, "repair source failed; asking the others first");
                order.retain(|i| !failed.contains(i));
                order.extend(failed);
            }
            let data = data.ok_or(last)?;
            self.stage(id, "writing", off);
            // Unsynced: the copy is not in the chunk's replica set until it is sealed, and the
            // seal flushes it first; a power cut before then leaves an unsealed prefix that the
            // next try deletes. Foreground appends on this disk never wait for its flushes.
            store
                .append_unsynced_async(id, off, &data)
                .await
                .map_err(|e| e.to_string())?;
            off += n;
            self.copied.fetch_add(n, Ordering::Relaxed);
            self.count(TRAFFIC_REPAIR_NETWORK, n);
            self.count(TRAFFIC_REPAIR_DEVICE, n);
        }
        self.stage(id, "sealing", off);
        let st = store.seal_async(id).await.map_err(|e| e.to_string())?;
        if let Some(crc) = source_crc
            && crc != st.crc32c
        {
            return Err(format!(
                "copy CRC {:#010x} differs from the source's {crc:#010x}",
                st.crc32c
            ));
        }
        Ok((st.length, st.crc32c))
    }
}

impl Repairer {
    /// Rebuilds member `task.member` of a chunk group: reads the same range of K good members
    /// (data members first; a member that fails is replaced by the next), decodes the missing
    /// cells and appends this member's, [`REBUILD_STRIPES`] stripes at a time. Every byte read
    /// is CRC-checked by the serving chunk store; the decode needs exactly K whole ranges.
    async fn rebuild(
        &self,
        task: &pb::RepairTask,
        store: &ChunkStore,
    ) -> Result<(u64, u32), String> {
        let (id, length) = (task.chunk_id, task.length);
        let (k, m, cell) = (
            task.ec_data as usize,
            task.ec_parity as usize,
            u64::from(task.ec_cell),
        );
        let width = k + m;
        let target = task.member as usize;
        if task.members.len() != width || target >= width || cell == 0 || length % cell != 0 {
            return Err(format!(
                "bad rebuild task: member {target} of {} members, ec {k}+{m}, cell {cell}, length {length}",
                task.members.len()
            ));
        }
        let codec = ReedSolomon::new(k, m).map_err(|e| e.to_string())?;
        // Readable members other than the one rebuilt, data members first (they are what
        // healthy reads touch, and a decode from them needs the fewest parity computations).
        let mut order: Vec<usize> = (0..width)
            .filter(|&i| i != target && task.members[i].id != 0)
            .collect();
        let mut addrs = Vec::with_capacity(width);
        for s in &task.members {
            addrs.push(s.addr.parse::<std::net::SocketAddr>().ok());
        }
        order.retain(|&i| addrs[i].is_some());
        let mut conns: Vec<Option<DataConn>> = (0..width).map(|_| None).collect();
        let piece = cell * REBUILD_STRIPES;
        let mut off = 0u64;
        while off < length {
            let n = (length - off).min(piece);
            self.stage(id, "waiting for the bandwidth cap", off);
            // The bytes read (K ranges) are what this costs the cluster.
            self.bucket.take(n * k as u64).await;
            self.cs.background(n * k as u64, FOREGROUND_FIRST).await;
            self.stage(id, "reading members", off);
            let mut cells: Vec<Option<Vec<u8>>> = vec![None; width];
            let mut have = 0;
            let mut failed = Vec::new();
            let mut last = String::from("fewer than K members readable");
            // K reads at once; a failure is replaced by the next member in `order`.
            let mut next = 0;
            while have < k && next < order.len() {
                let batch: Vec<usize> = order[next..].iter().take(k - have).copied().collect();
                next += batch.len();
                let mut ready = Vec::new();
                for &i in &batch {
                    if conns[i].is_none() {
                        match DataConn::connect_with(
                            addrs[i].expect("kept"),
                            TIMEOUT,
                            task_caps(task),
                            self.tls(),
                        )
                        .await
                        {
                            Ok(c) => conns[i] = Some(c),
                            Err(e) => {
                                last = format!("member {i} (server {}): {e}", task.members[i].id);
                                failed.push(i);
                                continue;
                            }
                        }
                    }
                    ready.push(i);
                }
                let reads = ready.iter().map(|&i| {
                    let c = conns[i].as_ref().expect("connected");
                    async move {
                        let r = tokio::time::timeout(TIMEOUT, c.read(id, off, n as usize)).await;
                        (i, r)
                    }
                });
                let answers = futures::future::join_all(reads).await;
                for (i, r) in answers {
                    match r {
                        Ok(Ok(d)) if d.len() as u64 == n => {
                            cells[i] = Some(d);
                            have += 1;
                        }
                        Ok(Ok(d)) => {
                            last = format!("member {i}: {} bytes where {n} were asked", d.len());
                            failed.push(i);
                        }
                        Ok(Err(e)) => {
                            last = format!("member {i} (server {}): {e}", task.members[i].id);
                            conns[i] = None;
                            failed.push(i);
                        }
                        Err(_) => {
                            last = format!("member {i}: no answer in {TIMEOUT:?}");
                            conns[i] = None;
                            failed.push(i);
                        }
                    }
                }
            }
            if have < k {
                return Err(format!("{last} (rebuilding at offset {off})"));
            }
            if !failed.is_empty() {
                tracing::warn!(chunk = id, offset = off, error = %last, "a member failed during a rebuild; reading others");
                order.retain(|i| !failed.contains(i));
                order.extend(failed);
            }
            self.stage(id, "decoding", off);
            let cells =
                tokio::task::spawn_blocking(move || codec.reconstruct(&mut cells).map(|()| cells))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
            let data = cells
                .into_iter()
                .nth(target)
                .flatten()
                .ok_or("the decoder returned no cell")?;
            self.stage(id, "writing", off);
            store
                .append_unsynced_async(id, off, &data)
                .await
                .map_err(|e| e.to_string())?;
            off += n;
            self.copied.fetch_add(n, Ordering::Relaxed);
            self.count(TRAFFIC_REPAIR_NETWORK, n * k as u64);
            self.count(TRAFFIC_REPAIR_DEVICE, n);
        }
        self.stage(id, "sealing", off);
        let st = store.seal_async(id).await.map_err(|e| e.to_string())?;
        Ok((st.length, st.crc32c))
    }
}

impl Repairer {
    /// Converts this server's copy of `task.convert_from` into chunk group `task.chunk_id` on
    /// `task.members` (crate::conversion in the masters): whole stripes, the last padded with
    /// zeros, [`CONVERT_STRIPES`] at a time, encoded in one call and appended to every member
    /// at once; then every member is sealed and its length and CRC32C compared with what was
    /// encoded. Returns a member's length.
    async fn convert(&self, task: &pb::RepairTask) -> Result<(u64, u64), String> {
        let (group, from, length) = (task.chunk_id, task.convert_from, task.length);
        let (k, m, cell) = (
            task.ec_data as usize,
            task.ec_parity as usize,
            task.ec_cell as usize,
        );
        let width = k + m;
        if task.members.len() != width || cell == 0 || cell % cairn_ec::CELL_ALIGN != 0 {
            return Err(format!(
                "bad conversion task: {} members for ec {k}+{m}, cell {cell}",
                task.members.len()
            ));
        }
        let codec = ReedSolomon::new(k, m).map_err(|e| e.to_string())?;
        self.stage(group, "opening the copy", 0);
        let store = self.cs.disks().find(from).map_err(|e| e.to_string())?;
        let st = store.stat(from).map_err(|e| e.to_string())?;
        if st.length < length {
            return Err(format!(
                "copy of chunk {from} holds {} bytes, the masters know {length}",
                st.length
            ));
        }
        self.stage(group, "creating the members", 0);
        let mut conns = Vec::with_capacity(width);
        for s in &task.members {
            let addr: std::net::SocketAddr = s
                .addr
                .parse()
                .map_err(|_| format!("bad member address {:?}", s.addr))?;
            let c = DataConn::connect_with(addr, TIMEOUT, task_caps(task), self.tls())
                .await
                .map_err(|e| format!("member server {}: {e}", s.id))?;
            c.create(group, task.version, Vec::new())
                .await
                .map_err(|e| format!("creating on server {}: {e}", s.id))?;
            conns.push(c);
        }
        let stripe = (k * cell) as u64;
        let step = (CONVERT_STRIPES * stripe) as usize;
        let block = task.compress_block as usize;
        if block > cairn_ec::block::MAX_BLOCK {
            return Err(format!("LZ4 block of {block} bytes"));
        }
        // The stream the group holds: the copy's bytes, or (compressing) LZ4 blocks of
        // `block` user bytes each, then their index. Written whole stripes at a time, the
        // last padded with zeros.
        let mut pending: Vec<u8> = Vec::with_capacity(2 * step);
        let mut offsets: Vec<u64> = Vec::new();
        let (mut produced, mut written, mut read) = (0u64, 0u64, 0u64);
        let mut input_done = false;
        let mut crcs = vec![0u32; width];
        let unit = store.unit_data_bytes() as usize;
        let mut carry: Vec<Vec<u8>> = vec![Vec::new(); width];
        let mut member_off = 0u64;
        loop {
            while pending.len() < step && !input_done {
                if read < length {
                    // Whole blocks (the last may be short), about a step's worth.
                    let want = match block {
                        0 => step as u64,
                        b => (step as u64).div_ceil(b as u64) * b as u64,
                    };
                    let n = (length - read).min(want) as usize;
                    self.stage(group, "waiting for the bandwidth", read);
                    self.cs.background(n as u64, FOREGROUND_FIRST).await;
                    self.stage(group, "reading the copy", read);
                    let st = store.clone();
                    let off = read;
                    let buf = tokio::task::spawn_blocking(move || st.read_buf(from, off, n))
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| e.to_string())?;
                    let mut user = vec![0u8; n];
                    buf.copy_to(&mut user);
                    if block == 0 {
                        pending.extend_from_slice(&user);
                        produced += n as u64;
                    } else {
                        let before = pending.len();
                        let base = produced;
                        let (out, offs) = tokio::task::spawn_blocking(move || {
                            let mut out = Vec::with_capacity(user.len() + 64);
                            let mut offs = Vec::new();
                            for b in user.chunks(block) {
                                offs.push(base + out.len() as u64);
                                cairn_ec::block::encode(b, &mut out);
                            }
                            (out, offs)
                        })
                        .await
                        .map_err(|e| e.to_string())?;
                        offsets.extend(offs);
                        pending.extend_from_slice(&out);
                        produced += (pending.len() - before) as u64;
                    }
                    read += n as u64;
                } else {
                    if block != 0 {
                        let before = pending.len();
                        cairn_ec::block::encode_index(&offsets, block as u32, &mut pending);
                        produced += (pending.len() - before) as u64;
                    }
                    input_done = true;
                }
            }
            // Done when nothing is pending and no member has bytes carried over (the input
            // can end right after a step that drained `pending`: then only the carries go).
            if pending.is_empty() && carry.iter().all(Vec::is_empty) {
                break;
            }
            // Whole stripes while more is coming; the rest, padded, at the end.
            let take = match input_done {
                true => pending.len().min(step),
                false => (pending.len().min(step) / stripe as usize) * stripe as usize,
            };
            let ns = (take as u64).div_ceil(stripe) as usize;
            let chunk: Vec<u8> = pending.drain(..take).collect();
            self.stage(group, "encoding", written);
            let shard = ns * cell;
            let encoded = match take {
                0 => None,
                _ => Some(tokio::task::spawn_blocking(move || {
                    // Data member i's shard: cell i of every stripe, zeros past the stream.
                    let mut shards = vec![vec![0u8; shard]; k];
                    for t in 0..ns {
                        for (i, sh) in shards.iter_mut().enumerate() {
                            let a = t * k * cell + i * cell;
                            if a < chunk.len() {
                                let b = (a + cell).min(chunk.len());
                                sh[t * cell..t * cell + (b - a)].copy_from_slice(&chunk[a..b]);
                            }
                        }
                    }
                    let refs: Vec<&[u8]> = shards.iter().map(Vec::as_slice).collect();
                    let parity = codec.encode(&refs)?;
                    shards.extend(parity);
                    Ok::<_, cairn_ec::CodecError>(shards)
                })),
            };
            let shards = match encoded {
                None => vec![Vec::new(); width],
                Some(t) => t
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?,
            };
            self.stage(group, "writing the members", written);
            // Whole units of the member stores per append while more follows (an unsynced
            // append that ends inside a unit makes the next one flush first); the rest is
            // carried to the next step.
            let last = input_done && pending.is_empty();
            let mut sends = Vec::with_capacity(width);
            for (i, sh) in shards.into_iter().enumerate() {
                let mut buf = std::mem::take(&mut carry[i]);
                buf.extend_from_slice(&sh);
                let n = match last {
                    true => buf.len(),
                    false => buf.len() / unit * unit,
                };
                carry[i] = buf.split_off(n);
                sends.push(buf);
            }
            let sent = sends[0].len();
            let writes = conns.iter().zip(sends).enumerate().map(|(i, (c, sh))| {
                let crc = cairn_proto::frame::crc32c(&sh);
                let len = sh.len();
                async move {
                    // Unsynced: the members count only once sealed, and the seal flushes them;
                    // foreground appends on their disks never wait behind these flushes.
                    let r = match len {
                        0 => Ok(Ok(member_off)),
                        _ => {
                            tokio::time::timeout(TIMEOUT, c.append_unsynced(group, member_off, sh))
                                .await
                        }
                    };
                    (i, crc, len, r)
                }
            });
            for (i, crc, len, r) in futures::future::join_all(writes).await {
                let id = task.members[i].id;
                match r {
                    Ok(Ok(_)) => {
                        crcs[i] = cairn_chunkstore::checksum::crc32c_combine(crcs[i], crc, len);
                        if id != self.me.load(Ordering::Relaxed) {
                            self.count(TRAFFIC_CONVERT_NETWORK, len as u64);
                        }
                        self.count(TRAFFIC_CONVERT_DEVICE, len as u64);
                    }
                    Ok(Err(e)) => return Err(format!("member {i} (server {id}): {e}")),
                    Err(_) => {
                        return Err(format!(
                            "member {i} (server {id}): no answer in {TIMEOUT:?}"
                        ));
                    }
                }
            }
            member_off += sent as u64;
            written += ns as u64 * stripe;
        }
        self.converted.fetch_add(length, Ordering::Relaxed);
        self.count(TRAFFIC_CONVERT_USER, length);
        let stripes = produced.div_ceil(stripe);
        self.stage(group, "sealing the members", length);
        let member_length = stripes * cell as u64;
        for (i, c) in conns.iter().enumerate() {
            let id = task.members[i].id;
            let info = c
                .seal(group)
                .await
                .map_err(|e| format!("sealing member {i} on server {id}: {e}"))?;
            if info.length != member_length || info.crc32c != crcs[i] {
                return Err(format!(
                    "member {i} on server {id}: sealed at {} bytes with CRC {:#010x}, {member_length} with {:#010x} were written",
                    info.length, info.crc32c, crcs[i]
                ));
            }
        }
        Ok((member_length, produced))
    }
}

/// A token bucket: `take(n)` waits until `n` bytes fit the rate. Allows a burst of 10 ms (at
/// least two pieces): pieces are spread over time, not sent back to back.
/// A token bucket of bytes/s (repairs here; the scrubber too).
pub(crate) struct Bucket {
    rate: AtomicU64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub(crate) fn new(rate: u64) -> Self {
        Self {
            rate: AtomicU64::new(rate),
            state: Mutex::new((0.0, Instant::now())),
        }
    }

    /// Sets the rate (0 leaves it as is).
    pub(crate) fn set_rate(&self, rate: u64) {
        if rate > 0 {
            self.rate.store(rate, Ordering::Relaxed);
        }
    }

    pub(crate) fn rate(&self) -> u64 {
        self.rate.load(Ordering::Relaxed)
    }

    pub(crate) async fn take(&self, n: u64) {
        let wait = {
            let rate = self.rate.load(Ordering::Relaxed).max(1) as f64;
            let burst = (rate / 100.0).max(2.0 * PIECE as f64);
            let mut st = self.state.lock();
            let now = Instant::now();
            st.0 = (st.0 + now.duration_since(st.1).as_secs_f64() * rate).min(burst);
            st.1 = now;
            st.0 -= n as f64;
            if st.0 >= 0.0 {
                return;
            }
            Duration::from_secs_f64(-st.0 / rate)
        };
        tokio::time::sleep(wait).await;
    }
}

/// The capabilities the masters signed into a task, for its connections to other servers.
fn task_caps(task: &pb::RepairTask) -> Option<Arc<cairn_client::caps::Caps>> {
    if task.caps.is_empty() {
        return None;
    }
    let caps = cairn_client::caps::Caps::default();
    for c in &task.caps {
        caps.remember(c);
    }
    Some(Arc::new(caps))
}
