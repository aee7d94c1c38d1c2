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
    let mut opts = MasterOptions::single(dir.to_path_buf(), addr.clone());
    opts.snapshot_every = 50;
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
    }
    let f = c
        .call(|mut c| async move {
            c.create(pb::CreateRequest {
                path: "/x".into(),
                policy: None,
                client_id: "w".into(),
                chunks: 2,
                parents: false,
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
        .call(|mut c| async move { c.list(path("/logs/app")).await })
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
