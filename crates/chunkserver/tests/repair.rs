//! A repair on loopback: a target chunkserver copies a sealed chunk from its sources.

use cairn_chunkserver::repair::Repairer;
use cairn_chunkserver::{Chunkserver, DiskSet, DiskSetOptions, ServerOptions};
use cairn_chunkstore::{FormatOptions, OpenOptions};
use cairn_client::DataConn;
use cairn_rpc::pb;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn chunkserver(dir: &std::path::Path) -> Arc<Chunkserver> {
    let set = DiskSet::open(&DiskSetOptions {
        paths: vec![dir.join("disk0.cairn")],
        create_bytes: 64 << 20,
        zero_fill: false,
        format: FormatOptions::default(),
        open: OpenOptions::default(),
    })
    .unwrap();
    Chunkserver::new(set, ServerOptions::default())
}

async fn serve(cs: Arc<Chunkserver>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(cs.serve(listener, std::future::pending()));
    addr
}

/// A server that accepts connections and never answers (a frozen process: the kernel still
/// completes the handshake); counts the connections.
async fn black_hole() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::Relaxed);
            held.push(s);
        }
    });
    (addr, n)
}

/// A source that stopped answering after the task was made costs one timeout, not one per
/// piece: the copy asks the source that answers first from then on. (Before, every 256 KiB
/// piece waited out the 10 s timeout on the frozen source: this 2 MiB copy took ~90 s, and a
/// 64 MiB one in the repair benchmark stood still for minutes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_stopped_answering_is_asked_last() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = serve(chunkserver(d1.path())).await;
    let len = 2usize << 20;
    let data: Vec<u8> = (0..len as u64).map(|i| (i * 7 + i / 4096) as u8).collect();
    let c = DataConn::connect(source, Duration::from_secs(10))
        .await
        .unwrap();
    c.create(5, 1, data.clone()).await.unwrap();
    let sealed = c.seal(5).await.unwrap();

    let target = chunkserver(d2.path());
    let target_addr = serve(target.clone()).await;
    let repairer = Repairer::new(target);
    let (frozen, asked) = black_hole().await;
    let t0 = Instant::now();
    repairer.start(pb::RepairTask {
        chunk_id: 5,
        version: 1,
        length: len as u64,
        sources: vec![
            pb::ServerAddr {
                id: 1,
                addr: frozen.to_string(),
            },
            pb::ServerAddr {
                id: 2,
                addr: source.to_string(),
            },
        ],
        ..Default::default()
    });
    let done = loop {
        let d = repairer.take_done();
        if let Some(d) = d.into_iter().next() {
            break d;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "repair not done after {:?}; running {:?}",
            t0.elapsed(),
            repairer.running()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(done.ok, "{}", done.error);
    assert_eq!((done.length, done.crc32c), (len as u64, sealed.crc32c));
    // The first piece waited out the frozen source (its stat and its read), every later
    // piece came from the other source at once: one connection to the frozen one, not one
    // per piece (8 here).
    assert_eq!(
        asked.load(Ordering::Relaxed),
        1,
        "the frozen source was asked again"
    );
    let t = DataConn::connect(target_addr, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(t.read(5, 0, len).await.unwrap(), data);
    assert!(t.stat(5).await.unwrap().sealed);
}
