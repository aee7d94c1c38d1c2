//! The block service end to end (docs/block.md): real master, chunkserver and `cairn nbd`
//! processes, driven by real NBD clients — qemu-img, qemu-io, nbdinfo, nbdcopy and fio's nbd
//! engine (scripts/block-tools.sh installs them; a missing one fails the test, it never
//! passes by skipping) — and by a raw TCP client for bad input and fencing.

// NBD is big-endian on the wire.
#![allow(clippy::big_endian_bytes)]

#[path = "block/clients.rs"]
mod clients;
mod common;
#[path = "block/crashes.rs"]
mod crashes;

use common::Cluster;
use common::nbd::{FLUSH, FUA, READ, Raw, WRITE, block_of, pattern};
use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

/// One test at a time: each runs a cluster and several client processes.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn tool(name: &str) -> Command {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{name} is not installed: run the tests through ./scripts/test.sh, which installs it"
    );
    Command::new(name)
}

fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn create_volume(masters: &[String], name: &str, size: &str) -> serde_json::Value {
    let out = common::run_ok(common::cairn().args([
        "volume",
        "create",
        name,
        "--size",
        size,
        "--json",
        "--cluster",
        &masters.join(","),
    ]));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A raw NBD client: the handshake and simple replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_protocols_errors_and_the_server_goes_on() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let nbd = common::nbd::server(&masters, &[]);
    create_volume(&masters, "v", "16m");

    // Garbage instead of a handshake: closed.
    let mut c = Raw::connect(&nbd.addr);
    c.s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert!(c.closed());
    // Unknown client flags: closed.
    let mut c = Raw::connect(&nbd.addr);
    c.flags(0x80);
    assert!(c.closed());
    // Unknown option: NBD_REP_ERR_UNSUP; an unknown export: NBD_REP_ERR_UNKNOWN; an
    // option longer than allowed: NBD_REP_ERR_TOO_BIG; the handshake goes on after each.
    let mut c = Raw::connect(&nbd.addr);
    c.flags(3);
    c.option(99, b"");
    assert_eq!(c.option_reply().1, (1 << 31) + 1);
    assert_eq!(c.go("nope"), (1 << 31) + 6);
    c.option(7, &vec![0u8; 8000]);
    assert_eq!(c.option_reply().1, (1 << 31) + 9);
    assert_eq!(c.go("v"), 1, "GO v");

    // Transmission: misaligned, past the end, too long, unknown: the errno the protocol
    // names, and the connection serves on.
    c.request(READ, 0, 1, 1, 4096, &[]);
    assert_eq!(c.reply(0).0, 22, "misaligned read: EINVAL");
    c.request(READ, 0, 2, 16 << 20, 4096, &[]);
    assert_eq!(c.reply(0).0, 22, "read past the end: EINVAL");
    c.request(WRITE, 0, 3, 16 << 20, 4096, &[7u8; 4096]);
    assert_eq!(c.reply(0).0, 28, "write past the end: ENOSPC");
    c.request(READ, 0, 4, 0, 64 << 20, &[]);
    assert_eq!(c.reply(0).0, 22, "read above the maximum: EINVAL");
    c.request(99, 0, 5, 0, 0, &[]);
    assert_eq!(c.reply(0).0, 22, "unknown command: EINVAL");
    c.request(WRITE, 0, 6, 4096, 100, &[1u8; 100]);
    assert_eq!(c.reply(0).0, 22, "misaligned write: EINVAL");
    // Many requests in flight; replies matched by cookie, in whatever order.
    let blocks = 32u64;
    for i in 0..blocks {
        let data = pattern(i, 4096);
        c.request(WRITE, 0, 100 + i, i * 4096, 4096, &data);
    }
    let mut seen: Vec<u64> = (0..blocks)
        .map(|_| c.reply(0))
        .map(|(e, k, _)| {
            assert_eq!(e, 0);
            k
        })
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, (100..100 + blocks).collect::<Vec<_>>());
    c.request(FLUSH, 0, 7, 0, 0, &[]);
    assert_eq!(c.reply(0).0, 0);
    c.request(READ, 0, 8, 0, (blocks * 4096) as u32, &[]);
    let (e, k, d) = c.reply((blocks * 4096) as usize);
    assert_eq!((e, k), (0, 8));
    let want: Vec<u8> = (0..blocks).flat_map(|i| pattern(i, 4096)).collect();
    assert!(d == want, "reads do not return what was written");
    // Never written: zeros.
    c.request(READ, 0, 9, 8 << 20, 8192, &[]);
    assert_eq!(c.reply(8192).2, vec![0u8; 8192]);

    // A client gone mid-request (half a write's payload): the server goes on serving.
    let mut gone = Raw::connect(&nbd.addr);
    gone.flags(3);
    assert_eq!(gone.go("v"), 1);
    gone.request(WRITE, 0, 1, 0, 4096, &[9u8; 100]);
    drop(gone);
    c.request(READ, 0, 10, 0, 4096, &[]);
    let (e, _, d) = c.reply(4096);
    assert_eq!(e, 0);
    assert_eq!(d, pattern(0, 4096), "a half-sent write changed the volume");
    let info = ok(tool("nbdinfo").arg(format!("nbd://{}/v", nbd.addr)));
    assert!(info.contains("export-size: 16777216"), "{info}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_writes_a_volume_and_a_stale_one_is_fenced() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let mut a = common::nbd::server(&masters, &[]);
    let b = common::nbd::server(&masters, &[]);
    create_volume(&masters, "f", "16m");

    // A serves the volume; B is refused while A holds it.
    let mut ca = Raw::connect(&a.addr);
    ca.flags(3);
    assert_eq!(ca.go("f"), 1);
    ca.request(WRITE, FUA, 1, 0, 4096, &pattern(1, 4096));
    assert_eq!(ca.reply(0).0, 0);
    let mut cb = Raw::connect(&b.addr);
    cb.flags(3);
    assert_eq!(
        cb.go("f"),
        (1 << 31) + 2,
        "a second server opened a served volume"
    );

    // A stops (SIGSTOP) past its lease: B takes the volume over and sees A's flushed write.
    let pid = a.pid() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut cb = loop {
        let mut cb = Raw::connect(&b.addr);
        cb.flags(3);
        if cb.go("f") == 1 {
            break cb;
        }
        assert!(Instant::now() < deadline, "B never took the volume over");
        std::thread::sleep(Duration::from_millis(500));
    };
    cb.request(READ, 0, 2, 0, 4096, &[]);
    assert_eq!(cb.reply(4096).2, pattern(1, 4096), "B lost A's FUA write");
    cb.request(WRITE, FUA, 3, 4096, 4096, &pattern(3, 4096));
    assert_eq!(cb.reply(0).0, 0);

    // A wakes up: its writes and flushes fail; nothing it sends reaches the volume.
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    ca.request(WRITE, 0, 4, 8192, 4096, &pattern(4, 4096));
    let w = ca.reply(0).0;
    ca.request(FLUSH, 0, 5, 0, 0, &[]);
    let f = ca.reply(0).0;
    assert!(
        w != 0 || f != 0,
        "the fenced server acknowledged a write and its flush"
    );
    cb.request(READ, 0, 6, 8192, 4096, &[]);
    assert_eq!(
        cb.reply(4096).2,
        vec![0u8; 4096],
        "a fenced write reached the volume"
    );
    drop(cb);

    // SIGKILL of the serving server: a restarted one reads every flushed write.
    a.kill();
    drop(b);
    let a2 = loop {
        let p = common::nbd::server(&masters, &[]);
        let mut c = Raw::connect(&p.addr);
        c.flags(3);
        if c.go("f") == 1 {
            c.request(READ, 0, 1, 0, 8192, &[]);
            let (_, _, d) = c.reply(8192);
            assert_eq!(&d[..4096], &pattern(1, 4096)[..]);
            assert_eq!(&d[4096..], &pattern(3, 4096)[..]);
            break p;
        }
        assert!(
            Instant::now() < deadline + Duration::from_secs(30),
            "never reopened"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    drop(a2);
}

/// A connection to volume `name` on the server at `addr`, once it opens it (a killed server's
/// lease runs out first): fails the test after a minute.
fn opened(addr: &str, name: &str) -> Raw {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(c) = Raw::open(addr, name) {
            return c;
        }
        assert!(Instant::now() < deadline, "volume {name} never reopened");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn volume_info(masters: &[String], name: &str) -> serde_json::Value {
    let out = common::run_ok(common::cairn().args([
        "volume",
        "info",
        name,
        "--json",
        "--cluster",
        &masters.join(","),
    ]));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn volume_cmd(masters: &[String], args: &[&str]) -> std::process::Output {
    common::cairn()
        .arg("volume")
        .args(args)
        .args(["--cluster", &masters.join(",")])
        .output()
        .unwrap()
}

fn qemu_io(uri: &str, cmds: &[&str]) -> String {
    let mut c = tool("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let out = ok(c.arg(uri));
    assert!(!out.contains("Pattern verification failed"), "{uri}: {out}");
    assert!(!out.to_lowercase().contains("error"), "{uri}: {out}");
    out
}

/// Snapshots and clones: a snapshot taken while a server serves the volume (by that server)
/// and one taken while nobody does (by the CLI) keep their contents through overwrites and
/// garbage collection; clones read them, write their own blocks without touching the parent,
/// and nest; what something depends on is not deleted; a served volume grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_clones_keep_their_contents() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    create_volume(&masters, "base", "4m");
    let gc = ["--segment-bytes", "256k", "--gc-every-ms", "100"];
    let nbd = common::nbd::server(&masters, &gc);
    let uri = |v: &str| format!("nbd://{}/{v}", nbd.addr);
    qemu_io(&uri("base"), &["write -P 0xaa 0 4M"]);
    // Taken by the CLI: nobody serves the volume between qemu-io runs.
    let out = volume_cmd(&masters, &["snapshot", "base", "s1", "--json"]);
    assert!(out.status.success(), "{out:?}");
    // Held open, so that the next snapshot and the resize reach a serving server.
    let mut held = Raw::connect(&nbd.addr);
    held.flags(3);
    assert_eq!(held.go("base"), 1);
    qemu_io(&uri("base"), &["write -P 0xbb 0 2M"]);
    let out = volume_cmd(&masters, &["snapshot", "base", "s2", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(snap["snapshot"]["ready"], true, "{snap}");
    // Every block of s1 and half of s2 overwritten; the collector runs for a while.
    qemu_io(&uri("base"), &["write -P 0xcc 0 4M"]);
    std::thread::sleep(Duration::from_millis(1500));
    // Clones read the snapshots as they were.
    for (snapshot, clone) in [("base@s1", "c1"), ("base@s2", "c2")] {
        let out = volume_cmd(&masters, &["clone", snapshot, clone, "--json"]);
        assert!(out.status.success(), "{out:?}");
    }
    qemu_io(&uri("c1"), &["read -P 0xaa 0 4M"]);
    qemu_io(&uri("c2"), &["read -P 0xbb 0 2M", "read -P 0xaa 2M 2M"]);
    qemu_io(&uri("base"), &["read -P 0xcc 0 4M"]);
    // A clone writes its own blocks; the parent and the snapshot keep theirs.
    qemu_io(&uri("c1"), &["write -P 0xdd 1M 64k", "read -P 0xdd 1M 64k"]);
    qemu_io(
        &uri("c1"),
        &[
            "read -P 0xaa 0 1M",
            "read -P 0xdd 1M 64k",
            "read -P 0xaa 1088k 2M",
        ],
    );
    qemu_io(&uri("base"), &["read -P 0xcc 0 4M"]);
    // A clone of a clone.
    assert!(
        volume_cmd(&masters, &["snapshot", "c1", "t"])
            .status
            .success()
    );
    let out = volume_cmd(&masters, &["clone", "c1@t", "g"]);
    assert!(out.status.success(), "{out:?}");
    qemu_io(&uri("g"), &["read -P 0xaa 0 1M", "read -P 0xdd 1M 64k"]);
    // Canary: a wrong pattern on a clone is reported.
    let bad = tool("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0xcc 0 64k", &uri("c1")])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stdout).contains("Pattern verification failed"));
    // What something depends on is not deleted.
    let refused = |args: &[&str], what: &str| {
        let out = volume_cmd(&masters, args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success() && err.contains(what),
            "{args:?}: {err}"
        );
    };
    refused(&["delete", "base"], "has snapshots");
    refused(&["delete", "base@s1"], "is a clone of base@s1");
    refused(&["snapshot", "base", "s1"], "exists");
    refused(&["clone", "base@nope", "x"], "no such snapshot");
    // A served volume grows: a new connection sees the new size and writes past the old end.
    let out = volume_cmd(&masters, &["resize", "base", "--size", "8m"]);
    assert!(out.status.success(), "{out:?}");
    std::thread::sleep(Duration::from_millis(1500));
    let info: serde_json::Value =
        serde_json::from_str(&ok(tool("nbdinfo").args(["--json", &uri("base")]))).unwrap();
    assert_eq!(info["exports"][0]["export-size"], 8 << 20, "{info}");
    qemu_io(
        &uri("base"),
        &["write -P 0xee 6M 64k", "read -P 0xee 6M 64k"],
    );
    drop(held);
    // Deleted in order, the snapshots' segments are collected.
    for args in [
        ["delete", "g"].as_slice(),
        &["delete", "c1@t"],
        &["delete", "c1"],
        &["delete", "c2"],
        &["delete", "base@s1"],
        &["delete", "base@s2"],
    ] {
        let out = volume_cmd(&masters, args);
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
    let before = volume_info(&masters, "base")["stored_bytes"]
        .as_u64()
        .unwrap();
    // Served again (the collector runs while the volume is open).
    let mut held = Raw::connect(&nbd.addr);
    held.flags(3);
    assert_eq!(held.go("base"), 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = volume_info(&masters, "base")["stored_bytes"]
            .as_u64()
            .unwrap();
        if now < 6 << 20 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {now} B stored (was {before}) for a 4 MiB volume"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(held);
    qemu_io(&uri("base"), &["read -P 0xcc 0 4M", "read -P 0xee 6M 64k"]);
    let out = volume_cmd(&masters, &["delete", "base"]);
    assert!(out.status.success(), "{out:?}");
}

/// A client that reconnects the moment it disconnected (nbdcopy's read right after its
/// write) finds the volume: the server closes its instance (a last journal record, segments
/// and journal sealed) before another connection may open it again, and the new instance
/// reads what the old one wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_reopened_while_its_last_connection_closes_serves_its_writes() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    create_volume(&masters, "r", "1m");
    let server = common::nbd::server(&masters, &[]);
    for round in 0..20u64 {
        let mut c = Raw::open(&server.addr, "r")
            .unwrap_or_else(|e| panic!("round {round}: the volume did not open: {e}"));
        if round > 0 {
            let (e, got) = c.call(READ, 0, (round - 1) % 16 * 4096, 4096, &[]).unwrap();
            assert_eq!(e, 0);
            assert!(
                got == block_of(round - 1),
                "round {round}: last round's write"
            );
        }
        let (e, _) = c
            .call(WRITE, 0, round % 16 * 4096, 4096, &block_of(round))
            .unwrap();
        assert_eq!(e, 0);
        drop(c);
    }
}

/// `cairn user cert NAME --dir DIR --ca-dir CA`.
fn user_cert(masters: &[String], name: &str, dir: &std::path::Path, ca: &std::path::Path) {
    common::run_ok(
        common::cairn()
            .args(["user", "cert", name, "--dir"])
            .arg(dir)
            .arg("--ca-dir")
            .arg(ca)
            .args(["--cluster", &masters.join(",")]),
    );
}

/// Issue 38 §1: NBD over TLS with users' client certificates. qemu-img and nbdcopy read and
/// write a user's volume with her certificate; plain NBD is refused; another user's
/// certificate neither lists nor opens it (and opens it read-only once its mode says so); a
/// certificate from another CA fails the handshake; revoked and deleted users are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbd_over_tls_opens_only_what_a_users_certificate_may() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tls = d.join("tls");
    common::run_ok(common::cairn().args(["tls", "init"]).arg(&tls));
    let cl = Cluster::start(d, 1, 3).await;
    let masters = cl.master_addrs();
    let audit = d.join("nbd-audit");
    let nbd = common::nbd::server_with(
        &masters,
        &[
            "--nbd-tls-dir",
            tls.to_str().unwrap(),
            "--audit-dir",
            audit.to_str().unwrap(),
        ],
    );
    common::create_user(&masters, "alice");
    common::create_user(&masters, "bob");
    let (alice, bob) = (d.join("alice"), d.join("bob"));
    user_cert(&masters, "alice", &alice, &tls);
    user_cert(&masters, "bob", &bob, &tls);
    for f in ["ca-cert.pem", "client-cert.pem", "client-key.pem"] {
        assert!(alice.join(f).exists(), "{f}");
    }
    common::run_ok(common::cairn().args([
        "volume",
        "create",
        "avol",
        "--size",
        "16m",
        "--owner",
        "alice",
        "--cluster",
        &masters.join(","),
    ]));
    let uri = |name: &str, certs: &std::path::Path| {
        format!(
            "nbds://{}/{name}?tls-certificates={}",
            nbd.addr,
            certs.display()
        )
    };
    let (host, port) = nbd.addr.split_once(':').unwrap();
    let qemu_obj = |certs: &std::path::Path| {
        format!(
            "tls-creds-x509,id=tls0,dir={},endpoint=client",
            certs.display()
        )
    };
    let qemu_target = format!(
        "driver=nbd,server.type=inet,server.host={host},server.port={port},export=avol,tls-creds=tls0"
    );

    // Alice: qemu-img convert and compare, nbdcopy back, over TLS.
    let img = d.join("disk.img");
    let mut body = pattern(3, 6 << 20);
    body.resize(16 << 20, 0);
    std::fs::write(&img, &body).unwrap();
    let raw_img = format!("driver=raw,file.filename={}", img.display());
    ok(tool("qemu-img")
        .args([
            "convert",
            "-n",
            "--object",
            &qemu_obj(&alice),
            "--image-opts",
            &raw_img,
        ])
        .args(["--target-image-opts", &qemu_target]));
    ok(tool("qemu-img").args([
        "compare",
        "--object",
        &qemu_obj(&alice),
        "--image-opts",
        &raw_img,
        &qemu_target,
    ]));
    let back = d.join("back.img");
    ok(tool("nbdcopy").arg(uri("avol", &alice)).arg(&back));
    assert!(
        std::fs::read(&back).unwrap() == body,
        "nbdcopy read back other bytes"
    );
    let list = ok(tool("nbdinfo").args(["--list", &uri("", &alice)]));
    assert!(list.contains("avol"), "{list}");

    // Plain NBD: refused (TLS required), by nbdinfo and on the wire.
    let plain = tool("nbdinfo")
        .arg(format!("nbd://{}/avol", nbd.addr))
        .output()
        .unwrap();
    assert!(!plain.status.success(), "plain NBD opened a volume");
    let mut raw = Raw::connect(&nbd.addr);
    raw.flags(3);
    raw.option(3, &[]); // LIST
    let (_, kind, msg) = raw.option_reply();
    assert_eq!(
        kind,
        (1 << 31) + 5,
        "LIST without TLS: {}",
        String::from_utf8_lossy(&msg)
    );

    // Bob: lists nothing of hers, cannot open it; opens it read-only once it is 0604.
    let list = ok(tool("nbdinfo").args(["--list", &uri("", &bob)]));
    assert!(!list.contains("avol"), "{list}");
    let refused = tool("nbdinfo").arg(uri("avol", &bob)).output().unwrap();
    assert!(!refused.status.success(), "bob opened alice's 0600 volume");
    common::run_ok(common::cairn().args([
        "volume",
        "chmod",
        "604",
        "avol",
        "--cluster",
        &masters.join(","),
    ]));
    let info: serde_json::Value =
        serde_json::from_str(&ok(tool("nbdinfo").args(["--json", &uri("avol", &bob)]))).unwrap();
    assert_eq!(info["exports"][0]["is_read_only"], true, "{info}");
    let write = tool("nbdcopy")
        .arg(&img)
        .arg(uri("avol", &bob))
        .output()
        .unwrap();
    assert!(
        !write.status.success(),
        "bob wrote a volume he may only read"
    );
    ok(tool("nbdcopy")
        .arg(uri("avol", &bob))
        .arg(d.join("bob.img")));
    assert!(std::fs::read(d.join("bob.img")).unwrap() == body);

    // A certificate of another CA (recorded for bob, trusting this cluster's server): the
    // handshake fails.
    let other_ca = d.join("other-ca");
    common::run_ok(common::cairn().args(["tls", "init"]).arg(&other_ca));
    let foreign = d.join("foreign");
    user_cert(&masters, "bob", &foreign, &other_ca);
    std::fs::copy(tls.join("ca.pem"), foreign.join("ca-cert.pem")).unwrap();
    let r = tool("nbdinfo").arg(uri("avol", &foreign)).output().unwrap();
    assert!(
        !r.status.success(),
        "a certificate of another CA opened a volume"
    );

    // The audit log (issue 38 §6) saw it all: connects, refusals, opens and closes.
    use serde_json::json;
    let checks: [(&str, Vec<(&str, serde_json::Value)>); 6] = [
        (
            "alice connected",
            vec![
                ("event", json!("connect")),
                ("user", json!("alice")),
                ("result", json!("ok")),
            ],
        ),
        (
            "alice opened avol read-write",
            vec![
                ("event", json!("open")),
                ("user", json!("alice")),
                ("volume", json!("avol")),
                ("mode", json!("read-write")),
            ],
        ),
        (
            "alice closed avol",
            vec![
                ("event", json!("close")),
                ("user", json!("alice")),
                ("volume", json!("avol")),
            ],
        ),
        (
            "plain NBD refused",
            vec![
                ("event", json!("connect")),
                ("result", json!("refused")),
                ("error", json!("NBD without TLS")),
            ],
        ),
        (
            "bob refused avol",
            vec![
                ("event", json!("open")),
                ("user", json!("bob")),
                ("volume", json!("avol")),
                ("result", json!("refused")),
            ],
        ),
        (
            "bob opened avol read-only",
            vec![
                ("event", json!("open")),
                ("user", json!("bob")),
                ("mode", json!("read-only")),
            ],
        ),
    ];
    for (what, fields) in &checks {
        common::audit_until(&audit, what, |l| common::has(l, fields));
    }
    let lines = common::audit_until(&audit, "at all", |l| !l.is_empty());
    for l in &lines {
        eprintln!("AUDIT {l}");
    }
    assert!(
        lines
            .iter()
            .all(|l| l["service"] == "nbd" && l["time"].is_string() && l["addr"].is_string()),
        "{lines:#?}"
    );

    // Alice holds a session open (qemu-io: a read, a pause, a read); her certificates are
    // revoked meanwhile: the open session is cut, not only new connections refused.
    let opens_before = lines
        .iter()
        .filter(|l| l["event"] == "open" && l["user"] == "alice")
        .count();
    let held = tool("qemu-io")
        .args([
            "--object",
            &qemu_obj(&alice),
            "--image-opts",
            &qemu_target,
            "-c",
            "read 0 4k",
            "-c",
            "sleep 7000",
            "-c",
            "read 0 4k",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    common::audit_until(&audit, "of alice's held session", |l| {
        l.iter()
            .filter(|l| l["event"] == "open" && l["user"] == "alice")
            .count()
            > opens_before
    });
    // Revoked (alice's certificates) and deleted (bob) users: refused within the servers'
    // 5 s memory.
    common::run_ok(common::cairn().args([
        "user",
        "revoke-certs",
        "alice",
        "--cluster",
        &masters.join(","),
    ]));
    let out = held.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        said.matches("read 4096/4096 bytes").count(),
        1,
        "the held session read on after the revocation: {said}"
    );
    common::audit_until(&audit, "of the cut session", |l| {
        l.iter().any(|l| {
            l["event"] == "close"
                && l["user"] == "alice"
                && l["error"].as_str().is_some_and(|e| e.contains("revoked"))
        })
    });
    common::run_ok(common::cairn().args([
        "user",
        "delete",
        "bob",
        "--cluster",
        &masters.join(","),
    ]));
    let deadline = Instant::now() + Duration::from_secs(15);
    for who in [&alice, &bob] {
        while tool("nbdinfo")
            .arg(uri("avol", who))
            .output()
            .unwrap()
            .status
            .success()
        {
            assert!(
                Instant::now() < deadline,
                "{} still opens the volume",
                who.display()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    drop(cl);
}
