//! Revoking capabilities already handed out (docs/security.md, "Revocation"): after a
//! `chmod` that clears bits, a `chown` or a user's deletion, the capabilities that change
//! took away stop working at the chunkservers within 5 s (a heartbeat), not when they expire
//! an hour later; the owner's and the servers' keep working, and a widening `chmod` revokes
//! nothing. Real master and chunkserver processes; a raw client sends STATs with the
//! capabilities each user was given.

mod common;

use cairn_client::CreateOptions;
use cairn_proto::cap::CAP_BYTES;
use cairn_proto::frame::{HEADER_BYTES, Header, Opcode, Status};
use cairn_rpc::auth::Credential;
use common::Cluster;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A STAT of `chunk` with `cap` on a raw connection: the status and the reply's message.
async fn stat(s: &mut TcpStream, chunk: u64, cap: &[u8]) -> (Status, String) {
    let mut h = Header::request(Opcode::Stat, 1, chunk).with_payload(b"");
    h.cap_len = CAP_BYTES as u16;
    s.write_all(&h.encode()).await.unwrap();
    s.write_all(cap).await.unwrap();
    let mut hb = [0u8; HEADER_BYTES];
    s.read_exact(&mut hb).await.unwrap();
    let rh = Header::decode(&hb).unwrap();
    let mut body = vec![0u8; rh.length as usize];
    s.read_exact(&mut body).await.unwrap();
    (
        rh.status().unwrap(),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// How long until `cap` is refused as revoked (polling every 100 ms, at most 15 s).
async fn until_revoked(s: &mut TcpStream, chunk: u64, cap: &[u8], since: Instant) -> Duration {
    loop {
        match stat(s, chunk, cap).await {
            (Status::Ok, _) => {}
            (Status::Unauthorized, why) => {
                assert!(
                    why.contains("revoked"),
                    "refused, but not as revoked: {why}"
                );
                return since.elapsed();
            }
            other => panic!("STAT answered {other:?}"),
        }
        assert!(
            since.elapsed() < Duration::from_secs(15),
            "the capability still works 15 s after the change"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn works(s: &mut TcpStream, chunk: u64, cap: &[u8], who: &str) {
    let (st, why) = stat(s, chunk, cap).await;
    assert_eq!(st, Status::Ok, "{who}'s capability: {why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_change_takes_away_stops_working_within_five_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let root = cl.client().await;
    let masters = cl.master_addrs();
    // The leader makes the first key within a scan (1 s); the servers hear of it next.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let client = |name: &str| {
        let (masters, keys) = (masters.clone(), common::create_user(&masters, name));
        async move {
            cairn_client::Client::with_options(
                &masters,
                cairn_client::ClientOptions {
                    credential: Some(Credential::User {
                        access_key: keys.access,
                        secret_key: keys.secret,
                    }),
                    retry_for: Duration::from_secs(3),
                    ..Default::default()
                },
            )
            .await
            .unwrap()
        }
    };
    let (alice, bob, carol, dave) = (
        client("alice").await,
        client("bob").await,
        client("carol").await,
        client("dave").await,
    );
    root.mkdir("/home/alice", true).await.unwrap();
    root.set_attr("/home/alice", None, Some("alice"))
        .await
        .unwrap();
    let data = common::bytes(3, 0, 40_000);
    for path in ["/home/alice/notes", "/home/alice/diary"] {
        let mut w = alice.create(path, CreateOptions::default()).await.unwrap();
        w.append(&data).await.unwrap();
        w.close().await.unwrap();
    }
    let chunk = common::chunks(&root, "/home/alice/notes").await[0].clone();
    let addr = cl
        .status()
        .await
        .unwrap()
        .servers
        .iter()
        .find(|s| s.id == chunk.servers[0])
        .unwrap()
        .addr
        .clone();
    let mut s = TcpStream::connect(&addr).await.unwrap();
    let cap_of = async |c: &cairn_client::Client, path: &str| {
        let cs = common::chunks(c, path).await;
        assert_eq!(cs[0].id, chunk.id);
        cs[0].cap.clone()
    };
    let mut took = Vec::new();

    // 1. chmod 0600 by the owner: bob's capability stops; alice's (the owner) and the
    //    cluster's (a server's: never revoked) keep working. Bob's client, which read the
    //    file before, now gets PermissionDenied (it forgets the refused capability and
    //    looks the chunk up again).
    assert_eq!(
        bob.read("/home/alice/notes", 0, 100).await.unwrap(),
        data[..100]
    );
    let (bob_cap, alice_cap, root_cap) = (
        cap_of(&bob, "/home/alice/notes").await,
        cap_of(&alice, "/home/alice/notes").await,
        cap_of(&root, "/home/alice/notes").await,
    );
    works(&mut s, chunk.id, &bob_cap, "bob").await;
    let t = Instant::now();
    alice
        .set_attr("/home/alice/notes", Some(0o600), None)
        .await
        .unwrap();
    took.push(until_revoked(&mut s, chunk.id, &bob_cap, t).await);
    works(&mut s, chunk.id, &alice_cap, "alice (the owner)").await;
    works(&mut s, chunk.id, &root_cap, "the cluster").await;
    let e = bob.read("/home/alice/notes", 0, 100).await.unwrap_err();
    assert!(
        e.to_string().contains("ermission"),
        "bob's client after the chmod: {e}"
    );

    // 2. A chmod that clears no bit revokes nothing: bob's fresh capability keeps working.
    alice
        .set_attr("/home/alice/notes", Some(0o644), None)
        .await
        .unwrap();
    let bob_cap = cap_of(&bob, "/home/alice/notes").await;
    alice
        .set_attr("/home/alice/notes", Some(0o664), None)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    works(&mut s, chunk.id, &bob_cap, "bob, after a widening chmod").await;

    // 3. chown to carol: the old owner's capability stops, the new owner's does not.
    let (alice_cap, carol_cap) = (
        cap_of(&alice, "/home/alice/notes").await,
        cap_of(&carol, "/home/alice/notes").await,
    );
    let t = Instant::now();
    root.set_attr("/home/alice/notes", None, Some("carol"))
        .await
        .unwrap();
    took.push(until_revoked(&mut s, chunk.id, &alice_cap, t).await);
    works(&mut s, chunk.id, &carol_cap, "carol (the new owner)").await;

    // 4. A directory's chmod revokes on every file below it, its owner's included.
    let carol_cap = cap_of(&carol, "/home/alice/notes").await;
    let t = Instant::now();
    alice
        .set_attr("/home/alice", Some(0o700), None)
        .await
        .unwrap();
    took.push(until_revoked(&mut s, chunk.id, &carol_cap, t).await);
    alice
        .set_attr("/home/alice", Some(0o755), None)
        .await
        .unwrap();

    // 5. A deleted user's capabilities stop everywhere; another user's do not.
    let (dave_cap, bob_cap) = (
        cap_of(&dave, "/home/alice/notes").await,
        cap_of(&bob, "/home/alice/notes").await,
    );
    let t = Instant::now();
    common::run_ok(common::cairn().args([
        "s3",
        "user",
        "delete",
        "dave",
        "--cluster",
        &masters.join(","),
    ]));
    took.push(until_revoked(&mut s, chunk.id, &dave_cap, t).await);
    works(&mut s, chunk.id, &bob_cap, "bob, after dave's deletion").await;

    // A chunkserver restarted learns every revocation again in its first heartbeat (with
    // the keys: once bob's capability works again, dave's must be refused).
    drop(s);
    let mut cl = cl;
    let p = cl
        .chunkservers
        .iter_mut()
        .find(|p| p.addr == addr)
        .expect("the chunk's first server");
    p.kill();
    p.start();
    let t = Instant::now();
    let mut s = loop {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the server did not come back"
        );
        if let Ok(mut s) = TcpStream::connect(&addr).await
            && stat(&mut s, chunk.id, &bob_cap).await.0 == Status::Ok
        {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (st, why) = stat(&mut s, chunk.id, &dave_cap).await;
    assert_eq!(st, Status::Unauthorized, "dave after the restart: {why}");
    assert!(why.contains("revoked"), "{why}");

    eprintln!("revoked after {took:?}");
    for (i, d) in took.iter().enumerate() {
        assert!(
            *d <= Duration::from_secs(5),
            "change {i}: revoked after {d:?}"
        );
    }
}
