//! `cairn nbd`: volumes served over the NBD protocol (fixed newstyle), so that qemu, fio and
//! the nbd tools use them unmodified (docs/block.md, "NBD").
//!
//! Every connection to an export shares the server's one open [`Volume`]: a FLUSH on any
//! connection journals the index changes of every connection's completed writes, which is
//! what NBD_FLAG_CAN_MULTI_CONN promises. Requests are served concurrently and answered as
//! they finish (out of order); a connection holds at most `max_in_flight` of them.

// NBD is big-endian on the wire (Cairn's own formats are little-endian).
#![allow(clippy::big_endian_bytes)]

mod access;
mod handshake;
use access::Who;
pub use handshake::starttls_handshake;
use handshake::{HANDSHAKE_TIMEOUT, Haggle, Outcome, greet};
pub mod proto;

use crate::volume::{Error as VolError, Volume, VolumeOptions};
use bytes::Bytes;
use cairn_client::Client;
use proto::*;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};

/// How the server serves.
#[derive(Clone)]
pub struct NbdOptions {
    /// The largest READ or WRITE (and the maximum block size announced).
    pub max_request: u32,
    /// Requests of one connection being served at once.
    pub max_in_flight: usize,
    pub volume: VolumeOptions,
    /// TLS required of every client (NBD_OPT_STARTTLS, TLS 1.3, a client certificate from
    /// the cluster CA: `cairn_rpc::tls::data::client_auth_acceptor`); the certificate's user
    /// opens what the volumes' owners and modes let them. `None`: plain NBD, and every client
    /// opens every volume (`cairn nbd --nbd-insecure`).
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Connects, refusals, opens and closes are recorded here (docs/security.md "Audit").
    pub audit: cairn_rpc::audit::Audit,
    /// Connection slots (docs/security.md "Resource limits"): a connection is proven by a
    /// user's certificate (TLS) or, on plain NBD, by opening a volume; until then it holds
    /// an unproven slot for at most `proof_timeout` (its greeting, TLS handshake and the
    /// masters' answer about the certificate included).
    pub connections: cairn_rpc::admission::Limits,
}

/// The NBD server's connection limits by default: proof within 3 s (a TLS handshake and a
/// round trip to the masters); strangers send little before they prove themselves.
pub fn default_connection_limits() -> cairn_rpc::admission::Limits {
    cairn_rpc::admission::Limits {
        max_unproven: 256,
        max_unproven_per_peer: 16,
        proof_timeout: std::time::Duration::from_secs(3),
        ..Default::default()
    }
}

const CONNECTION_METRICS: cairn_rpc::admission::Names = cairn_rpc::admission::Names {
    open: "cairn_nbd_connections",
    unproven: "cairn_nbd_connections_unproven",
    refused: "cairn_nbd_connections_refused_total",
};

impl std::fmt::Debug for NbdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdOptions")
            .field("max_request", &self.max_request)
            .field("max_in_flight", &self.max_in_flight)
            .field("volume", &self.volume)
            .field("tls", &self.tls.is_some())
            .field("audit", &self.audit)
            .field("connections", &self.connections)
            .finish()
    }
}

impl Default for NbdOptions {
    fn default() -> Self {
        Self {
            max_request: 32 << 20,
            max_in_flight: 64,
            volume: VolumeOptions::default(),
            tls: None,
            audit: cairn_rpc::audit::Audit::off(),
            connections: default_connection_limits(),
        }
    }
}

/// An NBD server of one cluster's volumes.
pub struct NbdServer {
    client: Client,
    opts: NbdOptions,
    /// Volumes open here, with the connections using each.
    open: tokio::sync::Mutex<HashMap<String, (Arc<Volume>, usize)>>,
    /// Whose client certificates are (by fingerprint), and since when this server knows.
    certs: parking_lot::Mutex<HashMap<String, (Who, std::time::Instant)>>,
    conns: Arc<cairn_rpc::admission::Admission>,
}

/// What the handshake settled.
struct Session {
    volume: Arc<Volume>,
    structured: bool,
    /// The user may read the volume, not write it: writes, trims and zeroings are refused.
    read_only: bool,
    /// Who opened it (for the log).
    user: String,
    /// The SHA-256 of the client certificate that proved the user (TLS sessions): its
    /// revocation, the user's deletion or a change of the volume's owner or mode that takes
    /// the user's rights away cuts the session (see [`NbdServer::revoked`]).
    fingerprint: Option<String>,
}

impl NbdServer {
    pub fn new(client: Client, opts: NbdOptions) -> Arc<Self> {
        Arc::new(Self {
            client,
            open: tokio::sync::Mutex::new(HashMap::new()),
            certs: parking_lot::Mutex::new(HashMap::new()),
            conns: cairn_rpc::admission::Admission::new(
                opts.connections.clone(),
                CONNECTION_METRICS,
            ),
            opts,
        })
    }

    /// Tells the masters this server serves `uri` (`nbd://HOST:PORT`), now and every
    /// [`cairn_rpc::object::GATEWAY_HEARTBEAT_MS`]: `cairn status` lists it under `nbd`
    /// (the masters keep S3 gateways and NBD servers in one table, by endpoint).
    pub async fn announce(self: Arc<Self>, uri: String) {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        let now = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64)
        };
        let started_ms = now();
        loop {
            let gateway = cairn_rpc::object::Gateway {
                endpoint: uri.clone(),
                host: host.clone(),
                pid: std::process::id(),
                started_ms,
                seen_ms: now(),
            };
            let op = cairn_rpc::object::ObjectOp::GatewaySeen { gateway };
            match self.client.masters().object_op(&op).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "could not tell the masters about this server")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not tell the masters about this server")
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(
                cairn_rpc::object::GATEWAY_HEARTBEAT_MS,
            ))
            .await;
        }
    }

    /// Serves connections until `shutdown` resolves, then closes every open volume (their
    /// last changes journaled, their leases given back).
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                r = listener.accept() => match r {
                    Ok((stream, peer)) => {
                        let Some(slot) = self.conns.admit(peer, false) else {
                            continue;
                        };
                        let this = self.clone();
                        tokio::spawn(async move { this.connection(stream, peer, slot).await });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                },
            }
        }
        let open: Vec<_> = self.open.lock().await.drain().collect();
        for (name, (v, _)) in open {
            if let Err(e) = v.close().await {
                tracing::warn!(volume = %name, error = %e, "closing");
            }
        }
    }

    async fn connection(
        self: Arc<Self>,
        mut stream: TcpStream,
        peer: SocketAddr,
        slot: cairn_rpc::admission::Slot,
    ) {
        let _ = stream.set_nodelay(true);
        let mut h = Haggle {
            no_zeroes: false,
            structured: false,
            tls: false,
            who: if self.opts.tls.is_some() {
                Who::Unproven
            } else {
                Who::Anyone
            },
            peer,
            fingerprint: None,
        };
        let started = async {
            greet(&mut stream, &mut h).await?;
            self.haggle(&mut stream, &mut h).await
        };
        // Until it proves itself, a connection has its slot's time; then the handshake's.
        let outcome = match tokio::time::timeout(slot.time_left(), started).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => {
                tracing::info!(%peer, error = %e, "handshake ended");
                return;
            }
            Err(_) => {
                self.unproven_cut(peer);
                return;
            }
        };
        match outcome {
            Outcome::Closed => {}
            Outcome::Session(session) => {
                // Plain NBD: opening a volume is the proof.
                if !slot.prove() {
                    return;
                }
                let (rd, wr) = stream.into_split();
                self.serve_session(session, rd, wr, peer).await;
            }
            Outcome::StartTls => {
                let Some(acceptor) = self.opts.tls.clone() else {
                    return;
                };
                let handshake = async {
                    let tls = acceptor.accept(stream).await?;
                    h.tls = true;
                    h.fingerprint = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|c| cairn_rpc::object::cert_fingerprint(c));
                    h.who = self.identify(&tls).await;
                    Ok::<_, std::io::Error>(tls)
                };
                let mut tls = match tokio::time::timeout(slot.time_left(), handshake).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        metrics::counter!("cairn_nbd_refused_total", "why" => "tls").increment(1);
                        if self.conns.may_log() {
                            tracing::info!(%peer, error = %e, "TLS handshake failed");
                        }
                        self.record(peer, "connect", None, None, Err(&e.to_string()));
                        return;
                    }
                    Err(_) => {
                        self.unproven_cut(peer);
                        return;
                    }
                };
                if let Who::Refused(why) = &h.who {
                    tracing::warn!(%peer, why = %why, "client certificate refused");
                    metrics::counter!("cairn_nbd_refused_total", "why" => "certificate")
                        .increment(1);
                    self.record(peer, "connect", None, None, Err(why));
                } else {
                    self.record(peer, "connect", Some(&h.who), None, Ok(""));
                    // A user's certificate is the proof.
                    if !slot.prove() {
                        return;
                    }
                }
                // A refused certificate is still answered (ERR_POLICY to its options), within
                // its unproven time.
                let limit = if slot.is_proven() {
                    HANDSHAKE_TIMEOUT
                } else {
                    slot.time_left()
                };
                match tokio::time::timeout(limit, self.haggle(&mut tls, &mut h)).await {
                    Ok(Ok(Outcome::Session(session))) => {
                        let (rd, wr) = tokio::io::split(tls);
                        self.serve_session(session, rd, wr, peer).await;
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::info!(%peer, error = %e, "options ended"),
                    Err(_) => tracing::info!(%peer, "option haggling took too long: closed"),
                }
            }
        }
    }

    /// A connection that did not prove itself in time is closed (counted, logged within the
    /// log budget).
    fn unproven_cut(&self, peer: SocketAddr) {
        metrics::counter!("cairn_nbd_connections_refused_total", "limit" => "deadline")
            .increment(1);
        if self.conns.may_log() {
            tracing::info!(%peer, "no proof in time: closed");
        }
    }

    /// Serves an opened volume's requests on one connection until it ends.
    async fn serve_session(
        &self,
        session: Session,
        rd: impl AsyncRead + Unpin,
        wr: impl AsyncWrite + Unpin + Send + 'static,
        peer: SocketAddr,
    ) {
        let rd = BufReader::with_capacity(256 << 10, rd);
        let wr = BufWriter::with_capacity(256 << 10, wr);
        let name = session.volume.meta().name.clone();
        tracing::info!(
            %peer,
            volume = %name,
            user = %session.user,
            read_only = session.read_only,
            structured = session.structured,
            "serving"
        );
        let r = self.transmission(&session, rd, wr).await;
        if let Err(e) = &r {
            tracing::info!(%peer, volume = %name, error = %e, "connection ended");
        }
        self.opts.audit.record(serde_json::json!({
            "service": "nbd",
            "event": "close",
            "addr": peer.to_string(),
            "user": session.user,
            "volume": name,
            "result": if r.is_ok() { "ok" } else { "error" },
            "error": r.err().map(|e| e.to_string()),
        }));
        self.release(&name).await;
    }

    /// The volume open here, opening it if no connection has.
    async fn acquire(&self, name: &str) -> Result<Arc<Volume>, (u32, String)> {
        let mut open = self.open.lock().await;
        if let Some((v, n)) = open.get_mut(name) {
            *n += 1;
            return Ok(v.clone());
        }
        let meta = self.lookup(name).await?;
        let v = Volume::open(self.client.clone(), meta, self.opts.volume.clone())
            .await
            .map_err(|e| (REP_ERR_POLICY, e.to_string()))?;
        let r = &v.opened;
        tracing::info!(
            volume = %name,
            runs = r.checkpoint_runs,
            journal_records = r.journal_records,
            journal_bytes = r.journal_bytes,
            tail_segments = r.tail_segments,
            tail_batches = r.tail_batches,
            tail_bytes = r.tail_bytes,
            ms = r.millis,
            "volume opened"
        );
        open.insert(name.into(), (v.clone(), 1));
        Ok(v)
    }

    async fn release(&self, name: &str) {
        let mut open = self.open.lock().await;
        let last = match open.get_mut(name) {
            Some((_, n)) => {
                *n -= 1;
                *n == 0
            }
            None => false,
        };
        // Closed with the table locked: a connection arriving meanwhile must not open the
        // volume again while this instance still journals and seals its files (it read a
        // journal the closing instance then sealed, and its open failed).
        if last && let Some((v, _)) = open.remove(name) {
            if let Err(e) = v.close().await {
                tracing::warn!(volume = %name, error = %e, "closing");
            }
            drop(open);
        }
    }

    async fn transmission(
        &self,
        s: &Session,
        mut rd: impl AsyncRead + Unpin,
        wr: impl AsyncWrite + Unpin + Send + 'static,
    ) -> std::io::Result<()> {
        // Each reply is its header and its data (empty for most), sent together.
        let (tx, mut rx) = mpsc::unbounded_channel::<(Bytes, Bytes)>();
        let writer = tokio::spawn(async move {
            let mut wr = wr;
            while let Some(first) = rx.recv().await {
                let mut next = Some(first);
                // Every reply waiting goes out before one flush; large data passes the
                // buffer by (written from the volume's buffer).
                while let Some((head, data)) = next {
                    wr.write_all(&head).await?;
                    wr.write_all(&data).await?;
                    next = rx.try_recv().ok();
                }
                wr.flush().await?;
            }
            Ok::<_, std::io::Error>(())
        });
        let slots = Arc::new(Semaphore::new(self.opts.max_in_flight));
        let reply = Replier {
            tx,
            structured: s.structured,
        };
        let revoked = self.revoked(s);
        tokio::pin!(revoked);
        let r = loop {
            let mut h = [0u8; REQUEST_BYTES];
            // A header half read when rights are lost is dropped with the connection.
            let read = tokio::select! {
                why = &mut revoked => {
                    metrics::counter!("cairn_nbd_refused_total", "why" => "revoked").increment(1);
                    tracing::warn!(volume = %s.volume.meta().name, user = %s.user, %why, "session cut");
                    break Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, why));
                }
                r = rd.read_exact(&mut h) => r,
            };
            match read {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break Ok(()),
                Err(e) => break Err(e),
            }
            let req = match Request::decode(&h) {
                Ok(r) => r,
                Err(e) => break Err(invalid(&e.to_string())),
            };
            let slot = slots.clone().acquire_owned().await.expect("never closed");
            let v = s.volume.clone();
            let size = v.size();
            let end = req.offset.checked_add(u64::from(req.length));
            let past_end = end.is_none_or(|e| e > size);
            let too_big = req.length > self.opts.max_request;
            let fua = req.flags & CMD_FLAG_FUA != 0;
            let writes = matches!(req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
            if writes && s.read_only {
                if req.kind == CMD_WRITE {
                    let mut skip = (&mut rd).take(u64::from(req.length));
                    tokio::io::copy(&mut skip, &mut tokio::io::sink()).await?;
                }
                reply.error(&req, EPERM, "the volume is open read-only for this user");
                continue;
            }
            match req.kind {
                CMD_WRITE => {
                    if too_big {
                        let mut skip = (&mut rd).take(u64::from(req.length));
                        tokio::io::copy(&mut skip, &mut tokio::io::sink()).await?;
                        reply.error(&req, EINVAL, "write longer than the maximum");
                        continue;
                    }
                    // Read into spare capacity (not zeroed first).
                    let mut data = Vec::with_capacity(req.length as usize);
                    let got = (&mut rd)
                        .take(u64::from(req.length))
                        .read_to_end(&mut data)
                        .await?;
                    if got < req.length as usize {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    if past_end {
                        reply.error(&req, ENOSPC, "write past the end of the volume");
                        continue;
                    }
                    let reply = reply.clone();
                    tokio::spawn(async move {
                        let r = v.write(req.offset, Bytes::from(data), fua).await;
                        reply.done(&req, r);
                        drop(slot);
                    });
                }
                CMD_READ => {
                    if too_big || past_end {
                        reply.error(&req, EINVAL, "read past the end or too long");
                        continue;
                    }
                    let reply = reply.clone();
                    tokio::spawn(async move {
                        match v.read(req.offset, u64::from(req.length)).await {
                            Ok(data) => reply.data(&req, data),
                            Err(e) => reply.done(&req, Err(e)),
                        }
                        drop(slot);
                    });
                }
                CMD_FLUSH => {
                    let reply = reply.clone();
                    tokio::spawn(async move {
                        reply.done(&req, v.flush().await);
                        drop(slot);
                    });
                }
                CMD_TRIM | CMD_WRITE_ZEROES => {
                    if past_end {
                        reply.error(&req, ENOSPC, "past the end of the volume");
                        continue;
                    }
                    let reply = reply.clone();
                    tokio::spawn(async move {
                        let r = v.trim(req.offset, u64::from(req.length), fua).await;
                        reply.done(&req, r);
                        drop(slot);
                    });
                }
                CMD_DISC => {
                    drop(slot);
                    // Requests in flight finish first.
                    let _ = slots
                        .acquire_many(self.opts.max_in_flight as u32)
                        .await
                        .expect("never closed");
                    break Ok(());
                }
                _ => reply.error(&req, EINVAL, "unknown command"),
            }
        };
        // Every reply is sent before the connection goes (requests in flight finish).
        let _ = slots
            .acquire_many(self.opts.max_in_flight as u32)
            .await
            .expect("never closed");
        drop(reply);
        let _ = writer.await;
        r
    }
}

fn invalid(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_owned())
}

/// The errno a volume error is answered with.
fn errno(e: &VolError) -> u32 {
    match e {
        VolError::Invalid(_) => EINVAL,
        VolError::Closed(_) => ESHUTDOWN,
        VolError::Fenced(..) => EPERM,
        VolError::Busy(_) | VolError::Io(..) | VolError::Corrupt(..) => EIO,
    }
}

/// Sends a connection's replies, simple or structured as negotiated.
#[derive(Clone)]
struct Replier {
    tx: mpsc::UnboundedSender<(Bytes, Bytes)>,
    structured: bool,
}

impl Replier {
    fn done(&self, req: &Request, r: Result<(), VolError>) {
        match r {
            Ok(()) if self.structured => {
                let h = structured_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, req.cookie, 0);
                self.send(h.to_vec(), Bytes::new());
            }
            Ok(()) => {
                self.send(simple_reply(0, req.cookie).to_vec(), Bytes::new());
            }
            Err(e) => {
                tracing::warn!(kind = req.kind, offset = req.offset, len = req.length, error = %e, "request failed");
                self.error(req, errno(&e), &e.to_string());
            }
        }
    }

    fn error(&self, req: &Request, code: u32, why: &str) {
        metrics::counter!("cairn_nbd_errors_total", "errno" => code.to_string()).increment(1);
        if self.structured {
            let msg = &why.as_bytes()[..why.len().min(1024)];
            let mut b = structured_header(
                REPLY_FLAG_DONE,
                REPLY_TYPE_ERROR,
                req.cookie,
                6 + msg.len() as u32,
            )
            .to_vec();
            b.extend_from_slice(&code.to_be_bytes());
            b.extend_from_slice(&(msg.len() as u16).to_be_bytes());
            b.extend_from_slice(msg);
            self.send(b, Bytes::new());
        } else {
            self.send(simple_reply(code, req.cookie).to_vec(), Bytes::new());
        }
    }

    fn send(&self, head: Vec<u8>, data: Bytes) {
        let _ = self.tx.send((Bytes::from(head), data));
    }

    fn data(&self, req: &Request, data: Bytes) {
        let mut b;
        if self.structured {
            b = Vec::with_capacity(28);
            b.extend_from_slice(&structured_header(
                REPLY_FLAG_DONE,
                REPLY_TYPE_OFFSET_DATA,
                req.cookie,
                8 + data.len() as u32,
            ));
            b.extend_from_slice(&req.offset.to_be_bytes());
        } else {
            b = simple_reply(0, req.cookie).to_vec();
        }
        self.send(b, data);
    }
}
