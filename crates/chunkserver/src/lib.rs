//! The chunkserver: serves the chunk stores of its disks over the data-plane protocol
//! (docs/formats/wire.md).
//!
//! One tokio task reads each connection's frames and starts one task per request; replies go
//! back through the connection's writer task in completion order. A request crosses one
//! thread hand-off between socket and disk: an append or a create is laid out on the tokio
//! worker and handed to the disk's device thread; a read is handed to a blocking thread that
//! reads from the device itself. In-flight requests and payload bytes per connection are
//! bounded; past the bound the reader stops reading the socket (TCP backpressure).

mod caps;
pub mod control;
mod disks;
pub mod repair;
pub mod scrub;

pub use disks::{DiskSet, DiskSetOptions};

use cairn_chunkstore::Error as StoreError;
use cairn_chunkstore::buf::{AlignedBuf, BufPool};
use cairn_chunkstore::format::segment::LARGE_MIN_BYTES;
use cairn_proto::fault::FaultSpec;
use cairn_proto::frame::{
    FLAG_SEAL_AT, FLAG_SEALED, FrameError, HEADER_BYTES, Header, Opcode, Status,
};
use cairn_rpc::admission::{Admission, LogBudget, Slot};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

/// Limits of one connection.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Requests of one connection being served at once.
    pub max_in_flight: usize,
    /// Payload bytes (request and read reply) of one connection being served at once.
    pub max_in_flight_bytes: usize,
    /// Largest read served in one request.
    pub max_read: u64,
    /// Accept FAULT requests (`--fault-injection`): for tests and drills only.
    pub fault_injection: bool,
    /// Refuse every request on a chunk that carries no valid capability (docs/security.md).
    pub require_capabilities: bool,
    /// Connections served at once, in all, and from one peer address; past either a new
    /// connection is closed at once.
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    /// Payload bytes all connections together may hold (each also within
    /// `max_in_flight_bytes`): a flood of headers announcing large payloads waits here
    /// rather than allocating.
    pub max_server_bytes: usize,
    /// A connection that starts no frame for this long is closed.
    pub idle_timeout: std::time::Duration,
    /// A frame whose header, capability and payload have not all arrived this long after its
    /// first byte (or after the server could take its payload) closes its connection: a
    /// slow or stalled sender holds nothing for long.
    pub frame_timeout: std::time::Duration,
    /// Serve frames over TLS only, and dial peers (repair, conversion) over TLS
    /// (`--data-tls`; docs/security.md).
    pub data_tls: Option<cairn_rpc::tls::data::ServerTls>,
    /// With capabilities required, a connection is *unproven* until one of its frames
    /// carries a valid capability; unproven connections have slots of their own — this many
    /// in all and `max_unproven_per_peer` from one address — and are closed
    /// `proof_timeout` after they were accepted (their TLS handshake included) unless they
    /// prove themselves. Then they take a slot among `max_connections`. So a flood of
    /// connections that hold no capability never takes a client's slot, and is gone within
    /// `proof_timeout`.
    pub max_unproven: usize,
    pub max_unproven_per_peer: usize,
    pub proof_timeout: std::time::Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            max_in_flight: 128,
            max_in_flight_bytes: 256 << 20,
            max_read: 64 << 20,
            fault_injection: false,
            require_capabilities: false,
            max_connections: 4096,
            max_connections_per_peer: 1024,
            max_server_bytes: 2 << 30,
            idle_timeout: std::time::Duration::from_secs(300),
            frame_timeout: std::time::Duration::from_secs(30),
            data_tls: None,
            max_unproven: 512,
            max_unproven_per_peer: 32,
            proof_timeout: std::time::Duration::from_secs(2),
        }
    }
}

/// A chunkserver: its disks and its connection limits.
pub struct Chunkserver {
    /// Rate of the warnings about refused TLS handshakes.
    refusals: LogBudget,
    disks: DiskSet,
    opts: ServerOptions,
    /// Requests being served right now (reported to the masters as load).
    load: std::sync::atomic::AtomicU32,
    /// The injected faults (with `fault_injection`); a change wakes stalled requests.
    faults: tokio::sync::watch::Sender<FaultSpec>,
    /// Receive buffers of large payloads, reused (a fresh one costs a zero-fill and page
    /// faults per request).
    recv_pool: BufPool,
    /// Copies the scrubber found bad, until repair replaces them.
    corrupt: scrub::BadSet,
    /// The background bandwidth (repair, conversion and scrub together), from the masters.
    background: repair::Bucket,
    /// The keys capabilities are checked with, and the newest writer epoch seen per chunk.
    caps: caps::Checker,
    /// Connection slots, proven and unproven (docs/security.md "Resource limits").
    conns: Arc<Admission>,
    /// Payload bytes held by all connections (`max_server_bytes`).
    server_bytes: Arc<Semaphore>,
    /// Whether capabilities are checked: `opts.require_capabilities`, switchable in process
    /// (`cairn bench caps` measures the checks A/B in one run; nothing on the network can).
    require_caps: std::sync::atomic::AtomicBool,
}

/// Background bandwidth until the masters set one (theirs is the same by default).
const DEFAULT_BACKGROUND_BYTES_PER_SEC: u64 = 200 << 20;

/// Bytes of a connection's read buffer.
const READ_BUFFER: usize = 64 << 10;
/// The buffer between a TLS session and its socket (rustls reads it 4 KiB at a time).
const TLS_READ_BUFFER: usize = 128 << 10;

/// Receive buffers kept for reuse (at most 16 × 4 MiB with `cairn fs put`'s appends).
const RECV_BUFFERS: usize = 16;

/// A request's payload. One long enough to be a large append of the chunk store
/// (docs/formats/chunk-store.md §3.2) is received into an aligned buffer, which the store then
/// writes to the device without copying it.
enum Payload {
    Bytes(Vec<u8>),
    Aligned(Arc<AlignedBuf>, usize),
}

impl Payload {
    async fn receive(
        rd: &mut (impl AsyncReadExt + Unpin),
        len: usize,
        pool: &BufPool,
    ) -> std::io::Result<Self> {
        if len < LARGE_MIN_BYTES {
            let mut b = vec![0u8; len];
            rd.read_exact(&mut b).await?;
            return Ok(Self::Bytes(b));
        }
        // The store writes the buffer up to its unit past `len` (a 64 KiB multiple covers
        // every unit size): zero that tail, so no earlier payload's bytes reach the device.
        let padded = len.next_multiple_of(64 << 10);
        let mut b = pool.take(padded);
        b[len..padded].fill(0);
        if let Err(e) = rd.read_exact(&mut b[..len]).await {
            pool.give(b);
            return Err(e);
        }
        Ok(Self::Aligned(Arc::new(b), len))
    }

    /// Returns an aligned buffer to `pool` once nothing else holds it (the store lets go of
    /// its reference when the write is done, before the append is acknowledged).
    fn recycle(self, pool: &BufPool) {
        if let Self::Aligned(b, _) = self
            && let Ok(b) = Arc::try_unwrap(b)
        {
            pool.give(b);
        }
    }

    /// Creates chunk `id` with it as the first append.
    async fn create_with_append(
        &self,
        store: &cairn_chunkstore::ChunkStore,
        id: u64,
        version: u64,
    ) -> Result<u64, StoreError> {
        match self {
            Self::Bytes(b) => store.create_with_append_async(id, version, b).await,
            Self::Aligned(b, len) => {
                store
                    .create_with_append_aligned_async(id, version, b.clone(), *len)
                    .await
            }
        }
    }

    /// Appends it to chunk `id` at `offset`.
    /// Appends the payload; `durable`: flushed before the answer.
    async fn append(
        &self,
        store: &cairn_chunkstore::ChunkStore,
        id: u64,
        offset: u64,
        durable: bool,
    ) -> Result<u64, StoreError> {
        match self {
            Self::Bytes(b) if durable => store.append_async(id, offset, b).await,
            Self::Bytes(b) => store.append_unsynced_async(id, offset, b).await,
            Self::Aligned(b, len) => {
                store
                    .append_aligned_async(id, offset, b.clone(), *len, durable)
                    .await
            }
        }
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Self::Bytes(b) => b,
            Self::Aligned(b, len) => &b[..*len],
        }
    }
}

/// A reply's payload: bytes, or a read's verified bytes still in the chunk store's buffer
/// (sent from there, never copied).
enum Body {
    Bytes(Vec<u8>),
    Read(cairn_chunkstore::ReadBuf),
}

impl Body {
    fn len(&self) -> usize {
        match self {
            Self::Bytes(b) => b.len(),
            Self::Read(r) => r.len(),
        }
    }

    async fn write_to(&self, wr: &mut (impl AsyncWriteExt + Unpin)) -> std::io::Result<()> {
        match self {
            Self::Bytes(b) => wr.write_all(b).await,
            Self::Read(r) => {
                for p in r.pieces() {
                    wr.write_all(p).await?;
                }
                Ok(())
            }
        }
    }
}

/// A reply on its way to the writer task, with the permits it releases once written.
struct Reply {
    header: Header,
    payload: Body,
    /// The request's slot, and its payload bytes on the connection and on the server.
    _permits: (OwnedSemaphorePermit, Option<[OwnedSemaphorePermit; 2]>),
}

impl Chunkserver {
    pub fn new(disks: DiskSet, opts: ServerOptions) -> Arc<Self> {
        Arc::new(Self {
            refusals: LogBudget::default(),
            disks,
            load: std::sync::atomic::AtomicU32::new(0),
            faults: tokio::sync::watch::Sender::new(FaultSpec::default()),
            recv_pool: BufPool::new(RECV_BUFFERS),
            corrupt: Default::default(),
            background: repair::Bucket::new(DEFAULT_BACKGROUND_BYTES_PER_SEC),
            caps: caps::Checker::default(),
            conns: Admission::new(
                cairn_rpc::admission::Limits {
                    max_connections: opts.max_connections,
                    max_connections_per_peer: opts.max_connections_per_peer,
                    max_unproven: opts.max_unproven,
                    max_unproven_per_peer: opts.max_unproven_per_peer,
                    proof_timeout: opts.proof_timeout,
                    // The frames watch their own sizes; Guarded is not used here.
                    max_unproven_bytes: u64::MAX,
                },
                cairn_rpc::admission::Names {
                    open: "cairn_chunkserver_connections",
                    unproven: "cairn_chunkserver_connections_unproven",
                    refused: "cairn_chunkserver_connections_refused_total",
                },
            ),
            server_bytes: Arc::new(Semaphore::new(opts.max_server_bytes)),
            require_caps: std::sync::atomic::AtomicBool::new(opts.require_capabilities),
            opts,
        })
    }

    /// Sets the background bandwidth (bytes/s; 0 leaves it as is).
    pub fn set_background_rate(&self, bytes_per_sec: u64) {
        self.background.set_rate(bytes_per_sec);
    }

    /// Replaces the keys capabilities are checked with (from the masters' heartbeat replies;
    /// an empty list keeps the ones held).
    /// Turns the capability checks on or off in process (for the A/B benchmark; a server's
    /// setting is `ServerOptions::require_capabilities`).
    pub fn set_require_capabilities(&self, on: bool) {
        self.require_caps
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn set_cap_keys(&self, keys: Vec<cairn_proto::cap::CapKey>) {
        self.caps.set_keys(keys);
    }

    /// The number of the last capability revocation held (caps.rs).
    pub fn revocations_seen(&self) -> u64 {
        self.caps.revocations_seen()
    }

    /// A heartbeat reply's capability revocations (caps.rs).
    pub fn add_revocations(&self, list: &[cairn_rpc::pb::Revocation], upto: u64) {
        self.caps.add_revocations(list, upto);
    }

    /// The background bandwidth now, bytes/s.
    pub fn background_rate(&self) -> u64 {
        self.background.rate()
    }

    /// Waits until background work may move `n` more bytes: within the background
    /// bandwidth, and behind foreground requests (for at most `max_yield`, so that repairs
    /// progress under a constant load).
    pub(crate) async fn background(&self, n: u64, max_yield: std::time::Duration) {
        let until = std::time::Instant::now() + max_yield;
        while self.load() > 0 && std::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        self.background.take(n).await;
    }

    /// Copies the scrubber found bad and repair has not replaced yet.
    pub fn corrupt(&self) -> std::collections::BTreeSet<u64> {
        self.corrupt.lock().clone()
    }

    pub(crate) fn corrupt_mut(
        &self,
    ) -> parking_lot::MutexGuard<'_, std::collections::BTreeSet<u64>> {
        self.corrupt.lock()
    }

    /// The faults injected right now.
    pub fn faults(&self) -> FaultSpec {
        *self.faults.borrow()
    }

    pub fn disks(&self) -> &DiskSet {
        &self.disks
    }

    /// Requests being served right now.
    pub fn load(&self) -> u32 {
        self.load.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The disks, to close them once the server is done.
    pub fn into_disks(self) -> DiskSet {
        self.disks
    }

    /// Accepts connections until `shutdown` resolves (over TLS with `data_tls`).
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let tls = self.opts.data_tls.as_ref().map(|t| t.acceptor.clone());
        self.serve_with(listener, tls, shutdown).await
    }

    /// [`Chunkserver::serve`] with `tls` instead of the options' (a benchmark serves one
    /// server on a plain and a TLS listener at once).
    pub async fn serve_with(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Option<cairn_rpc::tls::data::TlsAcceptor>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                r = listener.accept() => match r {
                    Ok((stream, peer)) => {
                        let Some(slot) = self.admit(peer) else {
                            continue;
                        };
                        let (this, tls) = (self.clone(), tls.clone());
                        tokio::spawn(async move {
                            this.accepted(stream, peer, tls.as_ref(), slot).await;
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                },
            }
        }
    }

    /// Takes a connection slot for `peer`, or refuses it (the caller drops the stream).
    fn admit(self: &Arc<Self>, peer: SocketAddr) -> Option<Slot> {
        let proven = !self.require_caps.load(std::sync::atomic::Ordering::Relaxed);
        self.conns.admit(peer, proven)
    }

    /// Serves an accepted connection: over TLS once its handshake completes when `tls` is
    /// given, else as it is.
    async fn accepted(
        self: Arc<Self>,
        stream: TcpStream,
        peer: SocketAddr,
        tls: Option<&cairn_rpc::tls::data::TlsAcceptor>,
        slot: Slot,
    ) {
        let _ = stream.set_nodelay(true);
        let Some(tls) = tls else {
            let (rd, wr) = stream.into_split();
            return self.connection(rd, wr, peer, slot).await;
        };
        // A TLS connection opens with a handshake record (content type 22); anything else is
        // a client that was not told this server speaks TLS.
        let mut first = [0u8; 1];
        // An unproven connection's handshake is within its time to prove itself.
        let t = if slot.is_proven() {
            self.opts.frame_timeout
        } else {
            slot.time_left()
        };
        match tokio::time::timeout(t, stream.peek(&mut first)).await {
            Ok(Ok(1)) if first[0] == 22 => {}
            Ok(Ok(1)) => {
                metrics::counter!("cairn_chunkserver_tls_refused_total", "why" => "plain")
                    .increment(1);
                if self.refusals.allow() {
                    tracing::warn!(%peer, "plain-text connection refused: this chunkserver serves its data plane over TLS (clients need --data-tls)");
                }
                return;
            }
            _ => return,
        }
        // rustls reads the socket 4 KiB at a time: a buffer under it turns the five reads of
        // each 16 KiB record into a fraction of one system call.
        let stream = tokio::io::BufReader::with_capacity(TLS_READ_BUFFER, stream);
        let stream = match tokio::time::timeout(t, tls.accept(stream)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                metrics::counter!("cairn_chunkserver_tls_refused_total", "why" => "handshake")
                    .increment(1);
                if self.refusals.allow() {
                    tracing::warn!(%peer, error = %e, "TLS handshake failed");
                }
                return;
            }
            Err(_) => {
                if self.refusals.allow() {
                    tracing::warn!(%peer, "TLS handshake timed out");
                }
                return;
            }
        };
        let (rd, wr) = tokio::io::split(stream);
        self.connection(rd, wr, peer, slot).await
    }

    async fn connection(
        self: Arc<Self>,
        rd: impl AsyncRead + Unpin + Send,
        wr: impl AsyncWrite + Unpin + Send + 'static,
        peer: SocketAddr,
        mut slot: Slot,
    ) {
        // Frames are read through a buffer: one read takes a small request's header and
        // payload (and whatever follows them) in one system call. Payloads longer than the
        // buffer are read straight into theirs.
        let mut rd = tokio::io::BufReader::with_capacity(READ_BUFFER, rd);
        let (tx, mut rx) = mpsc::unbounded_channel::<Reply>();
        // Replies are bounded by the permits they carry, so the channel needs no bound.
        let writer = tokio::spawn(async move {
            let mut wr = BufWriter::with_capacity(256 << 10, wr);
            while let Some(first) = rx.recv().await {
                let mut next = Some(first);
                while let Some(r) = next {
                    wr.write_all(&r.header.encode()).await?;
                    r.payload.write_to(&mut wr).await?;
                    next = rx.try_recv().ok();
                }
                wr.flush().await?;
            }
            Ok::<_, std::io::Error>(())
        });
        let count = Arc::new(Semaphore::new(self.opts.max_in_flight));
        let bytes = Arc::new(Semaphore::new(self.opts.max_in_flight_bytes));
        if let Err(e) = self
            .read_loop(&mut rd, &tx, &count, &bytes, &mut slot)
            .await
        {
            tracing::info!(%peer, error = %e, "closing connection");
        }
        drop(tx);
        let _ = writer.await;
    }

    async fn read_loop(
        self: &Arc<Self>,
        rd: &mut (impl AsyncReadExt + Unpin),
        tx: &mpsc::UnboundedSender<Reply>,
        count: &Arc<Semaphore>,
        bytes: &Arc<Semaphore>,
        slot: &mut Slot,
    ) -> Result<(), ConnError> {
        let (idle, frame) = (self.opts.idle_timeout, self.opts.frame_timeout);
        let timed =
            |what: &'static str, d: std::time::Duration| move |_| ConnError::Timeout(what, d);
        loop {
            let mut hb = [0u8; HEADER_BYTES];
            // Unproven: only until its deadline, whatever it sends meanwhile.
            let wait = if slot.is_proven() {
                idle
            } else {
                slot.time_left().min(idle)
            };
            let unproven = ConnError::Timeout("a valid capability", self.opts.proof_timeout);
            match tokio::time::timeout(wait, rd.read_exact(&mut hb[..1])).await {
                Err(_) if !slot.is_proven() => return Err(unproven),
                Err(_) => return Err(ConnError::Timeout("no request", idle)),
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Ok(Err(e)) => return Err(e.into()),
            }
            tokio::time::timeout(frame, rd.read_exact(&mut hb[1..]))
                .await
                .map_err(timed("a header", frame))??;
            let h = Header::decode(&hb)?;
            if h.is_reply() {
                return Err(ConnError::Protocol("a reply frame sent to the server"));
            }
            let mut cap = [0u8; cairn_proto::cap::CAP_BYTES];
            let has_cap = h.cap_len > 0;
            if has_cap {
                tokio::time::timeout(frame, rd.read_exact(&mut cap))
                    .await
                    .map_err(timed("a capability", frame))??;
            }
            // The capability is checked before anything is allocated for the payload: a
            // refused request's payload is read through a small buffer and dropped.
            let checked = self.caps.check_frame(
                &h,
                has_cap.then_some(&cap),
                self.require_caps.load(std::sync::atomic::Ordering::Relaxed),
            );
            let cap = match checked {
                Ok(Some(cap)) => {
                    if !slot.prove() {
                        return Err(ConnError::Protocol(
                            "every slot for proven connections is taken",
                        ));
                    }
                    Some(cap)
                }
                Ok(None) => {
                    if !slot.is_proven() && std::time::Instant::now() >= slot.deadline() {
                        return Err(unproven);
                    }
                    None
                }
                Err(e) => {
                    let mut skip = (&mut *rd).take(u64::from(h.length));
                    tokio::time::timeout(frame, tokio::io::copy(&mut skip, &mut tokio::io::sink()))
                        .await
                        .map_err(timed("a refused payload", frame))??;
                    let one = count.clone().acquire_owned().await.expect("never closed");
                    let (header, payload) = match self.caps.ready() {
                        true => error_reply(&h, Status::Unauthorized, e.to_string()),
                        false => error_reply(
                            &h,
                            Status::NotReady,
                            format!("no capability keys from the masters yet ({e})"),
                        ),
                    };
                    record(&h, &header, std::time::Duration::ZERO, 0, 0);
                    let _ = tx.send(Reply {
                        header,
                        payload: Body::Bytes(payload),
                        _permits: (one, None),
                    });
                    continue;
                }
            };
            let one = count.clone().acquire_owned().await.expect("never closed");
            // The bytes this request holds: its payload, or the reply's for a read.
            let want = if h.op() == Some(Opcode::Read) {
                h.arg.min(self.opts.max_read)
            } else {
                h.length as u64
            };
            let held = (want as usize)
                .min(self.opts.max_in_flight_bytes)
                .min(self.opts.max_server_bytes);
            let big = if held > 0 {
                let take = |s: &Arc<Semaphore>| s.clone().acquire_many_owned(held as u32);
                let conn = take(bytes).await.expect("never closed");
                let server = take(&self.server_bytes).await.expect("never closed");
                Some([conn, server])
            } else {
                None
            };
            let payload = tokio::time::timeout(
                frame,
                Payload::receive(rd, h.length as usize, &self.recv_pool),
            )
            .await
            .map_err(timed("a payload", frame))??;
            h.check_payload(&payload)?;
            let this = self.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                use std::sync::atomic::Ordering::Relaxed;
                this.load.fetch_add(1, Relaxed);
                let t = std::time::Instant::now();
                let bytes_in = payload.len() as u64;
                let (header, payload) = this.clone().handle(h, cap, payload).await;
                this.load.fetch_sub(1, Relaxed);
                record(&h, &header, t.elapsed(), bytes_in, payload.len() as u64);
                let _ = tx.send(Reply {
                    header,
                    payload,
                    _permits: (one, big),
                });
            });
        }
    }

    /// Serves one request; returns the reply header and payload.
    async fn handle(
        self: Arc<Self>,
        h: Header,
        cap: Option<cairn_proto::cap::Capability>,
        payload: Payload,
    ) -> (Header, Body) {
        let bytes = |(h, b): (Header, Vec<u8>)| (h, Body::Bytes(b));
        let Some(op) = h.op() else {
            return bytes(error_reply(
                &h,
                Status::BadRequest,
                format!("unknown opcode {}", h.opcode),
            ));
        };
        if !payload.is_empty() && !matches!(op, Opcode::Create | Opcode::Append | Opcode::Fault) {
            return bytes(error_reply(
                &h,
                Status::BadRequest,
                format!("{op:?} carries no payload"),
            ));
        }
        if op == Opcode::Fault {
            return bytes(self.set_faults(&h, &payload));
        }
        if let Some(rep) = self.inject(&h, op).await {
            return bytes(rep);
        }
        if let Some(cap) = &cap
            && let Err(e) = self.check_chunk(&h, op, cap)
        {
            return bytes(error_reply(&h, Status::Unauthorized, e.to_string()));
        }
        if op == Opcode::Read {
            return self.read(h).await;
        }
        let r = self.execute(h, op, &payload).await;
        payload.recycle(&self.recv_pool);
        bytes(r)
    }

    /// A read: the store's verified bytes, with the CRC they were verified against as the
    /// frame's payload CRC (no second pass over them).
    async fn read(&self, h: Header) -> (Header, Body) {
        let bytes = |(h, b): (Header, Vec<u8>)| (h, Body::Bytes(b));
        if h.arg > self.opts.max_read {
            return bytes(error_reply(
                &h,
                Status::TooLarge,
                format!(
                    "read of {} bytes; the limit is {}",
                    h.arg, self.opts.max_read
                ),
            ));
        }
        let id = h.chunk_id;
        let store = match self.disks.find(id) {
            Ok(s) => s,
            Err(e) => return bytes(store_error_reply(&h, &e)),
        };
        let (offset, len) = (h.offset, h.arg as usize);
        match tokio::task::spawn_blocking(move || store.read_buf(id, offset, len)).await {
            Ok(Ok(data)) => {
                let rep = h
                    .reply(Status::Ok)
                    .with_payload_crc(data.len(), data.crc32c());
                (rep, Body::Read(data))
            }
            Ok(Err(e)) => {
                if let StoreError::Corruption { .. } = e {
                    self.found_corrupt(id, &e);
                }
                bytes(store_error_reply(&h, &e))
            }
            Err(_) => bytes(error_reply(&h, Status::Io, "read task failed".into())),
        }
    }

    /// A read met a copy whose bytes fail their CRC: it is marked bad at once (as the
    /// scrubber would), so the next heartbeat tells the masters and they repair it from a good
    /// copy; the client reads another copy meanwhile.
    fn found_corrupt(&self, id: u64, e: &StoreError) {
        if self.corrupt.lock().insert(id) {
            tracing::error!(chunk = id, error = %e, "a read found a bad copy: marked for repair");
            metrics::counter!("cairn_chunkserver_read_corrupt_total").increment(1);
        }
    }

    /// Every other opcode.
    async fn execute(&self, h: Header, op: Opcode, payload: &Payload) -> (Header, Vec<u8>) {
        let id = h.chunk_id;
        let r: Result<(Header, Vec<u8>), StoreError> = match op {
            Opcode::Ping => Ok((h.reply(Status::Ok), Vec::new())),
            Opcode::Create => {
                async {
                    let store = self.disks.place(id)?;
                    // With a first append: one store batch, one flush for both.
                    let created = if payload.is_empty() {
                        store.create_async(id, h.arg).await.map(|()| 0)
                    } else {
                        payload.create_with_append(&store, id, h.arg).await
                    };
                    let mut rep = h.reply(Status::Ok);
                    match created {
                        Ok(len) => rep.offset = len,
                        // Refused before the chunk was made: it is not here.
                        Err(
                            e @ (StoreError::AlreadyExists { .. }
                            | StoreError::TooManyChunks { .. }
                            | StoreError::StoreFailed
                            | StoreError::Closed),
                        ) => {
                            self.disks.unplace(id);
                            return Err(e);
                        }
                        Err(e) => return Err(e),
                    }
                    Ok((rep, Vec::new()))
                }
                .await
            }
            Opcode::Append => {
                async {
                    let store = self.disks.find(id)?;
                    let mut rep = h.reply(Status::Ok);
                    let durable = h.flags & cairn_proto::frame::FLAG_UNSYNCED == 0;
                    rep.offset = payload.append(&store, id, h.offset, durable).await?;
                    Ok((rep, Vec::new()))
                }
                .await
            }
            Opcode::Read | Opcode::Fault => unreachable!("answered above"),
            Opcode::Seal if h.flags & FLAG_SEAL_AT != 0 => {
                // Computing the kept bytes' CRC reads them: off the runtime.
                let store = match self.disks.find(id) {
                    Ok(s) => s,
                    Err(e) => return store_error_reply(&h, &e),
                };
                let at = h.offset;
                match tokio::task::spawn_blocking(move || store.seal_at(id, at)).await {
                    Ok(r) => r.map(|st| stat_reply(&h, &st)),
                    Err(_) => return error_reply(&h, Status::Io, "seal task failed".into()),
                }
            }
            Opcode::Seal => {
                async {
                    let store = self.disks.find(id)?;
                    let st = store.seal_async(id).await?;
                    Ok(stat_reply(&h, &st))
                }
                .await
            }
            Opcode::Stat => self
                .disks
                .find(id)
                .and_then(|s| s.stat(id))
                .map(|st| stat_reply(&h, &st)),
            Opcode::Delete => {
                async {
                    let store = self.disks.find(id)?;
                    store.delete_async(id).await?;
                    self.disks.unplace(id);
                    Ok((h.reply(Status::Ok), Vec::new()))
                }
                .await
            }
        };
        match r {
            Ok(rep) => rep,
            Err(e) => store_error_reply(&h, &e),
        }
    }
}

impl Chunkserver {
    /// Checks a verified capability against the chunk as stored: its version (a create's
    /// is the one it asks for) and the newest writer epoch seen for it.
    fn check_chunk(
        &self,
        h: &Header,
        op: Opcode,
        cap: &cairn_proto::cap::Capability,
    ) -> Result<(), cairn_proto::cap::CapError> {
        let version = if op == Opcode::Create {
            h.arg
        } else {
            match self.disks.find(h.chunk_id).and_then(|s| s.stat(h.chunk_id)) {
                Ok(st) => st.version,
                // No such chunk: the request fails as it would have (NOT_FOUND).
                Err(_) => return Ok(()),
            }
        };
        self.caps.check_chunk(cap, version)
    }

    /// A FAULT request: replaces the injected faults (refused unless enabled).
    fn set_faults(&self, h: &Header, payload: &[u8]) -> (Header, Vec<u8>) {
        if !self.opts.fault_injection {
            return error_reply(
                h,
                Status::BadRequest,
                "fault injection is off on this chunkserver (start it with --fault-injection)"
                    .into(),
            );
        }
        match FaultSpec::decode(payload) {
            Ok(spec) => {
                tracing::warn!(?spec, "injected faults changed");
                self.faults.send_replace(spec);
                (h.reply(Status::Ok), Vec::new())
            }
            Err(e) => error_reply(h, Status::BadRequest, e.to_string()),
        }
    }

    /// Applies the injected faults to one request: holds it while stalled, delays it, or
    /// answers it with an injected error.
    async fn inject(&self, h: &Header, op: Opcode) -> Option<(Header, Vec<u8>)> {
        if !self.opts.fault_injection {
            return None;
        }
        let mut rx = self.faults.subscribe();
        let spec = loop {
            let spec = *rx.borrow_and_update();
            if spec.disk_only && matches!(op, Opcode::Stat | Opcode::Ping) {
                return None;
            }
            if !spec.stall {
                break spec;
            }
            metrics::counter!("cairn_chunkserver_faults_injected_total", "fault" => "stall")
                .increment(1);
            if rx.changed().await.is_err() {
                return None;
            }
        };
        let wait = u64::from(spec.delay_ms)
            + if spec.jitter_ms > 0 {
                rand::random_range(0..=u64::from(spec.jitter_ms))
            } else {
                0
            };
        if wait > 0 {
            metrics::counter!("cairn_chunkserver_faults_injected_total", "fault" => "delay")
                .increment(1);
            tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        }
        if spec.error_ppm > 0 && rand::random_range(0..1_000_000) < spec.error_ppm {
            metrics::counter!("cairn_chunkserver_faults_injected_total", "fault" => "error")
                .increment(1);
            return Some(error_reply(h, Status::Io, "injected fault".into()));
        }
        if spec.disk_full && matches!(op, Opcode::Create | Opcode::Append) {
            metrics::counter!("cairn_chunkserver_faults_injected_total", "fault" => "disk_full")
                .increment(1);
            return Some(error_reply(
                h,
                Status::NoSpace,
                "injected fault: disk full".into(),
            ));
        }
        None
    }
}

/// A stat or seal reply: length and version in the header; a sealed chunk's CRC32C as a
/// 4-byte payload.
fn stat_reply(h: &Header, st: &cairn_chunkstore::ChunkStat) -> (Header, Vec<u8>) {
    let payload = if st.sealed {
        st.crc32c.to_le_bytes().to_vec()
    } else {
        Vec::new()
    };
    let mut rep = h.reply(Status::Ok).with_payload(&payload);
    rep.offset = st.length;
    rep.arg = st.version;
    if st.sealed {
        rep.flags |= FLAG_SEALED;
    }
    (rep, payload)
}

/// One served request, in the process's metrics (docs/operations.md).
fn record(h: &Header, reply: &Header, took: std::time::Duration, bytes_in: u64, bytes_out: u64) {
    let op = h.op().map_or("unknown", Opcode::name);
    let status = reply.status().map_or("unknown", Status::name);
    metrics::histogram!("cairn_chunkserver_request_seconds", "op" => op).record(took.as_secs_f64());
    metrics::counter!("cairn_chunkserver_requests_total", "op" => op, "status" => status)
        .increment(1);
    metrics::counter!("cairn_chunkserver_bytes_total", "dir" => "in").increment(bytes_in);
    metrics::counter!("cairn_chunkserver_bytes_total", "dir" => "out").increment(bytes_out);
}

fn error_reply(h: &Header, status: Status, msg: String) -> (Header, Vec<u8>) {
    let payload = msg.into_bytes();
    (h.reply(status).with_payload(&payload), payload)
}

/// The status (and the fields it documents) for a chunk store error.
fn store_error_reply(h: &Header, e: &StoreError) -> (Header, Vec<u8>) {
    let (status, offset) = match e {
        StoreError::NotFound { .. } => (Status::NotFound, 0),
        StoreError::AlreadyExists { .. } => (Status::AlreadyExists, 0),
        StoreError::Sealed { length, .. } => (Status::Sealed, *length),
        StoreError::OffsetMismatch { length, .. } => (Status::WrongOffset, *length),
        StoreError::ChunkFull { length, .. } => (Status::TooLarge, *length),
        StoreError::BadAppendSize { .. } => (Status::TooLarge, 0),
        StoreError::OutOfRange { length, .. } => (Status::OutOfRange, *length),
        StoreError::Corruption { offset, .. } => (Status::Corrupt, *offset),
        StoreError::NoSpace | StoreError::TooManyChunks { .. } => (Status::NoSpace, 0),
        StoreError::ChunkFailed { .. } => (Status::ChunkFailed, 0),
        StoreError::StoreFailed => (Status::StoreFailed, 0),
        StoreError::Closed => (Status::ShuttingDown, 0),
        _ => (Status::Io, 0),
    };
    let payload = e.to_string().into_bytes();
    let mut rep = h.reply(status).with_payload(&payload);
    rep.offset = offset;
    (rep, payload)
}

/// Why a connection was closed.
#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0} did not arrive within {1:?}")]
    Timeout(&'static str, std::time::Duration),
}
