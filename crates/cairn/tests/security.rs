//! Capabilities end to end (docs/security.md): real master and chunkserver processes started
//! with `--require-capabilities`; the SDK writes and reads through them, and a raw TCP client
//! sending well-formed frames with missing, forged, narrowed, misdirected or superseded
//! capabilities is refused and changes nothing on disk.

mod common;

use cairn_client::{CreateOptions, Policy};
use cairn_proto::cap::{CAP_BYTES, Capability};
use cairn_proto::frame::{HEADER_BYTES, Header, Opcode, Status};
use cairn_rpc::pb;
use common::Cluster;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request on a raw connection: the header, the capability if any, the payload; returns
/// the reply's status, its `offset` field and its payload.
async fn raw(
    s: &mut TcpStream,
    mut h: Header,
    cap: Option<&[u8]>,
    payload: &[u8],
) -> (Status, u64, Vec<u8>) {
    h = h.with_payload(payload);
    if cap.is_some() {
        h.cap_len = CAP_BYTES as u16;
    }
    s.write_all(&h.encode()).await.unwrap();
    if let Some(c) = cap {
        s.write_all(c).await.unwrap();
    }
    s.write_all(payload).await.unwrap();
    let mut hb = [0u8; HEADER_BYTES];
    s.read_exact(&mut hb).await.unwrap();
    let rh = Header::decode(&hb).unwrap();
    let mut body = vec![0u8; rh.length as usize];
    s.read_exact(&mut body).await.unwrap();
    (rh.status().unwrap(), rh.offset, body)
}

/// STAT of `chunk` with `cap`: the reply's status.
async fn stat(s: &mut TcpStream, chunk: u64, cap: &[u8]) -> Status {
    raw(s, Header::request(Opcode::Stat, 1, chunk), Some(cap), b"")
        .await
        .0
}

/// A writer's view of a file from the masters (its chunks signed for writing).
async fn open_write(c: &cairn_client::Client, path: &str, client_id: &str) -> pb::FileReply {
    let req = pb::OpenWriteRequest {
        path: path.into(),
        client_id: client_id.into(),
        chunks: 1,
    };
    c.masters()
        .send(req, |mut m, r| async move { m.open_write(r).await })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunkservers_refuse_requests_without_a_valid_capability() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start_with(dir.path(), 1, 4, &["--require-capabilities"]).await;
    let c = cl.client().await;
    // The leader makes the first key within a scan (1 s); chunkservers get it with their
    // next heartbeat (200 ms here).
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The SDK works through the checks: replicated and erasure-coded files.
    let data = common::bytes(1, 0, 300_000);
    for (path, policy) in [("/r", "replicas:3"), ("/e", "ec:2+1")] {
        let opts = CreateOptions {
            policy: Some(policy.parse::<Policy>().unwrap()),
            ..CreateOptions::default()
        };
        let mut w = c.create(path, opts).await.unwrap();
        w.append(&data).await.unwrap();
        w.close().await.unwrap();
        assert_eq!(c.read(path, 0, data.len()).await.unwrap(), data, "{path}");
    }

    // A raw client, with the READ capability `stat` hands out.
    let chunks = common::chunks(&c, "/r").await;
    let (chunk, other) = (&chunks[0], &common::chunks(&c, "/e").await[0]);
    assert_eq!(
        chunk.cap.len(),
        CAP_BYTES,
        "the masters sign every chunk they describe"
    );
    let read_cap = chunk.cap.clone();
    let st = cl.status().await.unwrap();
    let addr = &st
        .servers
        .iter()
        .find(|s| s.id == chunk.servers[0])
        .unwrap()
        .addr;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let read = |id| {
        let mut h = Header::request(Opcode::Read, 1, id);
        h.offset = 0;
        h.arg = 100;
        h
    };
    let append = |at| {
        let mut h = Header::request(Opcode::Append, 2, chunk.id);
        h.offset = at;
        h
    };
    let len = chunk.length;

    // Refused, each with a typed UNAUTHORIZED and a reason, on one connection that keeps
    // serving: no capability; a reader's capability for an append; rights widened by hand;
    // any byte changed; another chunk's capability; a chunk id the capability does not name.
    let (st1, _, why) = raw(&mut s, append(len), None, b"evil").await;
    assert_eq!(
        st1,
        Status::Unauthorized,
        "{}",
        String::from_utf8_lossy(&why)
    );
    let (st2, _, why) = raw(&mut s, append(len), Some(&read_cap), b"evil").await;
    assert_eq!(st2, Status::Unauthorized);
    assert!(
        String::from_utf8_lossy(&why).contains("rights"),
        "{}",
        String::from_utf8_lossy(&why)
    );
    let mut widened = read_cap.clone();
    widened[1] = cairn_proto::cap::ALL;
    let (st3, _, why) = raw(&mut s, append(len), Some(&widened), b"evil").await;
    assert_eq!(st3, Status::Unauthorized);
    assert!(String::from_utf8_lossy(&why).contains("signature"));
    for at in [0, 8, 16, 24, 28, 40, 63] {
        let mut forged = read_cap.clone();
        forged[at] ^= 0x40;
        let (st, _, _) = raw(&mut s, read(chunk.id), Some(&forged), b"").await;
        assert_eq!(st, Status::Unauthorized, "byte {at} changed");
    }
    let (st4, _, _) = raw(&mut s, read(chunk.id), Some(&other.cap), b"").await;
    assert_eq!(st4, Status::Unauthorized);
    let (st5, _, _) = raw(&mut s, read(other.id), Some(&read_cap), b"").await;
    assert_eq!(st5, Status::Unauthorized);
    let mut del = Header::request(Opcode::Delete, 3, chunk.id);
    del.arg = 0;
    let (st6, _, _) = raw(&mut s, del, Some(&read_cap), b"").await;
    assert_eq!(st6, Status::Unauthorized);
    // The same connection serves a valid request, and nothing changed on disk.
    let (ok, _, bytes) = raw(&mut s, read(chunk.id), Some(&read_cap), b"").await;
    assert_eq!(ok, Status::Ok);
    assert_eq!(bytes, data[..100]);
    let (ok, length, _) = raw(
        &mut s,
        Header::request(Opcode::Stat, 4, chunk.id),
        Some(&read_cap),
        b"",
    )
    .await;
    assert_eq!((ok, length), (Status::Ok, len));
    assert_eq!(c.read("/r", 0, data.len()).await.unwrap(), data);

    // A superseded writer: writer A opens /w and appends with its capability; writer B takes
    // the file over (A's lease released); B's first request raises the chunk's fence, and a
    // replay of A's capability is refused from then on.
    let mut w = c.create("/w", CreateOptions::default()).await.unwrap();
    w.append(b"x").await.unwrap();
    w.close().await.unwrap();
    let a = open_write(&c, "/w", "writer-a").await;
    let fa = a.file.unwrap();
    let ca = fa.chunks.last().unwrap().clone();
    let cap_a = Capability::decode(&ca.cap).unwrap();
    let addr_a = &a
        .servers
        .iter()
        .find(|s| s.id == ca.servers[0])
        .unwrap()
        .addr;
    let mut s = TcpStream::connect(addr_a).await.unwrap();
    let mut create = Header::request(Opcode::Create, 5, ca.id);
    create.arg = ca.version;
    let (okc, _, why) = raw(&mut s, create, Some(&ca.cap), b"a1").await;
    assert_eq!(okc, Status::Ok, "{}", String::from_utf8_lossy(&why));
    let release = pb::CommitRequest {
        path: "/w".into(),
        client_id: "writer-a".into(),
        release: true,
        ..Default::default()
    };
    c.masters()
        .send(release, |mut m, r| async move { m.commit(r).await })
        .await
        .unwrap();
    let b = open_write(&c, "/w", "writer-b").await;
    let cb = b
        .file
        .unwrap()
        .chunks
        .into_iter()
        .find(|x| x.id == ca.id)
        .expect("A's chunk is still the file's");
    let cap_b = Capability::decode(&cb.cap).unwrap();
    assert!(
        cap_b.claims.epoch > cap_a.claims.epoch,
        "a new writer, a newer epoch"
    );
    let mut ab = Header::request(Opcode::Append, 6, ca.id);
    ab.offset = 2;
    let (okb, _, why) = raw(&mut s, ab, Some(&cb.cap), b"b1").await;
    assert_eq!(okb, Status::Ok, "{}", String::from_utf8_lossy(&why));
    let mut aa = Header::request(Opcode::Append, 7, ca.id);
    aa.offset = 4;
    let (stale, _, why) = raw(&mut s, aa, Some(&ca.cap), b"a2").await;
    assert_eq!(stale, Status::Unauthorized);
    assert!(
        String::from_utf8_lossy(&why).contains("epoch"),
        "{}",
        String::from_utf8_lossy(&why)
    );
    let (_, length, _) = raw(
        &mut s,
        Header::request(Opcode::Stat, 8, ca.id),
        Some(&cb.cap),
        b"",
    )
    .await;
    assert_eq!(length, 4, "A's replayed append changed nothing");
}

/// `cairn admin rotate-key`: the new key signs once the chunkservers hold it, capabilities of
/// the key before it keep working (the overlap), those of the key it drops stop at once, and a
/// second rotation before the first has reached the chunkservers is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rotate_without_downtime() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start_with(dir.path(), 1, 3, &["--require-capabilities"]).await;
    let masters = cl.master_addrs().join(",");
    let c = cl.client().await;
    // The first key is made within a second of the leader's start; a rotation waits until
    // it is 5 s old (below).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let data = common::bytes(2, 0, 10_000);
    let mut w = c.create("/k", CreateOptions::default()).await.unwrap();
    w.append(&data).await.unwrap();
    w.close().await.unwrap();
    let first = common::chunks(&c, "/k").await[0].clone();
    let key_of = |cap: &[u8]| Capability::decode(cap).unwrap().key_id;
    let k1 = key_of(&first.cap);
    let rotate = || {
        common::cairn()
            .args(["admin", "--cluster", &masters, "rotate-key", "--json"])
            .output()
            .unwrap()
    };
    let out = rotate();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let k2 = r["key_id"].as_u64().unwrap() as u32;
    assert!(k2 > k1);
    assert_eq!(r["dropped"], 0, "two keys are kept");
    // Too soon: refused, nothing changes.
    let out = rotate();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("still reaching"));

    let st = cl.status().await.unwrap();
    let addr = st
        .servers
        .iter()
        .find(|s| s.id == first.servers[0])
        .unwrap()
        .addr
        .clone();
    let mut s = TcpStream::connect(&addr).await.unwrap();
    // Until the new key is active the old one signs; afterwards the new one does.
    assert_eq!(key_of(&common::chunks(&c, "/k").await[0].cap), k1);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let second = common::chunks(&c, "/k").await[0].clone();
    assert_eq!(key_of(&second.cap), k2);
    assert_eq!(
        stat(&mut s, first.id, &second.cap).await,
        Status::Ok,
        "the new key verifies"
    );
    assert_eq!(
        stat(&mut s, first.id, &first.cap).await,
        Status::Ok,
        "the old key still verifies (overlap)"
    );
    // A third key drops the first: its capabilities stop working once the servers hear.
    let out = rotate();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["dropped"], k1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        stat(&mut s, first.id, &first.cap).await,
        Status::Unauthorized
    );
    assert_eq!(stat(&mut s, first.id, &second.cap).await, Status::Ok);
    // The SDK goes on reading through all of it.
    assert_eq!(c.read("/k", 0, data.len()).await.unwrap(), data);
}

/// A chunkserver joins only with the cluster's secret, and only masters holding it can send
/// Raft messages: a process with a wrong secret or none cannot register or heartbeat, and a
/// raw Raft call without a valid proof is refused before it is read — while the cluster of
/// three masters (their Raft traffic signed) and three chunkservers serves files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_join_only_with_the_cluster_secret() {
    use cairn_rpc::auth::ClusterSecret;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("cluster.secret");
    ClusterSecret::generate().write_new(&secret).unwrap();
    let wrong = dir.path().join("wrong.secret");
    ClusterSecret::generate().write_new(&wrong).unwrap();
    let arg = secret.display().to_string();
    let flag = ["--cluster-secret-file", arg.as_str()];
    let cl = Cluster::start_full(dir.path(), 3, 3, &flag, &flag).await;
    let c = cl.client().await;
    let data = common::bytes(3, 0, 100_000);
    let mut w = c.create("/s", CreateOptions::default()).await.unwrap();
    w.append(&data).await.unwrap();
    w.close().await.unwrap();
    assert_eq!(c.read("/s", 0, data.len()).await.unwrap(), data);

    // Chunkservers with a wrong secret and with none: never registered.
    let masters = cl.master_addrs().join(",");
    let mut strays: Vec<common::Proc> = [Some(&wrong), None]
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let mut args: Vec<String> = [
                "chunkserver",
                "--data-dir",
                &dir.path().join(format!("stray-{i}")).display().to_string(),
                "--listen",
                "127.0.0.1:0",
                "--masters",
                &masters,
                "--disk-size",
                "256m",
                "--no-zero-fill",
                "--heartbeat-ms",
                "200",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if let Some(s) = s {
                args.extend(["--cluster-secret-file".into(), s.display().to_string()]);
            }
            common::Proc {
                name: format!("stray-{i}"),
                args,
                addr: String::new(),
                child: None,
            }
        })
        .collect();
    for p in &mut strays {
        p.start();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let st = cl.status().await.unwrap();
    assert_eq!(st.servers.len(), 3, "no stray registered: {:?}", st.servers);
    for p in &strays {
        assert!(st.servers.iter().all(|s| s.addr != p.addr));
    }

    // Raw calls: a heartbeat for a real server's id and a Raft vote, without a proof and
    // with another cluster's.
    let leader = &cl.master_addrs()[(cl.leader().await - 1) as usize];
    let other = ClusterSecret::generate();
    let id = st.servers[0].id;
    let mut meta = pb::meta_client::MetaClient::connect(format!("http://{leader}"))
        .await
        .unwrap();
    let hb = || pb::HeartbeatRequest {
        server_id: id,
        healthy: true,
        ..Default::default()
    };
    for req in [
        tonic::Request::new(hb()),
        other.sign(hb(), "heartbeat", &format!("chunkserver-{id}")),
    ] {
        let e = meta.heartbeat(req).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
    }
    for addr in cl.master_addrs() {
        let mut raft = pb::raft_client::RaftClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let msg = || pb::RaftMessage {
            kind: 2,
            body: b"{}".to_vec(),
        };
        for req in [
            tonic::Request::new(msg()),
            other.sign(msg(), "raft", "master-1"),
        ] {
            let e = raft.call(req).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{addr}: {e}");
        }
    }
    // The cluster never noticed.
    assert_eq!(c.read("/s", 0, data.len()).await.unwrap(), data);
    assert_eq!(cl.status().await.unwrap().servers.len(), 3);
}

/// Chunkservers close connections idle past `--idle-timeout-secs`; the SDK replaces such a
/// connection before it uses it, so a writer that pauses longer than that goes on in the same
/// chunk with every replica (nothing dropped, no switch) and readers read on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_closed_by_servers_are_replaced_unnoticed() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start_with(dir.path(), 1, 3, &["--idle-timeout-secs", "1"]).await;
    let c = cl.client().await;
    let mut w = c.create("/idle", CreateOptions::default()).await.unwrap();
    let (a, b) = (common::bytes(4, 0, 5_000), common::bytes(4, 5_000, 5_000));
    w.append(&a).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    w.append(&b).await.unwrap();
    let st = w.stats().clone();
    assert_eq!((st.dropped, st.switches), (0, 0), "{st:?}");
    w.close().await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let got = c.read("/idle", 0, 10_000).await.unwrap();
    assert_eq!(got, [a, b].concat());
    assert_eq!(common::chunks(&c, "/idle").await.len(), 1);
    // No server was taken for failed because it had closed an idle connection.
    let h = c.health_stats();
    assert_eq!(h.listed_failed, 0, "{h:?}");
    assert!(c.blacklisted().is_empty(), "{:?}", c.blacklisted());
}
