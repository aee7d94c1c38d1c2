//! Local files as `cp` treats them, for `cairn fs get` and `put`.
//!
//! A destination is never replaced by something of another kind: a symlink is followed and
//! its target written; a FIFO, a character or block device is opened and written as a
//! stream; only a regular file (or a name that does not exist yet) is written atomically —
//! to a temporary file beside it, synced, given the old file's mode, renamed over it, and
//! the directory synced — so a reader sees the old bytes or the new, never half. `-` is
//! standard output (or, as a source, standard input).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A local path's error as Unix tools print it: `PATH: No such file or directory`.
pub fn path_error(path: &Path, e: std::io::Error) -> anyhow::Error {
    anyhow::anyhow!("{}: {}", path.display(), io_reason(&e))
}

/// An I/O error's reason without Rust's ` (os error N)` tail.
pub fn io_reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.rfind(" (os error ") {
        Some(i) if s.ends_with(')') => s[..i].to_owned(),
        _ => s,
    }
}

/// Where `fs get` writes.
pub enum Dest {
    /// `-`: standard output.
    Stdout(Stdout),
    /// A FIFO or a device (or a symlink to one): written in place, as a stream.
    Stream { path: PathBuf, file: File },
    /// A regular file or a new name: a temporary file renamed over `target` on [`Dest::finish`].
    Atomic {
        target: PathBuf,
        tmp: PathBuf,
        file: File,
        mode: Option<u32>,
        done: bool,
    },
}

impl Dest {
    /// Opens where a copy of the cluster's file `remote` goes when the user names `local`.
    ///
    /// # Errors
    /// `local` is a directory holding a directory of `remote`'s name, a socket, a dangling
    /// symlink (GNU cp refuses to write through one too), or cannot be created.
    pub fn open(local: &Path, remote: &str) -> anyhow::Result<Self> {
        if local.as_os_str() == "-" {
            return Ok(Self::Stdout(Stdout(std::io::stdout())));
        }
        let name = remote.rsplit('/').find(|s| !s.is_empty()).unwrap_or("file");
        let local = match std::fs::metadata(local) {
            Ok(m) if m.is_dir() => local.join(name),
            _ => local.to_path_buf(),
        };
        match std::fs::metadata(&local) {
            Ok(m) if m.is_dir() => Err(anyhow::anyhow!(
                "{}: cannot overwrite a directory with a file",
                local.display()
            )),
            Ok(m) if m.file_type().is_socket() => Err(anyhow::anyhow!(
                "{}: is a socket; not written",
                local.display()
            )),
            Ok(m) if m.is_file() => {
                // Through any symlinks: the rename replaces the file, not the link to it.
                let target = std::fs::canonicalize(&local).map_err(|e| path_error(&local, e))?;
                Self::atomic(target, Some(m.permissions().mode() & 0o7777))
            }
            Ok(_) => {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&local)
                    .map_err(|e| path_error(&local, e))?;
                Ok(Self::Stream { path: local, file })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if std::fs::symlink_metadata(&local).is_ok() {
                    anyhow::bail!(
                        "{}: not writing through a dangling symlink",
                        local.display()
                    );
                }
                Self::atomic(local, None)
            }
            Err(e) => Err(path_error(&local, e)),
        }
    }

    fn atomic(target: PathBuf, mode: Option<u32>) -> anyhow::Result<Self> {
        let dir = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let base = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(".{base}.cairn-partial.{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            // A new file gets what `cp` gives one: 0666 less the umask.
            .mode(0o666)
            .open(&tmp)
            .map_err(|e| path_error(&target, e))?;
        Ok(Self::Atomic {
            target,
            tmp,
            file,
            mode,
            done: false,
        })
    }

    /// The writer the bytes go to.
    pub fn writer(&mut self) -> &mut dyn Write {
        match self {
            Self::Stdout(s) => s,
            Self::Stream { file, .. } | Self::Atomic { file, .. } => file,
        }
    }

    /// Makes the copy complete: flushes a stream; syncs a temporary file, gives it the old
    /// file's mode, renames it over the target and syncs the directory.
    ///
    /// # Errors
    /// Any of those steps failed (the temporary file is then removed).
    pub fn finish(mut self) -> anyhow::Result<()> {
        match &mut self {
            Self::Stdout(s) => s
                .flush()
                .map_err(|e| anyhow::anyhow!("standard output: {}", io_reason(&e))),
            Self::Stream { path, file } => file.flush().map_err(|e| path_error(path, e)),
            Self::Atomic {
                target,
                tmp,
                file,
                mode,
                done,
            } => {
                let err = |e| path_error(target, e);
                file.sync_all().map_err(err)?;
                if let Some(m) = mode {
                    file.set_permissions(std::fs::Permissions::from_mode(*m))
                        .map_err(err)?;
                }
                std::fs::rename(&*tmp, &*target).map_err(err)?;
                *done = true;
                // The rename itself is durable once the directory is.
                if let Some(dir) = target.parent().filter(|p| !p.as_os_str().is_empty())
                    && let Ok(d) = File::open(dir)
                {
                    let _ = d.sync_all();
                }
                Ok(())
            }
        }
    }
}

impl Drop for Dest {
    fn drop(&mut self) {
        if let Self::Atomic {
            tmp, done: false, ..
        } = self
        {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// Where `fs put` reads: a regular file (or a FIFO, a device: read to its end) or `-`.
pub enum Source {
    Stdin(std::io::Stdin),
    File { file: File, length: Option<u64> },
}

impl Source {
    /// Opens `local`, refusing a directory before anything is made in the cluster.
    ///
    /// # Errors
    /// `local` is missing, unreadable or a directory.
    pub fn open(local: &Path) -> anyhow::Result<Self> {
        if local.as_os_str() == "-" {
            return Ok(Self::Stdin(std::io::stdin()));
        }
        let m = std::fs::metadata(local).map_err(|e| path_error(local, e))?;
        anyhow::ensure!(
            !m.is_dir(),
            "{}: is a directory (-r copies a tree)",
            local.display()
        );
        let file = File::open(local).map_err(|e| path_error(local, e))?;
        Ok(Self::File {
            file,
            length: m.is_file().then_some(m.len()),
        })
    }

    /// Its length when known in advance (a regular file).
    pub fn length(&self) -> Option<u64> {
        match self {
            Self::Stdin(_) => None,
            Self::File { length, .. } => *length,
        }
    }

    pub fn reader(&mut self) -> &mut dyn std::io::Read {
        match self {
            Self::Stdin(s) => s,
            Self::File { file, .. } => file,
        }
    }
}

/// Standard output that ends the process as `cat` ends when its reader goes away (`cairn fs
/// cat F | head`): killed by SIGPIPE, with no message.
pub struct Stdout(pub std::io::Stdout);

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf).map_err(closed)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush().map_err(closed)
    }
}

fn closed(e: std::io::Error) -> std::io::Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        die_of_sigpipe();
    }
    e
}

/// Ends the process killed by SIGPIPE, as a C program writing to a closed pipe ends (Rust
/// ignores the signal so that sockets report EPIPE; the CLI's standard output should not).
pub fn die_of_sigpipe() -> ! {
    // SAFETY: resetting a signal's disposition and raising it in this process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(128 + libc::SIGPIPE)
}

/// Makes `println!` to a closed pipe end the process as [`die_of_sigpipe`] does instead of
/// panicking with "failed printing to stdout: Broken pipe".
pub fn quiet_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if msg.contains("failed printing to stdout") && msg.contains("Broken pipe") {
            die_of_sigpipe();
        }
        default(info);
    }));
}
