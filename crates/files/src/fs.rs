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

use crate::shared::{ATTR_TTL, DirHandle, Shared, file_type, system_time, time_of};
use cairn_client::Client;
use cairn_rpc::files::{Attr, Data, FileOp, FileQuery, FileReply, NewNode, RenameFlags, SetAttr};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

/// The file system the FUSE session serves.
pub struct CairnFs {
    rt: tokio::runtime::Handle,
    shared: Arc<Shared>,
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

impl CairnFs {
    /// `sync_close`: every close waits for its commit (none answers before its flush);
    /// `sync_create`: every create waits for its make (none answers before it).
    pub fn new(
        rt: tokio::runtime::Handle,
        client: Client,
        sync_close: bool,
        sync_create: bool,
    ) -> Self {
        Self {
            rt,
            shared: Arc::new(Shared::new(client, sync_close, sync_create)),
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

/// The state of a file this mount made with a create sent at `sent`, open once.
fn created(st: &mut crate::shared::FileState, a: &Attr, sent: std::time::Instant) {
    st.opens += 1;
    st.size = Some(0);
    st.map = Some(Data::Extents(Vec::new()));
    st.fresh = Some(crate::fresh::Fresh::new(a.clone(), sent));
    // Its first commit ends the masters' hold: the background flush makes it if no close or
    // write does.
    st.dirty_since = Some(sent);
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
            s.segments.close().await;
        });
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        // A name not in a directory this mount made a moment ago (listed.rs).
        if let Ok(n) = crate::shared::name_of(name)
            && self.shared.listed.lock().absent(parent.0, &n)
        {
            return reply.error(Errno::ENOENT);
        }
        let s = self.shared.clone();
        let name = name.to_owned();
        self.spawn(async move {
            let r = async {
                let (path, name) = s.child_path(parent.0, &name)?;
                // A close's flush in flight first: the masters answer what it committed.
                let known = s.nodes.lock().at(parent.0, &name);
                if let Some(ino) = known {
                    s.flushed(ino).await;
                }
                match s.query(&s.lookup_query(path)).await? {
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
        self.shared.nodes.lock().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if let Some(a) = self.shared.getattr_now(ino.0) {
            return reply.attr(&ATTR_TTL, &file_attr(&a));
        }
        // What a commit of this mount's answered a moment ago (known.rs), kept for the rest
        // of the attribute time.
        if let Some((a, left)) = self.shared.known_attr(ino.0) {
            return reply.attr(&left, &file_attr(&a));
        }
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
        if let Some(a) = s.setattr_now(ino.0, &attr) {
            return reply.attr(&ATTR_TTL, &file_attr(&a));
        }
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
                match s.query(&s.map_query(path, ino.0)).await? {
                    FileReply::Map {
                        target: Some(t), ..
                    } => Ok(t),
                    FileReply::Map { .. } => Err(Errno::EINVAL),
                    _ => Err(Errno::EIO),
                }
            }
            .await;
            match r {
                Ok(t) => reply.data(&cairn_rpc::files::name_bytes(&t)),
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
        let perm = (mode & !umask & 0o7777) as u16;
        self.make_entry(req, parent, name, node, perm, reply);
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
        let perm = (mode & !umask & 0o7777) as u16;
        self.make_entry(req, parent, name, NewNode::Directory, perm, reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let bytes = target.as_os_str().as_bytes();
        if bytes.len() > cairn_rpc::files::SYMLINK_MAX {
            return reply.error(Errno::ENAMETOOLONG);
        }
        let target = cairn_rpc::files::name_from_bytes(bytes);
        self.make_entry(
            req,
            parent,
            link_name,
            NewNode::Symlink { target },
            0o777,
            reply,
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let s = self.shared.clone();
        let newname = newname.to_owned();
        self.spawn(async move {
            match s.link(ino.0, newparent.0, &newname).await {
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
                let (from, from_name) = s.child_path(parent.0, &name)?;
                let (to, to_name) = s.child_path(newparent.0, &newname)?;
                // Its bytes before its new name (and the replaced file's before it goes).
                s.settle_name(parent.0, &from_name).await?;
                s.settle_name(newparent.0, &to_name).await?;
                let r = s
                    .op(&FileOp::Rename {
                        from,
                        ino: 0,
                        to,
                        flags,
                        now: time_of(SystemTime::now()),
                        mount: s.mount_id.clone(),
                    })
                    .await;
                {
                    let mut l = s.listed.lock();
                    match r {
                        Ok(_) if !flags.exchange => {
                            l.renamed(parent.0, &from_name, newparent.0, &to_name);
                        }
                        Ok(_) => {}
                        Err(_) => {
                            l.forget(parent.0);
                            l.forget(newparent.0);
                        }
                    }
                }
                r?;
                // The node moved: where this mount finds it now (an exchanged one moved too).
                let mut nodes = s.nodes.lock();
                let moved = nodes.at(parent.0, &from_name);
                let other = nodes.at(newparent.0, &to_name);
                if moved.is_some() && moved == other {
                    // Two names of one node: rename(2) did nothing.
                    return Ok(());
                }
                if !flags.exchange {
                    // The replaced name is gone; its node goes on by another, if any.
                    nodes.name_gone(newparent.0, &to_name);
                }
                if let Some(m) = moved {
                    nodes.place(m, newparent.0, &to_name);
                }
                if flags.exchange
                    && let Some(o) = other
                {
                    nodes.place(o, parent.0, &from_name);
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

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let s = self.shared.clone();
        let reads = flags.0 & libc::O_ACCMODE != libc::O_WRONLY;
        self.spawn(async move {
            match s.opened(ino.0, reads).await {
                Ok(()) => {
                    let fh = s.next_handle.fetch_add(1, Ordering::Relaxed);
                    reply.opened(FileHandle(fh), FopenFlags::empty());
                }
                Err(e) => reply.error(e),
            }
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let s = self.shared.clone();
        let (name, ids) = (name.to_owned(), req_ids(req));
        let perm = (mode & !umask & 0o7777) as u16;
        // In a directory this mount made a moment ago: answered here, the make behind it
        // (early.rs).
        let early = match s.child_path(parent.0, &name) {
            Ok((path, n)) => s.create_early(ids, parent.0, &n, path, perm),
            Err(e) => return reply.error(e),
        };
        if let Some((a, make)) = early {
            let sent = std::time::Instant::now();
            // A number no node had: its state is new, and no one else's.
            let st = s.state(a.ino);
            if let Ok(mut g) = st.try_lock() {
                created(&mut g, &a, sent);
                drop(g);
                self.spawn(make);
                let fh = s.next_handle.fetch_add(1, Ordering::Relaxed);
                return reply.created(
                    &ATTR_TTL,
                    &file_attr(&a),
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::empty(),
                );
            }
            let attr = file_attr(&a);
            self.spawn(async move {
                created(&mut *st.lock().await, &a, sent);
                make.await;
            });
            let fh = s.next_handle.fetch_add(1, Ordering::Relaxed);
            return reply.created(
                &ATTR_TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            );
        }
        self.spawn(async move {
            let sent = std::time::Instant::now();
            match s
                .make(ids, parent.0, &name, NewNode::Regular, perm, true)
                .await
            {
                Ok(a) => {
                    created(&mut *s.state(a.ino).lock().await, &a, sent);
                    let fh = s.next_handle.fetch_add(1, Ordering::Relaxed);
                    reply.created(
                        &ATTR_TTL,
                        &file_attr(&a),
                        Generation(0),
                        FileHandle(fh),
                        FopenFlags::empty(),
                    );
                }
                // The name appeared after the kernel's lookup found none (another mount made
                // it, or a listing here missed it): an open without O_EXCL opens it instead.
                // ESTALE makes the kernel look the name up again (at the masters: a make
                // answered "exists" dropped the listing) and open what it finds.
                Err(Errno::EEXIST) if flags & libc::O_EXCL == 0 => reply.error(Errno::ESTALE),
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
        match self.shared.write_now(ino.0, offset, data) {
            Some(Ok(())) => return reply.written(data.len() as u32),
            Some(Err(e)) => return reply.error(e),
            None => {}
        }
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
        // A file made a moment ago: the close answers now, its flush follows (docs/files.md
        // "A close that does not wait").
        if let Some(permit) = self.shared.close_behind(ino.0) {
            let s = self.shared.clone();
            self.spawn(async move { s.flush_behind(ino.0, permit).await });
            return reply.ok();
        }
        self.flush_reply(ino, reply);
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
        if self.shared.release_now(ino.0) {
            return reply.ok();
        }
        let s = self.shared.clone();
        self.spawn(async move {
            match s.closed(ino.0).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let s = self.shared.clone();
        self.spawn(async move {
            match s.fallocate(ino.0, offset, length, mode).await {
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
        // Data and metadata alike: a flush commits the extents with the size and mtime.
        self.flush_reply(ino, reply);
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
            let up = s.nodes.lock().get(ino.0).map_or(1, |n| n.parent());
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
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Every directory change is a Raft write, durable when it returned — but the makes
        // behind creates answered early (early.rs), which this waits for.
        let s = self.shared.clone();
        self.spawn(async move {
            let r = match s.path(ino.0) {
                Ok(path) => s.made_under(&[&path]).await,
                Err(e) => Err(e),
            };
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
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

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let s = self.shared.clone();
        let (name, value) = (name.to_owned(), value.to_vec());
        self.spawn(async move {
            match s.setxattr(ino.0, &name, Some(&value), flags).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if let Some(r) = self.shared.getxattr_now(ino.0, name, size) {
            return xattr_reply(r, reply);
        }
        let s = self.shared.clone();
        let name = name.to_owned();
        self.spawn(async move { xattr_reply(s.getxattr(ino.0, &name, size).await, reply) });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let s = self.shared.clone();
        self.spawn(async move { xattr_reply(s.listxattr(ino.0, size).await, reply) });
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let s = self.shared.clone();
        let name = name.to_owned();
        self.spawn(async move {
            match s.setxattr(ino.0, &name, None, 0).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }
}

fn xattr_reply(r: Result<crate::xattrs::Sized, Errno>, reply: ReplyXattr) {
    match r {
        Ok(crate::xattrs::Sized::Len(n)) => reply.size(n),
        Ok(crate::xattrs::Sized::Data(d)) => reply.data(&d),
        Err(e) => reply.error(e),
    }
}

impl CairnFs {
    /// close (FUSE flush), fsync, fdatasync: the file's dirty ranges made durable and its own.
    fn flush_reply(&self, ino: INodeNo, reply: ReplyEmpty) {
        if self.shared.flush_now(ino.0) {
            return reply.ok();
        }
        let s = self.shared.clone();
        self.spawn(async move {
            match s.flush(ino.0).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    /// mknod, mkdir, symlink: a new node, answered as a lookup is.
    fn make_entry(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        node: NewNode,
        perm: u16,
        reply: ReplyEntry,
    ) {
        let s = self.shared.clone();
        let (name, ids) = (name.to_owned(), req_ids(req));
        self.spawn(async move {
            match s.make(ids, parent.0, &name, node, perm, false).await {
                Ok(a) => reply.entry(&ATTR_TTL, &file_attr(&a), Generation(0)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool, reply: ReplyEmpty) {
        let s = self.shared.clone();
        let name = name.to_owned();
        self.spawn(async move {
            match s.remove(parent.0, &name, dir).await {
                Ok(_) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }
}
