//! The README's first command: `cairn up` brings up a cluster of processes; the CLI finds it
//! through cluster.toml; Ctrl-C (SIGINT) stops it cleanly; running it again brings the data back.

mod common;

use common::run_ok;

/// The CLI as a user of `cairn up` runs it: with the admin credentials `cairn up` wrote (and
/// not the tests' cluster secret).
fn cairn(dir: &std::path::Path) -> std::process::Command {
    let mut c = common::cairn();
    c.env_remove("CAIRN_CLUSTER_SECRET_FILE")
        .env("CAIRN_CREDENTIALS", dir.join("admin.credentials"))
        // The control plane is TLS by default: the CLI, run elsewhere, needs the CA.
        .env("CAIRN_TLS_DIR", dir.join("tls"));
    c
}
use std::process::Stdio;
use std::time::{Duration, Instant};

#[allow(clippy::zombie_processes)] // on a failed start the test panics; the process is orphaned
fn up(dir: &std::path::Path) -> std::process::Child {
    up_with(dir, &[])
}

/// [`up`] with more arguments for `cairn up`.
#[allow(clippy::zombie_processes)]
fn up_with(dir: &std::path::Path, extra: &[&std::ffi::OsStr]) -> std::process::Child {
    use std::io::BufRead;
    let mut child = cairn(dir)
        .args(["up", "--disk-size", "128m", "--data-dir"])
        .arg(dir)
        .args(extra)
        .env("CAIRN_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Ready when `cairn up` says so; the rest of its output is drained so it never blocks.
    let (tx, rx) = std::sync::mpsc::channel();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if line.starts_with("cairn up: ready") || line.starts_with("cairn up: S3 at") {
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
        cairn(dir)
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
    // The S3 gateway greets with its endpoint and the credentials it made.
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("cairn up never printed its S3 endpoint");
    assert!(line.contains("http://127.0.0.1:"), "{line}");
    child
}

/// The gateway `cairn up` runs: its address in cluster.toml, its pid in `cairn status --json`.
fn s3_endpoint(dir: &std::path::Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let file: toml::Value =
            toml::from_str(&std::fs::read_to_string(dir.join("cluster.toml")).unwrap()).unwrap();
        let s3 = &file["s3"][0];
        let (addr, pid) = (
            s3["addr"].as_str().unwrap(),
            s3["pid"].as_integer().unwrap(),
        );
        let out = run_ok(
            cairn(dir)
                .args(["status", "--json"])
                .env("CAIRN_CLUSTER", masters(dir)),
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let listed = v["s3"].as_array().unwrap().iter().any(|g| {
            g["endpoint"] == format!("http://{addr}") && g["pid"] == pid && g["state"] == "up"
        });
        if listed {
            return format!("http://{addr}");
        }
        assert!(
            Instant::now() < deadline,
            "status never listed the gateway: {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs a boto3 snippet with the credentials `cairn up` wrote (see tests/s3.rs for python()).
fn boto3(dir: &std::path::Path, endpoint: &str, code: &str) -> String {
    let py = std::env::var("CAIRN_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let creds = std::fs::read_to_string(dir.join("admin.credentials")).unwrap();
    let field = |k: &str| {
        creds
            .lines()
            .find_map(|l| l.split_once('=').filter(|(n, _)| n.trim() == k))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap()
    };
    let script = format!(
        "import boto3\ns3 = boto3.client('s3', endpoint_url='{endpoint}', region_name='us-east-1', \
         aws_access_key_id='{}', aws_secret_access_key='{}')\n{code}",
        field("aws_access_key_id"),
        field("aws_secret_access_key")
    );
    let out = run_ok(std::process::Command::new(py).args(["-c", &script]));
    String::from_utf8(out.stdout).unwrap()
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
        cairn(&dir)
            .args(["fs", "put"])
            .arg(&data)
            .arg("/d/in.bin")
            .env("CAIRN_CLUSTER", &m),
    );
    let cat = cairn(&dir)
        .args(["fs", "cat", "/d/in.bin"])
        .env("CAIRN_CLUSTER", &m)
        .output()
        .unwrap();
    assert!(cat.stdout == bytes);
    // The servers prove a secret `cairn up` made, kept for its owner only.
    {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(dir.join("cluster.secret")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }
    let missing = cairn(&dir)
        .args(["fs", "cat", "/d/nope"])
        .env("CAIRN_CLUSTER", &m)
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no such file"));
    let endpoint = s3_endpoint(&dir);
    boto3(
        &dir,
        &endpoint,
        "s3.create_bucket(Bucket='tour')\ns3.put_object(Bucket='tour', Key='k', Body=b'kept')",
    );
    stop(child);
    // Same directory: same cluster (same addresses), same data.
    let child = up(&dir);
    assert_eq!(masters(&dir), m);
    let cat = cairn(&dir)
        .args(["fs", "cat", "/d/in.bin"])
        .env("CAIRN_CLUSTER", &m)
        .output()
        .unwrap();
    assert!(cat.stdout == bytes, "data back after a restart");
    // The same gateway address and credentials; the object is there.
    assert_eq!(s3_endpoint(&dir), endpoint);
    let got = boto3(
        &dir,
        &endpoint,
        "print(s3.get_object(Bucket='tour', Key='k')['Body'].read().decode())",
    );
    assert_eq!(got.trim(), "kept");
    // `cairn up` killed outright: its servers go with it (nothing left holding the ports).
    let mut child = child;
    let servers = children_of(child.id());
    assert!(servers.len() >= 5, "cairn up runs its servers: {servers:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<u32> = servers
            .iter()
            .copied()
            .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "servers {left:?} outlived their supervisor by 20 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether a FUSE file system is mounted at `dir` (a canonical path).
fn fuse_at(dir: &std::path::Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == dir.to_str() && l.contains(" - fuse"))
}

#[test]
fn up_with_mount_serves_the_file_system_and_unmounts_it_when_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cairn-data");
    let mnt = tmp.path().join("mnt");
    let child = up_with(&dir, &["--mount".as_ref(), mnt.as_os_str()]);
    let until = Instant::now() + Duration::from_secs(30);
    while !(fuse_at(&mnt) && std::fs::read_dir(&mnt).is_ok()) {
        assert!(
            Instant::now() < until,
            "cairn up never mounted {}",
            mnt.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::create_dir(mnt.join("tour")).unwrap();
    std::fs::write(mnt.join("tour/hello"), b"through the kernel").unwrap();
    assert_eq!(
        std::fs::read(mnt.join("tour/hello")).unwrap(),
        b"through the kernel"
    );
    // The same namespace as `cairn fs`.
    let out = run_ok(
        cairn(&dir)
            .args(["fs", "ls", "/tour"])
            .env("CAIRN_CLUSTER", masters(&dir)),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("hello"));
    stop(child);
    assert!(!fuse_at(&mnt), "the mount outlived `cairn up`");
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            // `PID (COMM) STATE PPID …`: COMM may hold spaces, so split after its `)`.
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.to_owned();
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// A second `cairn up` on a running cluster's directory is refused at once, names the running
/// supervisor, and writes nothing; `cairn down` stops the first; status shows a killed
/// process down at once, with master pids in its text.
#[test]
fn a_second_up_is_refused_and_down_stops_the_first() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cairn-data");
    let child = up(&dir);
    let m = masters(&dir);
    let before = std::fs::read_to_string(dir.join("cluster.toml")).unwrap();
    let began = Instant::now();
    let out = cairn(&dir)
        .args(["up", "--disk-size", "128m", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("already running") && err.contains(&format!("pid {}", child.id())),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("cluster.toml")).unwrap(),
        before,
        "a refused start wrote cluster.toml"
    );
    // Text status: the master's pid; a chunkserver killed is down at once.
    let file: toml::Value = toml::from_str(&before).unwrap();
    let master_pid = file["master"][0]["pid"].as_integer().unwrap();
    let cs_pid = file["chunkserver"][0]["pid"].as_integer().unwrap();
    // SAFETY: signalling a process of the cluster this test started.
    unsafe { libc::kill(cs_pid as i32, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = run_ok(
            cairn(&dir)
                .args(["status"])
                .current_dir(tmp.path())
                .env("CAIRN_CLUSTER", &m),
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(text.contains(&master_pid.to_string()), "{text}");
        let line = text.lines().find(|l| l.contains(&format!(" {cs_pid} ")));
        if line.is_some_and(|l| l.contains(" down ")) {
            break;
        }
        // Restarted and heard from before any status saw it down: the masters' view alone.
        assert!(
            line.is_some() && Instant::now() < deadline,
            "killed chunkserver {cs_pid} not shown down: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = cairn(&dir)
        .args(["down", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut child = child;
    let status = child.wait().unwrap();
    assert!(status.success(), "cairn up exited with {status}");
    // Nothing runs now: down says so.
    let out = cairn(&dir)
        .args(["down", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no cluster is running"));
}
