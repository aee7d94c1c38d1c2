//! `cairn mount DIR`: the cluster's file system at a local directory (docs/files.md).

use crate::cluster::ClusterArgs;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct MountArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The directory to mount on (it must exist).
    dir: PathBuf,
    /// Let other local users use the mount (the kernel checks each one's rights on the files'
    /// owners and bits); the default when run as root.
    #[arg(long)]
    allow_other: bool,
    /// Remove the files of `/.fs/unlinked` (unlinked while open) that no mount kept fresh
    /// for this many seconds: those of mounts that died before closing them.
    #[arg(long, default_value_t = cairn_files::UNLINKED_STALE.as_secs(), value_parser = clap::value_parser!(u64).range(4..))]
    unlinked_stale_secs: u64,
    /// Make every close wait until the file's bytes are committed, as for files made before
    /// the mount: by default the close of a file made here a moment ago answers at once and
    /// its flush follows (other mounts still see it whole after the close; a crash of this
    /// mount may lose it, as an unsynced write).
    #[arg(long)]
    sync_close: bool,
    /// Make every create wait until the masters have made the file: by default a create in
    /// a directory made here a moment ago answers at once and the masters make the file
    /// behind it (other mounts wait for it; a crash of this mount may lose it, as an
    /// unsynced write).
    #[arg(long)]
    sync_create: bool,
    /// The kernel's readahead for the mount, in KiB: a sequential reader's FUSE requests are
    /// this large, up to 1024 (0: the kernel's own, 128). Setting it needs root; without,
    /// the mount says so and serves with the kernel's.
    #[arg(long, default_value_t = cairn_files::READAHEAD_KIB)]
    readahead_kib: u32,
}

/// Mounts and serves until Ctrl-C, SIGTERM or an unmount (`fusermount3 -u DIR`, `umount
/// DIR`); at Ctrl-C and SIGTERM every write is flushed before the mount goes.
pub fn run(a: MountArgs) -> anyhow::Result<()> {
    let masters = a.cluster.masters()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let client = crate::cluster::client(&masters).await?;
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let opts = cairn_files::Options {
            allow_other: a.allow_other || root,
            unlinked_stale: std::time::Duration::from_secs(a.unlinked_stale_secs),
            sync_close: a.sync_close,
            sync_create: a.sync_create,
            readahead_kib: a.readahead_kib,
        };
        let stop = async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("a SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        if cairn_files::clear_stale(&a.dir)? {
            eprintln!(
                "cairn mount: {} held a mount whose process died (unmounted it)",
                a.dir.display()
            );
        }
        eprintln!(
            "cairn mount: serving {} (Ctrl-C to unmount)",
            a.dir.display()
        );
        cairn_files::mount(client, &a.dir, &opts, stop).await?;
        eprintln!("cairn mount: unmounted {}", a.dir.display());
        Ok(())
    })
}
