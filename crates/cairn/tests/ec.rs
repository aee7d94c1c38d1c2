//! Redundancy policies and erasure-coded files, end to end: real master and chunkserver
//! processes on loopback, used through the CLI and the SDK (docs/erasure-coding.md).

mod common;

use cairn_client::{CreateOptions, Error, Policy};
use cairn_rpc::ErrorKind;
use common::{Cluster, cairn, run_ok};

fn meta_kind(e: &Error) -> Option<ErrorKind> {
    match e {
        Error::Meta(m) => Some(m.kind),
        _ => None,
    }
}

fn stat_json(masters: &str, path: &str) -> serde_json::Value {
    let out = run_ok(cairn().args(["fs", "--cluster", masters, "--json", "stat", path]));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_are_set_inherited_shown_and_refused_when_unplaceable() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs().join(",");
    let fs = |args: &[&str]| {
        let mut c = cairn();
        c.args(["fs", "--cluster", &masters]).args(args);
        c
    };

    // A directory default, shown by stat and inherited by files and directories below it.
    run_ok(&mut fs(&[
        "mkdir",
        "-p",
        "--policy",
        "replicas:2,lz4",
        "/logs",
    ]));
    assert_eq!(stat_json(&masters, "/logs")["policy"], "replicas:2,lz4");
    run_ok(&mut fs(&["mkdir", "-p", "/logs/app"]));
    assert_eq!(stat_json(&masters, "/logs/app")["policy"], "replicas:2,lz4");
    run_ok(&mut fs(&["create", "/logs/app/a"]));
    let a = stat_json(&masters, "/logs/app/a");
    assert_eq!(a["policy"], "replicas:2,lz4");
    assert_eq!(a["replicas"], 2);
    // An explicit policy wins over the directory's.
    run_ok(&mut fs(&[
        "create",
        "--policy",
        "replicas:3,then:ec:2+1",
        "/logs/app/b",
    ]));
    assert_eq!(
        stat_json(&masters, "/logs/app/b")["policy"],
        "replicas:3,then:ec:2+1"
    );
    // An erasure-coded file shows its policy, and no replica count.
    run_ok(&mut fs(&["create", "--policy", "ec:2+1", "/logs/app/e"]));
    let e = stat_json(&masters, "/logs/app/e");
    assert_eq!(
        (e["policy"].as_str(), e["replicas"].as_u64()),
        (Some("ec:2+1"), Some(0))
    );
    let text = run_ok(&mut fs(&["stat", "/logs/app/e"])).stdout;
    assert!(String::from_utf8_lossy(&text).contains("ec:2+1"));
    // Outside the directory: the cluster default, and no directory default shown.
    run_ok(&mut fs(&["create", "/c"]));
    assert_eq!(stat_json(&masters, "/c")["policy"], "replicas:3");
    assert!(stat_json(&masters, "/")["policy"].is_null());
    // `mkdir -p --policy` on an existing directory changes the default for new files only.
    run_ok(&mut fs(&[
        "mkdir",
        "-p",
        "--policy",
        "replicas:1",
        "/logs/app",
    ]));
    run_ok(&mut fs(&["create", "/logs/app/d"]));
    assert_eq!(stat_json(&masters, "/logs/app/d")["policy"], "replicas:1");
    assert_eq!(
        stat_json(&masters, "/logs/app/a")["policy"],
        "replicas:2,lz4"
    );
    let text = run_ok(&mut fs(&["stat", "/logs/app/d"])).stdout;
    let text = String::from_utf8(text).unwrap();
    assert!(text.contains("replicas:1"), "{text}");

    // Bad text is refused by the CLI before anything is sent, with the reason.
    for bad in [
        "ec:1+1",
        "ec:4",
        "replicas:0",
        "replicas:3,then:replicas:2",
        "raid5",
    ] {
        let out = fs(&["create", "--policy", bad, "/bad"]).output().unwrap();
        assert!(!out.status.success(), "{bad} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("bad policy"), "{bad}: {err}");
    }
    // A policy wider than the cluster: refused at create with a clear error, at once (no
    // retries: servers that are not registered will not come up), nothing made.
    let c = cl.client().await;
    for (text, width) in [("ec:4+2", 6), ("replicas:3,then:ec:6+3", 9)] {
        let p: Policy = text.parse().unwrap();
        let opts = CreateOptions {
            policy: Some(p),
            ..CreateOptions::default()
        };
        let t0 = std::time::Instant::now();
        let e = c.create("/wide", opts).await.err().expect(text);
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(5),
            "{text}: retried"
        );
        assert_eq!(
            meta_kind(&e),
            Some(ErrorKind::InvalidArgument),
            "{text}: {e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(text) && msg.contains(&format!("needs {width}")),
            "{text}: {msg}"
        );
        assert_eq!(
            meta_kind(&c.stat("/wide").await.unwrap_err()),
            Some(ErrorKind::NotFound)
        );
    }
    // A put that would not fit says so before it writes anything: 1 GiB at replicas:3 is
    // 3 GiB stored, on three 256 MiB stores.
    let big = dir.path().join("big");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let out = fs(&["put", big.to_str().unwrap(), "/big"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("would not fit"), "{err}");
    assert_eq!(
        meta_kind(&c.stat("/big").await.unwrap_err()),
        Some(ErrorKind::NotFound)
    );
    // So is a directory default the cluster can place but a create below it cannot.
    run_ok(&mut fs(&["mkdir", "--policy", "ec:4+2", "/wide-dir"]));
    let e = c
        .create("/wide-dir/f", CreateOptions::default())
        .await
        .err()
        .expect("ec:4+2 on 3 servers");
    assert_eq!(meta_kind(&e), Some(ErrorKind::InvalidArgument), "{e}");
}

/// Asserts `got == want` for bytes read at file offset `at`, naming the first difference.
fn same(got: &[u8], want: &[u8], at: u64) {
    assert_eq!(got.len(), want.len(), "read at {at}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "read at {at}: first wrong byte at file offset {} (of {} read)",
            at + i as u64,
            got.len()
        );
    }
}

fn ec_opts(text: &str) -> CreateOptions {
    CreateOptions {
        policy: Some(text.parse().unwrap()),
        ..CreateOptions::default()
    }
}

/// Appends of every size to an `ec:4+2` file on 6 chunkservers: whole stripes go to chunk
/// groups, partial ones through the tail; everything reads back while open, after close,
/// with 2 of the 6 servers killed (degraded reads), and after the writer died mid-file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec_files_round_trip_through_groups_tails_dead_servers_and_a_dead_writer() {
    let dir = tempfile::tempdir().unwrap();
    let mut cl = Cluster::start(dir.path(), 1, 6).await;
    // Members of 512 KiB: a group holds 2 MiB of user bytes, so the file spans groups.
    let opts = cairn_client::ClientOptions {
        chunk_size: 512 << 10,
        renew_every: std::time::Duration::from_millis(500),
        ..cairn_client::ClientOptions::default()
    };
    let c = cl.client_with(opts.clone()).await;
    let mut w = c.create("/e", ec_opts("ec:4+2")).await.unwrap();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
    let mut acked = 0u64;
    // Small appends (through the tail), stripe-sized and larger (straight to groups), mixed.
    for i in 0..120 {
        let n = match i % 4 {
            0 => rand::Rng::random_range(&mut rng, 1..5000),
            1 => rand::Rng::random_range(&mut rng, 1..100_000),
            2 => 256 << 10,
            _ => rand::Rng::random_range(&mut rng, 200_000..1_200_000),
        };
        let at = w.append(&common::bytes(1, acked, n)).await.unwrap();
        assert_eq!(at, acked);
        acked += n as u64;
        if i % 17 == 0 {
            // Readable while open, up to the last acknowledged byte.
            let from = acked.saturating_sub(300_000);
            let got = c.read("/e", from, (acked - from) as usize).await.unwrap();
            same(&got, &common::bytes(1, from, (acked - from) as usize), from);
        }
    }
    assert_eq!(w.close().await.unwrap(), acked);
    let chunks = common::chunks(&c, "/e").await;
    let groups: Vec<_> = chunks.iter().filter(|c| c.ec_data > 0).collect();
    assert!(groups.len() >= 10, "{} groups", groups.len());
    for g in &groups {
        assert_eq!((g.ec_data, g.ec_parity, g.servers.len()), (4, 2, 6));
        assert_eq!(g.length % (4 * u64::from(g.ec_cell)), 0, "whole stripes");
        assert!(g.sealed);
    }
    let in_groups: u64 = groups.iter().map(|g| g.length).sum();
    let in_tails: u64 = chunks
        .iter()
        .filter(|c| c.ec_data == 0)
        .map(|c| c.length)
        .sum();
    assert_eq!(in_groups + in_tails, acked);
    eprintln!(
        "{acked} bytes: {in_groups} in {} groups, {in_tails} in tails",
        groups.len()
    );
    assert!(in_tails < in_groups / 10, "most bytes are in stripes");
    let check = |c: cairn_client::Client| async move {
        let mut off = 0u64;
        while off < acked {
            let n = (acked - off).min(700_001) as usize;
            let got = c.read("/e", off, n).await.unwrap();
            same(&got, &common::bytes(1, off, n), off);
            off += n as u64;
        }
    };
    check(c.clone()).await;

    // Two of six servers gone: every stripe still has K members; reads decode.
    cl.chunkservers[1].kill();
    cl.chunkservers[4].kill();
    let before = c.health_stats().degraded_reads;
    check(c.clone()).await;
    let degraded = c.health_stats().degraded_reads - before;
    assert!(degraded > 0, "no read decoded");
    eprintln!("{degraded} degraded reads with 2 of 6 servers down");
    // A third one is too many for the groups on it: a typed error, not wrong bytes.
    cl.chunkservers[2].kill();
    let e = c.read("/e", 0, 4 << 20).await.unwrap_err();
    assert!(
        matches!(e, Error::NoReplica { .. }),
        "three members lost: {e}"
    );
    cl.chunkservers[1].start();
    cl.chunkservers[2].start();
    cl.chunkservers[4].start();
    cl.wait_servers_up(6, std::time::Duration::from_secs(30))
        .await;

    // A writer that dies mid-stripe: every acknowledged byte is there for the next one.
    let c2 = cl.client_with(opts.clone()).await;
    let mut w = c2.create("/d", ec_opts("ec:4+2")).await.unwrap();
    let mut acked = 0u64;
    for n in [700_000usize, 3000, 262_144, 1, 50_000] {
        w.append(&common::bytes(2, acked, n)).await.unwrap();
        acked += n as u64;
    }
    drop(w); // no close: the lease runs out, the group and tail stay open
    drop(c2);
    let c3 = cl.client_with(opts).await;
    let mut w = loop {
        match c3.open_append("/d").await {
            Ok(w) => break w,
            Err(e) if meta_kind(&e) == Some(ErrorKind::LeaseHeld) => {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            }
            Err(e) => panic!("reopen: {e}"),
        }
    };
    assert!(w.len() >= acked, "recovered {} of {acked} bytes", w.len());
    let len = w.len();
    let got = c3.read("/d", 0, acked as usize).await.unwrap();
    same(&got, &common::bytes(2, 0, acked as usize), 0);
    // And the file goes on from there.
    w.append(&common::bytes(3, 0, 600_000)).await.unwrap();
    w.close().await.unwrap();
    let got = c3.read("/d", len, 600_000).await.unwrap();
    same(&got, &common::bytes(3, 0, 600_000), len);
}

/// A group member whose server died is rebuilt from K others onto a server outside the group
/// (the masters put it in the member's position), and serves the degraded reads when another
/// member's server dies afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_group_member_is_rebuilt_from_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let mut cl = Cluster::start(dir.path(), 1, 4).await;
    // Members of 512 KiB: 1 MiB of user bytes per group, three groups.
    let opts = cairn_client::ClientOptions {
        chunk_size: 512 << 10,
        ..cairn_client::ClientOptions::default()
    };
    let c = cl.client_with(opts).await;
    let mut w = c.create("/r", ec_opts("ec:2+1")).await.unwrap();
    let len = 3u64 << 20;
    for off in (0..len).step_by(256 << 10) {
        w.append(&common::bytes(4, off, 256 << 10)).await.unwrap();
    }
    assert_eq!(w.close().await.unwrap(), len);
    let before = common::chunks(&c, "/r").await;
    assert!(
        before
            .iter()
            .all(|g| g.ec_data == 2 && g.servers.len() == 3)
    );
    let first = before[0].servers.clone();
    let dead = first[0];
    let i = cl.index_of(dead).await;
    cl.chunkservers[i].kill();

    // Until the masters call the server down its members count as good: wait for the
    // rebuilds to move every member off it, then for nothing short or running.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while common::chunks(&c, "/r")
        .await
        .iter()
        .any(|g| g.servers.contains(&dead))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "members not rebuilt: {:?}",
            cl.status().await
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let s = cl
        .wait_fully_replicated(std::time::Duration::from_secs(60))
        .await;
    assert!(s.repairs_done >= 1, "{s:?}");
    eprintln!(
        "repairs done {}, {} bytes",
        s.repairs_done, s.repaired_bytes
    );
    let after = common::chunks(&c, "/r").await;
    for (a, b) in after.iter().zip(&before) {
        assert_eq!((a.id, a.length), (b.id, b.length));
        let mut distinct = a.servers.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            3,
            "members on distinct servers: {:?}",
            a.servers
        );
        assert!(
            !a.servers.contains(&dead),
            "{:?} still names {dead}",
            a.servers
        );
        // Only the dead server's position moved.
        for (i, (x, y)) in a.servers.iter().zip(&b.servers).enumerate() {
            assert!(x == y || *y == dead, "member {i}: {y} became {x}");
        }
    }
    // The rebuilt member of the first group is read (decoded with its parity) once the
    // server of the other data member dies too.
    let i = cl.index_of(first[1]).await;
    cl.chunkservers[i].kill();
    let got = c.read("/r", 0, len as usize).await.unwrap();
    same(&got, &common::bytes(4, 0, len as usize), 0);
}

/// `replicas:3,then:ec:2+1`: once the file has been left alone for the conversion age, its
/// sealed chunks are encoded into groups by the chunkservers and switched in one step each;
/// the replicas go. A worker chunkserver and the master killed mid-conversion leave every
/// byte readable, and the conversion finishes afterwards; the groups survive a lost server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn then_ec_files_are_converted_and_survive_kills_mid_conversion() {
    let dir = tempfile::tempdir().unwrap();
    let mut cl = Cluster::start(dir.path(), 1, 4).await;
    let masters = cl.master_addrs().join(",");
    let opts = cairn_client::ClientOptions {
        chunk_size: 1 << 20,
        ..cairn_client::ClientOptions::default()
    };
    let c = cl.client_with(opts).await;
    let mut w = c
        .create("/t", ec_opts("replicas:3,then:ec:2+1"))
        .await
        .unwrap();
    let len = 24_000_017u64;
    let mut off = 0;
    while off < len {
        let n = (len - off).min(300_001);
        w.append(&common::bytes(5, off, n as usize)).await.unwrap();
        off += n;
    }
    assert_eq!(w.close().await.unwrap(), len);
    // A compressed one beside it, its last group padded too.
    let zlen = 2_500_003usize;
    let mut w = c
        .create("/tz", ec_opts("replicas:3,then:ec:2+1,lz4"))
        .await
        .unwrap();
    w.append(&log_text(3, zlen)).await.unwrap();
    w.close().await.unwrap();
    let before = common::chunks(&c, "/t").await;
    assert!(before.len() >= 20, "{} chunks", before.len());
    let check = |c: cairn_client::Client| async move {
        let got = c.read("/t", 0, len as usize).await.unwrap();
        same(&got, &common::bytes(5, 0, len as usize), 0);
    };
    // Younger than the conversion age (an hour by default): nothing moves.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let s = cl.status().await.unwrap();
    assert_eq!((s.conversions_waiting, s.conversions_done), (0, 0), "{s:?}");
    assert!(
        common::chunks(&c, "/t")
            .await
            .iter()
            .all(|c| c.ec_data == 0)
    );

    // Slow background work (1 MiB/s per server), so that the kills land mid-conversion.
    let admin = |args: &[&str]| {
        run_ok(cairn().args(["admin", "--cluster", &masters]).args(args));
    };
    admin(&["set", "background-bandwidth", "1m"]);
    admin(&["set", "convert-after", "0"]);
    let converted =
        |chunks: &[cairn_rpc::pb::ChunkMeta]| chunks.iter().filter(|c| c.ec_data > 0).count();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while converted(&common::chunks(&c, "/t").await) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no conversion started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let s = cl.status().await.unwrap();
    eprintln!(
        "killing a chunkserver with {} conversions running, {} done",
        s.conversions_running, s.conversions_done
    );
    cl.chunkservers[0].kill();
    check(c.clone()).await;
    cl.chunkservers[0].start();
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    cl.masters[0].kill();
    cl.masters[0].start();
    cl.wait_servers_up(4, std::time::Duration::from_secs(30))
        .await;
    check(c.clone()).await;
    admin(&["set", "background-bandwidth", "200m"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let after = loop {
        let ch = common::chunks(&c, "/t").await;
        if converted(&ch) == ch.len() {
            break ch;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {} chunks converted; {:?}",
            converted(&ch),
            ch.len(),
            cl.status().await
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    for (a, b) in after.iter().zip(&before) {
        assert_eq!(a.length, b.length);
        assert_ne!(a.id, b.id, "a group has an id of its own");
        assert!(a.sealed);
        let mut distinct = a.servers.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 3, "{:?}", a.servers);
    }
    check(c.clone()).await;
    // The replicas (and the members of abandoned tries) are deleted: each server ends up
    // holding exactly its members, 1.5× the bytes instead of 3×.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let tz = loop {
        let ch = common::chunks(&c, "/tz").await;
        if converted(&ch) == ch.len() {
            break ch;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "/tz not converted: {ch:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(tz.iter().all(|g| g.lz4_stream > 0), "{tz:?}");
    let want = 3 * (after.len() + tz.len()) as u64;
    loop {
        let s = cl.status().await.unwrap();
        let held: u64 = s.servers.iter().map(|x| x.chunk_count).sum();
        if held == want && s.pending_deletes == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "servers hold {held} chunks, want {want}; {} pending deletes",
            s.pending_deletes
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let s = cl.status().await.unwrap();
    eprintln!(
        "converted {} chunks ({} bytes) since the restart, {} failed",
        s.conversions_done, s.converted_bytes, s.conversions_failed
    );
    let dead = cl.server_id(2).await;
    cl.chunkservers[2].kill();
    check(c.clone()).await;
    // The dead server's members (padded last stripes and compressed streams among them) are
    // rebuilt on the fourth server, and read from there.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let mut on_dead = 0;
        for path in ["/t", "/tz"] {
            let ch = common::chunks(&c, path).await;
            assert!(ch.iter().all(|c| c.ec_data > 0), "{path}: {ch:?}");
            on_dead += ch.iter().filter(|g| g.servers.contains(&dead)).count();
        }
        if on_dead == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{on_dead} groups still on {dead}: {:?}",
            cl.status().await
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    cl.wait_fully_replicated(std::time::Duration::from_secs(60))
        .await;
    check(c.clone()).await;
    let got = c.read("/tz", 0, zlen).await.unwrap();
    same(&got, &log_text(3, zlen), 0);
}

/// Log-like text, `n` bytes: compresses well, as logs do.
fn log_text(seed: u64, n: usize) -> Vec<u8> {
    use rand::Rng;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n + 200);
    let levels = ["INFO", "WARN", "DEBUG"];
    while out.len() < n {
        let line = format!(
            "2026-11-25T16:{:02}:{:02}.{:03}Z {} cairn_chunkserver::repair: chunk={} offset={} len={} elapsed={}us\n",
            rng.random_range(0..60),
            rng.random_range(0..60),
            rng.random_range(0..1000),
            levels[rng.random_range(0..3)],
            rng.random_range(1000..1100),
            rng.random_range(0..64) * 65536,
            rng.random_range(1..5) * 4096,
            rng.random_range(10..999),
        );
        out.extend_from_slice(line.as_bytes());
    }
    out.truncate(n);
    out
}

/// `replicas:3,then:ec:2+1,lz4`: the conversion stores LZ4 blocks and their index in the
/// group; reads of any range decompress them transparently; incompressible bytes stay raw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lz4_files_are_compressed_by_the_conversion() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs().join(",");
    let opts = cairn_client::ClientOptions {
        chunk_size: 2 << 20,
        ..cairn_client::ClientOptions::default()
    };
    let c = cl.client_with(opts).await;
    let mut w = c
        .create("/z", ec_opts("replicas:3,then:ec:2+1,lz4"))
        .await
        .unwrap();
    // 6 MiB of text, then 2 MiB of random bytes, then a little text.
    let mut want = log_text(1, 6 << 20);
    let mut noise = vec![0u8; 2 << 20];
    rand::RngCore::fill_bytes(
        &mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(6),
        &mut noise,
    );
    want.extend(noise);
    want.extend(log_text(2, 300_007));
    for piece in want.chunks(500_000) {
        w.append(piece).await.unwrap();
    }
    assert_eq!(w.close().await.unwrap(), want.len() as u64);
    run_ok(cairn().args(["admin", "--cluster", &masters, "set", "convert-after", "0"]));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let chunks = loop {
        let ch = common::chunks(&c, "/z").await;
        if ch.iter().all(|c| c.ec_data > 0) {
            break ch;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not converted: {ch:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let mut at = 0u64;
    for ch in &chunks {
        assert!(ch.lz4_stream > 0 && ch.lz4_block == 64 << 10, "{ch:?}");
        let ratio = ch.length as f64 / ch.lz4_stream as f64;
        eprintln!(
            "chunk at {at}: {} bytes in a {}-byte stream, ratio {ratio:.2}",
            ch.length, ch.lz4_stream
        );
        if at + ch.length <= 6 << 20 {
            assert!(ratio > 2.0, "text compressed {ratio:.2}×");
        } else if at >= 6 << 20 && at + ch.length <= 8 << 20 {
            // Noise: stored raw, 16 bytes a block plus the index.
            assert!(ch.lz4_stream > ch.length && ch.lz4_stream < ch.length + ch.length / 1000);
        }
        at += ch.length;
    }
    let got = c.read("/z", 0, want.len()).await.unwrap();
    same(&got, &want, 0);
    // The accounting: every user byte converted once; each group's three members written
    // (stripes of 128 KiB over the stream), two of them sent over the network (the worker
    // holds a copy and, with three servers, is always a member).
    let member = |ch: &cairn_rpc::pb::ChunkMeta| ch.lz4_stream.div_ceil(128 << 10) * (64 << 10);
    let device: u64 = chunks.iter().map(|ch| 3 * member(ch)).sum();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let s = cl.status().await.unwrap();
        let sum = |f: fn(&cairn_rpc::pb::ServerStatus) -> u64| s.servers.iter().map(f).sum::<u64>();
        let got = (
            sum(|x| x.convert_user_bytes),
            sum(|x| x.convert_device_bytes),
            sum(|x| x.convert_network_bytes),
        );
        if got == (want.len() as u64, device, device / 3 * 2) {
            eprintln!(
                "conversion wrote {:.3} bytes per user byte",
                device as f64 / want.len() as f64
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "accounting {got:?}, want {:?}",
            (want.len(), device, device / 3 * 2)
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let out = run_ok(cairn().args(["status", "--cluster", &masters]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("background traffic: conversion"), "{text}");
    // Ranges inside one block, across blocks, across chunks.
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(9);
    for _ in 0..40 {
        let off = rand::Rng::random_range(&mut rng, 0..want.len() as u64 - 1);
        let n = rand::Rng::random_range(&mut rng, 1..300_000).min(want.len() - off as usize);
        let got = c.read("/z", off, n).await.unwrap();
        same(&got, &want[off as usize..off as usize + n], off);
    }
}
