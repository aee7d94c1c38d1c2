//! fsx, the file-system exerciser, with and without mmap, and through a killed chunkserver.

use super::*;

/// fsx, the file-system exerciser (the `fsx` crate, a Rust rewrite of the Apple/FreeBSD tool
/// xfstests carries too), installed by ./scripts/fs-tools.sh.
fn fsx() -> PathBuf {
    let p = std::env::var_os("CAIRN_FSX").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/bin/fsx"),
        PathBuf::from,
    );
    assert!(
        p.exists(),
        "{} is not installed: run the tests through ./scripts/test.sh, which installs it",
        p.display()
    );
    p
}

/// An fsx configuration: every operation the mount serves, with or without mmap.
fn fsx_config(dir: &Path, mmap: bool) -> PathBuf {
    let map = if mmap { 10 } else { 0 };
    let p = dir.join(format!("fsx-{mmap}.toml"));
    fs::write(
        &p,
        format!(
            "flen = 1048576\n[weights]\nclose_open = 2\nread = 10\nwrite = 10\n\
             mapread = {map}\nmapwrite = {map}\ninvalidate = {}\ntruncate = 2\nfsync = 1\n\
             fdatasync = 1\nposix_fallocate = 1\npunch_hole = 1\nsendfile = 1\n\
             posix_fadvise = 1\ncopy_file_range = 1\n",
            u8::from(mmap)
        ),
    )
    .unwrap();
    p
}

fn run_fsx(cfg: &Path, file: &Path, ops: u32, seed: u32, artifacts: &Path) -> Child {
    std::process::Command::new(fsx())
        .arg("-f")
        .arg(cfg)
        .args(["-N", &ops.to_string(), "-S", &seed.to_string(), "-P"])
        .arg(artifacts)
        .arg(file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn fsx_ok(child: Child, what: &str) {
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("All operations completed A-OK!"),
        "fsx {what}: {}\n{}",
        out.status,
        text.lines().rev().take(40).collect::<Vec<_>>().join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsx_verifies_every_read_with_and_without_mmap_and_through_a_killed_chunkserver() {
    let dir = tempfile::tempdir().unwrap();
    let mut cl = Cluster::start(dir.path(), 1, 4).await;
    let masters = cl.master_addrs();
    let m = Mount::start(&masters, &dir.path().join("mnt"));
    let ops: u32 = std::env::var("CAIRN_FSX_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    // Reads, writes, mmap, truncates, holes, fallocate, copy_file_range, close and reopen:
    // every read checked against fsx's own model of the file.
    for (mmap, seed) in [(true, 1), (false, 2)] {
        let cfg = fsx_config(dir.path(), mmap);
        let child = run_fsx(&cfg, &m.path(&format!("fsx-{seed}")), ops, seed, dir.path());
        fsx_ok(child, &format!("mmap {mmap}"));
    }
    // Again while a chunkserver is killed and comes back: writes go on elsewhere, reads of
    // what it held come from the other replicas.
    let cfg = fsx_config(dir.path(), false);
    let child = run_fsx(&cfg, &m.path("fsx-kill"), ops, 3, dir.path());
    tokio::time::sleep(Duration::from_secs(2)).await;
    cl.chunkservers[1].kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    cl.chunkservers[1].start();
    let child = tokio::task::spawn_blocking(move || fsx_ok(child, "through a killed chunkserver"));
    child.await.unwrap();
    m.stop();
}
