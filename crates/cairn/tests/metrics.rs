//! Every process exports Prometheus metrics (`--metrics-listen`): a master and a chunkserver
//! serve `/metrics`, and the figures move with the traffic.

mod common;

use common::{Proc, free_addr};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// `GET /metrics` over a plain socket (HTTP/1.0: the server closes after the body).
fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(
        out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
        "{out}"
    );
    out
}

/// The value of the first sample of `metric` whose labels contain `labels`.
fn value(text: &str, metric: &str, labels: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(metric) && l.contains(labels))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_and_chunkserver_export_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (maddr, mmetrics, cmetrics) = (free_addr(), free_addr(), free_addr());
    let mut master = Proc {
        name: "master".into(),
        args: [
            "master",
            "--data-dir",
            &dir.path().join("m").display().to_string(),
            "--listen",
            &maddr,
            "--metrics-listen",
            &mmetrics,
        ]
        .map(String::from)
        .to_vec(),
        addr: maddr.clone(),
        child: None,
    };
    master.start();
    let mut cs = Proc {
        name: "chunkserver".into(),
        args: [
            "chunkserver",
            "--data-dir",
            &dir.path().join("c").display().to_string(),
            "--listen",
            "127.0.0.1:0",
            "--masters",
            &maddr,
            "--disk-size",
            "64m",
            "--heartbeat-ms",
            "200",
            "--metrics-listen",
            &cmetrics,
        ]
        .map(String::from)
        .to_vec(),
        addr: String::new(),
        child: None,
    };
    cs.start();
    let c = cairn_client::Client::with_options(
        std::slice::from_ref(&maddr),
        cairn_client::ClientOptions {
            credential: Some(common::credential()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // Wait for the server to register, then write and read a one-copy file.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut w = loop {
        let opts = cairn_client::CreateOptions::replicas(1);
        match c.create("/m/f", opts).await {
            Ok(w) => break w,
            Err(e) => {
                assert!(Instant::now() < deadline, "no chunkserver: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    for _ in 0..10 {
        w.append(&[7u8; 4096]).await.unwrap();
    }
    w.close().await.unwrap();
    assert_eq!(c.read("/m/f", 0, 4096).await.unwrap(), vec![7u8; 4096]);

    let text = scrape(&cmetrics);
    let appends = value(&text, "cairn_chunkserver_requests_total", "op=\"append\"").unwrap_or(0.0)
        + value(&text, "cairn_chunkserver_requests_total", "op=\"create\"").unwrap_or(0.0);
    assert!(appends >= 10.0, "{text}");
    assert!(
        value(
            &text,
            "cairn_chunkserver_request_seconds_count",
            "op=\"read\""
        )
        .unwrap()
            >= 1.0,
        "{text}"
    );
    assert!(value(&text, "cairn_chunkserver_bytes_total", "dir=\"in\"").unwrap() >= 40960.0);
    // The chunk store's own counters, exported at each heartbeat: the 10 appends (the first
    // may ride on the create), their bytes, their flushes and where their time went.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let t = scrape(&cmetrics);
        let store = |m: &str, labels: &str| value(&t, m, labels).unwrap_or(0.0);
        let disk = "disk=\"0\"";
        if store("cairn_chunkstore_appends_total", disk) >= 10.0 {
            assert!(
                store("cairn_chunkstore_append_bytes_total", disk) >= 40960.0,
                "{t}"
            );
            assert!(store("cairn_chunkstore_flushes_total", disk) >= 1.0, "{t}");
            let phase = |p: &str| {
                store(
                    "cairn_chunkstore_append_micros_total",
                    &format!("phase=\"{p}\""),
                )
            };
            // Ten synced appends cannot all take under a microsecond on the device.
            assert!(phase("write") + phase("flush") >= 1.0, "{t}");
            assert!(
                t.lines()
                    .any(|l| l.starts_with("cairn_chunkstore_append_micros_total{")
                        && l.contains("disk=\"0\",phase=\"queue\"}")),
                "{t}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "store counters never came:\n{t}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Gauges from the heartbeat and the master's once-a-second refresh.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = scrape(&mmetrics);
        let up = value(&m, "cairn_master_chunkservers", "state=\"up\"");
        let leader = value(&m, "cairn_master_is_leader", "");
        if up == Some(1.0)
            && leader == Some(1.0)
            && value(&m, "cairn_master_files", "") == Some(1.0)
        {
            // The state's tables report their rows (the file, the root and its directory
            // entry at least) and cache reads.
            assert!(
                value(
                    &m,
                    "cairn_master_state_rows",
                    "table=\"inodes\",partition=\"0\""
                )
                .is_some_and(|v| v >= 2.0),
                "{m}"
            );
            assert!(
                value(
                    &m,
                    "cairn_master_state_cache_hits_total",
                    "table=\"inodes\""
                )
                .is_some(),
                "{m}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "master metrics never settled:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
