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

/// A node's attributes for unit tests: a directory (0755, 2 links) or a 4 KiB file (0644).
#[cfg(test)]
pub(crate) fn test_attr(ino: u64, kind: cairn_rpc::files::NodeType) -> cairn_rpc::files::Attr {
    let dir = kind == cairn_rpc::files::NodeType::Directory;
    cairn_rpc::files::Attr {
        ino,
        kind,
        mode: if dir { 0o755 } else { 0o644 },
        uid: 0,
        gid: 0,
        nlink: if dir { 2 } else { 1 },
        size: if dir { 0 } else { 4096 },
        atime: cairn_rpc::files::Time::default(),
        mtime: cairn_rpc::files::Time::default(),
        ctime: cairn_rpc::files::Time::default(),
        rdev: 0,
        owner: String::new(),
        policy: String::new(),
    }
}

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
