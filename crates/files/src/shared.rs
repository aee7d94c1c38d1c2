//! The mount's state (docs/files.md): where each node the kernel knows is, each open file's
//! dirty ranges and extents, and the namespace calls (`data.rs` has reads, writes and
//! flushes). `fs.rs` turns the kernel's calls into these.

use crate::fresh::{CLOSES_BEHIND, Fresh, defer_attr, fresh_attr};
use crate::listed::Listed;
use crate::nodes::Nodes;
use crate::segment::GroupWriter;
use cairn_client::Client;
use cairn_rpc::files::{
    Attr, Data, FileOp, FileQuery, FileReply, NewNode, NodeType, SetAttr, Time,
};
use cairn_rpc::{ErrorKind, MetaError};
use fuser::{Errno, FileType, INodeNo, ReplyDirectory};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long the kernel keeps attributes and directory entries without asking again.
pub const ATTR_TTL: Duration = Duration::from_secs(1);
/// Dirty bytes of one file that make a write flush them before it returns.
pub const DIRTY_FILE_MAX: usize = 8 << 20;
/// Dirty ranges older than this are flushed by the background flush.
pub const FLUSH_EVERY: Duration = Duration::from_secs(5);
/// Entries asked of the masters per readdir page.
const READDIR_PAGE: u32 = 512;

/// A file's state in this mount while it is open or dirty.
#[derive(Default)]
pub(crate) struct FileState {
    pub(crate) opens: u32,
    /// Written and not yet flushed: non-overlapping ranges by offset.
    pub(crate) dirty: BTreeMap<u64, Vec<u8>>,
    pub(crate) dirty_bytes: usize,
    pub(crate) dirty_since: Option<Instant>,
    /// The file's size as this mount knows it (its writes and truncates included).
    pub(crate) size: Option<u64>,
    /// The file's extents as last read or written here (dropped at open: close-to-open).
    pub(crate) map: Option<Data>,
    /// Unlinked while open here: the name it was moved to below [`UNLINKED_DIR`], removed at
    /// its last close.
    pub(crate) unlinked: Option<String>,
    /// Made here by `create`, none of its bytes committed yet: the attribute changes taken
    /// since, committed with its first bytes.
    pub(crate) fresh: Option<Fresh>,
}

/// Whether a flush of the file would do anything: dirty bytes, or a new file's first
/// commit (which carries its attribute changes and ends its hold).
pub(crate) fn needs_flush(st: &FileState) -> bool {
    !st.dirty.is_empty() || st.fresh.is_some()
}

/// Where a file unlinked while this mount has it open waits for its last close (NFS's
/// "silly rename", out of its directory's listing): `/.fs/unlinked/<inode>-<random>`.
pub const UNLINKED_DIR: &str = "/.fs/unlinked";

/// A directory being read: the names handed out, by offset (cookies stay valid while the
/// directory changes: each names the entry to go on after).
pub(crate) struct DirHandle {
    pub(crate) names: Vec<(String, u64, FileType)>,
    pub(crate) done: bool,
}

pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) nodes: Mutex<Nodes>,
    pub(crate) files: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<FileState>>>>,
    pub(crate) dirs: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<DirHandle>>>>,
    pub(crate) segments: GroupWriter,
    pub(crate) next_handle: AtomicU64,
    pub(crate) xattr_cache: crate::xattrs::XattrCache,
    /// Directories this mount made a moment ago, whose names it knows (negative lookups).
    pub(crate) listed: Mutex<Listed>,
    /// What the masters answered a moment ago of the files this mount committed (known.rs).
    pub(crate) known: Mutex<crate::known::Known>,
    /// This mount's name at the masters (its client's id): the holder of the files it made.
    pub(crate) mount_id: String,
    /// Directories whose creates answer before their make, and those makes (early.rs).
    pub(crate) early: Mutex<crate::early::Early>,
    /// Permits for closes answered before their flush ([`CLOSES_BEHIND`]).
    pub(crate) closing: Arc<tokio::sync::Semaphore>,
    /// Every close waits for its commit (`cairn mount --sync-close`).
    pub(crate) sync_close: bool,
    /// Every create waits for its make (`cairn mount --sync-create`): no directory is held.
    sync_create: bool,
}

pub(crate) fn errno(e: &MetaError) -> Errno {
    match e.kind {
        ErrorKind::NotFound => Errno::ENOENT,
        ErrorKind::AlreadyExists => Errno::EEXIST,
        ErrorKind::NotADirectory => Errno::ENOTDIR,
        ErrorKind::IsADirectory => Errno::EISDIR,
        ErrorKind::DirectoryNotEmpty => Errno::ENOTEMPTY,
        ErrorKind::InvalidArgument => Errno::EINVAL,
        ErrorKind::PermissionDenied => Errno::EACCES,
        ErrorKind::NoSpace | ErrorKind::Reclaiming => Errno::ENOSPC,
        ErrorKind::CrossDevice => Errno::EXDEV,
        ErrorKind::TooManyLinks => Errno::EMLINK,
        _ => Errno::EIO,
    }
}

pub(crate) fn client_errno(e: &cairn_client::Error) -> Errno {
    match e {
        cairn_client::Error::Meta(m) => errno(m),
        _ => Errno::EIO,
    }
}

pub(crate) fn system_time(t: Time) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
            + Duration::from_nanos(u64::from(t.nanos))
    }
}

pub(crate) fn time_of(t: SystemTime) -> Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Time {
            secs: d.as_secs() as i64,
            nanos: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let (mut secs, mut nanos) = (-(d.as_secs() as i64), d.subsec_nanos());
            if nanos > 0 {
                secs -= 1;
                nanos = 1_000_000_000 - nanos;
            }
            Time { secs, nanos }
        }
    }
}

pub(crate) fn file_type(k: NodeType) -> FileType {
    match k {
        NodeType::Regular => FileType::RegularFile,
        NodeType::Directory => FileType::Directory,
        NodeType::Symlink => FileType::Symlink,
        NodeType::Fifo => FileType::NamedPipe,
        NodeType::Socket => FileType::Socket,
        NodeType::CharDevice => FileType::CharDevice,
        NodeType::BlockDevice => FileType::BlockDevice,
    }
}

/// A name from the kernel as the namespace keeps it: any bytes (those that are not UTF-8
/// as code points of their own: `cairn_rpc::files::name_from_bytes`).
pub(crate) fn name_of(name: &OsStr) -> Result<String, Errno> {
    let b = std::os::unix::ffi::OsStrExt::as_bytes(name);
    if b.len() > cairn_rpc::files::NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(cairn_rpc::files::name_from_bytes(b))
}

pub(crate) fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

impl Shared {
    pub(crate) fn new(client: Client, sync_close: bool, sync_create: bool) -> Self {
        Self {
            sync_close,
            sync_create,
            segments: GroupWriter::new(client.clone()),
            mount_id: client.client_id().to_owned(),
            closing: Arc::new(tokio::sync::Semaphore::new(CLOSES_BEHIND)),
            client,
            nodes: Mutex::new(Nodes::default()),
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            xattr_cache: Default::default(),
            listed: Mutex::new(Listed::default()),
            known: Mutex::new(crate::known::Known::default()),
            early: Mutex::default(),
        }
    }

    pub(crate) fn path(&self, ino: u64) -> Result<String, Errno> {
        self.nodes.lock().path(ino)
    }

    pub(crate) fn child_path(&self, parent: u64, name: &OsStr) -> Result<(String, String), Errno> {
        let name = name_of(name)?;
        let dir = self.path(parent)?;
        let path = join(&dir, &name);
        if path.len() > cairn_rpc::MAX_PATH {
            return Err(Errno::ENAMETOOLONG);
        }
        Ok((path, name))
    }

    /// The kernel learnt of `attr` as `name` in `parent`.
    pub(crate) fn remember(&self, parent: u64, name: &str, attr: &Attr) {
        if attr.ino == 1 {
            return;
        }
        self.nodes
            .lock()
            .remember(attr.ino, parent, name, attr.nlink, &attr.policy);
    }

    /// The name `name` in `parent` is gone (unlinked, or replaced by a rename): a node known
    /// by it goes on by another name it has, if this mount knows one.
    pub(crate) fn name_gone(&self, parent: u64, name: &str) {
        self.nodes.lock().name_gone(parent, name);
    }

    /// This mount's call to take `name` out of `parent` ended (`done`: it did) — what the
    /// directory's listing, if it has one, learns of it.
    pub(crate) fn gone_from(&self, parent: u64, name: &str, done: bool) {
        let mut l = self.listed.lock();
        if done {
            l.removed(parent, name);
        } else {
            l.forget(parent);
        }
    }

    /// The policy of the segments file `ino`'s bytes go to (empty: the default).
    pub(crate) fn policy_of(&self, ino: u64) -> String {
        self.nodes
            .lock()
            .get(ino)
            .map(|n| n.policy.clone())
            .unwrap_or_default()
    }

    pub(crate) fn state(&self, ino: u64) -> Arc<tokio::sync::Mutex<FileState>> {
        let mut files = self.files.lock();
        if !files.contains_key(&ino) {
            // Open or changing here: what the masters answered of it before is not kept.
            self.known.lock().drop_ino(ino);
        }
        files.entry(ino).or_default().clone()
    }

    /// A file's state, locked, and still the one the mount keeps: a release that forgot the
    /// state while this call waited for its lock (a close's flush held it) leaves it to no
    /// one, and an open counted there would be lost (an unlink would not see it open).
    pub(crate) async fn state_locked(&self, ino: u64) -> tokio::sync::OwnedMutexGuard<FileState> {
        loop {
            let st = self.state(ino);
            let g = st.clone().lock_owned().await;
            if self
                .files
                .lock()
                .get(&ino)
                .is_some_and(|s| Arc::ptr_eq(s, &st))
            {
                return g;
            }
        }
    }

    /// `attr` with this mount's unflushed size and attribute changes (and no link for a
    /// file unlinked while open).
    pub(crate) async fn local(&self, mut attr: Attr) -> Attr {
        let st = self.files.lock().get(&attr.ino).cloned();
        if let Some(st) = st {
            let mut st = st.lock().await;
            if let Some(f) = st.fresh.as_mut() {
                // What the masters say of what does not wait here (a link's count).
                f.attr = attr.clone();
                f.overlay(&mut attr);
            }
            if let Some(size) = st.size {
                attr.size = size;
            }
            if st.unlinked.is_some() {
                attr.nlink = 0;
            }
        }
        attr
    }

    /// A file's state, when it has one and its lock is free: for the calls answered on the
    /// kernel's thread.
    pub(crate) fn state_now(&self, ino: u64) -> Option<tokio::sync::OwnedMutexGuard<FileState>> {
        let st = self.files.lock().get(&ino).cloned()?;
        st.try_lock_owned().ok()
    }

    /// A close (FUSE flush) with nothing to flush, answered here. `false`: it needs
    /// [`Shared::flush`].
    pub(crate) fn flush_now(&self, ino: u64) -> bool {
        if !self.files.lock().contains_key(&ino) {
            return true;
        }
        self.state_now(ino).is_some_and(|st| !needs_flush(&st))
    }

    /// A release with nothing to flush, no segment of the file's own to seal and no set-aside
    /// name to remove, answered here. `false`: it needs [`Shared::closed`].
    pub(crate) fn release_now(&self, ino: u64) -> bool {
        let mut files = self.files.lock();
        let Some(st) = files.get(&ino).cloned() else {
            return true;
        };
        let Ok(mut g) = st.try_lock() else {
            return false;
        };
        if needs_flush(&g) || g.unlinked.is_some() {
            return false;
        }
        if g.opens > 1 {
            g.opens -= 1;
            return true;
        }
        if self.segments.has_own(ino) {
            return false;
        }
        drop(g);
        files.remove(&ino);
        true
    }

    /// unlink(2) and rmdir(2). A file this mount has open is moved to [`UNLINKED_DIR`]
    /// instead, so that its reads and writes go on, and removed at its last close
    /// ([`Shared::closed`]).
    pub(crate) async fn remove(&self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let (path, name) = self.child_path(parent, name)?;
        if !dir {
            self.settle_name(parent, &name).await?;
        }
        let open = if dir {
            None
        } else {
            let candidates: Vec<(u64, Arc<tokio::sync::Mutex<FileState>>)> = {
                let nodes = self.nodes.lock();
                self.files
                    .lock()
                    .iter()
                    .filter(|(ino, _)| nodes.get(**ino).is_some_and(|n| n.is(parent, &name)))
                    .map(|(ino, st)| (*ino, st.clone()))
                    .collect()
            };
            let mut found = None;
            for (ino, st) in candidates {
                if st.lock().await.opens > 0 {
                    found = Some((ino, st));
                }
            }
            found
        };
        // A file with other names stays reachable by them: only the name goes.
        let open = match open {
            Some((ino, _)) => match self.query(&self.lookup_query(path.clone())).await {
                Ok(FileReply::Attr(a)) if a.ino == ino && a.nlink > 1 => None,
                _ => open,
            },
            None => None,
        };
        let Some((ino, st)) = open else {
            // A directory removed takes its listing with it.
            let child = dir.then(|| self.nodes.lock().at(parent, &name)).flatten();
            let r = self
                .op(&FileOp::Remove {
                    path,
                    ino: 0,
                    dir,
                    now: time_of(SystemTime::now()),
                    mount: self.mount_id.clone(),
                })
                .await;
            self.gone_from(parent, &name, r.is_ok());
            if let Some(c) = child {
                self.listed.lock().forget(c);
                self.early.lock().forget(c);
            }
            r?;
            self.name_gone(parent, &name);
            return Ok(());
        };
        let mut st = st.lock().await;
        // Shared by every mount and user: the service's directory readable by all, the
        // waiting room writable by all with the sticky bit (as /tmp).
        for (d, mode) in [("/.fs", 0o755), (UNLINKED_DIR, 0o1777)] {
            let make = FileOp::Make {
                path: d.into(),
                node: NewNode::Directory,
                mode,
                uid: 0,
                gid: 0,
                now: time_of(SystemTime::now()),
                hold: String::new(),
                mount: String::new(),
                ino: 0,
                reserve: 0,
            };
            match self.op(&make).await {
                Ok(_) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(e),
            }
        }
        let to = format!("{UNLINKED_DIR}/{ino:016x}-{:016x}", rand::random::<u64>());
        let r = self
            .op(&FileOp::Rename {
                from: path,
                ino,
                to: to.clone(),
                flags: cairn_rpc::files::RenameFlags::default(),
                now: time_of(SystemTime::now()),
                mount: self.mount_id.clone(),
            })
            .await;
        self.gone_from(parent, &name, r.is_ok());
        r?;
        self.nodes.lock().place(ino, 0, &to);
        st.unlinked = Some(to);
        Ok(())
    }

    /// A file's open. Close-to-open: what another mount closed before it is read whole, so
    /// the extents known here are dropped (unless this mount has writes of its own not yet
    /// flushed) and, for an open that reads, fetched now — an open file stays readable when
    /// another mount unlinks it (its extents are known here; segments are not collected).
    pub(crate) async fn opened(&self, ino: u64, reads: bool) -> Result<(), Errno> {
        let mut st = self.state_locked(ino).await;
        if st.dirty.is_empty() && st.unlinked.is_none() {
            st.map = None;
            st.size = None;
        }
        if reads {
            // Its path names another inode now (renamed over, unlinked since the kernel
            // looked it up): ESTALE makes the kernel look the name up again and retry.
            self.map_of(ino, &mut st)
                .await
                .map_err(|e| if e == Errno::ENOENT { Errno::ESTALE } else { e })?;
        }
        st.opens += 1;
        Ok(())
    }

    /// A file's close (FUSE release): flushed; forgotten when no open and nothing dirty is
    /// left; removed for good when it was unlinked while open.
    pub(crate) async fn closed(&self, ino: u64) -> Result<(), Errno> {
        let Some(st) = self.files.lock().get(&ino).cloned() else {
            return Ok(());
        };
        let mut g = crate::warn_if_slow("the file's lock, to close it", ino, st.lock()).await;
        g.opens = g.opens.saturating_sub(1);
        if g.opens == 0
            && let Some(path) = g.unlinked.take()
        {
            // Its bytes go with it: nothing to flush.
            g.dirty.clear();
            g.dirty_bytes = 0;
            g.dirty_since = None;
            // Forgotten before the lock goes: an open waiting for it sees the state is no
            // one's and makes a new one ([`Shared::state_locked`]).
            self.files.lock().remove(&ino);
            drop(g);
            self.nodes.lock().remove(ino);
            self.segments.release(ino).await;
            self.op(&FileOp::Remove {
                path,
                ino,
                dir: false,
                now: time_of(SystemTime::now()),
                mount: self.mount_id.clone(),
            })
            .await?;
            return Ok(());
        }
        let r = self.flush_locked(ino, &mut g).await;
        if g.opens == 0 && !needs_flush(&g) {
            // Forgotten before the lock goes (as above).
            self.files.lock().remove(&ino);
            drop(g);
            self.segments.release(ino).await;
        }
        r
    }

    pub(crate) async fn getattr(&self, ino: u64) -> Result<Attr, Errno> {
        // After a flush in flight (the lock busy kept it from `getattr_now`).
        let st = self.files.lock().get(&ino).cloned();
        if let Some(st) = st
            && let Some(a) = fresh_attr(&*st.lock().await)
        {
            return Ok(a);
        }
        let path = self.path(ino)?;
        match self.query(&self.lookup_query(path)).await? {
            FileReply::Attr(a) if a.ino == ino => Ok(self.local(a).await),
            FileReply::Attr(_) => Err(Errno::ESTALE),
            _ => Err(Errno::EIO),
        }
    }

    pub(crate) async fn make(
        &self,
        req: (u32, u32),
        parent: u64,
        name: &OsStr,
        node: NewNode,
        mode: u16,
        hold: bool,
    ) -> Result<Attr, Errno> {
        let (path, name) = self.child_path(parent, name)?;
        // The service's own directories (segments, the unlinked) get names this mount's
        // calls do not make: never listed.
        // Nor held for this mount: every mount makes names there.
        let service = path == "/.fs" || path.starts_with("/.fs/");
        let list = matches!(node, NewNode::Directory) && !service;
        let op = FileOp::Make {
            path,
            node,
            mode,
            uid: req.0,
            gid: req.1,
            now: time_of(SystemTime::now()),
            hold: if hold {
                self.mount_id.clone()
            } else {
                String::new()
            },
            mount: if service {
                String::new()
            } else {
                self.mount_id.clone()
            },
            ino: 0,
            // A directory held for this mount: numbers for its early creates (early.rs).
            reserve: if list && !self.sync_create {
                crate::early::RESERVE
            } else {
                0
            },
        };
        let sent = Instant::now();
        let made = match self.op(&op).await {
            Ok(FileReply::Made {
                attr,
                first,
                count,
                policy,
            }) => {
                self.early.lock().held(attr.ino, sent, policy, first, count);
                Ok(FileReply::Attr(attr))
            }
            r => r,
        };
        match made {
            Ok(FileReply::Attr(a)) => {
                self.remember(parent, &name, &a);
                self.xattr_cache.none(a.ino);
                let mut l = self.listed.lock();
                l.added(parent, &name);
                if list {
                    l.made(&a, sent);
                }
                Ok(a)
            }
            Ok(_) => Err(Errno::EIO),
            Err(e) => {
                // "Exists": someone else's name, which the listing did not have.
                self.listed.lock().forget(parent);
                Err(e)
            }
        }
    }

    /// `link(2)`: `name` in `parent` becomes another name of `ino`.
    pub(crate) async fn link(&self, ino: u64, parent: u64, name: &OsStr) -> Result<Attr, Errno> {
        let from = self.path(ino)?;
        let (to, name) = self.child_path(parent, name)?;
        self.settle(ino).await?;
        let op = FileOp::Link {
            from,
            ino,
            to,
            now: time_of(SystemTime::now()),
            mount: self.mount_id.clone(),
        };
        let r = self.op(&op).await;
        match r {
            Ok(_) => self.listed.lock().added(parent, &name),
            Err(_) => self.listed.lock().forget(parent),
        }
        match r? {
            FileReply::Attr(a) => {
                self.remember(parent, &name, &a);
                Ok(self.local(a).await)
            }
            _ => Err(Errno::EIO),
        }
    }

    pub(crate) async fn setattr(&self, ino: u64, attr: SetAttr) -> Result<Attr, Errno> {
        self.listed.lock().changed(ino);
        let st = self.state(ino);
        let mut st = st.lock().await;
        if let Some(a) = defer_attr(&mut st, &attr) {
            return Ok(a);
        }
        if attr.size.is_some() || st.fresh.is_some() {
            // Writes before a truncate land before it; a new file's first commit (with the
            // changes it carries) before a change that would otherwise come before it.
            self.flush_locked(ino, &mut st).await?;
        }
        let path = self.path(ino)?;
        let op = FileOp::SetAttr {
            path,
            ino,
            attr: attr.clone(),
            now: time_of(SystemTime::now()),
        };
        let a = match self.op(&op).await? {
            FileReply::Attr(a) => a,
            _ => return Err(Errno::EIO),
        };
        if attr.size.is_some() {
            st.size = Some(a.size);
            st.map = None;
        }
        Ok(a)
    }

    /// `fallocate(2)`: mode 0 extends the size (holes read as zeros: space is not reserved
    /// ahead, a later write may still find the cluster full); `FALLOC_FL_KEEP_SIZE` alone
    /// does nothing; `FALLOC_FL_PUNCH_HOLE` and `FALLOC_FL_ZERO_RANGE` cut the range's
    /// extents out, so it reads as zeros. The rest (collapse, insert, unshare) is
    /// `EOPNOTSUPP`, as on file systems without them.
    pub(crate) async fn fallocate(
        &self,
        ino: u64,
        offset: u64,
        len: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        const KNOWN: i32 =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        let end = offset.checked_add(len).ok_or(Errno::EFBIG)?;
        if len == 0 {
            return Err(Errno::EINVAL);
        }
        if end > cairn_rpc::files::MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        if mode & !KNOWN != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let zero = mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0;
        if mode & libc::FALLOC_FL_PUNCH_HOLE != 0 && !keep_size {
            // As Linux: a hole is punched inside the size only.
            return Err(Errno::EOPNOTSUPP);
        }
        let st = self.state(ino);
        let mut st = st.lock().await;
        // Writes before it land before it.
        self.flush_locked(ino, &mut st).await?;
        let path = self.path(ino)?;
        if zero {
            self.op(&FileOp::Punch {
                path: path.clone(),
                ino,
                offset,
                len,
                now: time_of(SystemTime::now()),
            })
            .await?;
            st.map = None;
        }
        if !keep_size {
            if st.size.is_none() {
                self.map_of(ino, &mut st).await?;
            }
            if end > st.size.unwrap_or(0) {
                let op = FileOp::SetAttr {
                    path,
                    ino,
                    attr: SetAttr {
                        size: Some(end),
                        ..SetAttr::default()
                    },
                    now: time_of(SystemTime::now()),
                };
                if let FileReply::Attr(a) = self.op(&op).await? {
                    st.size = Some(a.size);
                }
                st.map = None;
            }
        }
        Ok(())
    }

    pub(crate) async fn readdir(&self, ino: u64, fh: u64, offset: u64, mut reply: ReplyDirectory) {
        let Some(h) = self.dirs.lock().get(&fh).cloned() else {
            return reply.error(Errno::EBADF);
        };
        let mut h = h.lock().await;
        let mut i = offset as usize;
        loop {
            while i < h.names.len() {
                let (name, child, kind) = &h.names[i];
                let name = cairn_rpc::files::name_bytes(name);
                let name = <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&name);
                if reply.add(INodeNo(*child), (i + 1) as u64, *kind, name) {
                    return reply.ok();
                }
                i += 1;
            }
            if h.done {
                return reply.ok();
            }
            let after = h
                .names
                .last()
                .filter(|_| h.names.len() > 2)
                .map(|n| n.0.clone())
                .unwrap_or_default();
            let path = match self.path(ino) {
                Ok(p) => p,
                Err(e) => return reply.error(e),
            };
            let q = FileQuery::Readdir {
                path,
                ino,
                after,
                limit: READDIR_PAGE,
                mount: self.mount_id.clone(),
            };
            match self.query(&q).await {
                Ok(FileReply::Readdir { entries, more }) => {
                    for e in entries {
                        h.names.push((e.name, e.attr.ino, file_type(e.attr.kind)));
                    }
                    h.done = !more;
                }
                Ok(_) => return reply.error(Errno::EIO),
                Err(e) => return reply.error(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_convert_both_ways() {
        for t in [
            Time { secs: 0, nanos: 0 },
            Time {
                secs: 1_700_000_000,
                nanos: 123,
            },
            Time {
                secs: -2,
                nanos: 500,
            },
        ] {
            assert_eq!(time_of(system_time(t)), t, "{t:?}");
        }
    }
}
