//! The S3 gateway end to end: real `cairn` processes, real S3 clients (boto3 and the aws CLI,
//! installed into a virtualenv by scripts/test.sh), real crashes.

mod common;

use common::{Cluster, Keys, Proc, cairn, create_user, gateway, gateway_with, run_ok};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The Python with boto3 and the aws CLI: `CAIRN_TEST_PYTHON` (scripts/test.sh sets it to its
/// virtualenv), else `python3`. A missing boto3 fails the test: it never passes by skipping.
fn python() -> String {
    let py = std::env::var("CAIRN_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .args(["-c", "import boto3, botocore"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{py} cannot import boto3: run the tests through ./scripts/test.sh, which installs it"
    );
    py
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/s3")
        .join(name)
}

fn python_cmd(gw: &Proc, a: &Keys, dir: &Path) -> Command {
    let mut c = Command::new(python());
    c.env("S3_ENDPOINT", format!("http://{}", gw.addr))
        .env("S3_A_KEY", &a.access)
        .env("S3_A_SECRET", &a.secret)
        .env("S3_TMP", dir)
        .env("PYTHONUNBUFFERED", "1");
    c
}

/// Runs test script `name` in `mode` against the gateway as `a`; its stdout. Fails the test
/// with both outputs when the script fails.
fn run_script(gw: &Proc, a: &Keys, dir: &Path, name: &str, mode: &str) -> String {
    let out = python_cmd(gw, a, dir)
        .arg(script(name))
        .arg(mode)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} {mode}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The number in "s3 flows: N passed, 0 failed".
fn passed(stdout: &str) -> usize {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("s3 flows: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn s3_flows_with_real_clients() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 1, 3).await;
    let masters = cluster.master_addrs();
    let gw = gateway(&masters, "127.0.0.1:0");
    let alice = create_user(&masters, "alice");
    let bob = create_user(&masters, "bob");
    // The gateway's files are closed to users of the file API: S3 is the only way in.
    let as_bob = cluster
        .client_with(cairn_client::ClientOptions {
            credential: Some(cairn_rpc::auth::Credential::User {
                access_key: bob.access.clone(),
                secret_key: bob.secret.clone(),
            }),
            ..Default::default()
        })
        .await;
    let st = cluster.client().await.stat("/.s3").await.unwrap();
    assert_eq!((st.owner.as_str(), st.mode), ("", 0o700));
    match as_bob.list("/.s3/packs").await {
        Err(cairn_client::Error::Meta(e)) => {
            assert_eq!(e.kind, cairn_rpc::ErrorKind::PermissionDenied)
        }
        other => panic!(
            "bob listed the gateway's packs: {:?}",
            other.map(|v| v.len())
        ),
    }
    // A name is taken once.
    let again = cairn()
        .args([
            "s3",
            "user",
            "create",
            "alice",
            "--cluster",
            &masters.join(","),
        ])
        .output()
        .unwrap();
    assert!(!again.status.success());
    let out = python_cmd(&gw, &alice, dir.path())
        .env("S3_B_KEY", &bob.access)
        .env("S3_B_SECRET", &bob.secret)
        .arg(script("flows.py"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "flows.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Canary: the script ran its checks (not an early, silent exit 0).
    assert!(passed(&stdout) >= 90, "too few checks ran: {stdout}");
}

/// SIGKILL of the gateway during PUTs: every PUT that returned 200 is there afterwards with
/// its ETag, and nothing partial is visible.
#[tokio::test(flavor = "multi_thread")]
async fn s3_gateway_sigkill_keeps_every_acknowledged_put() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 1, 3).await;
    let masters = cluster.master_addrs();
    let mut gw = gateway(&masters, "127.0.0.1:0");
    let alice = create_user(&masters, "alice");
    let acks = dir.path().join("acks");
    let mut writer = python_cmd(&gw, &alice, dir.path())
        .arg(script("crash.py"))
        .args(["write", "30"])
        .arg(&acks)
        .arg("1")
        .spawn()
        .unwrap();
    // Kill it mid-stream, once enough PUTs (small and large) were acknowledged.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&acks).map_or(0, |s| s.lines().count()) < 40 {
        assert!(
            std::time::Instant::now() < deadline,
            "the writer made no progress"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gw.kill();
    assert!(writer.wait().unwrap().success());
    let acked = std::fs::read_to_string(&acks).unwrap().lines().count();
    assert!(acked >= 40);
    // The same port and cluster: a new gateway process.
    gw.start();
    let out = python_cmd(&gw, &alice, dir.path())
        .arg(script("crash.py"))
        .arg("verify")
        .arg(&acks)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// SIGKILL of a chunkserver, then of the master leader (3 masters), during PUTs and GETs: the
/// S3 clients keep succeeding (with their standard retries across the election), and every
/// acknowledged object reads back whole.
#[tokio::test(flavor = "multi_thread")]
async fn s3_survives_chunkserver_and_leader_kills() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, 4).await;
    let masters = cluster.master_addrs();
    let gw = gateway(&masters, "127.0.0.1:0");
    let alice = create_user(&masters, "alice");
    let acks = dir.path().join("acks");
    let mut writer = python_cmd(&gw, &alice, dir.path())
        .arg(script("crash.py"))
        .args(["write", "25"])
        .arg(&acks)
        .arg("10")
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    cluster.chunkservers[1].kill();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let leader = cluster.leader().await as usize;
    cluster.masters[leader - 1].kill();
    let status = writer.wait().unwrap();
    assert!(status.success(), "PUTs or GETs failed under faults");
    let out = python_cmd(&gw, &alice, dir.path())
        .arg(script("crash.py"))
        .arg("verify")
        .arg(&acks)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Packs (shared small-object logs) whose objects were mostly deleted are compacted: the live
/// objects move to a new pack, the old packs are deleted, and every survivor reads back.
#[tokio::test(flavor = "multi_thread")]
async fn s3_compaction_reclaims_mostly_dead_packs() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 1, 3).await;
    let masters = cluster.master_addrs();
    // Small packs (each closed past 64 KiB) and frequent passes, to see it within seconds.
    let gw = gateway_with(
        &masters,
        "127.0.0.1:0",
        &[
            "--pack-bytes",
            "64k",
            "--compact-every-secs",
            "0.5",
            "--free-grace-secs",
            "0",
        ],
    );
    let alice = create_user(&masters, "alice");
    let packs = || -> Vec<String> {
        let out = run_ok(cairn().args(["fs", "ls", "/.s3/packs", "--cluster", &masters.join(",")]));
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let run = |mode: &str| {
        run_script(&gw, &alice, dir.path(), "compaction.py", mode);
    };
    run("fill");
    let before = packs();
    // 300 records of 4 KiB in packs of 64 KiB: at least 15 packs were written.
    assert!(before.len() >= 15, "{before:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let now = packs();
        // Every closed pack of the fill was 90 % dead: they are gone, but for the pack open
        // at the end and the one the compactor's passes during the fill moved live records
        // into (a pass that runs while the fill still writes — often, on a loaded machine —
        // fills the pack open then with live records, which keep it).
        let kept = now.iter().filter(|p| before.contains(p)).count();
        if now.len() <= 3 && kept <= 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "packs not compacted: before {before:?}, now {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    run("verify");
}

/// A PUT whose data went to a pack that compaction retired meanwhile is refused, not lost
/// (seed 62, scenario 144). The pack's writer held its lease but did not renew it in time
/// (here: 1 s leases renewed every 5 s; in the nemesis, masters down for longer than a lease),
/// so a pass found the pack with no live object and an expired lease and put it in the trash;
/// the next PUT appended to it and was acknowledged, and the trash deleted it. Now the index
/// refuses the PUT (503, which boto3 retries), the gateway leaves the pack, and the retry goes
/// to a new one.
#[tokio::test(flavor = "multi_thread")]
async fn s3_a_put_into_a_retired_pack_is_retried_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start_full(dir.path(), 1, 3, &["--lease-secs", "1"], &[]).await;
    let masters = cluster.master_addrs();
    let gw = gateway_with(
        &masters,
        "127.0.0.1:0",
        &["--compact-every-secs", "0.5", "--free-grace-secs", "8"],
    );
    let alice = create_user(&masters, "alice");
    let run = |mode: &str| {
        run_script(&gw, &alice, dir.path(), "compaction.py", mode);
    };
    let trash = || -> u64 {
        let out = run_ok(cairn().args(["status", "--json", "--cluster", &masters.join(",")]));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["objects"]["trash_files"].as_u64().unwrap_or(0)
    };
    let wait = |what: &str, done: &dyn Fn(u64) -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let t = trash();
            if done(t) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: {t} in the trash"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    run("retire-1");
    // The open pack, dead and unrenewed, goes to the trash.
    wait("the open pack was not retired", &|t| t >= 1);
    run("retire-2");
    // The trash is emptied after the grace: a record in the retired pack would go with it.
    wait("the trash was not emptied", &|t| t == 0);
    run("retire-3");
}

/// A bucket placed in three partitions (docs/partitions.md "Buckets"): its objects — small,
/// large, multipart — are spread over the shards' data directories, every listing (paginated,
/// with a delimiter, a prefix, StartAfter, open uploads) is whole and ordered, everything
/// reads back after the master restarts, and deleting the bucket is refused while it holds
/// objects (the shards reopen) and then deletes it.
#[tokio::test(flavor = "multi_thread")]
async fn s3_a_bucket_placed_in_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 1, 3).await;
    let masters = cluster.master_addrs();
    let gw = gateway(&masters, "127.0.0.1:0");
    let alice = create_user(&masters, "alice");
    let run = |mode: &str| run_script(&gw, &alice, dir.path(), "placed.py", mode);
    let count = |stdout: &str| -> usize {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("s3 placed: "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    run("create");
    let out = run_ok(cairn().args([
        "admin",
        "partition",
        "split",
        "--bucket",
        "placed",
        "--shards",
        "3",
        "--json",
        "--cluster",
        &masters.join(","),
    ]));
    let placed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let shards: Vec<u64> = placed["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    assert_eq!(shards.len(), 3, "{placed}");
    let filled = run("fill");
    assert!(count(&filled) >= 7, "too few checks ran: {filled}");
    // Each shard's data directory got packs; the root's got none of this bucket.
    let c = cluster.client().await;
    for p in &shards {
        let packs = c.list(&format!("/.s3/p/{p}/packs")).await.unwrap();
        assert!(!packs.is_empty(), "partition {p} holds no pack");
    }
    let root_packs = c.list("/.s3/packs").await.unwrap();
    assert!(root_packs.is_empty(), "{root_packs:?}");
    // Every partition's index names only its own files (the check fails the command).
    let check = cairn()
        .args(["admin", "check", "--cluster", &masters.join(",")])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    // The shards' state is on disk like the root's: read back from the log after a SIGKILL,
    // and from the store after a clean stop (which commits it durably).
    cluster.masters[0].kill();
    cluster.masters[0].start();
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.masters[0].stop();
    cluster.masters[0].start();
    let verified = run("verify");
    assert!(count(&verified) >= 190, "too few checks ran: {verified}");
}

/// Issue 38 §3: a signed PUT that declares 100 bytes and sends 50 holds its connection only
/// for the gateway's body idle time (`--body-idle-ms`), and the object is not made; a client
/// that sends the whole body is served meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_body_is_cut_after_the_idle_time() {
    use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};
    use std::io::{Read, Write};
    use std::time::Instant;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 1, 3).await;
    let masters = cluster.master_addrs();
    let gw = gateway_with(&masters, "127.0.0.1:0", &["--body-idle-ms", "1500"]);
    let alice = create_user(&masters, "alice");
    let endpoint = format!("http://{}", gw.addr);
    let bucket = Bucket::new(
        endpoint.parse().unwrap(),
        UrlStyle::Path,
        "stall".to_string(),
        "us-east-1",
    )
    .unwrap();
    let creds = Credentials::new(&alice.access, &alice.secret);
    let http = raw_http(
        &gw.addr,
        "PUT",
        &bucket.create_bucket(&creds).sign(Duration::from_secs(60)),
        b"",
    );
    assert!(http.starts_with("HTTP/1.1 200"), "{http}");

    let url = bucket
        .put_object(Some(&creds), "half")
        .sign(Duration::from_secs(60));
    let mut s = std::net::TcpStream::connect(&gw.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let target = &url.as_str()[url.as_str().find(url.path()).unwrap()..];
    write!(
        s,
        "PUT {target} HTTP/1.1\r\nHost: {}\r\nContent-Length: 100\r\n\r\n",
        gw.addr
    )
    .unwrap();
    s.write_all(&[b'x'; 50]).unwrap();
    let t0 = Instant::now();
    // A whole PUT on another connection is served meanwhile.
    let ok = raw_http(
        &gw.addr,
        "PUT",
        &bucket
            .put_object(Some(&creds), "whole")
            .sign(Duration::from_secs(60)),
        b"all of it",
    );
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "the stalled PUT held its connection {took:?}"
    );
    assert!(
        took >= Duration::from_millis(1000),
        "cut before the idle time: {took:?}"
    );
    // Nothing was made of half a body.
    let head = raw_http(
        &gw.addr,
        "GET",
        &bucket
            .get_object(Some(&creds), "half")
            .sign(Duration::from_secs(60)),
        b"",
    );
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
}

/// One request on a fresh connection (`Connection: close`); the response as text.
fn raw_http(addr: &str, method: &str, url: &url::Url, body: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let target = &url.as_str()[url.as_str().find(url.path()).unwrap()..];
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}
