//! `cairn mount`: the FUSE session around [`CairnFs`], its background flush, and what happens
//! at the start and the end of a mount (docs/files.md "Mounting").

use crate::fs::CairnFs;
use cairn_client::Client;
use fuser::{Config, MountOption, Session, SessionACL};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("{0}: not a directory to mount on")]
    NotADirectory(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: a mount whose process died is there and could not be unmounted: {source}")]
    Stale {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// How a mount is made.
#[derive(Debug, Clone)]
pub struct Options {
    /// Other local users may use the mount (the kernel checks each one's permissions on the
    /// nodes' POSIX owners and bits).
    pub allow_other: bool,
    /// Entries of `/.fs/unlinked` no mount kept fresh for this long are removed (unlinked.rs).
    pub unlinked_stale: Duration,
    /// Every close waits for its file's commit, a new file's too (docs/files.md "A close
    /// that does not wait").
    pub sync_close: bool,
    /// Every create waits for the masters to make the file (docs/files.md "A create that
    /// does not wait").
    pub sync_create: bool,
    /// The kernel's readahead for the mount, in KiB ([`READAHEAD_KIB`] by default; 0 leaves
    /// the kernel's own, 128 KiB).
    pub readahead_kib: u32,
}

/// The readahead a mount asks of the kernel, in KiB: one FUSE request's most (256 pages),
/// so a sequential reader's requests are 1 MiB each, not the kernel's 128 KiB. fio's 1 MiB
/// sequential reads, 4 jobs: 0.48 of `cairn bench read` at 128 KiB, 0.74 at 1 MiB (medians
/// of three), less at 4 MiB (BENCHMARKS.md, session 59).
pub const READAHEAD_KIB: u32 = 1024;

/// Sets the kernel's readahead for the FUSE mount at `dir` to `kib` KiB: the mount's
/// backing device's `read_ahead_kb` in sysfs (`/sys/class/bdi/MAJOR:MINOR`, `MAJOR:MINOR`
/// its `st_dev`), as mergerfs does (DAOS's and CubeFS's docs tell operators to); the kernel
/// offers a FUSE mount no more than 128 KiB at its start. Only after the kernel's `INIT` is
/// answered (the `stat` of `dir` here waits for it): answering it sets the readahead to the
/// smaller of the two.
/// `before` is `dir`'s device before the mount: the same device after it means the mount
/// is not there. Answers the file written. Needs root (sysfs).
fn set_readahead(dir: &Path, before: u64, kib: u32) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir)?.dev();
    if dev == before {
        return Err(std::io::Error::other("the mount is not at its directory"));
    }
    let knob = PathBuf::from(format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    ));
    std::fs::write(&knob, kib.to_string())
        .map(|()| knob.clone())
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", knob.display())))
}

/// Whether a mount whose process died is at `dir` (its directory answers "transport endpoint
/// is not connected"); if so it is unmounted (lazily) and the function says so.
///
/// # Errors
/// It is there and could not be unmounted.
pub fn clear_stale(dir: &Path) -> Result<bool, MountError> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| MountError::NotADirectory(dir.to_owned()))?;
    // `stat` alone is not enough: the kernel answers it from its attribute cache for a
    // second after the process died. statfs always asks the file system's process.
    let probe = std::fs::metadata(dir).and_then(|m| {
        // SAFETY: a NUL-terminated path and a zeroed statvfs for the kernel to fill.
        let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut sv) } == 0 {
            Ok(m)
        } else {
            Err(std::io::Error::last_os_error())
        }
    });
    match probe {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            // SAFETY: a NUL-terminated path; umount2 reads it only.
            let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            if r == 0 {
                return Ok(true);
            }
            let direct = std::io::Error::last_os_error();
            // Not root: the setuid helper, as libfuse does.
            let helper = std::process::Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(dir)
                .status();
            match helper {
                Ok(s) if s.success() => Ok(true),
                _ => Err(MountError::Stale {
                    path: dir.to_owned(),
                    source: direct,
                }),
            }
        }
        Err(e) => Err(MountError::Io {
            path: dir.to_owned(),
            source: e,
        }),
        Ok(m) if !m.is_dir() => Err(MountError::NotADirectory(dir.to_owned())),
        Ok(_) => Ok(false),
    }
}

/// Mounts the cluster's file system at `dir` and serves it until `stop` resolves (then
/// flushes every file and unmounts) or the mount is taken away (`fusermount -u`, `umount`).
///
/// # Errors
/// The mount point is not a directory, or the kernel refused the mount.
pub async fn mount(
    client: Client,
    dir: &Path,
    opts: &Options,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), MountError> {
    if clear_stale(dir)? {
        tracing::warn!(dir = %dir.display(), "a mount whose process died was here; unmounted it");
    }
    let fs = CairnFs::new(
        tokio::runtime::Handle::current(),
        client,
        opts.sync_close,
        opts.sync_create,
    );
    let shared = fs.shared();
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("cairn".into()),
        MountOption::Subtype("cairn".into()),
        MountOption::DefaultPermissions,
    ];
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(1);
    let io = |source| MountError::Io {
        path: dir.to_owned(),
        source,
    };
    let before = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(dir).map_err(io)?.dev()
    };
    let mut session = Session::new(fs, dir, &config).map_err(io)?;
    let mut unmounter = session.unmount_callable();
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
    let runner = std::thread::Builder::new()
        .name("fuse".into())
        .spawn(move || {
            let r = session.run();
            let _ = done_tx.send(());
            r
        })
        .map_err(io)?;
    let flusher = {
        let shared = shared.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                shared.flush_older(crate::FLUSH_EVERY).await;
            }
        })
    };
    let sweeper = {
        let (shared, stale) = (shared.clone(), opts.unlinked_stale);
        tokio::spawn(async move {
            let (touch, sweep) = (crate::unlinked::touch_every(stale), stale / 2);
            let mut swept = tokio::time::Instant::now();
            shared.sweep_unlinked(stale).await;
            loop {
                tokio::time::sleep(touch).await;
                shared.touch_unlinked().await;
                if swept.elapsed() >= sweep {
                    swept = tokio::time::Instant::now();
                    shared.sweep_unlinked(stale).await;
                }
            }
        })
    };
    if opts.readahead_kib > 0 {
        // Beside the serving, not before it: its `stat` waits for the masters' answer about
        // the root, and Ctrl-C must unmount meanwhile.
        let (d, kib) = (dir.to_owned(), opts.readahead_kib);
        tokio::spawn(async move {
            match tokio::task::spawn_blocking(move || set_readahead(&d, before, kib)).await {
                Ok(Ok(knob)) => tracing::debug!(kib, knob = %knob.display(), "readahead set"),
                Ok(Err(e)) => tracing::warn!(
                    kib,
                    error = %e,
                    "could not set the mount's readahead (sequential reads go in the kernel's 128 KiB requests)"
                ),
                Err(e) => tracing::warn!(error = %e, "setting the mount's readahead"),
            }
        });
    }
    tracing::info!(dir = %dir.display(), "mounted");
    tokio::select! {
        () = stop => {
            // Every write made durable before the mount goes.
            shared.flush_older(Duration::ZERO).await;
            if let Err(e) = unmounter.unmount() {
                tracing::warn!(error = %e, "unmounting");
            }
            let _ = (&mut done_rx).await;
        }
        _ = &mut done_rx => {}
    }
    flusher.abort();
    sweeper.abort();
    let r = tokio::task::spawn_blocking(move || runner.join())
        .await
        .map_err(|e| io(std::io::Error::other(e.to_string())))?;
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(io(e)),
        Err(_) => Err(io(std::io::Error::other("the FUSE session panicked"))),
    }
}
