//! The FUSE file system: the kernel's calls as the masters' file service calls and segment
//! appends (docs/files.md).
//!
//! Every call is answered on the mount's tokio runtime: the FUSE thread hands it over and
//! takes the next, so slow calls (a flush, a read from the chunkservers) do not hold up
//! others. Inode numbers are the namespace's (the root is 1 in both).
//!
//! Writes are kept in the mount's memory (the *dirty* ranges of each file) until a flush: the
//! file's `close` (FUSE `flush`), `fsync`, a truncate, [`DIRTY_FILE_MAX`] dirty bytes in one
//! file, or the background flush every [`FLUSH_EVERY`] for ranges older than that. A flush
//! appends the ranges to the mount's segment (durable on MinCopy replicas before the append
//! returns) and then commits them as the file's extents: when `close` or `fsync` returns, the
//! bytes are durable and any mount that opens the file later reads them.

use crate::segment::{Piece, Segments};
use cairn_client::Client;
use cairn_rpc::files::{
    Attr, Data, Extent, FileOp, FileQuery, FileReply, NewNode, NodeType, RenameFlags, SetAttr,
    Time, segment_path,
};
use cairn_rpc::{ErrorKind, MetaError};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long the kernel keeps attributes and directory entries without asking again.
pub const ATTR_TTL: Duration = Duration::from_secs(1);
/// Dirty bytes of one file that make a write flush them before it returns.
pub const DIRTY_FILE_MAX: usize = 8 << 20;
/// Dirty ranges older than this are flushed by the background flush.
pub const FLUSH_EVERY: Duration = Duration::from_secs(5);
/// Entries asked of the masters per readdir page.
const READDIR_PAGE: u32 = 512;

/// A node the kernel knows: where it is (as this mount last saw it).
struct Node {
    parent: u64,
    name: String,
    lookups: u64,
}

/// A file's state in this mount while it is open or dirty.
#[derive(Default)]
struct FileState {
    opens: u32,
    /// Written and not yet flushed: non-overlapping ranges by offset.
    dirty: BTreeMap<u64, Vec<u8>>,
    dirty_bytes: usize,
    dirty_since: Option<Instant>,
    /// The file's size as this mount knows it (its writes and truncates included).
    size: Option<u64>,
    /// The file's extents as last read or written here (dropped at open: close-to-open).
    map: Option<Data>,
}

/// A directory being read: the names handed out, by offset (cookies stay valid while the
/// directory changes: each names the entry to go on after).
struct DirHandle {
    names: Vec<(String, u64, FileType)>,
    done: bool,
}

pub(crate) struct Shared {
    client: Client,
    nodes: Mutex<HashMap<u64, Node>>,
    files: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<FileState>>>>,
    dirs: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<DirHandle>>>>,
    segments: tokio::sync::Mutex<Segments>,
    next_handle: AtomicU64,
}

/// The file system the FUSE session serves.
pub struct CairnFs {
    rt: tokio::runtime::Handle,
    shared: Arc<Shared>,
}

fn errno(e: &MetaError) -> Errno {
    match e.kind {
        ErrorKind::NotFound => Errno::ENOENT,
        ErrorKind::AlreadyExists => Errno::EEXIST,
        ErrorKind::NotADirectory => Errno::ENOTDIR,
        ErrorKind::IsADirectory => Errno::EISDIR,
        ErrorKind::DirectoryNotEmpty => Errno::ENOTEMPTY,
        ErrorKind::InvalidArgument => Errno::EINVAL,
        ErrorKind::PermissionDenied => Errno::EACCES,
        ErrorKind::NoSpace | ErrorKind::Reclaiming => Errno::ENOSPC,
        _ => Errno::EIO,
    }
}

fn client_errno(e: &cairn_client::Error) -> Errno {
    match e {
        cairn_client::Error::Meta(m) => errno(m),
        _ => Errno::EIO,
    }
}

fn system_time(t: Time) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
            + Duration::from_nanos(u64::from(t.nanos))
    }
}

fn time_of(t: SystemTime) -> Time {
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

fn file_type(k: NodeType) -> FileType {
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

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.ctime),
        kind: file_type(a.kind),
        perm: a.mode & 0o7777,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

fn name_of(name: &OsStr) -> Result<String, Errno> {
    let s = name.to_str().ok_or(Errno::EINVAL)?;
    if s.len() > cairn_rpc::files::NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(s.to_owned())
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// Inserts `data` at `offset` into non-overlapping `dirty` ranges, replacing what it covers
/// and joining ranges it touches; the change in dirty bytes.
fn add_dirty(dirty: &mut BTreeMap<u64, Vec<u8>>, offset: u64, data: &[u8]) -> isize {
    let end = offset + data.len() as u64;
    let mut start = offset;
    let mut merged: Vec<u8> = Vec::new();
    let mut removed = 0usize;
    // A range before that reaches the new one: its head comes first.
    if let Some((&o, prev)) = dirty.range(..=offset).next_back()
        && o + prev.len() as u64 >= offset
    {
        start = o;
        merged.extend_from_slice(&prev[..(offset - o) as usize]);
    }
    merged.extend_from_slice(data);
    let overlapping: Vec<u64> = dirty.range(start..=end).map(|(&o, _)| o).collect();
    for o in overlapping {
        let r = dirty.remove(&o).expect("listed");
        removed += r.len();
        let r_end = o + r.len() as u64;
        if r_end > end {
            merged.extend_from_slice(&r[(end - o) as usize..]);
        }
    }
    let added = merged.len();
    dirty.insert(start, merged);
    added as isize - removed as isize
}

impl Shared {
    fn path(&self, ino: u64) -> Result<String, Errno> {
        if ino == 1 {
            return Ok("/".into());
        }
        let nodes = self.nodes.lock();
        let mut names = Vec::new();
        let mut cur = ino;
        while cur != 1 {
            let n = nodes.get(&cur).ok_or(Errno::ESTALE)?;
            names.push(n.name.as_str());
            cur = n.parent;
            if names.len() > 4096 {
                return Err(Errno::ELOOP);
            }
        }
        names.reverse();
        Ok(format!("/{}", names.join("/")))
    }

    fn child_path(&self, parent: u64, name: &OsStr) -> Result<(String, String), Errno> {
        let name = name_of(name)?;
        let dir = self.path(parent)?;
        let path = join(&dir, &name);
        if path.len() > cairn_rpc::files::PATH_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        Ok((path, name))
    }

    /// The kernel learnt of `attr` as `name` in `parent`.
    fn remember(&self, parent: u64, name: &str, attr: &Attr) {
        if attr.ino == 1 {
            return;
        }
        let mut nodes = self.nodes.lock();
        let n = nodes.entry(attr.ino).or_insert_with(|| Node {
            parent,
            name: name.to_owned(),
            lookups: 0,
        });
        n.parent = parent;
        name.clone_into(&mut n.name);
        n.lookups += 1;
    }

    async fn query(&self, q: &FileQuery) -> Result<FileReply, Errno> {
        self.client
            .masters()
            .file_query(q)
            .await
            .map_err(|e| errno(&e))
    }

    async fn op(&self, op: &FileOp) -> Result<FileReply, Errno> {
        self.client
            .masters()
            .file_op(op)
            .await
            .map_err(|e| errno(&e))
    }

    fn state(&self, ino: u64) -> Arc<tokio::sync::Mutex<FileState>> {
        self.files.lock().entry(ino).or_default().clone()
    }

    /// `attr` with this mount's unflushed size.
    async fn local(&self, mut attr: Attr) -> Attr {
        let st = self.files.lock().get(&attr.ino).cloned();
        if let Some(st) = st {
            let st = st.lock().await;
            if let Some(size) = st.size {
                attr.size = size;
            }
        }
        attr
    }

    async fn getattr(&self, ino: u64) -> Result<Attr, Errno> {
        let path = self.path(ino)?;
        match self.query(&FileQuery::Lookup { path }).await? {
            FileReply::Attr(a) if a.ino == ino => Ok(self.local(a).await),
            FileReply::Attr(_) => Err(Errno::ESTALE),
            _ => Err(Errno::EIO),
        }
    }

    async fn make(
        &self,
        req: (u32, u32),
        parent: u64,
        name: &OsStr,
        node: NewNode,
        mode: u16,
    ) -> Result<Attr, Errno> {
        let (path, name) = self.child_path(parent, name)?;
        let op = FileOp::Make {
            path,
            node,
            mode,
            uid: req.0,
            gid: req.1,
            now: time_of(SystemTime::now()),
        };
        match self.op(&op).await? {
            FileReply::Attr(a) => {
                self.remember(parent, &name, &a);
                Ok(a)
            }
            _ => Err(Errno::EIO),
        }
    }

    /// The file's extents, read from the masters when not known here.
    async fn map_of(&self, ino: u64, st: &mut FileState) -> Result<Data, Errno> {
        if let Some(m) = &st.map {
            return Ok(m.clone());
        }
        let path = self.path(ino)?;
        match self.query(&FileQuery::Map { path, ino }).await? {
            FileReply::Map { attr, data, .. } => {
                if st.size.is_none() {
                    st.size = Some(attr.size);
                }
                st.map = Some(data.clone());
                Ok(data)
            }
            _ => Err(Errno::EIO),
        }
    }

    async fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let st = self.state(ino);
        let mut st = st.lock().await;
        let data = self.map_of(ino, &mut st).await?;
        let file_size = st.size.unwrap_or(0);
        if offset >= file_size {
            return Ok(Vec::new());
        }
        let len = u64::from(size).min(file_size - offset);
        let end = offset + len;
        let mut out = vec![0u8; len as usize];
        let own = |seg: u64| seg == 0;
        let extents = match &data {
            Data::Extents(x) => x.clone(),
            Data::Own => vec![Extent {
                offset: 0,
                len: u64::MAX / 2,
                seg: 0,
                seg_offset: 0,
            }],
        };
        for e in extents
            .iter()
            .filter(|e| e.offset < end && e.end() > offset)
        {
            let lo = e.offset.max(offset);
            let hi = e.end().min(end);
            let at = e.seg_offset + (lo - e.offset);
            let n = (hi - lo) as usize;
            let bytes = if own(e.seg) {
                // The file's own log: committed bytes only (past them, zeros).
                let path = self.path(ino)?;
                let committed = match self.client.stat(&path).await {
                    Ok(s) => s.length,
                    Err(e) => return Err(client_errno(&e)),
                };
                let n = (n as u64).min(committed.saturating_sub(at)) as usize;
                if n == 0 {
                    continue;
                }
                self.client.read(&path, at, n).await
            } else {
                self.client
                    .read_acknowledged(&segment_path(e.seg), at, n)
                    .await
            }
            .map_err(|e| {
                tracing::warn!(ino, error = %e, "reading a file's bytes");
                client_errno(&e)
            })?;
            let from = (lo - offset) as usize;
            out[from..from + bytes.len()].copy_from_slice(&bytes);
        }
        // This mount's unflushed writes over them.
        for (&o, d) in st.dirty.range(..end) {
            let d_end = o + d.len() as u64;
            if d_end <= offset {
                continue;
            }
            let lo = o.max(offset);
            let hi = d_end.min(end);
            out[(lo - offset) as usize..(hi - offset) as usize]
                .copy_from_slice(&d[(lo - o) as usize..(hi - o) as usize]);
        }
        Ok(out)
    }

    async fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        if end > cairn_rpc::files::MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        let st = self.state(ino);
        let mut st = st.lock().await;
        if st.size.is_none() {
            // The size a write past the end extends from.
            self.map_of(ino, &mut st).await?;
        }
        let delta = add_dirty(&mut st.dirty, offset, data);
        st.dirty_bytes = st.dirty_bytes.saturating_add_signed(delta);
        st.dirty_since.get_or_insert_with(Instant::now);
        st.size = Some(st.size.unwrap_or(0).max(end));
        if st.dirty_bytes >= DIRTY_FILE_MAX {
            self.flush_locked(ino, &mut st).await?;
        }
        Ok(())
    }

    /// Makes the file's dirty ranges durable and its own: records in the segment, then one
    /// commit of their extents (several for very many ranges).
    async fn flush_locked(&self, ino: u64, st: &mut FileState) -> Result<(), Errno> {
        if st.dirty.is_empty() {
            return Ok(());
        }
        let path = self.path(ino)?;
        let extents = {
            let pieces: Vec<Piece<'_>> = st
                .dirty
                .iter()
                .map(|(&offset, d)| Piece {
                    ino,
                    offset,
                    data: d,
                })
                .collect();
            self.segments
                .lock()
                .await
                .write(&pieces)
                .await
                .map_err(|e| {
                    tracing::warn!(ino, error = %e, "flushing a file's writes");
                    client_errno(&e)
                })?
        };
        let size = st.size.unwrap_or(0);
        for part in extents.chunks(cairn_rpc::files::MAX_WRITE_EXTENTS) {
            let op = FileOp::Write {
                path: path.clone(),
                ino,
                extents: part.to_vec(),
                size,
                now: time_of(SystemTime::now()),
            };
            self.op(&op).await?;
        }
        if let Some(Data::Extents(x)) = &mut st.map {
            for e in &extents {
                cairn_rpc::files::overlay(x, *e);
            }
        } else {
            st.map = None;
        }
        st.dirty.clear();
        st.dirty_bytes = 0;
        st.dirty_since = None;
        Ok(())
    }

    async fn flush(&self, ino: u64) -> Result<(), Errno> {
        let st = self.files.lock().get(&ino).cloned();
        match st {
            Some(st) => self.flush_locked(ino, &mut *st.lock().await).await,
            None => Ok(()),
        }
    }

    /// Flushes every file whose oldest dirty range is older than `age`.
    pub(crate) async fn flush_older(&self, age: Duration) {
        let files: Vec<(u64, Arc<tokio::sync::Mutex<FileState>>)> = self
            .files
            .lock()
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        for (ino, st) in files {
            let mut st = st.lock().await;
            if st.dirty_since.is_some_and(|t| t.elapsed() >= age)
                && let Err(e) = self.flush_locked(ino, &mut st).await
            {
                tracing::warn!(ino, errno = ?e, "background flush failed; will try again");
            }
        }
    }

    async fn setattr(&self, ino: u64, attr: SetAttr) -> Result<Attr, Errno> {
        let st = self.state(ino);
        let mut st = st.lock().await;
        if attr.size.is_some() {
            // Writes before a truncate land before it.
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

    async fn readdir(&self, ino: u64, fh: u64, offset: u64, mut reply: ReplyDirectory) {
        let Some(h) = self.dirs.lock().get(&fh).cloned() else {
            return reply.error(Errno::EBADF);
        };
        let mut h = h.lock().await;
        let mut i = offset as usize;
        loop {
            while i < h.names.len() {
                let (name, child, kind) = &h.names[i];
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

impl CairnFs {
    pub fn new(rt: tokio::runtime::Handle, client: Client) -> Self {
        let segments = tokio::sync::Mutex::new(Segments::new(client.clone()));
        Self {
            rt,
            shared: Arc::new(Shared {
                client,
                nodes: Mutex::new(HashMap::new()),
                files: Mutex::new(HashMap::new()),
                dirs: Mutex::new(HashMap::new()),
                segments,
                next_handle: AtomicU64::new(1),
            }),
        }
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    fn spawn<F>(&self, f: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.rt.spawn(f);
    }
}

fn req_ids(req: &Request) -> (u32, u32) {
    (req.uid(), req.gid())
}

impl Filesystem for CairnFs {
    fn init(&mut self, _req: &Request, _config: &mut KernelConfig) -> std::io::Result<()> {
        Ok(())
    }

    fn destroy(&mut self) {
        let s = self.shared.clone();
        // Unmounting: every dirty range is flushed before the session ends.
        self.rt.block_on(async move {
            s.flush_older(Duration::ZERO).await;
            s.segments.lock().await.close().await;
        });
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let s = self.shared.clone();
        let name = name.to_owned();
        self.spawn(async move {
            let r = async {
                let (path, name) = s.child_path(parent.0, &name)?;
                match s.query(&FileQuery::Lookup { path }).await? {
                    FileReply::Attr(a) => {
                        s.remember(parent.0, &name, &a);
                        Ok(s.local(a).await)
                    }
                    _ => Err(Errno::EIO),
                }
            }
            .await;
            match r {
                Ok(a) => reply.entry(&ATTR_TTL, &file_attr(&a), Generation(0)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let mut nodes = self.shared.nodes.lock();
        if let Some(n) = nodes.get_mut(&ino.0) {
            n.lookups = n.lookups.saturating_sub(nlookup);
            if n.lookups == 0 {
                nodes.remove(&ino.0);
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let s = self.shared.clone();
        self.spawn(async move {
            match s.getattr(ino.0).await {
                Ok(a) => reply.attr(&ATTR_TTL, &file_attr(&a)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let s = self.shared.clone();
        let when = |t: Option<TimeOrNow>| {
            t.map(|t| match t {
                TimeOrNow::SpecificTime(t) => time_of(t),
                TimeOrNow::Now => time_of(SystemTime::now()),
            })
        };
        let attr = SetAttr {
            mode: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            atime: when(atime),
            mtime: when(mtime),
        };
        self.spawn(async move {
            match s.setattr(ino.0, attr).await {
                Ok(a) => reply.attr(&ATTR_TTL, &file_attr(&s.local(a).await)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let s = self.shared.clone();
        self.spawn(async move {
            let r = async {
                let path = s.path(ino.0)?;
                match s.query(&FileQuery::Map { path, ino: ino.0 }).await? {
                    FileReply::Map {
                        target: Some(t), ..
                    } => Ok(t),
                    FileReply::Map { .. } => Err(Errno::EINVAL),
                    _ => Err(Errno::EIO),
                }
            }
            .await;
            match r {
                Ok(t) => reply.data(t.as_bytes()),
                Err(e) => reply.error(e),
            }
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let node = match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => NewNode::Regular,
            libc::S_IFIFO => NewNode::Fifo,
            libc::S_IFSOCK => NewNode::Socket,
            libc::S_IFCHR => NewNode::CharDevice { rdev },
            libc::S_IFBLK => NewNode::BlockDevice { rdev },
            libc::S_IFDIR => NewNode::Directory,
            _ => return reply.error(Errno::EINVAL),
        };
        let s = self.shared.clone();
        let (name, ids) = (name.to_owned(), req_ids(req));
        let perm = (mode & !umask & 0o7777) as u16;
        self.spawn(async move {
            match s.make(ids, parent.0, &name, node, perm).await {
                Ok(a) => reply.entry(&ATTR_TTL, &file_attr(&a), Generation(0)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let s = self.shared.clone();
        let (name, ids) = (name.to_owned(), req_ids(req));
        let perm = (mode & !umask & 0o7777) as u16;
        self.spawn(async move {
            match s.make(ids, parent.0, &name, NewNode::Directory, perm).await {
                Ok(a) => reply.entry(&ATTR_TTL, &file_attr(&a), Generation(0)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let Some(target) = target.to_str().map(str::to_owned) else {
            return reply.error(Errno::EINVAL);
        };
        if target.len() > cairn_rpc::files::SYMLINK_MAX {
            return reply.error(Errno::ENAMETOOLONG);
        }
        let s = self.shared.clone();
        let (name, ids) = (link_name.to_owned(), req_ids(req));
        self.spawn(async move {
            match s
                .make(ids, parent.0, &name, NewNode::Symlink { target }, 0o777)
                .await
            {
                Ok(a) => reply.entry(&ATTR_TTL, &file_attr(&a), Generation(0)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, false, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, true, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let s = self.shared.clone();
        let (name, newname) = (name.to_owned(), newname.to_owned());
        let flags = RenameFlags {
            noreplace: flags.contains(fuser::RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(fuser::RenameFlags::RENAME_EXCHANGE),
        };
        self.spawn(async move {
            let r = async {
                let (from, _) = s.child_path(parent.0, &name)?;
                let (to, to_name) = s.child_path(newparent.0, &newname)?;
                s.op(&FileOp::Rename {
                    from,
                    ino: 0,
                    to,
                    flags,
                    now: time_of(SystemTime::now()),
                })
                .await?;
                // The node moved: where this mount finds it now (an exchanged one moved too).
                let mut nodes = s.nodes.lock();
                let find = |nodes: &HashMap<u64, Node>, p: u64, n: &str| {
                    nodes
                        .iter()
                        .find(|(_, v)| v.parent == p && v.name == n)
                        .map(|(k, _)| *k)
                };
                let moved = find(&nodes, parent.0, &name.to_string_lossy());
                let other = find(&nodes, newparent.0, &to_name);
                if let Some(m) = moved
                    && let Some(n) = nodes.get_mut(&m)
                {
                    n.parent = newparent.0;
                    n.name = to_name.clone();
                }
                if flags.exchange
                    && let Some(o) = other
                    && let Some(n) = nodes.get_mut(&o)
                {
                    n.parent = parent.0;
                    n.name = name.to_string_lossy().into_owned();
                }
                Ok::<(), Errno>(())
            }
            .await;
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let s = self.shared.clone();
        self.spawn(async move {
            let st = s.state(ino.0);
            let mut st = st.lock().await;
            st.opens += 1;
            // Close-to-open: what another mount closed before this open is read whole.
            if st.dirty.is_empty() {
                st.map = None;
                st.size = None;
            }
            let fh = s.next_handle.fetch_add(1, Ordering::Relaxed);
            reply.opened(FileHandle(fh), FopenFlags::empty());
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let s = self.shared.clone();
        let (name, ids) = (name.to_owned(), req_ids(req));
        let perm = (mode & !umask & 0o7777) as u16;
        self.spawn(async move {
            match s.make(ids, parent.0, &name, NewNode::Regular, perm).await {
                Ok(a) => {
                    let st = s.state(a.ino);
                    let mut st = st.lock().await;
                    st.opens += 1;
                    st.size = Some(0);
                    st.map = Some(Data::Extents(Vec::new()));
                    let fh = s.next_handle.fetch_add(1, Ordering::Relaxed);
                    reply.created(
                        &ATTR_TTL,
                        &file_attr(&a),
                        Generation(0),
                        FileHandle(fh),
                        FopenFlags::empty(),
                    );
                }
                Err(e) => reply.error(e),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let s = self.shared.clone();
        self.spawn(async move {
            match s.read(ino.0, offset, size).await {
                Ok(d) => reply.data(&d),
                Err(e) => reply.error(e),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let s = self.shared.clone();
        let data = data.to_vec();
        self.spawn(async move {
            match s.write(ino.0, offset, &data).await {
                Ok(()) => reply.written(data.len() as u32),
                Err(e) => reply.error(e),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let s = self.shared.clone();
        self.spawn(async move {
            match s.flush(ino.0).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let s = self.shared.clone();
        self.spawn(async move {
            let r = s.flush(ino.0).await;
            let st = s.files.lock().get(&ino.0).cloned();
            if let Some(st) = st {
                let mut g = st.lock().await;
                g.opens = g.opens.saturating_sub(1);
                if g.opens == 0 && g.dirty.is_empty() {
                    drop(g);
                    s.files.lock().remove(&ino.0);
                }
            }
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let s = self.shared.clone();
        self.spawn(async move {
            match s.flush(ino.0).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let fh = self.shared.next_handle.fetch_add(1, Ordering::Relaxed);
        self.shared.dirs.lock().insert(
            fh,
            Arc::new(tokio::sync::Mutex::new(DirHandle {
                names: Vec::new(),
                done: false,
            })),
        );
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let s = self.shared.clone();
        // `.` and `..` first (the parent as this mount knows it).
        if let Some(h) = s.dirs.lock().get(&fh.0)
            && let Ok(mut h) = h.try_lock()
            && h.names.is_empty()
        {
            let up = s.nodes.lock().get(&ino.0).map_or(1, |n| n.parent);
            h.names.push((".".into(), ino.0, FileType::Directory));
            h.names.push(("..".into(), up, FileType::Directory));
        }
        self.spawn(async move { s.readdir(ino.0, fh.0, offset, reply).await });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.shared.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Every directory change is a Raft write, durable when it returned.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.shared.clone();
        self.spawn(async move {
            match s.query(&FileQuery::Statfs).await {
                Ok(FileReply::Statfs { total, free, files }) => {
                    let bs = 4096u64;
                    reply.statfs(
                        total / bs,
                        free / bs,
                        free / bs,
                        files,
                        u64::from(u32::MAX),
                        bs as u32,
                        255,
                        bs as u32,
                    );
                }
                Ok(_) => reply.error(Errno::EIO),
                Err(e) => reply.error(e),
            }
        });
    }
}

impl CairnFs {
    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool, reply: ReplyEmpty) {
        let s = self.shared.clone();
        let name = name.to_owned();
        self.spawn(async move {
            let r = async {
                let (path, _) = s.child_path(parent.0, &name)?;
                s.op(&FileOp::Remove {
                    path,
                    ino: 0,
                    dir,
                    now: time_of(SystemTime::now()),
                })
                .await
            }
            .await;
            match r {
                Ok(_) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_ranges_merge_and_replace() {
        let mut d = BTreeMap::new();
        assert_eq!(add_dirty(&mut d, 10, b"abc"), 3);
        assert_eq!(add_dirty(&mut d, 20, b"xyz"), 3);
        // Touching the first at its end joins it.
        assert_eq!(add_dirty(&mut d, 13, b"de"), 2);
        assert_eq!(d[&10], b"abcde");
        // Covering the first's tail up to the second's start joins all three.
        assert_eq!(add_dirty(&mut d, 12, b"12345678"), 5);
        assert_eq!(d.len(), 1);
        assert_eq!(d[&10], b"ab12345678xyz");
        // Inside: replaces bytes, no growth.
        assert_eq!(add_dirty(&mut d, 11, b"Q"), 0);
        assert_eq!(d[&10], b"aQ12345678xyz");
        // Before, not touching: a range of its own.
        assert_eq!(add_dirty(&mut d, 0, b"0"), 1);
        assert_eq!(d.len(), 2);
    }

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
