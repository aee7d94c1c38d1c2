//! Who gets a connection slot (docs/security.md "Resource limits"): every server — chunkservers,
//! masters, the S3 gateway, the NBD server — takes a connection into one of two pools.
//!
//! A connection is *unproven* until it shows what its service accepts as proof (a valid
//! capability, a server or user proof, a known access key, a user's certificate). Unproven
//! connections have a small pool of their own — `max_unproven` in all, `max_unproven_per_peer`
//! from one address — and are cut `proof_timeout` after they were accepted, whatever they send
//! meanwhile. A proven connection moves to the other pool (`max_connections`,
//! `max_connections_per_peer`) and stays as long as its service keeps it. So a flood of
//! strangers never takes a client's slot, and what it holds is gone within `proof_timeout`.
//!
//! [`Guarded`] applies the deadline (and a byte budget) to a byte stream whose service cannot
//! watch it itself (hyper and tonic serve the connection): reads and writes fail once an
//! unproven connection's time or bytes are up.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How many connections a server keeps, and how long and how much a stranger gets.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Proven connections, in all and from one peer address; past either a connection that
    /// proves itself is closed.
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    /// Unproven connections, in all and from one peer address; past either a new connection
    /// is closed at once.
    pub max_unproven: usize,
    pub max_unproven_per_peer: usize,
    /// An unproven connection is cut this long after it was accepted.
    pub proof_timeout: Duration,
    /// An unproven connection is cut once it has sent this many bytes ([`Guarded`] only).
    pub max_unproven_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_connections_per_peer: 1024,
            max_unproven: 512,
            max_unproven_per_peer: 32,
            proof_timeout: Duration::from_secs(2),
            max_unproven_bytes: 1 << 20,
        }
    }
}

/// The metric names a server's slots are reported under.
#[derive(Debug, Clone, Copy)]
pub struct Names {
    /// Gauge: proven connections open.
    pub open: &'static str,
    /// Gauge: unproven connections open.
    pub unproven: &'static str,
    /// Counter, label `limit` (`server`, `peer`, `unproven`, `unproven_peer`, `deadline`,
    /// `bytes`): connections closed by a limit.
    pub refused: &'static str,
}

/// A server's connection slots.
pub struct Admission {
    limits: Limits,
    names: Names,
    conns: parking_lot::Mutex<Conns>,
    refusals: LogBudget,
}

#[derive(Default)]
struct Conns {
    proven: Pool,
    unproven: Pool,
}

impl Conns {
    fn report(&self, names: &Names) {
        metrics::gauge!(names.open).set(self.proven.open as f64);
        metrics::gauge!(names.unproven).set(self.unproven.open as f64);
    }
}

/// Connections of one kind, in all and by peer address.
#[derive(Default)]
struct Pool {
    open: usize,
    by_peer: HashMap<IpAddr, usize>,
}

impl Pool {
    /// Takes a place for `peer` within `max` in all and `per_peer` from one address; else
    /// the counts it met (open in all, from `peer`).
    fn take(&mut self, peer: IpAddr, max: usize, per_peer: usize) -> Result<(), (usize, usize)> {
        let from_peer = self.by_peer.get(&peer).copied().unwrap_or(0);
        if self.open >= max || from_peer >= per_peer {
            return Err((self.open, from_peer));
        }
        self.open += 1;
        *self.by_peer.entry(peer).or_default() += 1;
        Ok(())
    }

    fn give_back(&mut self, peer: IpAddr) {
        self.open -= 1;
        if let std::collections::hash_map::Entry::Occupied(mut e) = self.by_peer.entry(peer) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

impl Admission {
    pub fn new(limits: Limits, names: Names) -> Arc<Self> {
        Arc::new(Self {
            limits,
            names,
            conns: Default::default(),
            refusals: LogBudget::default(),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Takes a slot for a connection from `peer` — among the proven ones at once when
    /// `proven` (the service asks no proof) — or refuses it (the caller drops the stream;
    /// the refusal is counted and logged within the log budget).
    pub fn admit(self: &Arc<Self>, peer: SocketAddr, proven: bool) -> Option<Slot> {
        let l = &self.limits;
        let mut c = self.conns.lock();
        let ip = peer.ip();
        let (pool, max, per_peer, names) = if proven {
            let p = &mut c.proven;
            (
                p,
                l.max_connections,
                l.max_connections_per_peer,
                ["server", "peer"],
            )
        } else {
            let p = &mut c.unproven;
            (
                p,
                l.max_unproven,
                l.max_unproven_per_peer,
                ["unproven", "unproven_peer"],
            )
        };
        let Err((open, from_peer)) = pool.take(ip, max, per_peer) else {
            c.report(&self.names);
            return Some(Slot {
                adm: self.clone(),
                peer: ip,
                proven: AtomicBool::new(proven),
                deadline: Instant::now() + l.proof_timeout,
                bytes: AtomicU64::new(0),
            });
        };
        drop(c);
        let why = if open >= max { names[0] } else { names[1] };
        self.refused(why);
        if self.refusals.allow() {
            tracing::warn!(%peer, limit = why, open, from_peer, "connection refused: too many connections");
        }
        None
    }

    fn refused(&self, why: &'static str) {
        metrics::counter!(self.names.refused, "limit" => why).increment(1);
    }

    /// Whether one more warning about a refused or cut connection may be logged now.
    pub fn may_log(&self) -> bool {
        self.refusals.allow()
    }
}

/// A connection's place in its server's [`Admission`], given back when it is dropped.
pub struct Slot {
    adm: Arc<Admission>,
    peer: IpAddr,
    proven: AtomicBool,
    deadline: Instant,
    /// Bytes read while unproven ([`Guarded`]).
    bytes: AtomicU64,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("peer", &self.peer)
            .field("proven", &self.is_proven())
            .finish()
    }
}

impl Slot {
    pub fn is_proven(&self) -> bool {
        self.proven.load(Ordering::Acquire)
    }

    /// When an unproven connection is cut.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Time left to prove itself (zero once proven or late).
    pub fn time_left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Moves this connection among the proven ones (it showed a valid proof); `false` when
    /// they are all taken (the caller closes it).
    pub fn prove(&self) -> bool {
        if self.is_proven() {
            return true;
        }
        let (l, names) = (&self.adm.limits, &self.adm.names);
        let mut c = self.adm.conns.lock();
        // Another call on the same connection may have proven it meanwhile.
        if self.is_proven() {
            return true;
        }
        if c.proven
            .take(self.peer, l.max_connections, l.max_connections_per_peer)
            .is_err()
        {
            drop(c);
            self.adm.refused("server");
            return false;
        }
        c.unproven.give_back(self.peer);
        self.proven.store(true, Ordering::Release);
        c.report(names);
        true
    }

    /// Counts `n` bytes read; `false` once an unproven connection has read more than its
    /// budget.
    fn read(&self, n: usize) -> bool {
        if self.is_proven() {
            return true;
        }
        let total = self.bytes.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        total <= self.adm.limits.max_unproven_bytes
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.adm.conns.lock();
        if self.is_proven() {
            c.proven.give_back(self.peer);
        } else {
            c.unproven.give_back(self.peer);
        }
        c.report(&self.adm.names);
    }
}

/// A byte stream held to its [`Slot`]: while unproven, reads and writes fail after the slot's
/// deadline or past its byte budget (so hyper or tonic, which serve the connection, close it).
pub struct Guarded<IO> {
    io: IO,
    slot: Arc<Slot>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<IO> Guarded<IO> {
    pub fn new(io: IO, slot: Slot) -> Self {
        Self {
            io,
            slot: Arc::new(slot),
            timer: None,
        }
    }

    /// The connection's slot: the service proves it there.
    pub fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }

    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// An error once an unproven connection is past its deadline; else registers a wake-up
    /// for the deadline (a connection that sends nothing is cut too).
    fn check(&mut self, cx: &mut Context<'_>) -> std::io::Result<()> {
        if self.slot.is_proven() {
            self.timer = None;
            return Ok(());
        }
        let deadline = self.slot.deadline;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline.into())));
        if timer.as_mut().poll(cx).is_ready() {
            return Err(self.cut("deadline"));
        }
        Ok(())
    }

    fn cut(&self, why: &'static str) -> std::io::Error {
        self.slot.adm.refused(why);
        let msg = match why {
            "deadline" => "no proof within the time an unproven connection has",
            _ => "an unproven connection sent more than it may",
        };
        if self.slot.adm.may_log() {
            tracing::info!(peer = %self.slot.peer, why, "unproven connection cut");
        }
        std::io::Error::new(std::io::ErrorKind::TimedOut, msg)
    }
}

use std::future::Future;

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        this.check(cx)?;
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        if !this.slot.read(buf.filled().len() - before) {
            return Poll::Ready(Err(this.cut("bytes")));
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        this.check(cx)?;
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        this.check(cx)?;
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// What a tonic request knows of its connection when it came through [`Guarded`].
#[derive(Clone)]
pub struct Peer {
    pub addr: Option<SocketAddr>,
    pub slot: Arc<Slot>,
}

impl tonic::transport::server::Connected for Guarded<tokio::net::TcpStream> {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        Peer {
            addr: self.io.peer_addr().ok(),
            slot: self.slot.clone(),
        }
    }
}

/// The connection a tonic request came on, served through [`Guarded`] (plain or TLS).
pub fn peer_of<T>(req: &tonic::Request<T>) -> Option<&Peer> {
    let ext = req.extensions();
    ext.get::<Peer>().or_else(|| {
        ext.get::<tonic::transport::server::TlsConnectInfo<Peer>>()
            .map(|t| t.get_ref())
    })
}

/// The peer address of a tonic request, whether or not it came through [`Guarded`].
pub fn remote_addr<T>(req: &tonic::Request<T>) -> Option<SocketAddr> {
    peer_of(req)
        .and_then(|p| p.addr)
        .or_else(|| req.remote_addr())
}

/// Accepts from `listener`, giving each connection a slot of `adm` (refused ones are closed at
/// once): tonic's `serve_with_incoming`.
pub fn incoming(
    listener: tokio::net::TcpListener,
    adm: Arc<Admission>,
) -> impl futures::Stream<Item = std::io::Result<Guarded<tokio::net::TcpStream>>> {
    futures::stream::unfold((listener, adm), |(listener, adm)| async move {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let Some(slot) = adm.admit(peer, false) else {
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let item = Ok(Guarded::new(stream, slot));
                    return Some((item, (listener, adm)));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    // Out of descriptors or similar: let the others close some.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    })
}

/// Warnings about refused connections: at most [`LogBudget::LINES`] each
/// [`LogBudget::WINDOW`], then one line saying how many were left out (a flood of strangers
/// must not fill the log).
#[derive(Default)]
pub struct LogBudget {
    inner: parking_lot::Mutex<(Option<Instant>, u32, u64)>,
}

impl LogBudget {
    pub const LINES: u32 = 10;
    pub const WINDOW: Duration = Duration::from_secs(10);

    /// Whether one more line may be written now.
    pub fn allow(&self) -> bool {
        let mut g = self.inner.lock();
        let (since, used, dropped) = &mut *g;
        let now = Instant::now();
        if since.is_none_or(|t| now.duration_since(t) >= Self::WINDOW) {
            if *dropped > 0 {
                tracing::warn!(
                    left_out = *dropped,
                    "refused connections not logged one by one in the last window"
                );
            }
            *g = (Some(now), 1, 0);
            return true;
        }
        if *used < Self::LINES {
            *used += 1;
            true
        } else {
            *dropped += 1;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: Names = Names {
        open: "test_open",
        unproven: "test_unproven",
        refused: "test_refused",
    };

    fn addr(last: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, last], 1000))
    }

    #[test]
    fn unproven_and_proven_slots_are_counted_apart_and_given_back() {
        let adm = Admission::new(
            Limits {
                max_connections: 3,
                max_connections_per_peer: 2,
                max_unproven: 3,
                max_unproven_per_peer: 2,
                ..Limits::default()
            },
            NAMES,
        );
        let a1 = adm.admit(addr(1), false).unwrap();
        let a2 = adm.admit(addr(1), false).unwrap();
        assert!(adm.admit(addr(1), false).is_none(), "per peer");
        let b1 = adm.admit(addr(2), false).unwrap();
        assert!(adm.admit(addr(3), false).is_none(), "in all");
        // Proving moves a slot: the unproven pool has room again.
        assert!(a1.prove() && a1.prove());
        let a3 = adm.admit(addr(1), false).unwrap();
        assert!(a2.prove());
        // Two proven from 127.0.0.1 already: a third may not prove itself.
        assert!(!a3.prove());
        assert!(!a3.is_proven());
        // A server that asks no proof admits straight among the proven.
        let c = adm.admit(addr(3), true).unwrap();
        assert!(c.is_proven());
        assert!(adm.admit(addr(4), true).is_none(), "proven pool full");
        drop((a1, c));
        assert!(adm.admit(addr(4), true).is_some());
        drop((a2, a3, b1));
        let g = adm.conns.lock();
        assert_eq!((g.unproven.open, g.unproven.by_peer.len()), (0, 0));
        assert_eq!((g.proven.open, g.proven.by_peer.len()), (0, 0));
    }

    #[tokio::test]
    async fn guarded_streams_are_cut_at_the_deadline_and_past_the_byte_budget() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let adm = Admission::new(
            Limits {
                proof_timeout: Duration::from_millis(200),
                max_unproven_bytes: 10,
                ..Limits::default()
            },
            NAMES,
        );
        // Silent: cut at the deadline, though nothing arrives.
        let (a, _b) = tokio::io::duplex(64);
        let mut g = Guarded::new(a, adm.admit(addr(1), false).unwrap());
        let t0 = Instant::now();
        let e = g.read_u8().await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(t0.elapsed() >= Duration::from_millis(190));
        // Chatty: cut past its bytes.
        let (a, mut b) = tokio::io::duplex(64);
        let mut g = Guarded::new(a, adm.admit(addr(1), false).unwrap());
        b.write_all(&[0; 11]).await.unwrap();
        let mut buf = [0u8; 32];
        assert!(g.read(&mut buf).await.is_err());
        // Proven: neither.
        let (a, mut b) = tokio::io::duplex(64);
        let mut g = Guarded::new(a, adm.admit(addr(1), false).unwrap());
        assert!(g.slot().prove());
        tokio::time::sleep(Duration::from_millis(300)).await;
        b.write_all(&[0; 40]).await.unwrap();
        assert_eq!(g.read(&mut buf).await.unwrap(), 32);
        g.write_all(b"ok").await.unwrap();
    }
}
