//! Cairn's file service (docs/files.md): a POSIX file system whose nodes are the masters'
//! namespace and whose bytes are extents of segments, FlatLogFiles the mounts append to,
//! served to the kernel with FUSE (`cairn mount`).

mod calls;
mod data;
mod early;
mod fresh;
mod fs;
mod known;
mod listed;
pub mod mount;
mod nodes;
pub mod segment;
mod shared;
mod unlinked;
mod xattrs;

pub use fs::CairnFs;
pub use listed::LISTED_FOR;
pub use mount::{MountError, Options, READAHEAD_KIB, clear_stale, mount};
pub use shared::{ATTR_TTL, DIRTY_FILE_MAX, FLUSH_EVERY};
pub use unlinked::UNLINKED_STALE;

/// How often a wait on the data path that has not ended says so.
const SLOW_EVERY: std::time::Duration = std::time::Duration::from_secs(20);

/// Runs `fut`, warning every [`SLOW_EVERY`] while it has not finished, with what it waits for
/// (`what`) and on what (`id`: an inode, a segment): a close that does not return names the
/// step it is stuck in.
pub(crate) async fn warn_if_slow<T>(what: &str, id: u64, fut: impl Future<Output = T>) -> T {
    let started = std::time::Instant::now();
    let mut fut = std::pin::pin!(fut);
    loop {
        tokio::select! {
            r = &mut fut => return r,
            () = tokio::time::sleep(SLOW_EVERY) => {
                tracing::warn!(id, waited_s = started.elapsed().as_secs(), "still waiting: {what}");
            }
        }
    }
}
