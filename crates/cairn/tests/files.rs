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
#[path = "files/fsx.rs"]
mod fsx;
#[path = "files/links.rs"]
mod links;
#[path = "files/lookups.rs"]
mod lookups;
#[path = "files/mounts.rs"]
mod mounts;
#[path = "files/names.rs"]
mod names;
#[path = "files/policies.rs"]
mod policies;
#[path = "files/posix.rs"]
mod posix;
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

    /// The mountpoint itself (no trailing slash: a dead mount's root cannot be looked into).
    fn dir(&self) -> PathBuf {
        self.dir.clone()
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

/// The mount a killed `cairn mount` left at `dir`, detached: for a test that does not mount
/// there again (a new mount would clear it), so that no dead FUSE mount outlives the test.
fn detach_dead(dir: &Path) {
    if let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) {
        // SAFETY: a NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// A test that failed with a mount running: the process and its mount go.
impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            detach_dead(&self.dir);
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
