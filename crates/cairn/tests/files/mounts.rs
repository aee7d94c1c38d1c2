//! Two mounts of one namespace: close-to-open consistency between them, and a killed mount.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_mounts_share_one_namespace_close_to_open_and_survive_a_killed_mount() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let a = Mount::start(&masters, &dir.path().join("a"));
    // B reads with the kernel's own readahead (the reads below in 128 KiB requests).
    let b = Mount::start_with(&masters, &dir.path().join("b"), &["--readahead-kib", "0"]);
    // (The kernel's own: VM_READAHEAD_PAGES, 128 KiB.)
    assert_eq!(readahead_kib(&b.dir), 128);

    // Close on one, open on the other: read whole.
    let data = bytes(9, 0, 1 << 20);
    fs::write(a.path("shared"), &data).unwrap();
    assert_eq!(read_all(&b.path("shared")), data);
    // Changed on B, closed; A's next open sees the change.
    {
        let f = OpenOptions::new()
            .write(true)
            .open(b.path("shared"))
            .unwrap();
        f.write_at(b"from b", 100).unwrap();
    }
    let got = read_all(&a.path("shared"));
    assert_eq!(&got[100..106], b"from b");
    assert_eq!(got.len(), data.len());
    // A rename on A is seen on B (after the kernel's entry cache, 1 s).
    fs::rename(a.path("shared"), a.path("moved")).unwrap();
    std::thread::sleep(cairn_files::ATTR_TTL + Duration::from_millis(300));
    assert_eq!(errno(fs::metadata(b.path("shared"))), libc::ENOENT);
    assert_eq!(&read_all(&b.path("moved"))[100..106], b"from b");
    // The same file by the `cairn fs` namespace: it is there.
    let c = cl.client().await;
    assert_eq!(c.stat("/moved").await.unwrap().path, "/moved");
    let cat = common::run_ok(
        cairn()
            .args(["fs", "--cluster", &masters.join(","), "cat", "/moved"])
            .env("CAIRN_LOG", "error"),
    );
    let mut want = data.clone();
    want[100..106].copy_from_slice(b"from b");
    assert!(
        cat.stdout == want,
        "cairn fs cat reads what the mounts wrote"
    );
    let ls = common::run_ok(cairn().args(["fs", "--cluster", &masters.join(","), "ls", "-l", "/"]));
    let ls = String::from_utf8_lossy(&ls.stdout);
    let line = ls.lines().find(|l| l.ends_with("moved")).expect("listed");
    assert!(
        line.contains(&data.len().to_string()),
        "its size listed: {line}"
    );

    // An extended attribute set on A is read on B once its cache (1 s) has passed; removed
    // on B, it is gone on A.
    assert_eq!(xattr::get(&b.path("moved"), "user.k"), Err(libc::ENODATA));
    assert_eq!(xattr::set(&a.path("moved"), "user.k", b"v", 0), Ok(()));
    std::thread::sleep(cairn_files::ATTR_TTL + Duration::from_millis(300));
    assert_eq!(xattr::get(&b.path("moved"), "user.k"), Ok(b"v".to_vec()));
    assert_eq!(xattr::remove(&b.path("moved"), "user.k"), Ok(()));
    std::thread::sleep(cairn_files::ATTR_TTL + Duration::from_millis(300));
    assert_eq!(xattr::get(&a.path("moved"), "user.k"), Err(libc::ENODATA));

    // Unlinked while open on this mount: reads, writes and fstat go on (no link left); the
    // directory empties; the last close removes it.
    fs::create_dir(a.path("tmpdir")).unwrap();
    {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(a.path("tmpdir/open"))
            .unwrap();
        f.write_all_at(b"Hello, World!", 0).unwrap();
        fs::remove_file(a.path("tmpdir/open")).unwrap();
        assert_eq!(errno(fs::metadata(a.path("tmpdir/open"))), libc::ENOENT);
        let mut buf = [0u8; 13];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"Hello, World!");
        f.write_all_at(b"again", 13).unwrap();
        let mut buf = [0u8; 18];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"Hello, World!again");
        assert_eq!(
            std::os::unix::fs::MetadataExt::nlink(&f.metadata().unwrap()),
            0
        );
        fs::remove_dir(a.path("tmpdir")).unwrap();
    }
    // (The kernel sends the release after close returns.)
    let until = Instant::now() + Duration::from_secs(5);
    while fs::read_dir(a.path(".fs/unlinked")).unwrap().count() > 0 {
        assert!(
            Instant::now() < until,
            "the last close left the unlinked file"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Unlinked by the other mount: an open that read it reads on.
    let data2 = bytes(11, 0, 300_000);
    fs::write(a.path("gone"), &data2).unwrap();
    {
        let f = File::open(b.path("gone")).unwrap();
        fs::remove_file(a.path("gone")).unwrap();
        let mut got = vec![0u8; data2.len()];
        f.read_exact_at(&mut got, 0).unwrap();
        assert!(
            got == data2,
            "the open file on B reads whole after A unlinked it"
        );
    }
    // A rename over a file, seen from the other mount: always the old or the new, whole.
    let (old, new) = (bytes(12, 0, 200_000), bytes(13, 0, 200_000));
    fs::write(a.path("target"), &old).unwrap();
    fs::write(a.path("incoming"), &new).unwrap();
    let reader = {
        let (p, old, new) = (b.path("target"), old.clone(), new.clone());
        std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(4);
            let (mut reads, mut saw_new) = (0, false);
            while Instant::now() < until {
                let got = read_all(&p);
                assert!(
                    got == old || got == new,
                    "a torn rename: {} bytes",
                    got.len()
                );
                saw_new |= got == new;
                reads += 1;
            }
            (reads, saw_new)
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    fs::rename(a.path("incoming"), a.path("target")).unwrap();
    let (reads, saw_new) = reader.join().unwrap();
    assert!(
        reads > 2 && saw_new,
        "{reads} reads, the new one seen: {saw_new}"
    );
    // Permissions across users: a file of uid 1234 mode 0600 made on A is refused to uid
    // 1235 on B and read by its owner there (the kernel checks, allow_other).
    fs::write(a.path("private"), b"mine").unwrap();
    std::os::unix::fs::chown(a.path("private"), Some(1234), Some(1234)).unwrap();
    fs::set_permissions(a.path("private"), fs::Permissions::from_mode(0o600)).unwrap();
    std::thread::sleep(cairn_files::ATTR_TTL + Duration::from_millis(300));
    let cat_as = |uid: u32| {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("cat")
            .arg(b.path("private"))
            .uid(uid)
            .gid(uid)
            .output()
            .unwrap()
    };
    let other = cat_as(1235);
    assert!(
        !other.status.success()
            && String::from_utf8_lossy(&other.stderr).contains("Permission denied"),
        "another user read a 0600 file: {other:?}"
    );
    assert_eq!(cat_as(1234).stdout, b"mine");

    // A killed mount: what was fsynced or closed is there; the directory is mounted again.
    {
        let mut f = File::create(a.path("synced")).unwrap();
        f.write_all(b"durable").unwrap();
        f.sync_all().unwrap();
        // Not closed before the kill.
        std::mem::forget(f);
    }
    let adir = a.dir.clone();
    a.kill();
    // (A listing: the root's attributes may come from the kernel's cache.)
    assert_eq!(errno(fs::read_dir(&adir)), libc::ENOTCONN);
    let a = Mount::start(&masters, &adir);
    assert_eq!(fs::read(a.path("synced")).unwrap(), b"durable");
    assert_eq!(fs::read(b.path("synced")).unwrap(), b"durable");
    assert!(
        fs::read_dir(a.path("")).unwrap().count() >= 2,
        "the remounted directory lists"
    );
    a.stop();
    b.stop();
}
