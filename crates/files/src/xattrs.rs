//! Extended attributes (docs/files.md): kept in the inode's record at the masters
//! ([`FileOp::SetXattr`], [`FileQuery::Xattrs`]), cached here for [`ATTR_TTL`] as attributes
//! are.
//!
//! The cache matters for writes: before each `write(2)` the kernel asks for
//! `security.capability` (to drop file capabilities on a write), so without it every write
//! would cost a call to the masters.

use crate::shared::{ATTR_TTL, Shared, time_of};
use cairn_rpc::files::{FileOp, FileQuery, FileReply, XATTR_NAMESPACES, XattrSet};
use fuser::Errno;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

type Xattrs = Arc<BTreeMap<String, Vec<u8>>>;

/// Cached entries past which the stale ones are swept out.
const CACHE_SWEEP: usize = 4096;

/// Each node's extended attributes as last read or written here, and when.
#[derive(Default)]
pub(crate) struct XattrCache {
    map: parking_lot::Mutex<HashMap<u64, (Instant, Xattrs)>>,
    /// Bumped by every change made here: a read of the masters that started before one
    /// does not cache what it found (it may predate the change).
    changes: std::sync::atomic::AtomicU64,
}

impl XattrCache {
    fn get(&self, ino: u64) -> Option<Xattrs> {
        let m = self.map.lock();
        let (at, x) = m.get(&ino)?;
        (at.elapsed() < ATTR_TTL).then(|| x.clone())
    }

    fn changes(&self) -> u64 {
        self.changes.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Caches `x`, read when [`XattrCache::changes`] was `seen`, unless a change was made
    /// here since.
    fn put(&self, ino: u64, x: Xattrs, seen: u64) {
        let mut m = self.map.lock();
        if self.changes() != seen {
            return;
        }
        if m.len() >= CACHE_SWEEP {
            m.retain(|_, (at, _)| at.elapsed() < ATTR_TTL);
        }
        m.insert(ino, (Instant::now(), x));
    }

    /// A node made here has none (saves the first write's question to the masters).
    pub(crate) fn none(&self, ino: u64) {
        self.put(ino, Arc::default(), self.changes());
    }

    /// A change of `ino`'s attributes is under way or done: what is cached goes, and reads
    /// in flight do not cache theirs.
    fn forget(&self, ino: u64) {
        let mut m = self.map.lock();
        self.changes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        m.remove(&ino);
    }
}

/// What `getxattr(2)` and `listxattr(2)` answer for a buffer of `size` bytes: the length
/// alone when `size` is 0, `ERANGE` when the value does not fit.
pub(crate) enum Sized {
    Len(u32),
    Data(Vec<u8>),
}

fn sized(value: Vec<u8>, size: u32) -> Result<Sized, Errno> {
    let len = u32::try_from(value.len()).map_err(|_| Errno::E2BIG)?;
    if size == 0 {
        Ok(Sized::Len(len))
    } else if len > size {
        Err(Errno::ERANGE)
    } else {
        Ok(Sized::Data(value))
    }
}

/// A name the masters can hold: UTF-8, in a namespace kept (others cannot exist here).
fn known(name: &OsStr) -> Option<&str> {
    let n = name.to_str()?;
    XATTR_NAMESPACES
        .iter()
        .any(|ns| n.starts_with(ns))
        .then_some(n)
}

impl Shared {
    async fn xattrs(&self, ino: u64) -> Result<Xattrs, Errno> {
        if let Some(x) = self.xattr_cache.get(ino) {
            return Ok(x);
        }
        let path = self.path(ino)?;
        let seen = self.xattr_cache.changes();
        match self.query(&FileQuery::Xattrs { path, ino }).await? {
            FileReply::Xattrs(x) => {
                let x = Arc::new(x);
                self.xattr_cache.put(ino, x.clone(), seen);
                Ok(x)
            }
            _ => Err(Errno::EIO),
        }
    }

    /// `getxattr(2)` answered from the cache on the kernel's thread (the kernel's question
    /// before each write among them). `None`: not cached; it needs [`Shared::getxattr`].
    pub(crate) fn getxattr_now(
        &self,
        ino: u64,
        name: &OsStr,
        size: u32,
    ) -> Option<Result<Sized, Errno>> {
        let Some(name) = known(name) else {
            return Some(Err(Errno::ENODATA));
        };
        let x = self.xattr_cache.get(ino)?;
        Some(match x.get(name) {
            Some(v) => sized(v.clone(), size),
            None => Err(Errno::ENODATA),
        })
    }

    pub(crate) async fn getxattr(&self, ino: u64, name: &OsStr, size: u32) -> Result<Sized, Errno> {
        let Some(name) = known(name) else {
            return Err(Errno::ENODATA);
        };
        let x = self.xattrs(ino).await?;
        let v = x.get(name).ok_or(Errno::ENODATA)?;
        sized(v.clone(), size)
    }

    pub(crate) async fn listxattr(&self, ino: u64, size: u32) -> Result<Sized, Errno> {
        let x = self.xattrs(ino).await?;
        let mut names = Vec::new();
        for n in x.keys() {
            names.extend_from_slice(n.as_bytes());
            names.push(0);
        }
        sized(names, size)
    }

    /// `setxattr(2)` (`value` some, with its flags) and `removexattr(2)` (none).
    pub(crate) async fn setxattr(
        &self,
        ino: u64,
        name: &OsStr,
        value: Option<&[u8]>,
        flags: i32,
    ) -> Result<(), Errno> {
        // Its ctime changes (listed.rs).
        self.listed.lock().changed(ino);
        let Some(name) = known(name) else {
            // ext4 answers the same for a namespace it does not keep (system.posix_acl_*
            // without ACLs).
            return Err(if value.is_some() {
                Errno::EOPNOTSUPP
            } else {
                Errno::ENODATA
            });
        };
        let flags = match flags & (libc::XATTR_CREATE | libc::XATTR_REPLACE) {
            0 => XattrSet::Any,
            libc::XATTR_CREATE => XattrSet::Create,
            libc::XATTR_REPLACE => XattrSet::Replace,
            _ => return Err(Errno::EINVAL),
        };
        let op = FileOp::SetXattr {
            path: self.path(ino)?,
            ino,
            name: name.to_owned(),
            value: value.map(<[u8]>::to_vec),
            flags,
            now: time_of(SystemTime::now()),
        };
        self.xattr_cache.forget(ino);
        let r = self.op(&op).await;
        self.xattr_cache.forget(ino);
        match r? {
            FileReply::Attr(_) => Ok(()),
            FileReply::NoXattr => Err(Errno::ENODATA),
            _ => Err(Errno::EIO),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_that_started_before_a_change_is_not_cached() {
        let c = XattrCache::default();
        let seen = c.changes();
        c.forget(7);
        c.put(7, Arc::default(), seen);
        assert!(c.get(7).is_none(), "read before the change");
        c.put(7, Arc::default(), c.changes());
        assert!(c.get(7).is_some());
        c.none(8);
        assert!(c.get(8).is_some_and(|x| x.is_empty()));
    }

    #[test]
    fn sizes_follow_the_syscalls_rules() {
        assert!(matches!(sized(b"abc".to_vec(), 0), Ok(Sized::Len(3))));
        assert!(matches!(sized(b"abc".to_vec(), 2), Err(e) if e == Errno::ERANGE));
        assert!(matches!(sized(b"abc".to_vec(), 3), Ok(Sized::Data(d)) if d == b"abc"));
        assert_eq!(known(OsStr::new("user.a")), Some("user.a"));
        assert_eq!(known(OsStr::new("system.posix_acl_access")), None);
    }
}
