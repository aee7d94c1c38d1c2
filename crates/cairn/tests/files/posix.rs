//! One mount serving the POSIX calls programs make (docs/files.md "Operations"), and its
//! files outliving it.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_serves_posix_operations_and_its_files_outlive_it() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let mnt = dir.path().join("mnt");
    let m = Mount::start(&masters, &mnt);
    // A sequential reader's requests are 1 MiB (`--readahead-kib`'s default), the 3 MiB
    // file read back below among them.
    // (Set beside the serving, a moment after the mount answers.)
    if root() {
        let until = Instant::now() + Duration::from_secs(10);
        while readahead_kib(&mnt) != 1024 {
            assert!(
                Instant::now() < until,
                "the mount's readahead never became 1 MiB"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    // Directories, files written in pieces, read back whole.
    fs::create_dir_all(m.path("a/b")).unwrap();
    let data = bytes(1, 0, 3 << 20);
    {
        let mut f = File::create(m.path("a/b/big")).unwrap();
        for piece in data.chunks(100_000) {
            f.write_all(piece).unwrap();
        }
        f.sync_all().unwrap();
    }
    assert_eq!(read_all(&m.path("a/b/big")), data);
    // Random overwrites inside, reads across their edges.
    let mut want = data.clone();
    let f = OpenOptions::new()
        .write(true)
        .read(true)
        .open(m.path("a/b/big"))
        .unwrap();
    for (at, len) in [
        (10u64, 5usize),
        (4090, 20),
        (1 << 20, 70_000),
        (3_000_000, 1),
    ] {
        let b = bytes(at + 7, 0, len);
        f.write_at(&b, at).unwrap();
        want[at as usize..at as usize + len].copy_from_slice(&b);
        let mut got = vec![0u8; len + 200];
        let from = at.saturating_sub(100);
        let n = f.read_at(&mut got, from).unwrap();
        assert_eq!(
            &got[..n],
            &want[from as usize..from as usize + n],
            "at {at}"
        );
    }
    drop(f);
    assert_eq!(read_all(&m.path("a/b/big")), want);
    // Truncate down, then up: the bytes past the cut read as zeros (sparse).
    let f = OpenOptions::new()
        .write(true)
        .open(m.path("a/b/big"))
        .unwrap();
    f.set_len(1000).unwrap();
    f.set_len(5000).unwrap();
    drop(f);
    let got = read_all(&m.path("a/b/big"));
    assert_eq!(got.len(), 5000);
    assert_eq!(&got[..1000], &want[..1000]);
    assert!(got[1000..].iter().all(|&b| b == 0));
    // A write far past the end leaves a hole.
    {
        let f = File::create(m.path("sparse")).unwrap();
        f.write_at(b"end", 10 << 20).unwrap();
    }
    let meta = fs::metadata(m.path("sparse")).unwrap();
    assert_eq!(meta.len(), (10 << 20) + 3);
    let mut hole = vec![1u8; 4096];
    File::open(m.path("sparse"))
        .unwrap()
        .read_at(&mut hole, 5 << 20)
        .unwrap();
    assert!(hole.iter().all(|&b| b == 0));
    // O_APPEND.
    {
        let mut f = OpenOptions::new()
            .append(true)
            .open(m.path("sparse"))
            .unwrap();
        f.write_all(b"+more").unwrap();
    }
    assert_eq!(
        fs::metadata(m.path("sparse")).unwrap().len(),
        (10 << 20) + 8
    );

    // Renames: over a file, of a directory, NOREPLACE and EXCHANGE.
    fs::write(m.path("x"), b"x").unwrap();
    fs::write(m.path("y"), b"y").unwrap();
    fs::rename(m.path("x"), m.path("y")).unwrap();
    assert_eq!(fs::read(m.path("y")).unwrap(), b"x");
    assert_eq!(errno(fs::metadata(m.path("x"))), libc::ENOENT);
    fs::rename(m.path("a/b"), m.path("c")).unwrap();
    assert_eq!(fs::metadata(m.path("c/big")).unwrap().len(), 5000);
    fs::write(m.path("z"), b"z").unwrap();
    assert_eq!(
        renameat2(&m.path("y"), &m.path("z"), libc::RENAME_NOREPLACE),
        libc::EEXIST
    );
    assert_eq!(
        renameat2(&m.path("y"), &m.path("c"), libc::RENAME_EXCHANGE),
        0
    );
    assert_eq!(fs::read(m.path("c")).unwrap(), b"x");
    assert!(m.path("y/big").exists());
    // A directory over a non-empty one; a file over a directory.
    assert_eq!(errno(fs::rename(m.path("a"), m.path("y"))), libc::ENOTEMPTY);
    assert_eq!(errno(fs::rename(m.path("z"), m.path("a"))), libc::EISDIR);

    // Symlinks, FIFOs, modes, owners, times.
    std::os::unix::fs::symlink("y/big", m.path("link")).unwrap();
    assert_eq!(fs::read_link(m.path("link")).unwrap(), Path::new("y/big"));
    assert_eq!(fs::metadata(m.path("link")).unwrap().len(), 5000);
    let fifo = std::ffi::CString::new(m.path("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(
        &fs::symlink_metadata(m.path("fifo")).unwrap().file_type()
    ));
    fs::set_permissions(m.path("z"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        fs::metadata(m.path("z")).unwrap().permissions().mode() & 0o7777,
        0o600
    );
    std::os::unix::fs::chown(m.path("z"), Some(1234), Some(5678)).unwrap();
    let md = std::os::unix::fs::MetadataExt::uid(&fs::metadata(m.path("z")).unwrap());
    assert_eq!(md, 1234);

    // fallocate: mode 0 extends, KEEP_SIZE does not, a punched hole reads as zeros and
    // keeps the size, what the mount lacks is EOPNOTSUPP.
    {
        use std::os::fd::AsRawFd;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(m.path("holes"))
            .unwrap();
        f.write_all_at(&[7u8; 10_000], 0).unwrap();
        let fd = f.as_raw_fd();
        // SAFETY: fallocate(2) on an open descriptor.
        let falloc = |mode: libc::c_int, off: i64, len: i64| unsafe {
            if libc::fallocate(fd, mode, off, len) == 0 {
                0
            } else {
                std::io::Error::last_os_error().raw_os_error().unwrap()
            }
        };
        assert_eq!(falloc(0, 0, 20_000), 0);
        assert_eq!(f.metadata().unwrap().len(), 20_000);
        assert_eq!(falloc(libc::FALLOC_FL_KEEP_SIZE, 0, 50_000), 0);
        assert_eq!(f.metadata().unwrap().len(), 20_000);
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        assert_eq!(falloc(punch, 1000, 2000), 0);
        assert_eq!(f.metadata().unwrap().len(), 20_000);
        let mut want = vec![7u8; 10_000];
        want[1000..3000].fill(0);
        want.resize(20_000, 0);
        assert_eq!(read_all(&m.path("holes")), want);
        assert_eq!(
            falloc(libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096),
            libc::EOPNOTSUPP
        );
    }

    // Errors as POSIX names them.
    assert_eq!(errno(fs::remove_dir(m.path("y"))), libc::ENOTEMPTY);
    assert_eq!(errno(fs::remove_file(m.path("y"))), libc::EISDIR);
    assert_eq!(errno(fs::create_dir(m.path("z/sub"))), libc::ENOTDIR);
    assert_eq!(
        errno(fs::write(m.path(&"n".repeat(256)), b"")),
        libc::ENAMETOOLONG
    );
    fs::write(m.path(&"n".repeat(255)), b"longest name").unwrap();

    // A directory of more entries than a readdir page, listed whole.
    fs::create_dir(m.path("many")).unwrap();
    for i in 0..1200 {
        File::create(m.path(&format!("many/f{i:04}"))).unwrap();
    }
    let mut names: Vec<_> = fs::read_dir(m.path("many"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 1200);
    assert_eq!(names[0], "f0000");
    assert_eq!(names[1199], "f1199");

    // statfs: the cluster's space.
    let c = std::ffi::CString::new(mnt.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and a zeroed statvfs to fill.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0);
    assert!(sv.f_blocks > 0 && sv.f_bfree > 0 && sv.f_bfree <= sv.f_blocks);

    // Extended attributes, with setxattr(2)'s flags and the sizes programs ask for.
    let x = m.path("xattrs");
    fs::write(&x, b"data").unwrap();
    assert_eq!(xattr::list(&x), Ok(vec![]));
    assert_eq!(xattr::get(&x, "user.color"), Err(libc::ENODATA));
    assert_eq!(xattr::set(&x, "user.color", b"blue", 0), Ok(()));
    assert_eq!(xattr::get(&x, "user.color"), Ok(b"blue".to_vec()));
    assert_eq!(xattr::get_into(&x, "user.color", 2), Err(libc::ERANGE));
    assert_eq!(
        xattr::set(&x, "user.color", b"red", libc::XATTR_CREATE),
        Err(libc::EEXIST)
    );
    assert_eq!(
        xattr::set(&x, "user.size", b"1", libc::XATTR_REPLACE),
        Err(libc::ENODATA)
    );
    assert_eq!(
        xattr::set(&x, "user.color", b"green", libc::XATTR_REPLACE),
        Ok(())
    );
    assert_eq!(xattr::set(&x, "user.empty", b"", 0), Ok(()));
    assert_eq!(xattr::get(&x, "user.empty"), Ok(Vec::new()));
    assert_eq!(xattr::set(&x, "trusted.t", b"\0\xff binary", 0), Ok(()));
    assert_eq!(
        xattr::list(&x),
        Ok(vec![
            "trusted.t".into(),
            "user.color".into(),
            "user.empty".into()
        ])
    );
    assert_eq!(xattr::remove(&x, "user.empty"), Ok(()));
    assert_eq!(xattr::remove(&x, "user.empty"), Err(libc::ENODATA));
    // Largest values (64 KiB) until the node's 128 KiB is full: ENOSPC, as ext4 says.
    let big = bytes(3, 0, 65536);
    assert_eq!(xattr::set(&x, "user.big1", &big, 0), Ok(()));
    assert_eq!(xattr::set(&x, "user.big2", &big, 0), Err(libc::ENOSPC));
    assert_eq!(xattr::get(&x, "user.big1"), Ok(big.clone()));
    // No POSIX ACLs: a valid one (user rw, group r, other r) is refused.
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm) in [(0x01u16, 6u16), (0x04, 4), (0x20, 4)] {
        acl.extend(tag.to_le_bytes());
        acl.extend(perm.to_le_bytes());
        acl.extend(u32::MAX.to_le_bytes());
    }
    assert_eq!(
        xattr::set(&x, "system.posix_acl_access", &acl, 0),
        Err(libc::EOPNOTSUPP)
    );
    // The attr tools, as a person runs them (scripts/fs-tools.sh installs them).
    common::run_ok(
        std::process::Command::new("setfattr")
            .args(["-n", "user.tool", "-v", "0x00ff10"])
            .arg(&x),
    );
    let dump = common::run_ok(
        std::process::Command::new("getfattr")
            .args(["-d", "-e", "hex"])
            .arg(&x),
    );
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(
        dump.contains("user.tool=0x00ff10") && dump.contains("user.color=0x677265656e"),
        "{dump}"
    );
    assert_eq!(xattr::get(&x, "user.tool"), Ok(vec![0, 0xff, 0x10]));
    // Directories hold them too; writes go on after (the kernel asks for
    // security.capability before each write).
    assert_eq!(xattr::set(&m.path("y"), "user.dir", b"d", 0), Ok(()));
    fs::write(&x, bytes(4, 0, 100_000)).unwrap();
    assert_eq!(read_all(&x), bytes(4, 0, 100_000));

    // Ctrl-C: every write flushed, unmounted; a new mount reads it all.
    fs::write(m.path("last"), b"written just before the unmount").unwrap();
    m.stop();
    let m = Mount::start(&masters, &mnt);
    assert_eq!(
        fs::read(m.path("last")).unwrap(),
        b"written just before the unmount"
    );
    assert_eq!(xattr::get(&x, "user.color"), Ok(b"green".to_vec()));
    assert_eq!(xattr::get(&m.path("y"), "user.dir"), Ok(b"d".to_vec()));
    assert_eq!(xattr::get(&x, "user.big1"), Ok(big));
    assert_eq!(&read_all(&m.path("y/big"))[..1000], &want[..1000]);
    assert_eq!(fs::read_dir(m.path("many")).unwrap().count(), 1200);
    m.stop();
}
