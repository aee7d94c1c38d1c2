//! The data-plane connection to one chunkserver (docs/formats/wire.md).

use crate::caps::Caps;
use bytes::Bytes;
use cairn_proto::cap::CAP_BYTES;
pub use cairn_proto::fault::FaultSpec;
pub use cairn_proto::frame::Status;
use cairn_proto::frame::{
    FLAG_SEAL_AT, FLAG_SEALED, FrameError, HEADER_BYTES, Header, MAX_PAYLOAD, Opcode,
};
use cairn_rpc::tls::data::TlsConnector;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// What went wrong.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    #[error("connecting to {addr}: {message}")]
    Connect { addr: SocketAddr, message: String },
    #[error("connection to {addr} lost: {message}")]
    ConnectionLost { addr: SocketAddr, message: String },
    #[error("no reply from {addr} within {after:?}")]
    Timeout {
        addr: SocketAddr,
        after: std::time::Duration,
    },
    #[error("bad frame from {addr}: {source}")]
    Frame {
        addr: SocketAddr,
        source: FrameError,
    },
    #[error("{status:?} from the chunkserver: {message}")]
    Status {
        status: Status,
        /// The chunk length for WRONG_OFFSET / SEALED / OUT_OF_RANGE, the failing offset for
        /// CORRUPT, else 0.
        offset: u64,
        message: String,
    },
    #[error("payload of {0} bytes is larger than a frame carries")]
    TooLarge(usize),
}

impl Error {
    /// The server's status, if this is a status error.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The server may answer if asked again (it was unreachable or slow), as opposed to an
    /// answer that asking again would repeat.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Connect { .. } | Error::ConnectionLost { .. } | Error::Timeout { .. }
        ) || matches!(self.status(), Some(Status::ShuttingDown | Status::NotReady))
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// A chunk's state as a chunkserver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkInfo {
    pub length: u64,
    pub version: u64,
    pub sealed: bool,
    /// CRC32C of the whole chunk when sealed, else 0.
    pub crc32c: u32,
}

type Pending = Arc<Mutex<PendingState>>;

/// A reply: its header and payload.
type Frame = (Header, Vec<u8>);

/// Counters of one connection.
#[derive(Debug, Default)]
pub struct ConnStats {
    pub requests: AtomicU64,
    /// Replies that arrived after the reply to a later request.
    pub out_of_order_replies: AtomicU64,
    /// Replies to requests whose caller had given up (timed out or cancelled).
    pub abandoned_replies: AtomicU64,
}

struct PendingState {
    waiting: HashMap<u64, oneshot::Sender<Result<Frame>>>,
    /// The highest request id sent so far.
    issued: u64,
    /// Set when the connection is gone: new requests fail at once.
    dead: Option<String>,
}

/// A multiplexed data-plane connection to one chunkserver.
pub struct DataConn {
    addr: SocketAddr,
    stats: Arc<ConnStats>,
    tx: mpsc::Sender<(Header, Option<[u8; CAP_BYTES]>, Bytes)>,
    /// Where the capability of each request's chunk comes from (none: requests carry none).
    caps: Option<Arc<Caps>>,
    pending: Pending,
    next_id: AtomicU64,
    /// A request without a reply after this long fails with [`Error::Timeout`].
    timeout: std::time::Duration,
}

/// The buffer between a TLS session and its socket (see `connect_with`).
pub const TLS_READ_BUFFER: usize = 128 << 10;

/// Requests queued for the socket before senders wait.
const SEND_QUEUE: usize = 256;

impl DataConn {
    /// Connects to a chunkserver; requests time out after `timeout` (the connect too).
    pub async fn connect(addr: SocketAddr, timeout: std::time::Duration) -> Result<Self> {
        Self::connect_with(addr, timeout, None, None).await
    }

    /// [`DataConn::connect`] whose requests on a chunk carry its capability from `caps`
    /// (docs/security.md), over TLS when `tls` is given (the server's certificate is checked
    /// against the address dialled).
    pub async fn connect_with(
        addr: SocketAddr,
        timeout: std::time::Duration,
        caps: Option<Arc<Caps>>,
        tls: Option<&TlsConnector>,
    ) -> Result<Self> {
        let timed_out = |_| Error::Timeout {
            addr,
            after: timeout,
        };
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(timed_out)?
            .map_err(|e| Error::Connect {
                addr,
                message: e.to_string(),
            })?;
        let _ = stream.set_nodelay(true);
        let Some(tls) = tls else {
            let (rd, wr) = stream.into_split();
            return Ok(Self::start(rd, wr, addr, timeout, caps));
        };
        let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
        // rustls reads the socket 4 KiB at a time: a buffer under it turns the five reads of
        // each 16 KiB record into a fraction of one system call.
        let stream = tokio::io::BufReader::with_capacity(TLS_READ_BUFFER, stream);
        let stream = tokio::time::timeout(timeout, tls.0.connect(name, stream))
            .await
            .map_err(timed_out)?
            .map_err(|e| Error::Connect {
                addr,
                message: format!("TLS: {e}"),
            })?;
        let (rd, wr) = tokio::io::split(stream);
        Ok(Self::start(rd, wr, addr, timeout, caps))
    }

    /// Runs the connection's writer and reader tasks on `rd` and `wr`.
    fn start(
        rd: impl AsyncRead + Unpin + Send + 'static,
        wr: impl AsyncWrite + Unpin + Send + 'static,
        addr: SocketAddr,
        timeout: std::time::Duration,
        caps: Option<Arc<Caps>>,
    ) -> Self {
        // Replies are read through a buffer: one read takes every reply that has arrived.
        let mut rd = tokio::io::BufReader::with_capacity(64 << 10, rd);
        let (tx, mut rx) = mpsc::channel::<(Header, Option<[u8; CAP_BYTES]>, Bytes)>(SEND_QUEUE);
        let pending: Pending = Arc::new(Mutex::new(PendingState {
            waiting: HashMap::new(),
            issued: 0,
            dead: None,
        }));
        let p = pending.clone();
        tokio::spawn(async move {
            let mut wr = BufWriter::with_capacity(256 << 10, wr);
            let r: std::io::Result<()> = async {
                while let Some(first) = rx.recv().await {
                    let mut next = Some(first);
                    while let Some((h, cap, payload)) = next {
                        wr.write_all(&h.encode()).await?;
                        if let Some(cap) = &cap {
                            wr.write_all(cap).await?;
                        }
                        wr.write_all(&payload).await?;
                        next = rx.try_recv().ok();
                    }
                    wr.flush().await?;
                }
                Ok(())
            }
            .await;
            if let Err(e) = r {
                fail_all(&p, addr, format!("write: {e}"));
            }
        });
        let p = pending.clone();
        let stats = Arc::new(ConnStats::default());
        let st = stats.clone();
        tokio::spawn(async move {
            let mut newest = 0u64;
            let why = loop {
                let mut hb = [0u8; HEADER_BYTES];
                if let Err(e) = rd.read_exact(&mut hb).await {
                    break format!("read: {e}");
                }
                let h = match Header::decode(&hb) {
                    Ok(h) => h,
                    Err(e) => break format!("bad frame: {e}"),
                };
                let mut payload = vec![0u8; h.length as usize];
                if let Err(e) = rd.read_exact(&mut payload).await {
                    break format!("read: {e}");
                }
                let r = match h.check_payload(&payload) {
                    Ok(()) => Ok((h, payload)),
                    Err(source) => Err(Error::Frame { addr, source }),
                };
                if h.request_id < newest {
                    st.out_of_order_replies.fetch_add(1, Ordering::Relaxed);
                }
                newest = newest.max(h.request_id);
                let w = {
                    let mut ps = p.lock();
                    match ps.waiting.remove(&h.request_id) {
                        Some(w) => w,
                        // A request its caller gave up on (timed out, or a backup read that
                        // lost): the late reply is dropped.
                        None if h.request_id <= ps.issued => {
                            st.abandoned_replies.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        None => break format!("a reply to unknown request {}", h.request_id),
                    }
                };
                let bad = r.is_err();
                let _ = w.send(r);
                if bad {
                    break "bad payload CRC".into();
                }
            };
            fail_all(&p, addr, why);
        });
        Self {
            addr,
            stats,
            tx,
            caps,
            pending,
            next_id: AtomicU64::new(1),
            timeout,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stats(&self) -> &ConnStats {
        &self.stats
    }

    /// The connection is gone (the server closed it — an idle one after its idle timeout — or
    /// it failed): every call on it would fail at once.
    pub fn is_closed(&self) -> bool {
        self.pending.lock().dead.is_some()
    }

    async fn call(&self, h: Header, payload: Bytes) -> Result<(Header, Vec<u8>)> {
        self.call_crc(h, payload, None).await
    }

    /// `crc`: the payload's CRC32C when the caller has it already.
    async fn call_crc(
        &self,
        mut h: Header,
        payload: Bytes,
        crc: Option<u32>,
    ) -> Result<(Header, Vec<u8>)> {
        if payload.len() > MAX_PAYLOAD as usize {
            return Err(Error::TooLarge(payload.len()));
        }
        h = match crc {
            Some(crc) => h.with_payload_crc(payload.len(), crc),
            None => h.with_payload(&payload),
        };
        h.request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let cap = match (&self.caps, h.op().and_then(cairn_proto::cap::needed)) {
            (Some(caps), Some(rights)) => caps.get(h.chunk_id, rights),
            _ => None,
        };
        if cap.is_some() {
            h.cap_len = CAP_BYTES as u16;
        }
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = oneshot::channel();
        {
            let mut p = self.pending.lock();
            if let Some(why) = &p.dead {
                return Err(Error::ConnectionLost {
                    addr: self.addr,
                    message: why.clone(),
                });
            }
            p.waiting.insert(h.request_id, reply);
            p.issued = p.issued.max(h.request_id);
        }
        let lost = |message: String| Error::ConnectionLost {
            addr: self.addr,
            message,
        };
        // However this call ends — error, timeout, or its caller dropping it (a backup read
        // that lost) — its waiter leaves the table.
        let _forget = Forget {
            pending: &self.pending,
            id: h.request_id,
        };
        // The timeout covers the wait for room in the send queue too: a writer stuck on a
        // peer that stopped reading (a stopped process, a full socket) holds the queue, and a
        // call must not wait on it without bound.
        let sent_and_answered = async {
            if self.tx.send((h, cap, payload)).await.is_err() {
                return Err(lost("writer gone".into()));
            }
            rx.await.map_err(|_| lost("reply dropped".into()))?
        };
        let (rh, rp) = match tokio::time::timeout(self.timeout, sent_and_answered).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(Error::Timeout {
                    addr: self.addr,
                    after: self.timeout,
                });
            }
        };
        // A refused reader's capability (expired, its key rotated out) is forgotten, so that
        // the caller's next lookup of the chunk brings a fresh one; a writer's is refreshed by
        // its writer's next commit (crate::caps).
        if rh.status() == Some(Status::Unauthorized)
            && let (Some(caps), Some(sent)) = (&self.caps, &cap)
        {
            caps.refused(h.chunk_id, sent);
        }
        match rh.status() {
            Some(Status::Ok) => Ok((rh, rp)),
            Some(status) => Err(Error::Status {
                status,
                offset: rh.offset,
                message: String::from_utf8_lossy(&rp).into_owned(),
            }),
            None => Err(Error::Status {
                status: Status::Io,
                offset: rh.offset,
                message: format!("unknown status code {}", rh.status),
            }),
        }
    }

    /// Creates a chunk, appending `first` (may be empty) in the same trip. Returns the
    /// chunk's length.
    pub async fn create(
        &self,
        chunk_id: u64,
        version: u64,
        first: impl Into<Bytes>,
    ) -> Result<u64> {
        self.create_crc(chunk_id, version, first.into(), None).await
    }

    /// Appends at `offset` (the chunk's current length). Returns the new length.
    pub async fn append(&self, chunk_id: u64, offset: u64, data: impl Into<Bytes>) -> Result<u64> {
        self.append_crc(chunk_id, offset, data.into(), None).await
    }

    /// [`DataConn::append`] answered before the bytes are durable (docs/formats/wire.md,
    /// `UNSYNCED`): for background writers whose chunk counts only once sealed (the seal
    /// flushes it).
    pub async fn append_unsynced(
        &self,
        chunk_id: u64,
        offset: u64,
        data: impl Into<Bytes>,
    ) -> Result<u64> {
        let mut h = Header::request(Opcode::Append, 0, chunk_id);
        h.offset = offset;
        h.flags |= cairn_proto::frame::FLAG_UNSYNCED;
        Ok(self.call_crc(h, data.into(), None).await?.0.offset)
    }

    /// [`DataConn::create`] of bytes whose CRC32C ([`cairn_proto::frame::crc32c`]) the caller
    /// computed once for all the replicas it sends them to. A wrong `crc` is a bad frame: the
    /// server closes the connection.
    pub async fn create_with_crc(
        &self,
        chunk_id: u64,
        version: u64,
        first: Bytes,
        crc: u32,
    ) -> Result<u64> {
        self.create_crc(chunk_id, version, first, Some(crc)).await
    }

    /// [`DataConn::append`] of bytes whose CRC32C the caller computed once (as
    /// [`DataConn::create_with_crc`]).
    pub async fn append_with_crc(
        &self,
        chunk_id: u64,
        offset: u64,
        data: Bytes,
        crc: u32,
    ) -> Result<u64> {
        self.append_crc(chunk_id, offset, data, Some(crc)).await
    }

    async fn create_crc(
        &self,
        chunk_id: u64,
        version: u64,
        first: Bytes,
        crc: Option<u32>,
    ) -> Result<u64> {
        let mut h = Header::request(Opcode::Create, 0, chunk_id);
        h.arg = version;
        Ok(self.call_crc(h, first, crc).await?.0.offset)
    }

    async fn append_crc(
        &self,
        chunk_id: u64,
        offset: u64,
        data: Bytes,
        crc: Option<u32>,
    ) -> Result<u64> {
        let mut h = Header::request(Opcode::Append, 0, chunk_id);
        h.offset = offset;
        Ok(self.call_crc(h, data, crc).await?.0.offset)
    }

    /// Reads `len` bytes at `offset`; the payload CRC is checked end to end.
    pub async fn read(&self, chunk_id: u64, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut h = Header::request(Opcode::Read, 0, chunk_id);
        h.offset = offset;
        h.arg = len as u64;
        let (rh, data) = self.call(h, Bytes::new()).await?;
        if data.len() != len {
            return Err(Error::Status {
                status: Status::Io,
                offset: rh.offset,
                message: format!("asked for {len} bytes, got {}", data.len()),
            });
        }
        Ok(data)
    }

    pub async fn seal(&self, chunk_id: u64) -> Result<ChunkInfo> {
        let (h, p) = self
            .call(Header::request(Opcode::Seal, 0, chunk_id), Bytes::new())
            .await?;
        info(self.addr, &h, &p)
    }

    pub async fn stat(&self, chunk_id: u64) -> Result<ChunkInfo> {
        let (h, p) = self
            .call(Header::request(Opcode::Stat, 0, chunk_id), Bytes::new())
            .await?;
        info(self.addr, &h, &p)
    }

    pub async fn delete(&self, chunk_id: u64) -> Result<()> {
        self.call(Header::request(Opcode::Delete, 0, chunk_id), Bytes::new())
            .await?;
        Ok(())
    }

    /// Seals the chunk at `length`, dropping any bytes past it (`OUT_OF_RANGE` when the
    /// replica holds less).
    pub async fn seal_at(&self, chunk_id: u64, length: u64) -> Result<ChunkInfo> {
        let mut h = Header::request(Opcode::Seal, 0, chunk_id);
        h.flags |= FLAG_SEAL_AT;
        h.offset = length;
        let (h, p) = self.call(h, Bytes::new()).await?;
        info(self.addr, &h, &p)
    }

    pub async fn ping(&self) -> Result<()> {
        self.call(Header::request(Opcode::Ping, 0, 0), Bytes::new())
            .await?;
        Ok(())
    }

    /// Replaces the server's injected faults (refused unless it runs with
    /// `--fault-injection`).
    pub async fn fault(&self, spec: &FaultSpec) -> Result<()> {
        let payload = if spec.is_clear() {
            Bytes::new()
        } else {
            Bytes::copy_from_slice(&spec.encode())
        };
        self.call(Header::request(Opcode::Fault, 0, 0), payload)
            .await?;
        Ok(())
    }
}

/// A stat/seal reply: a sealed chunk's CRC is the 4-byte payload.
fn info(addr: SocketAddr, h: &Header, payload: &[u8]) -> Result<ChunkInfo> {
    let sealed = h.flags & FLAG_SEALED != 0;
    let crc32c = match (sealed, payload) {
        (true, &[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]),
        (false, []) => 0,
        _ => {
            return Err(Error::ConnectionLost {
                addr,
                message: format!("stat reply with a {}-byte payload", payload.len()),
            });
        }
    };
    Ok(ChunkInfo {
        length: h.offset,
        version: h.arg,
        sealed,
        crc32c,
    })
}

/// Removes a request's waiter when the call ends (a no-op once the reply took it).
struct Forget<'a> {
    pending: &'a Pending,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.pending.lock().waiting.remove(&self.id);
    }
}

fn fail_all(p: &Pending, addr: SocketAddr, why: String) {
    let mut st = p.lock();
    if st.dead.is_none() {
        tracing::debug!(%addr, %why, "data connection closed");
        st.dead = Some(why.clone());
    }
    for (_, w) in st.waiting.drain() {
        let _ = w.send(Err(Error::ConnectionLost {
            addr,
            message: why.clone(),
        }));
    }
}
