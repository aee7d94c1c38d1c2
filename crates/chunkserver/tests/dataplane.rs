//! The data plane end to end on loopback: a chunkserver on real O_DIRECT store files, the SDK's
//! multiplexed connection.

use cairn_chunkserver::{Chunkserver, DiskSet, DiskSetOptions, ServerOptions};
use cairn_chunkstore::{FormatOptions, OpenOptions};
use cairn_client::{DataConn, DataError as Error, Status};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

async fn server(disks: usize, opts: ServerOptions) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let set = DiskSet::open(&DiskSetOptions {
        paths: (0..disks)
            .map(|i| dir.path().join(format!("disk{i}.cairn")))
            .collect(),
        create_bytes: 64 << 20,
        zero_fill: false,
        format: FormatOptions::default(),
        open: OpenOptions::default(),
    })
    .unwrap();
    let cs = Chunkserver::new(set, opts);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(cs.serve(listener, async {
        let _ = rx.await;
    }));
    Server {
        addr,
        stop: Some(tx),
        task,
        _dir: dir,
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        self.task.abort();
    }
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(0x9E37_79B9)) as u8)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_and_its_errors() {
    let s = server(2, ServerOptions::default()).await;
    let c = DataConn::connect(s.addr, std::time::Duration::from_secs(30))
        .await
        .unwrap();
    c.ping().await.unwrap();
    // Create with the first append piggybacked, then appends at the expected offset.
    let first = bytes(1, 10_000);
    assert_eq!(c.create(7, 3, first.clone()).await.unwrap(), 10_000);
    let more = bytes(2, 70_000);
    assert_eq!(c.append(7, 10_000, more.clone()).await.unwrap(), 80_000);
    let mut whole = first.clone();
    whole.extend_from_slice(&more);
    assert_eq!(c.read(7, 0, 80_000).await.unwrap(), whole);
    assert_eq!(c.read(7, 9_999, 2).await.unwrap(), whole[9_999..10_001]);
    let st = c.stat(7).await.unwrap();
    assert_eq!((st.length, st.version, st.sealed), (80_000, 3, false));
    // A wrong offset is refused with the chunk's current length.
    let e = c.append(7, 5, &b"x"[..]).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::Status {
                status: Status::WrongOffset,
                offset: 80_000,
                ..
            }
        ),
        "{e:?}"
    );
    // Reads past the end, unknown chunks, duplicate creates: typed, with a message.
    assert_eq!(
        c.read(7, 79_999, 2).await.unwrap_err().status(),
        Some(Status::OutOfRange)
    );
    assert_eq!(
        c.stat(8).await.unwrap_err().status(),
        Some(Status::NotFound)
    );
    let e = c.create(7, 1, &b""[..]).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::AlreadyExists));
    // Seal: the chunk CRC, then no more appends.
    let sealed = c.seal(7).await.unwrap();
    assert!(sealed.sealed);
    assert_eq!(sealed.crc32c, crc32c::crc32c(&whole));
    assert_eq!(c.stat(7).await.unwrap(), sealed);
    assert_eq!(
        c.append(7, 80_000, &b"y"[..]).await.unwrap_err().status(),
        Some(Status::Sealed)
    );
    // Delete frees the id.
    c.delete(7).await.unwrap();
    assert_eq!(
        c.read(7, 0, 1).await.unwrap_err().status(),
        Some(Status::NotFound)
    );
    assert_eq!(c.create(7, 4, &b"again"[..]).await.unwrap(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_requests_in_flight_on_one_connection_come_back_out_of_order() {
    // A tiny in-flight limit as well: the server must push back, not drop or deadlock.
    let s = server(
        2,
        ServerOptions {
            max_in_flight: 4,
            max_in_flight_bytes: 1 << 20,
            ..ServerOptions::default()
        },
    )
    .await;
    let c = Arc::new(
        DataConn::connect(s.addr, std::time::Duration::from_secs(30))
            .await
            .unwrap(),
    );
    let chunks = 16u64;
    let appends = 20usize;
    let mut tasks = Vec::new();
    for id in 0..chunks {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut len = c.create(id, 1, &b""[..]).await.unwrap();
            let mut whole = Vec::new();
            for k in 0..appends {
                // Mixed sizes: a 300 KiB append is in flight beside 1 KiB ones.
                let size = if k % 5 == 0 { 300 << 10 } else { 1 << 10 };
                let data = bytes(id * 1000 + k as u64, size);
                len = c.append(id, len, data.clone()).await.unwrap();
                whole.extend_from_slice(&data);
            }
            assert_eq!(c.read(id, 0, whole.len()).await.unwrap(), whole);
            len
        }));
    }
    // Pings interleaved with the bulk work complete too.
    for _ in 0..50 {
        c.ping().await.unwrap();
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Probe: replies really overtook each other (small appends pass the 300 KiB ones).
    let ooo = c
        .stats()
        .out_of_order_replies
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(ooo > 0, "every reply came back in request order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_frame_closes_that_connection_only() {
    let s = server(1, ServerOptions::default()).await;
    let good = DataConn::connect(s.addr, std::time::Duration::from_secs(30))
        .await
        .unwrap();
    good.create(1, 1, &b"kept"[..]).await.unwrap();
    // Garbage: the server closes this connection without a reply.
    let mut raw = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    raw.write_all(&[0xAB; 64]).await.unwrap();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), raw.read(&mut buf))
        .await
        .expect("server closes the connection")
        .unwrap_or(0);
    assert_eq!(n, 0, "no reply to a corrupt frame");
    // A frame whose payload does not match its CRC: closed as well.
    let mut raw = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let h = cairn_proto::Header::request(cairn_proto::Opcode::Append, 9, 1).with_payload(b"abcd");
    raw.write_all(&h.encode()).await.unwrap();
    raw.write_all(b"abce").await.unwrap();
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), raw.read(&mut buf))
        .await
        .expect("server closes the connection")
        .unwrap_or(0);
    assert_eq!(n, 0);
    // An unknown opcode in a well-formed frame is answered, not fatal.
    let mut raw = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let mut h = cairn_proto::Header::request(cairn_proto::Opcode::Ping, 5, 0);
    h.opcode = 99;
    raw.write_all(&h.encode()).await.unwrap();
    let mut hb = [0u8; cairn_proto::HEADER_BYTES];
    raw.read_exact(&mut hb).await.unwrap();
    let rep = cairn_proto::Header::decode(&hb).unwrap();
    assert_eq!(rep.request_id, 5);
    assert_eq!(rep.status(), Some(Status::BadRequest));
    // A header announcing more than a frame may carry: closed before any payload is read.
    let mut raw = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let mut hb = cairn_proto::Header::request(cairn_proto::Opcode::Append, 6, 1).encode();
    hb[40..44].copy_from_slice(&(cairn_proto::MAX_PAYLOAD + 1).to_le_bytes());
    let crc = crc32c::crc32c(&hb[..60]);
    hb[60..64].copy_from_slice(&crc.to_le_bytes());
    raw.write_all(&hb).await.unwrap();
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), raw.read(&mut buf))
        .await
        .expect("server closes the connection")
        .unwrap_or(0);
    assert_eq!(n, 0);
    // An append larger than the store takes: a typed TOO_LARGE, and the connection lives on.
    let e = good.append(1, 4, vec![7u8; 5 << 20]).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::TooLarge), "{e}");
    // The good connection never noticed.
    assert_eq!(good.read(1, 0, 4).await.unwrap(), b"kept");
}

/// A store file is made under a temporary name and renamed into place once formatted: what a
/// process killed while zero-filling leaves behind is removed at the next start, and the store
/// is made again.
#[test]
fn a_half_made_store_file_is_made_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk0.cairn");
    let leftover = dir.path().join("disk0.cairn.new");
    std::fs::write(&leftover, vec![0xAB; 1 << 20]).unwrap();
    let opts = DiskSetOptions {
        paths: vec![path.clone()],
        create_bytes: 16 << 20,
        zero_fill: true,
        format: FormatOptions::default(),
        open: OpenOptions::default(),
    };
    let set = DiskSet::open(&opts).unwrap();
    assert!(!leftover.exists(), "the half-made file is gone");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 16 << 20);
    let store = set.place(7).unwrap();
    store.create(7, 1).unwrap();
    assert_eq!(store.append(7, 0, b"kept").unwrap(), 4);
    // The store file is locked while open.
    let e = DiskSet::open(&opts)
        .err()
        .expect("a second open is refused");
    assert!(e.to_string().contains("locked"), "{e}");
    drop(store);
    set.close().unwrap();
    // The next start opens the same store (nothing is made again).
    let set = DiskSet::open(&opts).unwrap();
    assert_eq!(set.find(7).unwrap().read(7, 0, 4).unwrap(), b"kept");
    set.close().unwrap();
}

/// Waits for the server to close `raw` (a read returns nothing within 10 s, or fails).
async fn closed_by_server(raw: &mut tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(10), raw.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// A hostile or broken client cannot take the server down: connections past the limits are
/// closed at once, an idle one and a slow sender are closed after their timeouts, and a
/// header announcing a large payload holds no memory past them — while a good client is
/// served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limits_and_timeouts() {
    use std::time::Duration;
    let s = server(
        1,
        ServerOptions {
            max_connections_per_peer: 3,
            idle_timeout: Duration::from_secs(2),
            frame_timeout: Duration::from_millis(500),
            ..ServerOptions::default()
        },
    )
    .await;
    let good = DataConn::connect(s.addr, Duration::from_secs(30))
        .await
        .unwrap();
    good.create(1, 1, &b"kept"[..]).await.unwrap();

    // A payload announced and never sent: closed after the frame timeout.
    let mut slow = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let h = cairn_proto::Header::request(cairn_proto::Opcode::Append, 1, 1)
        .with_payload(&vec![0u8; 1 << 20]);
    slow.write_all(&h.encode()).await.unwrap();
    slow.write_all(&[0u8; 10]).await.unwrap();
    // Half a header, then nothing: closed likewise.
    let mut half = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    half.write_all(&h.encode()[..20]).await.unwrap();
    // Those two and `good` fill this peer's three slots: a fourth is closed at once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut fourth = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let t = std::time::Instant::now();
    assert!(
        closed_by_server(&mut fourth).await,
        "a connection past the limit is closed"
    );
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "at once, not by a timeout"
    );
    assert!(
        closed_by_server(&mut slow).await,
        "a stalled payload is cut"
    );
    assert!(closed_by_server(&mut half).await, "a stalled header is cut");
    good.ping().await.unwrap();

    // Their slots are free again; a connection that sends nothing is closed when idle.
    let mut idle = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let t = std::time::Instant::now();
    assert!(closed_by_server(&mut idle).await);
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "idle timeout, not at once"
    );
    // The good connection was idle as long: it reconnects as any client does, and the store
    // holds what it held.
    let again = DataConn::connect(s.addr, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(again.read(1, 0, 4).await.unwrap(), b"kept");
}
