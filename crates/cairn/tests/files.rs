//! The file service through the kernel (issue 40, docs/files.md): `cairn mount` processes
//! serving real FUSE mounts, driven with std::fs and libc calls as any program would.

#[path = "files/behind.rs"]
mod behind;
#[path = "files/collect.rs"]
mod collect;
mod common;
#[path = "files/early.rs"]
mod early;
#[path = "files/fresh.rs"]
mod fresh;
#[path = "files/links.rs"]
mod links;
#[path = "files/lookups.rs"]
mod lookups;
#[path = "files/names.rs"]
mod names;
#[path = "files/policies.rs"]
mod policies;
#[path = "files/unlinked.rs"]
mod unlinked;

use common::{Cluster, bytes, cairn};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// A `cairn mount` process and its directory.
struct Mount {
    dir: PathBuf,
    child: Option<Child>,
}

fn mounted(dir: &Path) -> bool {
    // (Not canonicalized: a dead mount's directory does not stat; the test's are canonical.)
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == dir.to_str() && l.contains(" - fuse"))
}

impl Mount {
    fn start(masters: &[String], dir: &Path) -> Self {
        Self::start_with(masters, dir, &[])
    }

    /// A mount with `extra` arguments to `cairn mount`.
    fn start_with(masters: &[String], dir: &Path, extra: &[&str]) -> Self {
        // Made the first time; a dead mount's directory is there (and does not stat).
        let _ = fs::create_dir(dir);
        let child = cairn()
            .args(["mount", "--cluster", &masters.join(",")])
            .args(extra)
            .arg(dir)
            .env("CAIRN_LOG", "warn,fuser=error")
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        // Mounted and answering (a dead mount at `dir` is listed until the new one clears it).
        while !(mounted(dir) && fs::read_dir(dir).is_ok()) {
            assert!(Instant::now() < until, "{} never mounted", dir.display());
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            dir: dir.to_owned(),
            child: Some(child),
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.join(p)
    }

    fn signal(&mut self, sig: libc::c_int) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(c.id() as libc::pid_t, sig) };
        c.wait().unwrap()
    }

    /// SIGSTOP: the mount answers nothing until [`Mount::resume`].
    fn pause(&mut self) {
        let c = self.child.as_ref().expect("running");
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGSTOP) };
    }

    fn resume(&mut self) {
        let c = self.child.as_ref().expect("running");
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGCONT) };
    }

    /// Ctrl-C: flushes, unmounts, exits 0.
    fn stop(mut self) {
        let st = self.signal(libc::SIGINT);
        assert!(st.success(), "cairn mount exited {st}");
        assert!(!mounted(&self.dir), "still mounted after Ctrl-C");
    }

    /// SIGKILL: the mount stays behind, its directory answering ENOTCONN.
    fn kill(mut self) {
        self.signal(libc::SIGKILL);
    }
}

/// A test that failed with a mount running: the process and its mount go.
impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            if let Ok(c) = std::ffi::CString::new(self.dir.as_os_str().as_bytes()) {
                // SAFETY: a NUL-terminated path.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

fn errno(r: std::io::Result<impl Sized>) -> i32 {
    match r {
        Err(e) => e.raw_os_error().unwrap_or(-1),
        Ok(_) => 0,
    }
}

fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> i32 {
    let f = std::ffi::CString::new(from.as_os_str().as_bytes()).unwrap();
    let t = std::ffi::CString::new(to.as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated paths, AT_FDCWD.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

/// Extended attribute calls as a program makes them: `Err(errno)` on failure.
mod xattr {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    fn c(s: &[u8]) -> CString {
        CString::new(s).unwrap()
    }

    fn ret(r: isize) -> Result<usize, i32> {
        if r < 0 {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(-1))
        } else {
            Ok(r as usize)
        }
    }

    pub fn set(p: &Path, name: &str, value: &[u8], flags: i32) -> Result<(), i32> {
        let (p, n) = (c(p.as_os_str().as_bytes()), c(name.as_bytes()));
        // SAFETY: NUL-terminated strings and a value slice with its length.
        let r = unsafe {
            libc::setxattr(
                p.as_ptr(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        };
        ret(r as isize).map(|_| ())
    }

    /// The value, read as programs do: its size first, then into a buffer that size.
    pub fn get(p: &Path, name: &str) -> Result<Vec<u8>, i32> {
        let (p, n) = (c(p.as_os_str().as_bytes()), c(name.as_bytes()));
        // SAFETY: NUL-terminated strings; a null buffer of size 0 asks for the size.
        let len = ret(unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) })?;
        let mut buf = vec![0u8; len];
        // SAFETY: a buffer of `len` bytes.
        let got = ret(unsafe {
            libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        })?;
        buf.truncate(got);
        Ok(buf)
    }

    /// getxattr into a buffer of `size` bytes.
    pub fn get_into(p: &Path, name: &str, size: usize) -> Result<usize, i32> {
        let (p, n) = (c(p.as_os_str().as_bytes()), c(name.as_bytes()));
        let mut buf = vec![0u8; size];
        // SAFETY: a buffer of `size` bytes.
        ret(unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), size) })
    }

    pub fn list(p: &Path) -> Result<Vec<String>, i32> {
        let p = c(p.as_os_str().as_bytes());
        // SAFETY: as `get`.
        let len = ret(unsafe { libc::listxattr(p.as_ptr(), std::ptr::null_mut(), 0) })?;
        let mut buf = vec![0u8; len];
        // SAFETY: a buffer of `len` bytes.
        let got = ret(unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), len) })?;
        let mut names: Vec<String> = buf[..got]
            .split(|&b| b == 0)
            .filter(|n| !n.is_empty())
            .map(|n| String::from_utf8(n.to_vec()).unwrap())
            .collect();
        names.sort();
        Ok(names)
    }

    pub fn remove(p: &Path, name: &str) -> Result<(), i32> {
        let (p, n) = (c(p.as_os_str().as_bytes()), c(name.as_bytes()));
        // SAFETY: NUL-terminated strings.
        ret(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) } as isize).map(|_| ())
    }
}

/// The kernel's readahead for the mount at `dir`, in KiB (its backing device's in sysfs).
fn readahead_kib(dir: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    let dev = fs::metadata(dir).unwrap().dev();
    let knob = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    fs::read_to_string(&knob).unwrap().trim().parse().unwrap()
}

/// Whether this process is root (the mount sets its readahead in sysfs only then).
fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn read_all(p: &Path) -> Vec<u8> {
    let mut v = Vec::new();
    File::open(p).unwrap().read_to_end(&mut v).unwrap();
    v
}

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
