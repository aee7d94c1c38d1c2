//! Cairn's file service (docs/files.md): a POSIX file system whose nodes are the masters'
//! namespace and whose bytes are extents of segments, FlatLogFiles the mounts append to,
//! served to the kernel with FUSE (`cairn mount`).

mod fs;
pub mod mount;
pub mod segment;
mod shared;

pub use fs::CairnFs;
pub use mount::{MountError, Options, clear_stale, mount};
pub use shared::{ATTR_TTL, DIRTY_FILE_MAX, FLUSH_EVERY};
