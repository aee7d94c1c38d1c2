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
    run_ok(&mut fs(&["mkdir", "-p", "--policy", "replicas:2,lz4", "/logs"]));
    assert_eq!(stat_json(&masters, "/logs")["policy"], "replicas:2,lz4");
    run_ok(&mut fs(&["mkdir", "-p", "/logs/app"]));
    assert_eq!(stat_json(&masters, "/logs/app")["policy"], "replicas:2,lz4");
    run_ok(&mut fs(&["create", "/logs/app/a"]));
    let a = stat_json(&masters, "/logs/app/a");
    assert_eq!(a["policy"], "replicas:2,lz4");
    assert_eq!(a["replicas"], 2);
    // An explicit policy wins over the directory's.
    run_ok(&mut fs(&["create", "--policy", "replicas:3,then:ec:2+1", "/logs/app/b"]));
    assert_eq!(
        stat_json(&masters, "/logs/app/b")["policy"],
        "replicas:3,then:ec:2+1"
    );
    // Outside the directory: the cluster default, and no directory default shown.
    run_ok(&mut fs(&["create", "/c"]));
    assert_eq!(stat_json(&masters, "/c")["policy"], "replicas:3");
    assert!(stat_json(&masters, "/")["policy"].is_null());
    // `mkdir -p --policy` on an existing directory changes the default for new files only.
    run_ok(&mut fs(&["mkdir", "-p", "--policy", "replicas:1", "/logs/app"]));
    run_ok(&mut fs(&["create", "/logs/app/d"]));
    assert_eq!(stat_json(&masters, "/logs/app/d")["policy"], "replicas:1");
    assert_eq!(stat_json(&masters, "/logs/app/a")["policy"], "replicas:2,lz4");
    let text = run_ok(&mut fs(&["stat", "/logs/app/d"])).stdout;
    let text = String::from_utf8(text).unwrap();
    assert!(text.contains("replicas:1"), "{text}");

    // Bad text is refused by the CLI before anything is sent, with the reason.
    for bad in ["ec:1+1", "ec:4", "replicas:0", "replicas:3,then:replicas:2", "raid5"] {
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
        assert!(t0.elapsed() < std::time::Duration::from_secs(5), "{text}: retried");
        assert_eq!(meta_kind(&e), Some(ErrorKind::InvalidArgument), "{text}: {e}");
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
    // So is a directory default the cluster can place but a create below it cannot.
    run_ok(&mut fs(&["mkdir", "--policy", "ec:4+2", "/wide-dir"]));
    let e = c
        .create("/wide-dir/f", CreateOptions::default())
        .await
        .err()
        .expect("ec:4+2 on 3 servers");
    assert_eq!(meta_kind(&e), Some(ErrorKind::InvalidArgument), "{e}");
}
