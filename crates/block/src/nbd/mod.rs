//! `cairn nbd`: volumes served over the NBD protocol (fixed newstyle), so that qemu, fio and
//! the nbd tools use them unmodified (docs/block.md, "NBD").
//!
//! Every connection to an export shares the server's one open [`Volume`]: a FLUSH on any
//! connection journals the index changes of every connection's completed writes, which is
//! what NBD_FLAG_CAN_MULTI_CONN promises. Requests are served concurrently and answered as
//! they finish (out of order); a connection holds at most `max_in_flight` of them.

// NBD is big-endian on the wire (Cairn's own formats are little-endian).
#![allow(clippy::big_endian_bytes)]

pub mod proto;

use crate::volume::{Error as VolError, Volume, VolumeOptions};
use bytes::Bytes;
use cairn_client::Client;
use cairn_rpc::object::{ObjectError, ObjectQuery, QueryReply, Volume as VolumeMeta};
use proto::*;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};

/// How the server serves.
#[derive(Debug, Clone)]
pub struct NbdOptions {
    /// The largest READ or WRITE (and the maximum block size announced).
    pub max_request: u32,
    /// Requests of one connection being served at once.
    pub max_in_flight: usize,
    pub volume: VolumeOptions,
}

impl Default for NbdOptions {
    fn default() -> Self {
        Self {
            max_request: 32 << 20,
            max_in_flight: 64,
            volume: VolumeOptions::default(),
        }
    }
}

/// The transmission flags every export has.
const TFLAGS: u16 = TFLAG_HAS_FLAGS
    | TFLAG_SEND_FLUSH
    | TFLAG_SEND_FUA
    | TFLAG_SEND_TRIM
    | TFLAG_SEND_WRITE_ZEROES
    | TFLAG_CAN_MULTI_CONN;

/// An NBD server of one cluster's volumes.
pub struct NbdServer {
    client: Client,
    opts: NbdOptions,
    /// Volumes open here, with the connections using each.
    open: tokio::sync::Mutex<HashMap<String, (Arc<Volume>, usize)>>,
}

/// What the handshake settled.
struct Session {
    volume: Arc<Volume>,
    structured: bool,
}

impl NbdServer {
    pub fn new(client: Client, opts: NbdOptions) -> Arc<Self> {
        Arc::new(Self {
            client,
            opts,
            open: tokio::sync::Mutex::new(HashMap::new()),
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
                        let this = self.clone();
                        tokio::spawn(async move { this.connection(stream, peer).await });
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

    async fn connection(self: Arc<Self>, stream: TcpStream, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let (rd, wr) = stream.into_split();
        let mut rd = BufReader::with_capacity(256 << 10, rd);
        let mut wr = BufWriter::with_capacity(256 << 10, wr);
        let session = match self.handshake(&mut rd, &mut wr).await {
            Ok(Some(s)) => s,
            Ok(None) => return,
            Err(e) => {
                tracing::info!(%peer, error = %e, "handshake ended");
                return;
            }
        };
        let name = session.volume.meta().name.clone();
        tracing::info!(%peer, volume = %name, structured = session.structured, "serving");
        if let Err(e) = self.transmission(&session, rd, wr).await {
            tracing::info!(%peer, volume = %name, error = %e, "connection ended");
        }
        self.release(&name).await;
    }

    /// The volume's record from the masters.
    async fn lookup(&self, name: &str) -> Result<VolumeMeta, (u32, String)> {
        let q = ObjectQuery::Volume { name: name.into() };
        match self.client.masters().object_query(&q).await {
            Ok(Ok(QueryReply::Volume(v))) => Ok(v),
            Ok(Err(ObjectError::NoSuchVolume)) => {
                Err((REP_ERR_UNKNOWN, format!("no volume named {name:?}")))
            }
            Ok(Ok(_)) => Err((REP_ERR_INVALID, "unexpected answer".into())),
            Ok(Err(e)) => Err((REP_ERR_POLICY, e.to_string())),
            Err(e) => Err((REP_ERR_POLICY, format!("the masters: {e}"))),
        }
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

    async fn handshake(
        &self,
        rd: &mut (impl AsyncRead + Unpin),
        wr: &mut (impl AsyncWrite + Unpin),
    ) -> std::io::Result<Option<Session>> {
        let mut hello = Vec::with_capacity(18);
        hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
        hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
        hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        wr.write_all(&hello).await?;
        wr.flush().await?;
        let client_flags = rd.read_u32().await?;
        if client_flags & !u32::from(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES) != 0 {
            return Err(invalid("unknown client flags"));
        }
        let no_zeroes = client_flags & u32::from(FLAG_NO_ZEROES) != 0;
        let mut structured = false;
        loop {
            let mut h = [0u8; 16];
            rd.read_exact(&mut h).await?;
            let (opt, len) = option_header(&h).map_err(|e| invalid(&e.to_string()))?;
            if len as usize > MAX_OPTION {
                // Not read into memory: skipped, and refused.
                let mut skip = (&mut *rd).take(u64::from(len));
                tokio::io::copy(&mut skip, &mut tokio::io::sink()).await?;
                reply_err(wr, opt, REP_ERR_TOO_BIG, "option too long").await?;
                continue;
            }
            let mut data = vec![0u8; len as usize];
            rd.read_exact(&mut data).await?;
            match opt {
                OPT_EXPORT_NAME => {
                    let name = String::from_utf8_lossy(&data).into_owned();
                    // The protocol has no error reply here: the server closes.
                    let v = match self.acquire(&name).await {
                        Ok(v) => v,
                        Err((_, why)) => {
                            tracing::warn!(volume = %name, error = %why, "export refused");
                            return Ok(None);
                        }
                    };
                    let mut out = Vec::with_capacity(134);
                    out.extend_from_slice(&v.size().to_be_bytes());
                    out.extend_from_slice(&TFLAGS.to_be_bytes());
                    if !no_zeroes {
                        out.extend_from_slice(&[0u8; 124]);
                    }
                    if let Err(e) = async {
                        wr.write_all(&out).await?;
                        wr.flush().await
                    }
                    .await
                    {
                        self.release(&name).await;
                        return Err(e);
                    }
                    return Ok(Some(Session {
                        volume: v,
                        structured,
                    }));
                }
                OPT_ABORT => {
                    wr.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                    wr.flush().await?;
                    return Ok(None);
                }
                OPT_LIST => {
                    if !data.is_empty() {
                        reply_err(wr, opt, REP_ERR_INVALID, "LIST takes no data").await?;
                        continue;
                    }
                    match self
                        .client
                        .masters()
                        .object_query(&ObjectQuery::Volumes)
                        .await
                    {
                        Ok(Ok(QueryReply::Volumes(vs))) => {
                            for v in vs {
                                let mut p = Vec::with_capacity(4 + v.name.len());
                                p.extend_from_slice(&(v.name.len() as u32).to_be_bytes());
                                p.extend_from_slice(v.name.as_bytes());
                                wr.write_all(&option_reply(opt, REP_SERVER, &p)).await?;
                            }
                            wr.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                        }
                        other => {
                            let why = format!("listing volumes: {other:?}");
                            reply_err(wr, opt, REP_ERR_POLICY, &why).await?;
                        }
                    }
                    wr.flush().await?;
                }
                OPT_STRUCTURED_REPLY => {
                    if !data.is_empty() {
                        reply_err(wr, opt, REP_ERR_INVALID, "STRUCTURED_REPLY takes no data")
                            .await?;
                        continue;
                    }
                    structured = true;
                    wr.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                    wr.flush().await?;
                }
                OPT_INFO | OPT_GO => {
                    let (name, infos) = match info_request(&data) {
                        Ok(x) => x,
                        Err(e) => {
                            reply_err(wr, opt, REP_ERR_INVALID, &e.to_string()).await?;
                            continue;
                        }
                    };
                    // INFO describes the volume without opening it; GO opens it.
                    let (size, bs, vol) = if opt == OPT_GO {
                        match self.acquire(&name).await {
                            Ok(v) => (v.size(), v.block_size() as u32, Some(v)),
                            Err((code, why)) => {
                                tracing::warn!(volume = %name, error = %why, "export refused");
                                reply_err(wr, opt, code, &why).await?;
                                continue;
                            }
                        }
                    } else {
                        match self.lookup(&name).await {
                            Ok(m) => (m.size, m.block_size, None),
                            Err((code, why)) => {
                                reply_err(wr, opt, code, &why).await?;
                                continue;
                            }
                        }
                    };
                    let r: std::io::Result<()> = async {
                        let mut p = Vec::with_capacity(12);
                        p.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                        p.extend_from_slice(&size.to_be_bytes());
                        p.extend_from_slice(&TFLAGS.to_be_bytes());
                        wr.write_all(&option_reply(opt, REP_INFO, &p)).await?;
                        let mut p = Vec::with_capacity(14);
                        p.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                        p.extend_from_slice(&bs.to_be_bytes());
                        p.extend_from_slice(&bs.max(4096).to_be_bytes());
                        p.extend_from_slice(&self.opts.max_request.to_be_bytes());
                        wr.write_all(&option_reply(opt, REP_INFO, &p)).await?;
                        if infos.contains(&INFO_NAME) {
                            let mut p = INFO_NAME.to_be_bytes().to_vec();
                            p.extend_from_slice(name.as_bytes());
                            wr.write_all(&option_reply(opt, REP_INFO, &p)).await?;
                        }
                        if infos.contains(&INFO_DESCRIPTION) {
                            let mut p = INFO_DESCRIPTION.to_be_bytes().to_vec();
                            p.extend_from_slice(b"cairn volume");
                            wr.write_all(&option_reply(opt, REP_INFO, &p)).await?;
                        }
                        wr.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                        wr.flush().await
                    }
                    .await;
                    if let Err(e) = r {
                        if vol.is_some() {
                            self.release(&name).await;
                        }
                        return Err(e);
                    }
                    if let Some(volume) = vol {
                        return Ok(Some(Session { volume, structured }));
                    }
                }
                OPT_STARTTLS => {
                    reply_err(wr, opt, REP_ERR_POLICY, "TLS is not offered on NBD").await?;
                }
                _ => {
                    reply_err(wr, opt, REP_ERR_UNSUP, "unknown option").await?;
                }
            }
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
        let r = loop {
            let mut h = [0u8; REQUEST_BYTES];
            match rd.read_exact(&mut h).await {
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

async fn reply_err(
    wr: &mut (impl AsyncWrite + Unpin),
    opt: u32,
    code: u32,
    why: &str,
) -> std::io::Result<()> {
    wr.write_all(&option_reply(opt, code, why.as_bytes()))
        .await?;
    wr.flush().await
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
