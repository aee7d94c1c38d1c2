//! Security end to end (docs/security.md): real master and chunkserver processes, which
//! check capabilities and credentials by default; the SDK writes and reads through them, a
//! raw TCP client
//! sending well-formed frames with missing, forged, narrowed, misdirected or superseded
//! capabilities is refused and changes nothing on disk.

mod common;
#[path = "../src/s3client.rs"]
#[allow(dead_code)]
mod s3client;

use cairn_client::{CreateOptions, Policy};
use cairn_proto::cap::{CAP_BYTES, Capability};
use cairn_proto::frame::{HEADER_BYTES, Header, Opcode, Status};
use cairn_rpc::pb;
use common::Cluster;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The idle-connection test times a pause against the servers' idle timeout: it runs alone
/// (the others share), so that the load of five clusters starting beside it does not move
/// the moment a server closes a connection onto the moment the writer uses it.
static QUIET: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

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
        continue_below: 0,
    };
    c.masters()
        .send(req, |mut m, r| async move { m.open_write(r).await })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunkservers_refuse_requests_without_a_valid_capability() {
    let _shared = QUIET.read().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 4).await;
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
    let _shared = QUIET.read().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
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
    // A writer open through the rotations, its capabilities signed with the first key (it
    // renews its lease too rarely here for a renewal to bring fresh ones first).
    let w = cl
        .client_with(cairn_client::ClientOptions {
            renew_every: Duration::from_secs(600),
            ..Default::default()
        })
        .await;
    let mut open = w.create("/open", CreateOptions::default()).await.unwrap();
    let head = common::bytes(3, 0, 50_000);
    open.append(&head).await.unwrap();
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
    // Until the new key is active the old one signs; afterwards the new one does.
    assert_eq!(key_of(&common::chunks(&c, "/k").await[0].cap), k1);
    tokio::time::sleep(Duration::from_secs(6)).await;
    // Connected now: a connection must show a valid capability within 2 s of its accept.
    let mut s = TcpStream::connect(&addr).await.unwrap();
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
    // The open writer's capabilities (first key) are refused now. A reader in the same
    // process brings read-only ones (new key) for the same chunk; the writer neither takes
    // those nor gives up its replicas: it asks the masters for fresh ones and goes on in the
    // same chunk, nothing sealed short (RELIABILITY.md, 2026-11-28).
    assert_eq!(w.read("/open", 0, head.len()).await.unwrap(), head);
    let tail = common::bytes(3, head.len() as u64, 50_000);
    open.append(&tail).await.unwrap();
    let stats = open.stats().clone();
    assert_eq!(open.close().await.unwrap(), 100_000);
    assert_eq!(
        (stats.switches, stats.dropped, stats.rewritten),
        (0, 0, 0),
        "{stats:?}"
    );
    assert_eq!(
        c.read("/open", 0, 100_000).await.unwrap(),
        common::bytes(3, 0, 100_000)
    );
    assert_eq!(common::chunks(&c, "/open").await[0].length, 100_000);
}

/// A chunkserver that has not heard from the masters since it started holds no keys: it
/// answers NOT_READY (retried by clients like a lost connection), not UNAUTHORIZED (which a
/// client acts on: a refused capability is forgotten or refreshed), until its first
/// heartbeat reply brings them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_chunkserver_is_not_ready_until_it_has_its_keys() {
    let _shared = QUIET.read().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cl = Cluster::start(dir.path(), 1, 3).await;
    let c = cl.client().await;
    let data = common::bytes(4, 0, 20_000);
    let mut w = c.create("/r", CreateOptions::default()).await.unwrap();
    w.append(&data).await.unwrap();
    w.close().await.unwrap();
    let chunk = common::chunks(&c, "/r").await[0].clone();
    let i = cl.index_of(chunk.servers[0]).await;
    cl.masters[0].kill();
    cl.chunkservers[i].kill();
    cl.chunkservers[i].start();
    let mut s = TcpStream::connect(&cl.chunkservers[i].addr).await.unwrap();
    let (st, _, why) = raw(
        &mut s,
        Header::request(Opcode::Stat, 1, chunk.id),
        Some(&chunk.cap),
        b"",
    )
    .await;
    assert_eq!(st, Status::NotReady, "{}", String::from_utf8_lossy(&why));
    cl.masters[0].start();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut s = TcpStream::connect(&cl.chunkservers[i].addr).await.unwrap();
        match stat(&mut s, chunk.id, &chunk.cap).await {
            Status::Ok => break,
            Status::NotReady if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            st => panic!("{st:?} after the masters came back"),
        }
    }
    assert_eq!(c.read("/r", 0, data.len()).await.unwrap(), data);
}

/// A chunkserver joins only with the cluster's secret, and only masters holding it can send
/// Raft messages: a process with a wrong secret or none cannot register or heartbeat, and a
/// raw Raft call without a valid proof is refused before it is read — while the cluster of
/// three masters (their Raft traffic signed) and three chunkservers serves files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_join_only_with_the_cluster_secret() {
    let _shared = QUIET.read().await;
    use cairn_rpc::auth::{ClusterSecret, Credential};
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong.secret");
    ClusterSecret::generate().write_new(&wrong).unwrap();
    let cl = Cluster::start(dir.path(), 3, 3).await;
    let c = cl.client().await;
    let data = common::bytes(3, 0, 100_000);
    let mut w = c.create("/s", CreateOptions::default()).await.unwrap();
    w.append(&data).await.unwrap();
    w.close().await.unwrap();
    assert_eq!(c.read("/s", 0, data.len()).await.unwrap(), data);

    // Chunkservers with a wrong secret and with none (`--insecure`): never registered.
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
            match s {
                Some(s) => args.extend(["--cluster-secret-file".into(), s.display().to_string()]),
                None => args.push("--insecure".into()),
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
    let other = |who: &str| Credential::Server {
        secret: ClusterSecret::generate(),
        who: who.into(),
    };
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
        other(&format!("chunkserver-{id}")).sign(hb(), "Heartbeat"),
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
            group: 0,
        };
        for req in [
            tonic::Request::new(msg()),
            other("master-1").sign(msg(), "raft"),
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
    let _alone = QUIET.write().await;
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

/// The kind of a control-plane refusal the SDK passed on.
fn meta_kind<T>(r: Result<T, cairn_client::Error>) -> cairn_rpc::ErrorKind {
    match r {
        Err(cairn_client::Error::Meta(e)) => e.kind,
        Err(e) => panic!("expected a masters' refusal, got {e}"),
        Ok(_) => panic!("expected a masters' refusal, got success"),
    }
}

/// Users prove their keys on every call to the masters; files and directories have owners
/// and permission bits the masters check (also for a chunk looked up by id); operators' calls
/// need an admin; a call without credentials, with a wrong key, or replayed is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_are_authenticated_and_permission_bits_hold() {
    let _shared = QUIET.read().await;
    use cairn_rpc::ErrorKind as K;
    use cairn_rpc::auth::Credential;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let root = cl.client().await;
    let masters = cl.master_addrs();
    let as_user = |k: &common::Keys| Credential::User {
        access_key: k.access.clone(),
        secret_key: k.secret.clone(),
    };
    let client = |cred: Option<Credential>| {
        let masters = masters.clone();
        async move {
            cairn_client::Client::with_options(
                &masters,
                cairn_client::ClientOptions {
                    credential: cred,
                    retry_for: Duration::from_secs(3),
                    ..Default::default()
                },
            )
            .await
            .unwrap()
        }
    };

    // No credentials, a wrong secret key, an unknown access key: Unauthenticated.
    let alice_keys = common::create_user(&masters, "alice");
    let bob_keys = common::create_user(&masters, "bob");
    let nobody = client(None).await;
    assert_eq!(meta_kind(nobody.stat("/").await), K::Unauthenticated);
    let forged = client(Some(Credential::User {
        access_key: alice_keys.access.clone(),
        secret_key: "not-her-secret".into(),
    }))
    .await;
    assert_eq!(meta_kind(forged.list("/").await), K::Unauthenticated);
    let stranger = client(Some(Credential::User {
        access_key: "CKNOSUCHKEY".into(),
        secret_key: alice_keys.secret.clone(),
    }))
    .await;
    assert_eq!(
        meta_kind(stranger.create("/x", CreateOptions::default()).await),
        K::Unauthenticated
    );

    let alice = client(Some(as_user(&alice_keys))).await;
    let bob = client(Some(as_user(&bob_keys))).await;
    // The root is the cluster's (0755): users read it, cannot write it.
    alice.list("/").await.unwrap();
    assert_eq!(
        meta_kind(alice.create("/mine", CreateOptions::default()).await),
        K::PermissionDenied
    );
    assert_eq!(
        meta_kind(alice.mkdir("/home", false).await),
        K::PermissionDenied
    );
    // An admin (the cluster secret here) makes her a home and gives it to her.
    root.mkdir("/home/alice", true).await.unwrap();
    root.set_attr("/home/alice", None, Some("alice"))
        .await
        .unwrap();
    let data = common::bytes(9, 0, 50_000);
    let mut w = alice
        .create("/home/alice/notes", CreateOptions::default())
        .await
        .unwrap();
    w.append(&data).await.unwrap();
    w.close().await.unwrap();
    let st = alice.stat("/home/alice/notes").await.unwrap();
    assert_eq!((st.owner.as_str(), st.mode), ("alice", 0o644));

    // Bob reads a 0644 file; cannot append to it, delete it, change its mode or owner.
    assert_eq!(
        bob.read("/home/alice/notes", 0, data.len()).await.unwrap(),
        data
    );
    assert_eq!(
        meta_kind(bob.open_append("/home/alice/notes").await),
        K::PermissionDenied
    );
    assert_eq!(
        meta_kind(bob.delete("/home/alice/notes").await),
        K::PermissionDenied
    );
    assert_eq!(
        meta_kind(bob.set_attr("/home/alice/notes", Some(0o666), None).await),
        K::PermissionDenied
    );
    assert_eq!(
        meta_kind(
            alice
                .set_attr("/home/alice/notes", None, Some("alice"))
                .await
        ),
        K::PermissionDenied,
        "only admins change owners"
    );
    assert_eq!(
        meta_kind(
            bob.create("/home/alice/bobs", CreateOptions::default())
                .await
        ),
        K::PermissionDenied
    );
    // 0600: bob can neither stat it for reading nor locate its chunks by id.
    alice
        .set_attr("/home/alice/notes", Some(0o600), None)
        .await
        .unwrap();
    let fresh_bob = client(Some(as_user(&bob_keys))).await;
    assert_eq!(
        meta_kind(fresh_bob.read("/home/alice/notes", 0, 10).await),
        K::PermissionDenied
    );
    let ids: Vec<u64> = common::chunks(&root, "/home/alice/notes")
        .await
        .iter()
        .map(|c| c.id)
        .collect();
    let locate = async |c: &cairn_client::Client| {
        c.masters()
            .send(
                pb::LocateRequest {
                    chunk_ids: ids.clone(),
                },
                |mut m, r| async move { m.locate(r).await },
            )
            .await
    };
    assert_eq!(locate(&bob).await.unwrap_err().kind, K::PermissionDenied);
    assert!(
        locate(&alice)
            .await
            .unwrap()
            .chunks
            .iter()
            .all(|c| !c.cap.is_empty())
    );
    // A private directory (0700) hides even the way through it.
    alice
        .mkdir_with("/home/alice/private", false, None, Some(0o700))
        .await
        .unwrap();
    let mut w = alice
        .create(
            "/home/alice/private/diary",
            CreateOptions {
                mode: Some(0o644),
                ..CreateOptions::default()
            },
        )
        .await
        .unwrap();
    w.append(b"dear diary").await.unwrap();
    w.close().await.unwrap();
    assert_eq!(
        meta_kind(bob.list("/home/alice/private").await),
        K::PermissionDenied
    );
    assert_eq!(
        meta_kind(bob.read("/home/alice/private/diary", 0, 4).await),
        K::PermissionDenied
    );
    // Alice renames within her home; bob cannot move her files out.
    alice
        .rename("/home/alice/private/diary", "/home/alice/diary")
        .await
        .unwrap();
    assert_eq!(
        meta_kind(bob.rename("/home/alice/diary", "/tmp-diary").await),
        K::PermissionDenied
    );

    // Operators' calls and the object index need an admin.
    let e = alice
        .masters()
        .call(|mut c| async move { c.rotate_key(pb::Empty {}).await })
        .await
        .unwrap_err();
    assert_eq!(e.kind, K::PermissionDenied);
    let q = cairn_rpc::object::ObjectQuery::User {
        access_key: bob_keys.access.clone(),
    };
    assert_eq!(
        alice.masters().object_query(&q).await.unwrap_err().kind,
        K::PermissionDenied,
        "users never read others' keys"
    );
    // ... and an admin user passes: `cairn user create --admin --save`, then the CLI with it.
    let carol_file = dir.path().join("carol.credentials");
    common::run_ok(common::cairn().args([
        "user",
        "create",
        "carol",
        "--admin",
        "--save",
        &carol_file.display().to_string(),
        "--cluster",
        &masters.join(","),
    ]));
    let alice_file = dir.path().join("alice.credentials");
    Credential::write_new(&alice_file, "alice", &alice_keys.access, &alice_keys.secret).unwrap();
    let admin_cli = |file: &std::path::Path, args: &[&str]| {
        common::cairn()
            .env_remove("CAIRN_CLUSTER_SECRET_FILE")
            .args(args)
            .args(["--cluster", &masters.join(","), "--credentials"])
            .arg(file)
            .output()
            .unwrap()
    };
    let out = admin_cli(&alice_file, &["user", "create", "mallory"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("admin"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = admin_cli(&carol_file, &["admin", "set", "repair-bandwidth", "50m"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = admin_cli(&alice_file, &["admin", "set", "repair-bandwidth", "60m"]);
    assert!(!out.status.success());
    // Without any credential the CLI is refused and says what to do.
    let out = common::cairn()
        .env_remove("CAIRN_CLUSTER_SECRET_FILE")
        .current_dir(dir.path())
        .args(["status", "--cluster", &masters.join(",")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("credentials"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A proof is good once: the same call replayed is refused.
    let leader = &masters[(cl.leader().await - 1) as usize];
    let mut raw = pb::meta_client::MetaClient::connect(format!("http://{leader}"))
        .await
        .unwrap();
    let signed = as_user(&alice_keys).sign(
        pb::PathRequest {
            path: "/home/alice".into(),
        },
        "Stat",
    );
    let header = signed
        .metadata()
        .get(cairn_rpc::auth::USER_AUTH_METADATA)
        .unwrap()
        .clone();
    raw.stat(signed).await.unwrap();
    let mut again = tonic::Request::new(pb::PathRequest {
        path: "/home/alice".into(),
    });
    again
        .metadata_mut()
        .insert(cairn_rpc::auth::USER_AUTH_METADATA, header.clone());
    let e = raw.stat(again).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
    assert!(e.message().contains("replayed"), "{e}");
    // A proof for one call does not open another.
    let mut other = tonic::Request::new(pb::PathRequest {
        path: "/home/alice/notes".into(),
    });
    other
        .metadata_mut()
        .insert(cairn_rpc::auth::USER_AUTH_METADATA, header);
    let e = raw.delete(other).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
    // A call changed in flight (same method, same proof, another body: as an attacker in
    // the path without TLS would) is refused; the body signed goes through.
    let set = |mode: u32| pb::SetAttrRequest {
        path: "/home/alice/notes".into(),
        mode: Some(mode),
        owner: None,
    };
    let signed = as_user(&alice_keys).sign(set(0o640), "SetAttr");
    let mut changed = tonic::Request::new(set(0o666));
    *changed.metadata_mut() = signed.metadata().clone();
    let e = raw.set_attr(changed).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
    assert!(e.message().contains("body changed"), "{e}");
    raw.set_attr(signed).await.unwrap();
    assert_eq!(alice.stat("/home/alice/notes").await.unwrap().mode, 0o640);
    // Everything alice wrote is there.
    assert_eq!(
        root.read("/home/alice/notes", 0, data.len()).await.unwrap(),
        data
    );
}

/// The control plane over TLS (`cairn tls init`, `--tls-dir`): three masters (their Raft
/// traffic TLS too) and three chunkservers (heartbeats, which carry the capability keys, over
/// TLS) serve files; a client or CLI that talks plain TCP, or checks with another CA, gets
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_the_control_and_data_planes() {
    let _shared = QUIET.read().await;
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    common::run_ok(common::cairn().args(["tls", "init"]).arg(&tls));
    for (f, mode) in [
        ("ca.pem", 0o644),
        ("node.pem", 0o644),
        ("node.key", 0o600),
        ("ca.key", 0o600),
    ] {
        use std::os::unix::fs::PermissionsExt;
        let m = std::fs::metadata(tls.join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(m, mode, "{f}");
    }
    let t = tls.display().to_string();
    let flag = ["--tls-dir", t.as_str()];
    let cs_flags = ["--tls-dir", t.as_str(), "--data-tls"];
    let cl = Cluster::start_full(dir.path(), 3, 4, &flag, &cs_flags).await;
    let c = cl.client().await;
    let data = common::bytes(5, 0, 200_000);
    let mut w = c.create("/tls", CreateOptions::default()).await.unwrap();
    w.append(&data).await.unwrap();
    w.close().await.unwrap();
    assert_eq!(c.read("/tls", 0, data.len()).await.unwrap(), data);

    // The data plane: a client that dials chunkservers in plain TCP reads nothing; a raw
    // frame in plain TCP is answered by a closed connection; TLS checked with another
    // cluster's CA fails its handshake.
    let plain_data = cairn_client::Client::with_options(
        &cl.master_addrs(),
        cairn_client::ClientOptions {
            credential: Some(common::credential()),
            tls: cl.tls_config(),
            retry_for: Duration::from_secs(2),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(
        plain_data.stat("/tls").await.is_ok(),
        "the control plane answers"
    );
    assert!(plain_data.read("/tls", 0, 10).await.is_err());
    let cs_addr: std::net::SocketAddr = cl.chunkservers[0].addr.parse().unwrap();
    let mut s = TcpStream::connect(cs_addr).await.unwrap();
    let h = Header::request(Opcode::Read, 1, 1);
    s.write_all(&h.encode()).await.unwrap();
    let mut buf = [0u8; 1];
    assert!(
        matches!(s.read(&mut buf).await, Ok(0) | Err(_)),
        "a plain frame got a reply from a TLS port"
    );

    // Plain TCP, and TLS checked with another cluster's CA: refused.
    let other = dir.path().join("other");
    common::run_ok(common::cairn().args(["tls", "init"]).arg(&other));
    for tls in [None, Some(cairn_rpc::tls::client_config(&other).unwrap())] {
        let plain = cairn_client::Client::with_options(
            &cl.master_addrs(),
            cairn_client::ClientOptions {
                credential: Some(common::credential()),
                tls,
                retry_for: Duration::from_secs(2),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        assert!(plain.stat("/tls").await.is_err());
    }
    let other_ca = cairn_rpc::tls::data::connector(&other).unwrap();
    match cairn_client::DataConn::connect_with(
        cs_addr,
        Duration::from_secs(5),
        None,
        Some(&other_ca),
    )
    .await
    {
        Err(cairn_client::DataError::Connect { message, .. }) => {
            assert!(message.contains("TLS"), "{message}")
        }
        Err(e) => panic!("another CA's client: {e}"),
        Ok(_) => panic!("another CA's client connected"),
    }
    // The CLI with CAIRN_TLS_DIR, and without.
    let masters = cl.master_addrs().join(",");
    let out = common::cairn()
        .env("CAIRN_TLS_DIR", &tls)
        .args(["fs", "stat", "/tls", "--cluster", &masters])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = common::cairn()
        .args(["status", "--cluster", &masters])
        .output()
        .unwrap();
    assert!(!out.status.success());
    // A leader change goes over TLS Raft: kill the leader, the others elect and serve.
    let mut cl = cl;
    let leader = cl.leader().await as usize;
    cl.masters[leader - 1].kill();
    assert_eq!(c.read("/tls", 0, data.len()).await.unwrap(), data);
    let mut w = c.create("/tls2", CreateOptions::default()).await.unwrap();
    w.append(b"after the election").await.unwrap();
    w.close().await.unwrap();
    // Repair between chunkservers goes over TLS: a killed server's copies are made again.
    let victim_id = common::chunks(&c, "/tls").await[0].servers[0];
    let victim = cl.index_of(victim_id).await;
    cl.chunkservers[victim].kill();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let list = common::chunks(&c, "/tls").await;
        if list
            .iter()
            .all(|ch| ch.servers.len() == 3 && !ch.servers.contains(&victim_id))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not re-replicated over TLS: {list:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cl.wait_fully_replicated(Duration::from_secs(60)).await;
    assert_eq!(c.read("/tls", 0, data.len()).await.unwrap(), data);
}

/// Every file and directory under `dir` with its mode, and whether its bytes contain any of
/// `needles` (the first found).
fn scan_tree(
    dir: &std::path::Path,
    needles: &[&str],
) -> Vec<(std::path::PathBuf, u32, Option<String>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(p) = todo.pop() {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        let mode = meta.permissions().mode() & 0o777;
        if meta.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                todo.push(e.unwrap().path());
            }
            out.push((p, mode, None));
        } else if meta.is_file() {
            let bytes = std::fs::read(&p).unwrap();
            let found = needles
                .iter()
                .find(|n| bytes.windows(n.len()).any(|w| w == n.as_bytes()))
                .map(|n| n.to_string());
            out.push((p, mode, found));
        }
    }
    out
}

/// Section 2 of issue 38: after users are made, used, given new keys and their cluster
/// snapshotted, no file under the servers' data directories holds a user's secret key, and
/// every file and directory there is the servers' user's alone (0600 / 0700); a data directory
/// left open by an older version is closed when its server starts.
#[tokio::test(flavor = "multi_thread")]
async fn no_secret_at_rest_and_nothing_readable_by_others() {
    let _shared = QUIET.read().await;
    let dir = tempfile::tempdir().unwrap();
    // Snapshots every 20 entries: the workload below is snapshotted (into master.redb) too.
    let mut cl = Cluster::start_full(dir.path(), 3, 3, &["--snapshot-every", "20"], &[]).await;
    let masters = cl.master_addrs();
    let alice = common::create_user(&masters, "alice");
    let bob_old = common::create_user(&masters, "bob");
    let out = common::run_ok(common::cairn().args([
        "user",
        "rotate-key",
        "bob",
        "--json",
        "--cluster",
        &masters.join(","),
    ]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let bob = common::Keys {
        access: v["access_key"].as_str().unwrap().to_owned(),
        secret: v["secret_key"].as_str().unwrap().to_owned(),
    };
    let root = cl.client().await;
    for (name, keys) in [("alice", &alice), ("bob", &bob)] {
        root.mkdir(&format!("/home/{name}"), true).await.unwrap();
        root.set_attr(&format!("/home/{name}"), None, Some(name))
            .await
            .unwrap();
        let c = cairn_client::Client::with_options(
            &masters,
            cairn_client::ClientOptions {
                credential: Some(cairn_rpc::auth::Credential::User {
                    access_key: keys.access.clone(),
                    secret_key: keys.secret.clone(),
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        for i in 0..15 {
            let path = format!("/home/{name}/f{i}");
            let mut w = c.create(&path, CreateOptions::default()).await.unwrap();
            w.append(b"some data").await.unwrap();
            w.close().await.unwrap();
            assert_eq!(c.read(&path, 0, 9).await.unwrap(), b"some data");
        }
    }
    // The S3 gateway checks SigV4 with the secret the masters open for it.
    let gw = common::gateway(&masters, "127.0.0.1:0");
    let s3 = s3client::S3Bucket::new(
        &format!("http://{}", gw.addr),
        "alices",
        &alice.access,
        &alice.secret,
        2,
    )
    .unwrap();
    s3.create_bucket().await.unwrap();
    s3.put("k", bytes::Bytes::from_static(b"object"))
        .await
        .unwrap();
    assert_eq!(&s3.get("k").await.unwrap()[..], b"object");
    let forged = s3client::S3Bucket::new(
        &format!("http://{}", gw.addr),
        "alices",
        &alice.access,
        &bob.secret,
        2,
    )
    .unwrap();
    assert!(
        forged.get("k").await.is_err(),
        "a wrong secret was accepted"
    );
    drop(gw);
    // Stopped, so that every write has reached its file.
    for p in cl.masters.iter_mut().chain(cl.chunkservers.iter_mut()) {
        p.stop();
    }

    let secrets = [
        alice.secret.as_str(),
        bob.secret.as_str(),
        bob_old.secret.as_str(),
    ];
    let files = scan_tree(dir.path(), &secrets);
    let mut open = Vec::new();
    for (p, mode, found) in &files {
        assert!(found.is_none(), "{} holds a user's secret key", p.display());
        // The test's temporary directory itself is the test's.
        if p != dir.path() && mode & 0o077 != 0 {
            open.push(format!("{} {mode:o}", p.display()));
        }
    }
    assert!(open.is_empty(), "readable by others: {open:?}");
    // Canary: the scan reads the files the users are kept in (their access keys are not
    // secret, and are there in plain text), the Raft log and the snapshots among them.
    let access = [alice.access.as_str()];
    let holding: Vec<_> = scan_tree(&dir.path().join("master-1"), &access)
        .into_iter()
        .filter(|(_, _, f)| f.is_some())
        .map(|(p, _, _)| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(
        holding.iter().any(|f| f.ends_with(".wal")) && holding.iter().any(|f| f == "master.redb"),
        "the scan did not find the users where they are kept: {holding:?}"
    );

    // A data directory an older version left open is closed on start.
    use std::os::unix::fs::PermissionsExt;
    let m1 = dir.path().join("master-1");
    std::fs::set_permissions(&m1, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        m1.join("master.redb"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    cl.masters[0].start();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while mode(&m1) != 0o700 || mode(&m1.join("master.redb")) != 0o600 {
        assert!(std::time::Instant::now() < deadline, "not closed on start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
