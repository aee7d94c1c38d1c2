//! Hard links through the kernel (docs/files.md "Hard links"): one file by several names on
//! every mount, any name unlinked or replaced without losing the others, and links kept in
//! their file's partition (`EXDEV` across).

use super::{Mount, errno, read_all};
use crate::common::{Cluster, bytes, cairn, run_ok};
use std::fs::{self, OpenOptions};
use std::os::unix::fs::{DirEntryExt, FileExt, MetadataExt};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_links_name_one_file_on_every_mount_and_stay_in_their_partition() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let a = Mount::start(&masters, &dir.path().join("a"));
    let b = Mount::start(&masters, &dir.path().join("b"));
    let settle = || std::thread::sleep(cairn_files::ATTR_TTL + Duration::from_millis(300));

    let mut data = bytes(4, 0, 300_000);
    fs::write(a.path("f"), &data).unwrap();
    fs::create_dir(a.path("d")).unwrap();
    fs::hard_link(a.path("f"), a.path("d/g")).unwrap();
    let (f, g) = (
        fs::metadata(a.path("f")).unwrap(),
        fs::metadata(a.path("d/g")).unwrap(),
    );
    assert_eq!((f.ino(), f.nlink()), (g.ino(), 2));
    // Written by one name, read by the other, on this mount and the next.
    OpenOptions::new()
        .write(true)
        .open(a.path("d/g"))
        .unwrap()
        .write_at(b"linked", 10)
        .unwrap();
    data[10..16].copy_from_slice(b"linked");
    assert_eq!(read_all(&a.path("f")), data);
    settle();
    let (bf, bg) = (
        fs::metadata(b.path("f")).unwrap(),
        fs::metadata(b.path("d/g")).unwrap(),
    );
    assert_eq!((bf.ino(), bf.nlink(), bg.ino()), (f.ino(), 2, f.ino()));
    assert_eq!(read_all(&b.path("d/g")), data);
    let listed: Vec<u64> = fs::read_dir(b.path("d"))
        .unwrap()
        .map(|e| e.unwrap().ino())
        .collect();
    assert_eq!(listed, [f.ino()]);

    // The first name unlinked: the other keeps the file, here and on the other mount.
    fs::remove_file(a.path("f")).unwrap();
    assert_eq!(errno(fs::metadata(a.path("f"))), libc::ENOENT);
    assert_eq!(fs::metadata(a.path("d/g")).unwrap().nlink(), 1);
    assert_eq!(read_all(&a.path("d/g")), data);
    settle();
    assert_eq!(errno(fs::metadata(b.path("f"))), libc::ENOENT);
    assert_eq!(read_all(&b.path("d/g")), data);

    // A name of an open file unlinked: the file is still named, so it is not set aside;
    // writes through the open file are read by the name left.
    fs::hard_link(a.path("d/g"), a.path("h")).unwrap();
    {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(a.path("d/g"))
            .unwrap();
        fs::remove_file(a.path("d/g")).unwrap();
        f.write_all_at(b"open", 0).unwrap();
        assert_eq!(f.metadata().unwrap().nlink(), 1);
    }
    data[..4].copy_from_slice(b"open");
    assert_eq!(read_all(&a.path("h")), data);
    let unlinked = cairn()
        .args(["fs", "--cluster", &masters.join(","), "ls", "/.fs/unlinked"])
        .env("CAIRN_LOG", "error")
        .output()
        .unwrap();
    assert!(
        unlinked.stdout.is_empty(),
        "nothing waits in /.fs/unlinked: {}",
        String::from_utf8_lossy(&unlinked.stdout)
    );

    // Renames: between two names of one file, nothing happens; another file over a name
    // takes only that name.
    fs::hard_link(a.path("h"), a.path("h2")).unwrap();
    fs::rename(a.path("h2"), a.path("h")).unwrap();
    assert_eq!(fs::metadata(a.path("h2")).unwrap().nlink(), 2);
    fs::write(a.path("other"), b"other").unwrap();
    fs::rename(a.path("other"), a.path("h2")).unwrap();
    assert_eq!(fs::read(a.path("h2")).unwrap(), b"other");
    assert_eq!(fs::metadata(a.path("h")).unwrap().nlink(), 1);
    assert_eq!(read_all(&a.path("h")), data);

    // What a commit answered is kept for the next stat a moment (known.rs); a link and a
    // rename since make it stale, and the stat shows the link's count (canary checked: it
    // fails when a change leaves what is kept alone).
    {
        use std::io::Write as _;
        let mut k = fs::File::create(a.path("k")).unwrap();
        k.write_all(b"kept").unwrap();
        k.sync_all().unwrap();
    }
    fs::hard_link(a.path("k"), a.path("k2")).unwrap();
    fs::rename(a.path("k2"), a.path("k3")).unwrap();
    assert_eq!(
        fs::metadata(a.path("k")).unwrap().nlink(),
        2,
        "k after a link"
    );
    fs::remove_file(a.path("k3")).unwrap();
    assert_eq!(
        fs::metadata(a.path("k")).unwrap().nlink(),
        1,
        "k after an unlink"
    );

    // Refused as on Linux: a directory (EPERM), an existing name (EEXIST).
    assert_eq!(errno(fs::hard_link(a.path("d"), a.path("d2"))), libc::EPERM);
    assert_eq!(
        errno(fs::hard_link(a.path("h"), a.path("h2"))),
        libc::EEXIST
    );

    // Another partition: a link there is EXDEV, and so is moving a linked file there (`mv`
    // copies then); a file without links moves. (The split gives /p, which this mount knew,
    // its partition's number for its top: the kernel looks it up again and goes on.)
    fs::create_dir(a.path("p")).unwrap();
    run_ok(cairn().args([
        "admin",
        "--cluster",
        &masters.join(","),
        "partition",
        "split",
        "/p",
    ]));
    fs::hard_link(a.path("h"), a.path("h3")).unwrap();
    assert_eq!(
        errno(fs::hard_link(a.path("h"), a.path("p/x"))),
        libc::EXDEV
    );
    assert_eq!(errno(fs::rename(a.path("h3"), a.path("p/x"))), libc::EXDEV);
    fs::rename(a.path("h2"), a.path("p/x")).unwrap();
    fs::write(a.path("p/y"), b"y").unwrap();
    fs::hard_link(a.path("p/y"), a.path("p/z")).unwrap();
    assert_eq!(fs::metadata(a.path("p/z")).unwrap().nlink(), 2);

    // Across a remount, the names and the bytes are there; the masters' check is clean.
    a.stop();
    b.stop();
    let a = Mount::start(&masters, &dir.path().join("a"));
    assert_eq!(read_all(&a.path("h3")), data);
    assert_eq!(fs::metadata(a.path("h")).unwrap().nlink(), 2);
    assert_eq!(fs::read(a.path("p/z")).unwrap(), b"y");
    // `cairn fs ls` shows a link's entry with its file's size.
    let ls = run_ok(cairn().args(["fs", "--cluster", &masters.join(","), "ls", "-l", "/"]));
    let ls = String::from_utf8_lossy(&ls.stdout);
    let line = ls.lines().find(|l| l.ends_with(" h3")).expect("h3 listed");
    assert!(line.contains(&data.len().to_string()), "{line}");
    let out = run_ok(cairn().args(["admin", "--cluster", &masters.join(","), "check", "--json"]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["problems"], 0, "{v}");
    a.stop();
}
