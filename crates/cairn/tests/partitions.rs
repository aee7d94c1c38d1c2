//! Partitions end to end (docs/partitions.md): real masters and chunkservers on loopback. A
//! subtree split into a partition of its own is served by that partition's Raft group through
//! the SDK and the CLI; its chunks carry the partition in their ids and are never taken for
//! orphans; it survives the loss of the leader and a restart of every master. A populated
//! subtree moves into a partition while it is written, its chunks forwarded, and a subtree
//! of that partition moves on into another.

mod common;

use cairn_client::{ClientOptions, CreateOptions, Error};
use cairn_rpc::ErrorKind;
use common::{Cluster, bytes, cairn};
use std::time::{Duration, Instant};

fn small_chunks() -> ClientOptions {
    ClientOptions {
        chunk_size: 256 << 10,
        renew_every: Duration::from_millis(500),
        ..ClientOptions::default()
    }
}

fn kind(e: &Error) -> Option<ErrorKind> {
    match e {
        Error::Meta(m) => Some(m.kind),
        _ => None,
    }
}

async fn write(c: &cairn_client::Client, path: &str, seed: u64, len: usize) {
    let mut w = c
        .create(
            path,
            CreateOptions {
                parents: true,
                ..CreateOptions::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    for piece in bytes(seed, 0, len).chunks(100_000) {
        w.append(piece).await.unwrap();
    }
    w.close().await.unwrap();
}

async fn check(c: &cairn_client::Client, files: &[(String, u64, usize)]) {
    for (path, seed, len) in files {
        let got = c
            .read(path, 0, *len)
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(got == bytes(*seed, 0, *len), "{path}: other bytes");
    }
}

/// The partition `id`'s row of the status.
/// `cairn admin --cluster ADDRS ARGS…`, which must succeed; its JSON output.
fn admin_json(addrs: &str, args: &[&str]) -> serde_json::Value {
    let out = cairn()
        .args(["admin", "--cluster", addrs])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// SIGKILLs every master, starts them again, and waits (30 s at most) until `path` is served;
/// a new client.
async fn restart_every_master(cl: &mut Cluster, path: &str) -> cairn_client::Client {
    for m in &mut cl.masters {
        m.kill();
    }
    for m in &mut cl.masters {
        m.start();
    }
    let fresh = cl.client_with(small_chunks()).await;
    let t = Instant::now();
    while fresh.stat(path).await.is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{path} is not served again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    fresh
}

/// Kills chunkserver `i` and waits until the masters count it down; its id.
async fn lose_chunkserver(cl: &mut Cluster, i: usize) -> u64 {
    let lost = cl.server_id(i).await;
    cl.chunkservers[i].kill();
    let t = Instant::now();
    while !cl
        .status()
        .await
        .is_ok_and(|s| s.servers.iter().any(|s| s.state == "down"))
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the chunkserver is never down"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lost
}

async fn partition(cl: &Cluster, id: u32) -> cairn_rpc::pb::PartitionStatus {
    let s = cl.status().await.unwrap();
    s.partitions
        .into_iter()
        .find(|p| p.id == id)
        .unwrap_or_else(|| panic!("partition {id} is not in the status"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subtree_split_into_a_partition_serves_files_through_failures() {
    let dir = tempfile::tempdir().unwrap();
    // Orphans go after 1 s: a chunk the root's state does not know is deleted at once unless
    // the leader asks the partition that allocated it.
    // (The harness's masters take a silent chunkserver for down after 4 s.)
    let fast = ["--orphan-grace-secs", "1"];
    let mut cl = Cluster::start_full(dir.path(), 3, 4, &fast, &[]).await;
    let c = cl.client_with(small_chunks()).await;
    let mut files = vec![("/root-file".to_owned(), 1, 300_000)];
    write(&c, "/root-file", 1, 300_000).await;
    let addrs = cl.master_addrs().join(",");
    let split = |path: &str| {
        cairn()
            .args([
                "admin",
                "--cluster",
                &addrs,
                "partition",
                "split",
                path,
                "--json",
            ])
            .output()
            .unwrap()
    };
    // A file cannot be a partition's top (a populated directory moves: the next test).
    let out = split("/root-file");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a directory"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = split("/p");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["id"], 1, "{v}");
    assert_eq!(v["subtree"], "/p");
    for i in 0..12u64 {
        let path = format!("/p/d{}/f{i}", i % 3);
        let len = 50_000 + (i as usize * 104_729) % 600_000;
        write(&c, &path, 100 + i, len).await;
        files.push((path, 100 + i, len));
    }
    // Ids carry the partition: chunks, and the subtree's top directory.
    for (path, _, _) in &files {
        let want = u64::from(path.starts_with("/p/"));
        for ch in common::chunks(&c, path).await {
            assert_eq!(ch.id >> 48, want, "{path}: chunk {}", ch.id);
        }
    }
    let p = partition(&cl, 1).await;
    assert_eq!((p.files, p.dirs, p.subtree.as_str()), (12, 4, "/p"));
    assert_eq!(partition(&cl, 0).await.files, 1);
    let listed: Vec<String> = c
        .list("/p")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(listed, ["d0", "d1", "d2"]);
    // Renames inside the partition; across partitions both ways (two-phase commit through
    // the root; the files keep their chunks, which resolve through forwards), of files and of
    // a directory with its files; of its top: refused, typed.
    c.rename("/p/d0/f0", "/p/d1/moved").await.unwrap();
    files[1].0 = "/p/d1/moved".into();
    c.rename("/p/d1/moved", "/elsewhere").await.unwrap();
    files[1].0 = "/elsewhere".into();
    c.rename("/root-file", "/p/d2/arrived").await.unwrap();
    files[0].0 = "/p/d2/arrived".into();
    assert_eq!(
        kind(&c.stat("/root-file").await.unwrap_err()),
        Some(ErrorKind::NotFound)
    );
    check(&c, &files).await;
    c.rename("/p/d0", "/d0").await.unwrap();
    let moved = |files: &mut Vec<(String, u64, usize)>, from: &str, to: &str| {
        for f in files.iter_mut() {
            if let Some(rest) = f.0.strip_prefix(from) {
                f.0 = format!("{to}{rest}");
            }
        }
    };
    moved(&mut files, "/p/d0/", "/d0/");
    assert_eq!(
        kind(&c.stat("/p/d0").await.unwrap_err()),
        Some(ErrorKind::NotFound)
    );
    check(&c, &files).await;
    assert_eq!(partition(&cl, 1).await.files, 9, "3 files left with d0");
    // Back, while a file in it is read; onto an existing path: refused, nothing moves.
    let e = c.rename("/d0", "/elsewhere").await.unwrap_err();
    assert_eq!(kind(&e), Some(ErrorKind::AlreadyExists), "{e}");
    c.rename("/d0", "/p/d0").await.unwrap();
    moved(&mut files, "/d0/", "/p/d0/");
    check(&c, &files).await;
    assert_eq!(partition(&cl, 1).await.files, 12);
    let e = c.rename("/elsewhere", "/p").await.unwrap_err();
    assert_eq!(kind(&e), Some(ErrorKind::InvalidArgument), "{e}");
    let e = c.delete("/p").await.unwrap_err();
    assert_eq!(kind(&e), Some(ErrorKind::InvalidArgument), "{e}");
    // The orphan grace passes many times over; every chunk stays.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let s = cl.status().await.unwrap();
    assert_eq!(s.pending_deletes, 0);
    check(&c, &files).await;
    // A chunkserver is lost: the partition's chunks are repaired like the root's.
    let lost = lose_chunkserver(&mut cl, 0).await;
    cl.wait_fully_replicated(Duration::from_secs(60)).await;
    // Not only "nothing counted missing": every chunk is on three servers, none the lost one.
    for (path, _, _) in &files {
        for ch in common::chunks(&c, path).await {
            assert_eq!(ch.servers.len(), 3, "{path}: chunk {}", ch.id);
            assert!(
                !ch.servers.contains(&lost),
                "{path}: chunk {} on the lost server",
                ch.id
            );
        }
    }
    check(&c, &files).await;
    // The leader is lost: the partition's leadership follows the root's to the new leader.
    let old = cl.leader().await;
    cl.masters[old as usize - 1].kill();
    let t = Instant::now();
    loop {
        if let Ok(s) = cl.status().await
            && s.leader_id != old
            && s.partitions.iter().all(|p| p.leader_id == s.leader_id)
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no new leader for every partition"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    write(&c, "/p/d2/after-kill", 7, 400_000).await;
    files.push(("/p/d2/after-kill".into(), 7, 400_000));
    check(&c, &files).await;
    // Every master is killed and starts again: the map, the partition's files and ids stay.
    let fresh = restart_every_master(&mut cl, "/p/d2/after-kill").await;
    check(&fresh, &files).await;
    write(&fresh, "/p/d0/after-restart", 8, 10_000).await;
    let ch = common::chunks(&fresh, "/p/d0/after-restart").await;
    assert_eq!(ch[0].id >> 48, 1);
    assert_eq!(partition(&cl, 1).await.files, 14);
    cl.wait_fully_replicated(Duration::from_secs(30)).await;
    assert_eq!(cl.status().await.unwrap().pending_deletes, 0);
    // A chunk id of a partition the map does not hold is an unknown chunk, not an outage.
    let unknown = fresh.locate((7 << 48) | 1).await.unwrap();
    assert!(
        unknown.servers.is_empty() && unknown.length == 0,
        "{unknown:?}"
    );
    // The metadata check reads both partitions and finds them consistent.
    let v = admin_json(&addrs, &["check", "--json"]);
    assert_eq!(v["problems"], 0, "{v}");
    assert_eq!(v["partitions"][1]["partition"], 1, "{v}");
    // The top, d0..d2 and 14 files; their chunks.
    assert_eq!(v["partitions"][1]["inodes"], 18, "{v}");
    assert!(v["partitions"][1]["chunks"].as_u64().unwrap() >= 14, "{v}");
    // The three masters' copies of both partitions, compared at one entry: equal.
    let v = admin_json(&addrs, &["digests", "--json", "--rounds", "50"]);
    assert_eq!(v["diverged"], 0, "{v}");
    let parts = v["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 2, "{v}");
    for p in parts {
        assert_eq!(p["compared"], true, "{v}");
        let m = p["masters"].as_array().unwrap();
        assert_eq!(m.len(), 3, "{v}");
        assert!(m[0]["rows"].as_u64().unwrap() > 0, "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_populated_subtree_moves_into_a_partition_while_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let fast = ["--orphan-grace-secs", "1"];
    let mut cl = Cluster::start_full(dir.path(), 3, 4, &fast, &[]).await;
    let c = cl.client_with(small_chunks()).await;
    let mut files = Vec::new();
    for i in 0..30u64 {
        let path = format!("/full/d{}/e{}/f{i}", i % 4, i % 3);
        let len = 1_000 + (i as usize * 65_537) % 700_000;
        write(&c, &path, 200 + i, len).await;
        files.push((path, 200 + i, len));
    }
    write(&c, "/stays/f", 9, 5_000).await;
    files.push(("/stays/f".into(), 9, 5_000));
    // A writer keeps its file open across the move.
    let live = bytes(77, 0, 900_000);
    let mut w = c
        .create(
            "/full/live",
            CreateOptions {
                parents: true,
                ..CreateOptions::default()
            },
        )
        .await
        .unwrap();
    w.append(&live[..300_000]).await.unwrap();
    let addrs = cl.master_addrs().join(",");
    let split = {
        let addrs = addrs.clone();
        tokio::task::spawn_blocking(move || {
            cairn()
                .args(["admin", "--cluster", &addrs, "partition", "split", "/full"])
                .args(["--json"])
                .output()
                .unwrap()
        })
    };
    // Calls under /full while it moves: they wait for the move, then land in the partition.
    for i in 0..6u64 {
        let path = format!("/full/new/n{i}");
        write(&c, &path, 300 + i, 20_000).await;
        files.push((path, 300 + i, 20_000));
    }
    w.append(&live[300_000..600_000]).await.unwrap();
    let out = split.await.unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    w.append(&live[600_000..]).await.unwrap();
    w.close().await.unwrap();
    assert_eq!(c.read("/full/live", 0, live.len()).await.unwrap(), live);
    let p = partition(&cl, 1).await;
    assert_eq!((p.subtree.as_str(), p.files), ("/full", 37), "{p:?}");
    assert_eq!(partition(&cl, 0).await.files, 1);
    check(&c, &files).await;
    // The moved files' chunks keep their ids (allocated by the root); new ones are the
    // partition's.
    let old = common::chunks(&c, "/full/d1/e1/f1").await;
    assert!(old.iter().all(|ch| ch.id >> 48 == 0), "{old:?}");
    write(&c, "/full/d1/after", 5, 10_000).await;
    files.push(("/full/d1/after".into(), 5, 10_000));
    assert_eq!(common::chunks(&c, "/full/d1/after").await[0].id >> 48, 1);
    let located = c.locate(old[0].id).await.unwrap();
    assert_eq!(
        located.id, old[0].id,
        "a moved chunk is located through its forward"
    );
    // The orphan grace passes many times over: no moved chunk is taken for an orphan.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(cl.status().await.unwrap().pending_deletes, 0);
    check(&c, &files).await;
    // A chunkserver is lost: the moved chunks are repaired through their forwards.
    let lost = lose_chunkserver(&mut cl, 1).await;
    cl.wait_fully_replicated(Duration::from_secs(90)).await;
    for ch in common::chunks(&c, "/full/d1/e1/f1").await {
        assert_eq!(ch.servers.len(), 3, "chunk {}", ch.id);
        assert!(
            !ch.servers.contains(&lost),
            "chunk {} on the lost server",
            ch.id
        );
    }
    // Every master restarts: the map, the rows and the forwards stay.
    let fresh = restart_every_master(&mut cl, "/full/live").await;
    check(&fresh, &files).await;
    let v = admin_json(&addrs, &["check", "--json"]);
    assert_eq!(v["problems"], 0, "{v}");
    let v = admin_json(&addrs, &["digests", "--json", "--rounds", "50"]);
    assert_eq!(v["diverged"], 0, "{v}");

    // A subtree of partition 1 moves on into a partition of its own while it is written:
    // its chunks the root allocated (forwarded to partition 1 by the first move) and those
    // partition 1 allocated follow it, and none is taken for an orphan.
    let c = fresh;
    let split = {
        let addrs = addrs.clone();
        tokio::task::spawn_blocking(move || {
            cairn()
                .args([
                    "admin",
                    "--cluster",
                    &addrs,
                    "partition",
                    "split",
                    "/full/d1",
                ])
                .args(["--json"])
                .output()
                .unwrap()
        })
    };
    for i in 0..4u64 {
        let path = format!("/full/d1/new2/n{i}");
        write(&c, &path, 400 + i, 20_000).await;
        files.push((path, 400 + i, 20_000));
    }
    let out = split.await.unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let p2 = partition(&cl, 2).await;
    assert_eq!(p2.subtree, "/full/d1", "{p2:?}");
    check(&c, &files).await;
    let moved_on = common::chunks(&c, "/full/d1/e1/f1").await;
    assert!(moved_on.iter().all(|ch| ch.id >> 48 == 0), "{moved_on:?}");
    let by_p1 = common::chunks(&c, "/full/d1/after").await;
    assert_eq!(by_p1[0].id >> 48, 1);
    for id in [moved_on[0].id, by_p1[0].id] {
        assert_eq!(c.locate(id).await.unwrap().id, id, "chunk {id} is located");
    }
    write(&c, "/full/d1/after2", 6, 10_000).await;
    files.push(("/full/d1/after2".into(), 6, 10_000));
    assert_eq!(common::chunks(&c, "/full/d1/after2").await[0].id >> 48, 2);
    write(&c, "/full/d0/after2", 7, 10_000).await;
    files.push(("/full/d0/after2".into(), 7, 10_000));
    assert_eq!(common::chunks(&c, "/full/d0/after2").await[0].id >> 48, 1);
    // A directory of partition 1 above the subtree it gave away cannot be renamed.
    assert!(c.rename("/full/d1", "/full/d9").await.is_err());
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(cl.status().await.unwrap().pending_deletes, 0);
    check(&c, &files).await;
    let v = admin_json(&addrs, &["check", "--json"]);
    assert_eq!(v["problems"], 0, "{v}");
    let v = admin_json(&addrs, &["digests", "--json", "--rounds", "50"]);
    assert_eq!(v["diverged"], 0, "{v}");
}

/// Waits (30 s at most) until a partition holds `subtree`; its status.
async fn split_off(cl: &Cluster, subtree: &str) -> cairn_rpc::pb::PartitionStatus {
    let t = Instant::now();
    loop {
        if let Some(p) = cl
            .status()
            .await
            .ok()
            .and_then(|s| s.partitions.into_iter().find(|p| p.subtree == subtree))
        {
            return p;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{subtree} never split off: {:?}",
            cl.status().await.map(|s| s.partitions)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A partition that grows past `--split-files` splits on its own, the directory nearest half
/// of it going to a new partition; one that takes more calls a second than `--split-load`
/// splits off the directory taking nearest half of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_split_on_their_own_by_size_and_by_load() {
    // By size: 40 files in /big/a/x, 20 in /big/b, 5 in /small and 5 directories, 70 inodes
    // against a threshold of 60: /big/a/x (40 of 70) is nearest half.
    let dir = tempfile::tempdir().unwrap();
    let size = [
        "--split-files",
        "60",
        "--split-load",
        "0",
        "--split-every-secs",
        "1",
    ];
    let cl = Cluster::start_full(dir.path(), 1, 3, &size, &[]).await;
    let c = cl.client_with(small_chunks()).await;
    let mut files = Vec::new();
    for (d, n) in [("/big/a/x", 40u64), ("/big/b", 20), ("/small", 5)] {
        for i in 0..n {
            let path = format!("{d}/f{i}");
            write(&c, &path, i, 100).await;
            files.push((path, i, 100));
        }
    }
    let p = split_off(&cl, "/big/a/x").await;
    assert_eq!(p.files, 40, "{p:?}");
    check(&c, &files).await;
    write(&c, "/big/a/x/after", 1, 100).await;
    assert_ne!(common::chunks(&c, "/big/a/x/after").await[0].id >> 48, 0);
    // What is left (30 inodes) stays where it is.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(cl.status().await.unwrap().partitions.len(), 2);
    let addrs = cl.master_addrs().join(",");
    let v = admin_json(&addrs, &["check", "--json"]);
    assert_eq!(v["problems"], 0, "{v}");
    drop(cl);

    // By load: stats spread evenly over /hot/a and /hot/b (each half of the calls; /hot
    // takes them all, so it is no use) at more than 20 a second.
    let dir = tempfile::tempdir().unwrap();
    let load = [
        "--split-files",
        "0",
        "--split-load",
        "20",
        "--split-every-secs",
        "2",
    ];
    let cl = Cluster::start_full(dir.path(), 1, 3, &load, &[]).await;
    let c = cl.client_with(small_chunks()).await;
    for d in ["/hot/a/d", "/hot/b/d"] {
        for i in 0..3 {
            write(&c, &format!("{d}/f{i}"), i, 100).await;
        }
    }
    let t = Instant::now();
    let mut split = None;
    while split.is_none() {
        for i in 0..20u64 {
            let d = if i % 2 == 0 { "/hot/a/d" } else { "/hot/b/d" };
            c.stat(&format!("{d}/f{}", i % 3)).await.unwrap();
        }
        split = cl
            .status()
            .await
            .unwrap()
            .partitions
            .into_iter()
            .find(|p| p.id != 0 && !p.subtree.is_empty());
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no split by load within 30 s"
        );
    }
    let p = split.unwrap();
    assert!(
        p.subtree == "/hot/a" || p.subtree == "/hot/b",
        "{p:?}: a directory taking half the calls"
    );
    for d in ["/hot/a/d", "/hot/b/d"] {
        for i in 0..3 {
            c.stat(&format!("{d}/f{i}")).await.unwrap();
        }
    }
    let addrs = cl.master_addrs().join(",");
    let v = admin_json(&addrs, &["check", "--json"]);
    assert_eq!(v["problems"], 0, "{v}");
    drop(cl);

    // By load, one flat directory taking every call, spread over its files: no directory
    // to split off, so it is hashed over four partitions.
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start_full(dir.path(), 1, 3, &load, &[]).await;
    let c = cl.client_with(small_chunks()).await;
    let mut flat = Vec::new();
    for i in 0..24u64 {
        let path = format!("/flat/f{i}");
        write(&c, &path, i, 100).await;
        flat.push((path, i, 100));
    }
    let t = Instant::now();
    loop {
        for (path, _, _) in &flat {
            c.stat(path).await.unwrap();
        }
        let s = cl.status().await.unwrap();
        let shards = s.partitions.iter().filter(|p| p.subtree == "/flat").count();
        if shards > 0 {
            assert_eq!(shards, 4, "{:?}", s.partitions);
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no hashing by load within 30 s"
        );
    }
    check(&c, &flat).await;
    assert_eq!(c.list("/flat").await.unwrap().len(), 24);
    let addrs = cl.master_addrs().join(",");
    let v = admin_json(&addrs, &["check", "--json"]);
    assert_eq!(v["problems"], 0, "{v}");
}

/// A directory hashed over four partitions (`cairn admin partition split PATH --shards 4`):
/// its entries spread over the shards by name; a listing merges them in name order, page by
/// page; renames of files and directories between its names cross shards; its mode reaches
/// every shard; it is neither deleted nor renamed. One inside a split partition is reached
/// by a user who is not an admin (search rights checked in the partitions above it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_hashed_over_partitions_spreads_its_entries_and_lists_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start_full(dir.path(), 3, 3, &[], &[]).await;
    let c = cl.client_with(small_chunks()).await;
    let addrs = cl.master_addrs().join(",");
    let v = admin_json(
        &addrs,
        &["partition", "split", "/hot", "--shards", "4", "--json"],
    );
    let shards: Vec<u32> = v["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(shards.len(), 4, "{v}");
    // Asked again: the same shards, no new partition.
    let again = admin_json(
        &addrs,
        &["partition", "split", "/hot", "--shards", "4", "--json"],
    );
    assert_eq!(again["shards"], v["shards"]);
    let mut files = Vec::new();
    let mut names = Vec::new();
    for i in 0..40u64 {
        let name = format!("f{i:02}");
        let path = format!("/hot/{name}");
        write(&c, &path, 500 + i, 20_000).await;
        files.push((path, 500 + i, 20_000));
        names.push(name);
    }
    write(&c, "/hot/d/inner", 600, 30_000).await;
    files.push(("/hot/d/inner".into(), 600, 30_000));
    names.push("d".into());
    names.sort();
    let mut held = 0;
    for &p in &shards {
        let st = partition(&cl, p).await;
        assert_eq!(st.subtree, "/hot");
        assert!(st.files > 0, "shard {p} holds nothing: {st:?}");
        held += st.files;
    }
    assert_eq!(held, 41);
    let listed: Vec<String> = c
        .list("/hot")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(listed, names);
    // Page by page, 7 at a time: the same names, once each.
    let mut paged = Vec::new();
    let mut after = String::new();
    loop {
        let (page, more) = c.list_page("/hot", &after, 7).await.unwrap();
        assert!(page.len() <= 7);
        paged.extend(page.iter().map(|e| e.name.clone()));
        match page.last() {
            Some(l) if more => after = l.name.clone(),
            _ => break,
        }
    }
    assert_eq!(paged, names);
    // Renames between names (most cross shards), of files and of a directory.
    for (i, f) in files.iter_mut().enumerate().take(10) {
        let (from, to) = (format!("/hot/f{i:02}"), format!("/hot/g{i:02}"));
        c.rename(&from, &to).await.unwrap();
        f.0 = to;
    }
    c.rename("/hot/d", "/hot/e").await.unwrap();
    files[40].0 = "/hot/e/inner".into();
    check(&c, &files).await;
    // The directory itself: stat'ed; never deleted or renamed; its mode on every shard.
    assert!(c.stat("/hot").await.unwrap().is_dir);
    let e = c.delete("/hot").await.unwrap_err();
    assert_eq!(kind(&e), Some(ErrorKind::InvalidArgument), "{e}");
    let e = c.rename("/hot", "/cold").await.unwrap_err();
    assert_eq!(kind(&e), Some(ErrorKind::InvalidArgument), "{e}");
    c.set_attr("/hot", Some(0o777), None).await.unwrap();
    // A user who is not an admin creates under it (every shard's top allows it), and under
    // a directory hashed inside a split partition (search checked in each partition above).
    let alice = common::create_user(&cl.master_addrs(), "alice");
    let as_alice = cl
        .client_with(ClientOptions {
            credential: Some(cairn_rpc::auth::Credential::User {
                access_key: alice.access.clone(),
                secret_key: alice.secret.clone(),
            }),
            ..small_chunks()
        })
        .await;
    for i in 0..8 {
        write(&as_alice, &format!("/hot/alice{i}"), 700 + i, 1_000).await;
    }
    // Narrowed again: every shard refuses her (and the capabilities handed out for the
    // shards' files are revoked by the root).
    c.set_attr("/hot", Some(0o755), None).await.unwrap();
    for i in 0..8 {
        let e = as_alice
            .create(&format!("/hot/late{i}"), CreateOptions::default())
            .await
            .err()
            .unwrap_or_else(|| panic!("/hot/late{i}: created"));
        assert_eq!(kind(&e), Some(ErrorKind::PermissionDenied), "{e}");
    }
    admin_json(&addrs, &["partition", "split", "/p", "--json"]);
    c.mkdir_with("/p/q", true, None, Some(0o755)).await.unwrap();
    admin_json(
        &addrs,
        &["partition", "split", "/p/q/h", "--shards", "2", "--json"],
    );
    c.set_attr("/p/q/h", Some(0o777), None).await.unwrap();
    for i in 0..6 {
        write(&as_alice, &format!("/p/q/h/n{i}"), 800 + i, 1_000).await;
    }
    assert_eq!(as_alice.list("/p/q/h").await.unwrap().len(), 6);
    c.set_attr("/p/q", Some(0o700), None).await.unwrap();
    let e = as_alice.stat("/p/q/h/n0").await.unwrap_err();
    assert_eq!(kind(&e), Some(ErrorKind::PermissionDenied), "{e}");
    check(&c, &files).await;
    // A populated directory hashes too: its rows move to their shards by name (the split's
    // copy, spread), chunks forwarded; listed whole, read back, written on.
    let mut warm = Vec::new();
    for i in 0..30u64 {
        let path = format!("/warm/d{}/f{i}", i % 6);
        write(&c, &path, 900 + i, 10_000).await;
        warm.push((path, 900 + i, 10_000));
    }
    for i in 0..12u64 {
        let path = format!("/warm/top{i}");
        write(&c, &path, 950 + i, 10_000).await;
        warm.push((path, 950 + i, 10_000));
    }
    let v = admin_json(
        &addrs,
        &["partition", "split", "/warm", "--shards", "3", "--json"],
    );
    let wshards: Vec<u32> = v["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(wshards.len(), 3, "{v}");
    let mut held = 0;
    for &p in &wshards {
        held += partition(&cl, p).await.files;
    }
    assert_eq!(held, 42);
    let listed: Vec<String> = c
        .list("/warm")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    let mut want: Vec<String> = (0..6)
        .map(|d| format!("d{d}"))
        .chain((0..12).map(|i| format!("top{i}")))
        .collect();
    want.sort();
    assert_eq!(listed, want);
    check(&c, &warm).await;
    for (path, _, _) in &warm {
        for ch in common::chunks(&c, path).await {
            assert_eq!(ch.servers.len(), 3, "{path}: chunk {}", ch.id);
        }
    }
    write(&c, "/warm/d0/after", 990, 5_000).await;
    warm.push(("/warm/d0/after".into(), 990, 5_000));
    check(&c, &warm).await;
    check(&c, &files).await;
    let v = admin_json(&addrs, &["check", "--json"]);
    assert_eq!(v["problems"], 0, "{v}");
}
