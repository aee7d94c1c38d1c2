//! Files unlinked while open (docs/files.md "Unlinked while open"): the mount that holds one
//! keeps its entry in `/.fs/unlinked` fresh for as long as it holds it, and reads it on
//! long past the stale age; once that mount is killed, another mount's sweep removes it.

use super::Mount;
use crate::common::{Cluster, bytes};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Seconds: the smallest `--unlinked-stale-secs` takes (touched every second, swept every 2).
const STALE: u64 = 4;

fn unlinked(m: &Mount) -> Vec<String> {
    match fs::read_dir(m.path(".fs/unlinked")) {
        Ok(d) => d
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect(),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Vec::new(),
        Err(e) => panic!("listing /.fs/unlinked: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_mounts_unlinked_open_files_are_swept_and_a_live_ones_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let stale = ["--unlinked-stale-secs", &STALE.to_string()];
    let a = Mount::start_with(&masters, &dir.path().join("a"), &stale);
    let b = Mount::start_with(&masters, &dir.path().join("b"), &stale);
    let data = bytes(5, 0, 100_000);
    fs::write(a.path("f"), &data).unwrap();
    fs::write(dir.path().join("data"), &data).unwrap();
    // A process of its own holds the file (a descriptor of this test binary would be
    // inherited, and closed, by every process another test starts).
    let script = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.unlink(sys.argv[1])
print("held", flush=True)
sys.stdin.readline()
same = os.pread(fd, 1 << 20, 0) == open(sys.argv[2], "rb").read()
print("same" if same else "differs", flush=True)
sys.stdin.readline()
"#;
    let mut holder = Command::new("python3")
        .args(["-c", script])
        .arg(a.path("f"))
        .arg(dir.path().join("data"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "held");
    let held = unlinked(&b);
    assert_eq!(held.len(), 1, "{held:?}");

    // Past twice the stale age, with b sweeping meanwhile: the live holder's entry stays
    // (the canary: untouched, b would have removed it), and it reads whole.
    std::thread::sleep(Duration::from_secs(2 * STALE + 1));
    assert_eq!(
        unlinked(&b),
        held,
        "a live mount's unlinked open file was swept"
    );
    let mut stdin = holder.stdin.take().unwrap();
    writeln!(stdin).unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(
        line.trim(),
        "same",
        "the unlinked open file read back wrong"
    );

    // Its mount killed with the file open: b removes the entry.
    let a_dir = a.dir();
    a.kill();
    let _ = holder.kill();
    let _ = holder.wait();
    let until = Instant::now() + Duration::from_secs(6 * STALE + 20);
    while !unlinked(&b).is_empty() {
        assert!(
            Instant::now() < until,
            "a dead mount's unlinked file was never swept: {:?}",
            unlinked(&b)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(b);
    super::detach_dead(&a_dir);
}
