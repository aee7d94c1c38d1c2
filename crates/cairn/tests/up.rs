//! The README's first command: `cairn up` brings up a cluster of processes; the CLI finds it
//! through cluster.toml; Ctrl-C (SIGINT) stops it cleanly; running it again brings the data back.

mod common;

use common::{cairn, run_ok};
use std::process::Stdio;
use std::time::{Duration, Instant};

#[allow(clippy::zombie_processes)] // on a failed start the test panics; the process is orphaned
fn up(dir: &std::path::Path) -> std::process::Child {
    use std::io::BufRead;
    let mut child = cairn()
        .args(["up", "--disk-size", "128m", "--data-dir"])
        .arg(dir)
        .env("CAIRN_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Ready when `cairn up` says so; the rest of its output is drained so it never blocks.
    let (tx, rx) = std::sync::mpsc::channel();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if line.starts_with("cairn up: ready") {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("cairn up never said it was ready");
    assert!(line.contains("3 of 3"), "{line}");
    // What it called ready is: the first command finds every chunkserver up.
    let out = run_ok(
        cairn()
            .args(["status", "--json"])
            .env("CAIRN_CLUSTER", masters(dir)),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let up = v["chunkservers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["state"] == "up")
        .count();
    assert_eq!(up, 3, "ready, but status says {v}");
    child
}

fn masters(dir: &std::path::Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(s) = std::fs::read_to_string(dir.join("cluster.toml")) {
            let v: toml::Value = toml::from_str(&s).unwrap();
            return v["masters"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
                .join(",");
        }
        assert!(Instant::now() < deadline, "no cluster.toml");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn stop(mut child: std::process::Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert!(status.success(), "cairn up exited with {status}");
}

#[test]
fn up_put_cat_ctrl_c_and_up_again() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cairn-data");
    let child = up(&dir);
    let m = masters(&dir);
    let data = tmp.path().join("in.bin");
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&data, &bytes).unwrap();
    run_ok(
        cairn()
            .args(["fs", "put"])
            .arg(&data)
            .arg("/d/in.bin")
            .env("CAIRN_CLUSTER", &m),
    );
    let cat = cairn()
        .args(["fs", "cat", "/d/in.bin"])
        .env("CAIRN_CLUSTER", &m)
        .output()
        .unwrap();
    assert!(cat.stdout == bytes);
    let missing = cairn()
        .args(["fs", "cat", "/d/nope"])
        .env("CAIRN_CLUSTER", &m)
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no such file"));
    stop(child);
    // Same directory: same cluster (same addresses), same data.
    let child = up(&dir);
    assert_eq!(masters(&dir), m);
    let cat = cairn()
        .args(["fs", "cat", "/d/in.bin"])
        .env("CAIRN_CLUSTER", &m)
        .output()
        .unwrap();
    assert!(cat.stdout == bytes, "data back after a restart");
    stop(child);
}
