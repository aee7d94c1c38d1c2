//! One `cairn up` per data directory: the supervisor holds an exclusive `flock` on
//! `DIR/up.lock` for as long as it runs, with its pid written inside. A second `cairn up` on
//! the directory is refused before it touches anything (cluster.toml, secrets, store files);
//! `cairn down` finds the supervisor through the same file. The lock goes with the process
//! (the kernel drops it however the process ends), so a killed supervisor leaves nothing to
//! clean up, and children do not inherit it (Rust opens files close-on-exec).

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The lock file's name in the data directory.
pub const LOCK: &str = "up.lock";

/// The held lock; dropping it (or the process ending) releases it.
pub struct UpLock {
    _file: File,
}

/// What a try of the lock found.
pub enum Held {
    /// Nobody held it: now we do.
    Ours(UpLock),
    /// A running supervisor holds it; its pid, as it wrote it (0 if unreadable).
    Theirs(u32),
}

fn open(dir: &Path) -> anyhow::Result<(PathBuf, File)> {
    let p = dir.join(LOCK);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&p)
        .map_err(|e| crate::local::path_error(&p, e))?;
    Ok((p, f))
}

/// Tries to take `dir`'s lock without waiting.
///
/// # Errors
/// The lock file cannot be opened or written.
pub fn try_lock(dir: &Path) -> anyhow::Result<Held> {
    take(dir, true)
}

fn take(dir: &Path, write_pid: bool) -> anyhow::Result<Held> {
    let (p, mut f) = open(dir)?;
    // SAFETY: flock(2) on a descriptor this function owns.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(crate::local::path_error(&p, e));
        }
        let mut s = String::new();
        let _ = f.read_to_string(&mut s);
        return Ok(Held::Theirs(s.trim().parse().unwrap_or(0)));
    }
    if write_pid {
        f.set_len(0)?;
        f.rewind()?;
        writeln!(f, "{}", std::process::id())?;
        f.sync_all()?;
    }
    Ok(Held::Ours(UpLock { _file: f }))
}

/// The pid of the supervisor running on `dir`, if one is.
///
/// # Errors
/// The lock file exists but cannot be read.
pub fn running(dir: &Path) -> anyhow::Result<Option<u32>> {
    if !dir.join(LOCK).exists() {
        return Ok(None);
    }
    match take(dir, false)? {
        // Released again when dropped here: nobody was running.
        Held::Ours(_) => Ok(None),
        Held::Theirs(pid) => Ok(Some(pid)),
    }
}
