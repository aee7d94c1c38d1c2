//! One real master on loopback, driven through its gRPC API.

use cairn_master::{MasterOptions, serve};
use cairn_rpc::{ErrorKind, Masters, pb};
use std::time::Duration;

struct Running {
    addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

async fn start(dir: &std::path::Path, port: u16) -> Running {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut opts = MasterOptions::single(dir.to_path_buf(), addr);
    opts.snapshot_every = 50;
    opts.state_cache = 16;
    run(opts, listener)
}

fn run(opts: MasterOptions, listener: tokio::net::TcpListener) -> Running {
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        serve(opts, listener, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    Running {
        addr,
        stop: Some(tx),
        task,
    }
}

impl Running {
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap();
    }
}

fn path(p: &str) -> pb::PathRequest {
    pb::PathRequest { path: p.into() }
}

/// The whole directory at `p` (no limit: a small one).
fn list(p: &str) -> pb::ListRequest {
    pb::ListRequest {
        path: p.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_over_grpc_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let m = start(dir.path(), 0).await;
    let port: u16 = m.addr.rsplit(':').next().unwrap().parse().unwrap();
    let c = Masters::new(std::slice::from_ref(&m.addr)).unwrap();
    c.call(|mut c| async move {
        c.mkdir(pb::MkdirRequest {
            path: "/logs/app".into(),
            parents: true,
            policy: None,
            mode: None,
        })
        .await
    })
    .await
    .unwrap();
    // 100 files: enough log entries for two snapshots (every 50) before the restart.
    for i in 0..100 {
        c.call(|mut c| async move {
            c.create(pb::CreateRequest {
                path: format!("/logs/app/f{i:03}"),
                policy: None,
                client_id: String::new(),
                chunks: 0,
                parents: false,
                mode: None,
            })
            .await
        })
        .await
        .unwrap();
    }
    let e = c
        .call(|mut c| async move { c.stat(path("/nope")).await })
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    let e = c
        .call(|mut c| async move { c.stat(path("relative")).await })
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    // A chunk needs chunkservers: none registered yet → NoServers (after the client's retries).
    let quick = Masters::new(std::slice::from_ref(&m.addr))
        .unwrap()
        .retry_for(Duration::from_millis(200));
    let e = quick
        .call(|mut c| async move {
            c.create(pb::CreateRequest {
                path: "/x".into(),
                policy: None,
                client_id: "w".into(),
                chunks: 1,
                parents: false,
                mode: None,
            })
            .await
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoServers);
    // Register three servers, heartbeat, then chunks are placed on all three.
    for id in 1..=3u64 {
        c.call(|mut c| async move {
            c.register(pb::RegisterRequest {
                server_id: id,
                addr: format!("127.0.0.1:{}", 9000 + id),
                host: format!("h{id}"),
                rack: String::new(),
            })
            .await
        })
        .await
        .unwrap();
        // Until the answer carries the capability keys (the leader makes the first within a
        // second): a server without them takes no new chunks.
        loop {
            let r = c
                .call(|mut c| async move {
                    c.heartbeat(pb::HeartbeatRequest {
                        server_id: id,
                        capacity_bytes: 1 << 30,
                        healthy: true,
                        full_report: true,
                        ..Default::default()
                    })
                    .await
                })
                .await
                .unwrap();
            assert!(!r.send_full_report);
            if !r.cap_keys.is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    let f = c
        .call(|mut c| async move {
            c.create(pb::CreateRequest {
                path: "/x".into(),
                policy: None,
                client_id: "w".into(),
                chunks: 2,
                parents: false,
                mode: None,
            })
            .await
        })
        .await
        .unwrap();
    let file = f.file.unwrap();
    assert_eq!(file.chunks.len(), 2);
    let mut s = file.chunks[0].servers.clone();
    s.sort();
    assert_eq!(s, [1, 2, 3]);
    assert_eq!(f.servers.len(), 3);
    assert_eq!(file.lease.unwrap().holder, "w");
    m.stop().await;

    // Restart on the same port and directory: everything is still there.
    let m = start(dir.path(), port).await;
    let c = Masters::new(std::slice::from_ref(&m.addr)).unwrap();
    let l = c
        .call(|mut c| async move { c.list(list("/logs/app")).await })
        .await
        .unwrap();
    assert_eq!(l.entries.len(), 100);
    let st = c
        .call(|mut c| async move { c.stat(path("/x")).await })
        .await
        .unwrap();
    assert_eq!(st.file.unwrap().chunks.len(), 2);
    let status = c
        .call(|mut c| async move { c.status(pb::Empty {}).await })
        .await
        .unwrap();
    assert_eq!(status.files, 101);
    assert_eq!(status.servers.len(), 3);
    m.stop().await;
}

/// Creates and deletes of many concurrent callers share `Batch` calls; each caller gets its
/// own result (the one create of a duplicated path wins, a missing parent fails alone), the
/// same as with one call each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_share_batches() {
    let dir = tempfile::tempdir().unwrap();
    let m = start(dir.path(), 0).await;
    for in_flight in [1, 0] {
        let c = std::sync::Arc::new(
            Masters::new(std::slice::from_ref(&m.addr))
                .unwrap()
                .batch_in_flight(in_flight),
        );
        let top = format!("/b{in_flight}");
        c.call(|mut c| {
            let top = top.clone();
            async move {
                c.mkdir(pb::MkdirRequest {
                    path: top,
                    parents: false,
                    policy: None,
                    mode: None,
                })
                .await
            }
        })
        .await
        .unwrap();
        let create = |p: String| pb::CreateRequest {
            path: p,
            policy: None,
            client_id: String::new(),
            chunks: 0,
            parents: false,
            mode: None,
        };
        // 64 distinct files, 8 creates of one path, 4 under a missing directory.
        let mut tasks = Vec::new();
        for i in 0..76 {
            let (c, p) = (
                c.clone(),
                match i {
                    0..64 => format!("{top}/f{i}"),
                    64..72 => format!("{top}/dup"),
                    _ => format!("{top}/missing/f{i}"),
                },
            );
            let req = create(p);
            tasks.push(tokio::spawn(async move { c.create(req).await.map(|_| ()) }));
        }
        let mut kinds = std::collections::BTreeMap::new();
        for t in tasks {
            let k = t.await.unwrap().err().map(|e| e.kind);
            *kinds.entry(format!("{k:?}")).or_insert(0) += 1;
        }
        assert_eq!(kinds["None"], 65, "{kinds:?}");
        assert_eq!(kinds["Some(AlreadyExists)"], 7, "{kinds:?}");
        assert_eq!(kinds["Some(NotFound)"], 4, "{kinds:?}");
        let l = c
            .call(|mut cl| {
                let top = top.clone();
                async move { cl.list(list(&top)).await }
            })
            .await
            .unwrap();
        assert_eq!(l.entries.len(), 65);
        // Delete them all concurrently, plus one that is not there.
        let mut tasks = Vec::new();
        for e in l
            .entries
            .iter()
            .map(|e| format!("{top}/{}", e.name))
            .chain([format!("{top}/nope")])
        {
            let c = c.clone();
            tasks.push(tokio::spawn(async move { c.delete(path(&e)).await }));
        }
        let failed: Vec<_> = futures::future::join_all(tasks)
            .await
            .into_iter()
            .filter_map(|r| r.unwrap().err())
            .collect();
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].kind, ErrorKind::NotFound);
        let stats = c.batch_stats();
        if in_flight == 0 {
            assert_eq!(stats.calls, 0, "no batching asked for");
        } else {
            assert_eq!(stats.ops, 76 + 66);
            // The canary that batching happened at all: far fewer calls than operations.
            assert!(stats.calls < stats.ops / 2, "{stats:?}");
        }
    }
    m.stop().await;
}

async fn create_files(c: &Masters, from: usize, to: usize) {
    for i in from..to {
        c.call(|mut c| async move {
            c.create(pb::CreateRequest {
                path: format!("/t/f{i:03}"),
                policy: None,
                client_id: String::new(),
                chunks: 0,
                parents: true,
                mode: None,
            })
            .await
        })
        .await
        .unwrap();
    }
}

async fn count_files(c: &Masters) -> usize {
    let r = c
        .call(|mut c| async move { c.list(list("/t")).await })
        .await
        .unwrap();
    r.entries.len()
}

fn snapshot_files(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join("snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// The files of `/t` in the state a stopped master's data directory holds.
fn files_on_disk(dir: &std::path::Path) -> usize {
    let db = cairn_master::store::open_db(&dir.join("master.redb")).unwrap();
    let sm = cairn_master::store::StateMachine::open(db, dir, 16).unwrap();
    let a = sm.shared();
    let a = a.lock();
    a.state.list("/t").unwrap().len()
}

/// A master whose state was in memory, snapshotted as JSON (`fixtures/json-snapshot-master`:
/// the data directory a master of commit 1a7a65d left after creating `/t/f000`…`/t/f079`,
/// a snapshot every 50 entries, and deleting `/t/f003`), starts with its state moved into
/// the store's tables, which stand for the JSON snapshot (no copy in a file), and keeps it
/// through restarts and further snapshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_snapshot_master_moves_into_tables() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/json-snapshot-master.tar.gz"
    );
    let untar = std::process::Command::new("tar")
        .args(["-xzf", fixture, "-C"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(untar.success());
    let (mut expect, mut next) = (79, 80);
    let mut port = 0;
    for round in 0..3 {
        let m = start(dir.path(), port).await;
        port = m.addr.rsplit(':').next().unwrap().parse().unwrap();
        let c = Masters::new(std::slice::from_ref(&m.addr)).unwrap();
        assert_eq!(count_files(&c).await, expect, "round {round}");
        // The JSON is gone, and no file stands for it: the tables are the snapshot.
        assert_eq!(
            snapshot_files(dir.path()),
            Vec::<String>::new(),
            "round {round}"
        );
        create_files(&c, next, next + 70).await;
        (expect, next) = (expect + 70, next + 70);
        assert_eq!(count_files(&c).await, expect);
        m.stop().await;
        assert_eq!(files_on_disk(dir.path()), expect, "round {round}");
        let files = snapshot_files(dir.path());
        assert!(
            files.is_empty(),
            "snapshots are not copied into files: {files:?}"
        );
    }
}

/// What the masters of this test binary log (each line), to see that a snapshot was
/// installed (and where).
#[derive(Clone, Default)]
struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn capture() -> Self {
        let log = Log::default();
        let w = log.clone();
        tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .init();
        log
    }

    fn lines(&self, with: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains(with))
            .map(str::to_owned)
            .collect()
    }
}

fn addr_of(l: &tokio::net::TcpListener) -> String {
    l.local_addr().unwrap().to_string()
}

/// Listeners for three masters on loopback, and their addresses.
async fn three_listeners() -> (Vec<tokio::net::TcpListener>, Vec<String>) {
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(
            tokio::net::TcpListener::bind(("127.0.0.1", 0))
                .await
                .unwrap(),
        );
    }
    let addrs = listeners.iter().map(addr_of).collect();
    (listeners, addrs)
}

/// Starts master `i + 1` on each listener with `opts(i)`.
fn run_all(
    listeners: Vec<tokio::net::TcpListener>,
    opts: impl Fn(usize) -> MasterOptions,
) -> Vec<Option<Running>> {
    listeners
        .into_iter()
        .enumerate()
        .map(|(i, l)| Some(run(opts(i), l)))
        .collect()
}

/// Master `i + 1` of the group of masters at `addrs`, keeping its data in `dir`.
fn member(dir: &std::path::Path, addrs: &[String], i: usize) -> MasterOptions {
    let mut o = MasterOptions::single(dir.to_path_buf(), addrs[i].clone());
    o.id = i as u64 + 1;
    o.peers = (1..).zip(addrs.iter().cloned()).collect();
    o
}

/// Three masters; one is stopped while the others write and purge their logs past it (a
/// snapshot every 20 entries, 5 kept below it), so on its return it can only catch up by
/// receiving the leader's tables (streamed in chunks, kept as a file, checked, loaded). The
/// proof: with another master stopped, writes need it, and its own data directory holds
/// every file afterwards, also after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_far_behind_installs_the_leaders_snapshot() {
    let log = Log::capture();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (listeners, addrs) = three_listeners().await;
    let opts = |i: usize| {
        let mut o = member(dirs[i].path(), &addrs, i);
        o.snapshot_every = 20;
        o.log_keep = 5;
        o.state_cache = 8;
        o
    };
    let mut masters = run_all(listeners, opts);
    let c = Masters::new(&addrs).unwrap();
    create_files(&c, 0, 50).await;
    masters[2].take().unwrap().stop().await;
    create_files(&c, 50, 250).await;
    let l = tokio::net::TcpListener::bind(addrs[2].as_str())
        .await
        .unwrap();
    masters[2] = Some(run(opts(2), l));
    masters[0].take().unwrap().stop().await;
    // Masters 2 and 3 are the quorum now: these writes need master 3 caught up.
    create_files(&c, 250, 260).await;
    assert_eq!(count_files(&c).await, 260);
    masters[1].take().unwrap().stop().await;
    masters[2].take().unwrap().stop().await;
    let installed = log.lines("snapshot installed");
    assert!(
        installed
            .iter()
            .any(|l| l.contains(&dirs[2].path().display().to_string())),
        "master 3 caught up without installing a snapshot: {installed:?}"
    );
    assert!(files_on_disk(dirs[2].path()) >= 250);
    let incoming: Vec<_> = std::fs::read_dir(dirs[2].path().join("snapshots-incoming"))
        .unwrap()
        .collect();
    assert!(incoming.is_empty(), "partial transfers left: {incoming:?}");
    let kept = snapshot_files(dirs[2].path());
    assert!(
        kept.is_empty(),
        "an installed snapshot's file is kept: {kept:?}"
    );
}

async fn status(c: &Masters) -> pb::StatusReply {
    c.call(|mut c| async move { c.status(pb::Empty {}).await })
        .await
        .unwrap()
}

/// Waits until partition `id` has a leader that is the root's leader and every member
/// hosts it; returns the status then.
async fn partition_follows_root(c: &Masters, id: u32) -> pb::StatusReply {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = status(c).await;
        let p = s.partitions.iter().find(|p| p.id == id);
        if p.is_some_and(|p| p.hosted && p.leader_id == s.leader_id && p.last_applied > 0) {
            return s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "partition {id} never followed the root's leader: {:?}",
            s.partitions
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A partition is a Raft group of its own on the same masters (docs/partitions.md): created
/// by one call, hosted by every member in a directory of its own, led by the root's leader
/// (also after that master stops and another leads the root), and there again after every
/// master restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_is_a_raft_group_that_follows_the_roots_leader() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (listeners, addrs) = three_listeners().await;
    let opts = |i: usize| member(dirs[i].path(), &addrs, i);
    let mut masters = run_all(listeners, opts);
    let c = Masters::new(&addrs).unwrap();
    let made = c
        .call(|mut c| async move {
            c.create_partition(pb::PartitionRequest { members: vec![] })
                .await
        })
        .await
        .unwrap();
    let p1 = made
        .partitions
        .iter()
        .find(|p| p.id == 1)
        .expect("partition 1");
    assert_eq!(p1.members, vec![1, 2, 3]);
    assert_eq!(made.partitions[0].id, 0, "the root comes first");
    // A member the root does not have is refused.
    let e = c
        .call(|mut c| async move {
            c.create_partition(pb::PartitionRequest {
                members: vec![1, 9],
            })
            .await
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");

    let s = partition_follows_root(&c, 1).await;
    for d in &dirs {
        let p = d.path().join("partitions/1");
        assert!(p.join("master.redb").exists() && p.join("raft-log").is_dir());
    }
    // The root's leader stops: another leads the root, and partition 1 follows it there.
    let old = s.leader_id as usize;
    masters[old - 1].take().unwrap().stop().await;
    let s = partition_follows_root(&c, 1).await;
    assert_ne!(s.leader_id as usize, old);
    let l = tokio::net::TcpListener::bind(addrs[old - 1].as_str())
        .await
        .unwrap();
    masters[old - 1] = Some(run(opts(old - 1), l));
    // Every master restarts: the partition is in the root's state and in its own store.
    for m in &mut masters {
        m.take().unwrap().stop().await;
    }
    for (i, a) in addrs.iter().enumerate() {
        let l = tokio::net::TcpListener::bind(a.as_str()).await.unwrap();
        masters[i] = Some(run(opts(i), l));
    }
    let s = partition_follows_root(&c, 1).await;
    assert_eq!(s.partitions.len(), 2, "{:?}", s.partitions);
    for m in &mut masters {
        m.take().unwrap().stop().await;
    }
}
