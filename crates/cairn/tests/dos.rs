//! Denial of service without credentials (issue 38 §3, docs/security.md "Resource limits"):
//! connections that prove nothing are budgeted per address and cut; made-up client reports
//! cannot mark a server avoided.

mod common;
#[path = "../src/s3client.rs"]
#[allow(dead_code)]
mod s3client;

use cairn_client::CreateOptions;
use cairn_proto::frame::{HEADER_BYTES, Header, Opcode};
use cairn_rpc::auth::Credential;
use cairn_rpc::pb;
use common::Cluster;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A TCP connection to `addr` from the local address `from` (127.0.0.x).
async fn connect_from(from: &str, addr: &str) -> TcpStream {
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.bind(format!("{from}:0").parse().unwrap()).unwrap();
    s.connect(addr.parse().unwrap()).await.unwrap()
}

/// Whether the server closed `s` within `within` (a read returns nothing or fails).
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut b = [0u8; 64];
    matches!(
        tokio::time::timeout(within, s.read(&mut b)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Whether the server closed `s` within `within`, whatever it sent before (a greeting,
/// answers).
async fn cut_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut b = [0u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// Issue 38 §3 at the masters (gRPC), the S3 gateway and the NBD server: as at the
/// chunkservers, connections that prove nothing have a small budget per address and are cut
/// soon after they were accepted — idle or chatting — while users' calls go on.
#[tokio::test(flavor = "multi_thread")]
async fn strangers_are_budgeted_and_cut_at_the_masters_the_gateway_and_the_nbd_server() {
    let dir = tempfile::tempdir().unwrap();
    let limits = ["--proof-timeout-ms", "1000", "--max-unproven-per-peer", "4"];
    let cl = Cluster::start_full(dir.path(), 1, 3, &limits, &[]).await;
    let addrs = cl.master_addrs();
    let alice = common::create_user(&addrs, "alice");
    let gw = common::gateway_with(&addrs, "127.0.0.1:0", &limits);
    let nbd = common::nbd::server(&addrs, &limits);
    common::run_ok(common::cairn().args([
        "volume",
        "create",
        "vol",
        "--size",
        "16m",
        "--cluster",
        &addrs.join(","),
    ]));
    let s3 = s3client::S3Bucket::new(
        &format!("http://{}", gw.addr),
        "alices",
        &alice.access,
        &alice.secret,
        1,
    )
    .unwrap();
    s3.create_bucket().await.unwrap();
    let c = cl.client().await;
    for (what, addr) in [
        ("master", addrs[0].as_str()),
        ("gateway", gw.addr.as_str()),
        ("nbd", nbd.addr.as_str()),
    ] {
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(connect_from("127.0.0.2", addr).await);
        }
        let mut fifth = connect_from("127.0.0.2", addr).await;
        assert!(
            cut_within(&mut fifth, Duration::from_millis(500)).await,
            "{what}: past the budget"
        );
        let other = connect_from("127.0.0.3", addr).await;
        held.push(other);
        let t0 = std::time::Instant::now();
        // Users are served meanwhile, on connections that outlive the deadline.
        s3.put("k", bytes::Bytes::from_static(b"twelve bytes"))
            .await
            .unwrap();
        c.mkdir(&format!("/{what}"), false).await.unwrap();
        for s in &mut held {
            assert!(
                cut_within(s, Duration::from_secs(3)).await,
                "{what}: an unproven connection was kept"
            );
        }
        assert!(t0.elapsed() < Duration::from_secs(3), "{what}: cut late");
        // The budget is free again.
        let mut again = connect_from("127.0.0.2", addr).await;
        assert!(
            !closed_within(&mut again, Duration::from_millis(200)).await,
            "{what}: the budget was not given back"
        );
    }
    // A stranger chatting with the gateway (unsigned requests, each answered) is cut all
    // the same.
    let mut chatty = connect_from("127.0.0.4", &gw.addr).await;
    let t0 = std::time::Instant::now();
    let mut answered = 0;
    loop {
        let req = "GET /alices/k HTTP/1.1\r\nHost: x\r\n\r\n";
        if chatty.write_all(req.as_bytes()).await.is_err() {
            break;
        }
        let mut b = [0u8; 4096];
        match tokio::time::timeout(Duration::from_millis(500), chatty.read(&mut b)).await {
            Ok(Ok(n)) if n > 0 => {
                assert!(
                    b[..n].starts_with(b"HTTP/1.1 403"),
                    "{}",
                    String::from_utf8_lossy(&b[..n])
                );
                answered += 1;
            }
            _ => break,
        }
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "a chatting stranger was kept"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered >= 1, "no unsigned request was answered");
    // Alice's connection, proven long ago, still serves; so does an NBD client that opened a
    // volume (plain NBD: the open is the proof) past the deadline.
    assert_eq!(&s3.get("k").await.unwrap()[..], b"twelve bytes");
    let nbd_addr = nbd.addr.clone();
    tokio::task::spawn_blocking(move || {
        let mut v = common::nbd::Raw::open(&nbd_addr, "vol").unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let (err, data) = v.call(common::nbd::READ, 0, 0, 4096, &[]).unwrap();
        assert_eq!((err, data.len()), (0, 4096));
    })
    .await
    .unwrap();
}

/// Issue 38 §3: connections that never show a valid capability have a small budget per
/// address and are cut a short time after they were accepted (PINGs or not), while a real
/// client's reads and writes go on.
#[tokio::test(flavor = "multi_thread")]
async fn unproven_connections_are_budgeted_and_cut() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--proof-timeout-ms", "1000", "--max-unproven-per-peer", "4"];
    let cl = Cluster::start_with(dir.path(), 1, 3, &flags).await;
    let c = cl.client().await;
    let addr = cl.status().await.unwrap().servers[0].addr.clone();

    // Four from 127.0.0.2 are let in; a fifth is closed at once.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect_from("127.0.0.2", &addr).await);
    }
    let mut fifth = connect_from("127.0.0.2", &addr).await;
    assert!(
        closed_within(&mut fifth, Duration::from_millis(500)).await,
        "past the budget"
    );
    // Another address has a budget of its own.
    let mut other = connect_from("127.0.0.3", &addr).await;
    // One of them pings all along: a PING proves nothing.
    let mut pinger = held.pop().unwrap();
    let t0 = std::time::Instant::now();
    let ping = Header::request(Opcode::Ping, 0, 0);
    let mut pinged = 0;
    loop {
        if pinger.write_all(&ping.encode()).await.is_err() {
            break;
        }
        let mut r = [0u8; HEADER_BYTES];
        match tokio::time::timeout(Duration::from_millis(300), pinger.read_exact(&mut r)).await {
            Ok(Ok(_)) => pinged += 1,
            _ => break,
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "a pinging stranger was kept"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(pinged >= 1, "no PING was answered");
    // The rest, idle, are cut at the proof deadline — not at the 300 s idle timeout.
    for s in held.iter_mut().chain([&mut other]) {
        assert!(
            closed_within(s, Duration::from_secs(3)).await,
            "an unproven connection was kept"
        );
    }
    // Meanwhile and after, a client with capabilities reads and writes; its connections
    // outlive the proof deadline.
    let data = common::bytes(3, 0, 300_000);
    let mut w = c.create("/busy", CreateOptions::default()).await.unwrap();
    w.append(&data).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    w.append(&data).await.unwrap();
    w.close().await.unwrap();
    assert_eq!(c.read("/busy", 0, data.len()).await.unwrap(), data);
    // The budget is free again.
    let mut again = connect_from("127.0.0.2", &addr).await;
    assert!(
        !closed_within(&mut again, Duration::from_millis(300)).await,
        "the budget was not given back"
    );
}

/// Issue 38 §3: one user's 50 made-up client ids are one vote. Three users report a healthy
/// cluster and one reports server X slow from 50 ids: X is listed by 1 of 4 voters, not
/// avoided (before: 50 of 53). A report naming servers the cluster lacks counts none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_client_ids_are_one_vote() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let addrs = cl.master_addrs();
    let x = cl.server_id(0).await;
    let keys: std::collections::HashMap<&str, common::Keys> = ["mallory", "ann", "ben", "cat"]
        .into_iter()
        .map(|n| (n, common::create_user(&addrs, n)))
        .collect();
    let report = |name: &str, client: String, listed: Vec<u64>| {
        let m = cairn_rpc::Masters::new(&addrs)
            .unwrap()
            .credential(Some(Credential::User {
                access_key: keys[name].access.clone(),
                secret_key: keys[name].secret.clone(),
            }));
        let req = pb::ClientReport {
            client_id: client,
            servers: listed
                .into_iter()
                .map(|server_id| pb::ServerReport {
                    server_id,
                    failed: false,
                    slow: true,
                    errors: 0,
                })
                .collect(),
        };
        async move {
            m.send(req, |mut c, r| async move { c.report(r).await })
                .await
                .unwrap();
        }
    };
    for i in 0..50 {
        report("mallory", format!("made-up-{i}"), vec![x, 999_999, x]).await;
    }
    for name in ["ann", "ben", "cat"] {
        report(name, "honest".into(), vec![]).await;
    }
    let s = cl.status().await.unwrap();
    assert_eq!(s.reporting_clients, 4, "one vote per user");
    let me = s.servers.iter().find(|c| c.id == x).unwrap();
    assert_eq!(me.reported_by, 1);
    assert!(!me.avoided, "made-up ids marked a server avoided");
    // Canary: the same votes from four users do mark it.
    for name in ["ann", "ben", "cat"] {
        report(name, "honest".into(), vec![x]).await;
    }
    let s = cl.status().await.unwrap();
    let me = s.servers.iter().find(|c| c.id == x).unwrap();
    assert!(me.avoided && me.reported_by == 4, "{me:?}");
}
