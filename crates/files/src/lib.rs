//! Cairn's file service (docs/files.md): a POSIX file system whose nodes are the masters'
//! namespace and whose bytes are extents of segments, FlatLogFiles the mounts append to,
//! served to the kernel with FUSE (`cairn mount`).

mod fs;
pub mod mount;
pub mod segment;

pub use fs::{ATTR_TTL, CairnFs, DIRTY_FILE_MAX, FLUSH_EVERY};
pub use mount::{MountError, Options, clear_stale, mount};
