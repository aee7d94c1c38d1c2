//! A new file's `chmod`, `chown` and `utimens` wait in the mount and go to the masters with
//! its first bytes (docs/files.md "Attributes of a new file"): the writing mount shows them at
//! once, another mount sees the create's attributes until the close and then all of them
//! with the bytes; a `tar -x` onto the mount keeps every mode, owner and time.

use super::{Mount, read_all};
use crate::common::{Cluster, bytes};
use std::fs::{self, File};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Past the kernel's attribute and entry cache, so another mount asks the masters.
fn after_ttl() {
    std::thread::sleep(cairn_files::ATTR_TTL + Duration::from_millis(300));
}

/// futimens(2) of `f`: its mtime set to `secs`, its atime left.
fn set_mtime(f: &File, secs: i64) {
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: secs,
            tv_nsec: 0,
        },
    ];
    // SAFETY: an open descriptor and two timespecs.
    assert_eq!(unsafe { libc::futimens(f.as_raw_fd(), times.as_ptr()) }, 0);
}

fn fchown(f: &File, uid: u32, gid: u32) {
    // SAFETY: an open descriptor.
    assert_eq!(unsafe { libc::fchown(f.as_raw_fd(), uid, gid) }, 0);
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_files_attributes_go_with_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let a = Mount::start(&masters, &dir.path().join("a"));
    let b = Mount::start(&masters, &dir.path().join("b"));

    // As tar does it: create, write, utimens, chown, chmod, close — by a process of its
    // own, which holds the file open until told: any process this test binary starts
    // meanwhile (another test's) would inherit the descriptor and close it at its exec,
    // which is a close of the file (FUSE flush) like any other.
    let data = bytes(3, 0, 10_000);
    fs::write(dir.path().join("data"), &data).unwrap();
    let script = r#"
import json, os, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
os.write(fd, open(sys.argv[2], "rb").read())
os.utime(fd, (1e9, 1e9))
os.fchown(fd, 1234, 5678)
os.fchmod(fd, 0o640)
st = os.fstat(fd)
print(json.dumps([st.st_mode & 0o7777, st.st_uid, st.st_gid, int(st.st_mtime), st.st_size]), flush=True)
sys.stdin.readline()
os.close(fd)
"#;
    let mut writer = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(a.path("new"))
        .arg(dir.path().join("data"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(writer.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let shown: Vec<i64> = serde_json::from_str(&line).unwrap();
    assert_eq!(
        shown,
        [0o640, 1234, 5678, 1_000_000_000, 10_000],
        "the writing mount shows the changes at once"
    );
    // The other mount: the create's attributes, no bytes yet (the changes wait for them).
    after_ttl();
    let seen = fs::metadata(b.path("new")).unwrap();
    assert_eq!((seen.uid(), seen.size()), (0, 0), "{seen:?}");
    assert_ne!(seen.mtime(), 1_000_000_000);
    std::io::Write::write_all(writer.stdin.as_mut().unwrap(), b"\n").unwrap();
    assert!(writer.wait().unwrap().success());
    after_ttl();
    let seen = fs::metadata(b.path("new")).unwrap();
    assert_eq!(
        (
            seen.mode() & 0o7777,
            seen.uid(),
            seen.gid(),
            seen.mtime(),
            seen.size()
        ),
        (0o640, 1234, 5678, 1_000_000_000, 10_000),
        "the close committed them with the bytes"
    );
    assert_eq!(read_all(&b.path("new")), data);
    // Once its bytes are committed, a change goes to the masters at once.
    fs::set_permissions(a.path("new"), fs::Permissions::from_mode(0o600)).unwrap();
    after_ttl();
    assert_eq!(fs::metadata(b.path("new")).unwrap().mode() & 0o7777, 0o600);

    // A write after a utimens: the write's time is the file's (POSIX), not the one set.
    let f = File::create(a.path("later")).unwrap();
    set_mtime(&f, 1_000_000_000);
    std::io::Write::write_all(&mut &f, b"after").unwrap();
    drop(f);
    after_ttl();
    let m = fs::metadata(b.path("later")).unwrap();
    assert!(
        (m.mtime() - now_secs()).abs() < 60,
        "mtime {} is the write's",
        m.mtime()
    );
    // A change with nothing written (an empty file): committed at the close alone.
    let f = File::create(a.path("empty")).unwrap();
    f.set_permissions(fs::Permissions::from_mode(0o604))
        .unwrap();
    drop(f);
    after_ttl();
    assert_eq!(
        fs::metadata(b.path("empty")).unwrap().mode() & 0o7777,
        0o604
    );
    // fsync makes them durable too: a killed mount loses none of them.
    let f = File::create(a.path("synced")).unwrap();
    std::io::Write::write_all(&mut &f, b"synced").unwrap();
    fchown(&f, 42, 43);
    f.sync_all().unwrap();
    a.kill();
    drop(f);
    after_ttl();
    let m = fs::metadata(b.path("synced")).unwrap();
    assert_eq!((m.uid(), m.gid(), m.size()), (42, 43, 6));
    b.stop();
    // The dead mount cleared by the next.
    Mount::start(&masters, &dir.path().join("a")).stop();
}

/// Lays a tree out in `root` with modes, owners and times of its own.
fn tree(root: &Path) {
    fs::create_dir_all(root.join("d/e")).unwrap();
    for (i, (path, mode)) in [
        ("a", 0o644),
        ("x", 0o755),
        ("d/secret", 0o600),
        ("d/e/g", 0o444),
    ]
    .into_iter()
    .enumerate()
    {
        let p = root.join(path);
        fs::write(&p, bytes(i as u64, 0, 1000 + i * 5000)).unwrap();
        let f = File::open(&p).unwrap();
        set_mtime(&f, 1_500_000_000 + i as i64 * 1000);
        fchown(&f, 1000 + i as u32, 2000 + i as u32);
        drop(f);
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tar_extracts_onto_the_mount_with_every_mode_owner_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let src = dir.path().join("src");
    tree(&src);
    let archive = dir.path().join("t.tar");
    let ok = std::process::Command::new("tar")
        .arg("-C")
        .arg(&src)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()
        .unwrap();
    assert!(ok.success());
    let a = Mount::start(&masters, &dir.path().join("a"));
    fs::create_dir(a.path("x")).unwrap();
    let ok = std::process::Command::new("tar")
        .arg("-C")
        .arg(a.path("x"))
        .arg("-xf")
        .arg(&archive)
        .status()
        .unwrap();
    assert!(ok.success());
    a.stop();
    // Read back through a new mount: everything the masters hold.
    let a = Mount::start(&masters, &dir.path().join("a"));
    for path in ["a", "x", "d/secret", "d/e/g"] {
        let (want, got) = (
            fs::metadata(src.join(path)).unwrap(),
            fs::metadata(a.path("x").join(path)).unwrap(),
        );
        let attrs = |m: &fs::Metadata| (m.mode(), m.uid(), m.gid(), m.mtime(), m.size());
        assert_eq!(attrs(&got), attrs(&want), "{path}");
        assert_eq!(
            fs::read(a.path("x").join(path)).unwrap(),
            fs::read(src.join(path)).unwrap(),
            "{path}"
        );
    }
    a.stop();
}
