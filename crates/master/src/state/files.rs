//! The file service's nodes (docs/files.md): POSIX attributes on the namespace's inodes and
//! each regular file's extents, changed by [`FileOp`]s and read by [`FileQuery`]s.
//!
//! A node the file service made or changed carries [`Posix`]; a node only `cairn fs` touched
//! has none, and its attributes are derived (uid and gid 0, times from the namespace's
//! milliseconds, a file's bytes its own FlatLogFile's). The namespace's owner and permission
//! bits are the node's: `chmod` changes the bits every client checks, `chown` the POSIX owner
//! the mount's kernel checks (docs/files.md "One namespace").

use super::*;
use cairn_rpc::files::{
    Attr, Data, Entry, Extent, FileOp, FileQuery, FileReply, MAX_FILE_SIZE, NewNode, NodeType,
    RenameFlags, SetAttr, Time, XattrSet, cut, overlay,
};

fn stale(path: &str, ino: u64) -> MetaError {
    MetaError::not_found(format!(
        "{path}: no longer inode {ino} (renamed or removed by another mount)"
    ))
}

fn node_type(ino: &Inode) -> NodeType {
    match (&ino.posix, &ino.kind) {
        (Some(p), _) => p.kind,
        (None, Kind::Dir) => NodeType::Directory,
        (None, Kind::File(_)) => NodeType::Regular,
    }
}

impl State {
    /// What `stat` shows of `ino`.
    pub fn node_attr(&self, ino: &Inode) -> Attr {
        let (size, nlink) = match (&ino.posix, &ino.kind) {
            (Some(p), _) => (p.size, p.nlink),
            (None, Kind::File(f)) => (f.committed_length(), 1),
            (None, Kind::Dir) => (0, 2),
        };
        let derived = Time::from_ms(ino.mtime_ms);
        Attr {
            // A partition's top is its inode 1; the kernel knows it by its public number.
            ino: self.public_id(ino.id),
            kind: node_type(ino),
            mode: ino.mode,
            uid: ino.posix.as_ref().map_or(0, |p| p.uid),
            gid: ino.posix.as_ref().map_or(0, |p| p.gid),
            nlink,
            size,
            atime: ino.posix.as_ref().map_or(derived, |p| p.atime),
            mtime: ino.posix.as_ref().map_or(derived, |p| p.mtime),
            ctime: ino
                .posix
                .as_ref()
                .map_or(Time::from_ms(ino.ctime_ms.max(ino.mtime_ms)), |p| p.ctime),
            rdev: ino.posix.as_ref().map_or(0, |p| p.rdev),
            owner: ino.owner.clone(),
            policy: match &ino.kind {
                Kind::File(f) if f.policy != Policy::default() => f.policy.text().to_string(),
                _ => String::new(),
            },
        }
    }

    /// The node at `path` (through a hard link's entry: links.rs), which must be inode `ino`
    /// (0: any).
    fn node(&self, path: &str, ino: u64) -> Result<Arc<Inode>, MetaError> {
        Ok(self.entry(path, ino)?.1)
    }

    /// The POSIX attributes of inode `id`, made from the derived ones when it has none.
    fn posix_mut(&mut self, id: InodeId) -> &mut Posix {
        let attr = {
            let ino = self.ino(id);
            (ino.posix.is_none()).then(|| (self.node_attr(&ino), ino.file().is_some()))
        };
        let ino = self.inodes.get_mut(&id).expect("exists");
        if let Some((a, file)) = attr {
            ino.posix = Some(Box::new(Posix {
                kind: a.kind,
                uid: a.uid,
                gid: a.gid,
                nlink: a.nlink,
                size: a.size,
                atime: a.atime,
                mtime: a.mtime,
                ctime: a.ctime,
                rdev: 0,
                target: String::new(),
                // A file `cairn fs` wrote: its own log holds its bytes until a write.
                extents: (!file).then(Vec::new),
                xattrs: Default::default(),
                link: 0,
                links: Vec::new(),
                hold: None,
            }));
        }
        ino.posix.as_mut().expect("just made")
    }

    /// A directory's entry changed: its mtime and ctime are `now`, and `subdirs` its count of
    /// subdirectories' change.
    fn touch_dir(&mut self, id: InodeId, now: Time, subdirs: i32) {
        let p = self.posix_mut(id);
        p.mtime = now;
        p.ctime = now;
        p.nlink = p.nlink.saturating_add_signed(subdirs).max(2);
        if let Some(i) = self.inodes.get_mut(&id) {
            i.mtime_ms = i.mtime_ms.max(now.as_ms());
        }
    }

    /// Applies a file service change (Command::Files).
    pub(super) fn apply_files(&mut self, op: &FileOp) -> Response {
        let reply = match op {
            FileOp::Make {
                path,
                node,
                mode,
                uid,
                gid,
                now,
                hold,
                mount,
                ino,
                reserve,
            } => self.make_node(
                path,
                node,
                (*mode, *uid, *gid),
                *now,
                (hold, mount, *ino, *reserve),
            )?,
            FileOp::Remove {
                path,
                ino,
                dir,
                now,
                ..
            } => {
                self.remove_node(path, *ino, *dir, *now)?;
                FileReply::Done
            }
            FileOp::Rename {
                from,
                ino,
                to,
                flags,
                now,
                ..
            } => {
                self.rename_node(from, *ino, to, *flags, *now)?;
                FileReply::Done
            }
            FileOp::Link {
                from, ino, to, now, ..
            } => self.link_node(from, *ino, to, *now)?,
            FileOp::SetAttr {
                path,
                ino,
                attr,
                now,
            } => self.set_node_attr(path, *ino, attr, *now)?,
            FileOp::Write {
                path,
                ino,
                extents,
                size,
                then,
                now,
            } => {
                if let Some(then) = then {
                    // Checked before the write changes anything: the change is whole or
                    // not at all.
                    authorize::check_then(path, then)?;
                }
                let written = self.write_node(path, *ino, extents, *size, *now)?;
                match then {
                    Some(then) => self.set_node_attr(path, *ino, then, *now)?,
                    None => written,
                }
            }
            FileOp::Punch {
                path,
                ino,
                offset,
                len,
                now,
            } => self.punch_node(path, *ino, *offset, *len, *now)?,
            FileOp::Hold {
                path,
                ino,
                holder,
                now,
            } => {
                self.renew_hold(path, *ino, holder, *now)?;
                FileReply::Done
            }
            FileOp::SetXattr {
                path,
                ino,
                name,
                value,
                flags,
                now,
            } => self.set_xattr(path, *ino, name, value.as_deref(), *flags, *now)?,
        };
        Ok(Reply {
            file: Some(reply),
            ..Reply::default()
        })
    }

    /// `FileOp::Make`: `hold`, when not empty, the mount a new regular file is held for;
    /// `mount`, the one a new directory is when it reserves numbers for its later makes
    /// (`reserve`); `ino`, when not 0, the number the mount reserved for the node.
    fn make_node(
        &mut self,
        path: &str,
        node: &NewNode,
        (mode, uid, gid): (u16, u32, u32),
        now: Time,
        (hold, mount, ino, reserve): (&str, &str, u64, u32),
    ) -> Result<FileReply, MetaError> {
        perm::check_mode(Some(mode))?;
        let name = path.rsplit('/').next().unwrap_or_default();
        cairn_rpc::files::check_name(name)?;
        if let NewNode::Symlink { target } = node
            && (target.is_empty()
                || cairn_rpc::files::name_bytes(target).len() > cairn_rpc::files::SYMLINK_MAX)
        {
            return Err(MetaError::invalid(format!(
                "a symbolic link's target is 1 to {} bytes",
                cairn_rpc::files::SYMLINK_MAX
            )));
        }
        let (parent, name) = self.parent_for_new(path, false, now.as_ms())?;
        if ino != 0 {
            // Handed out by this partition (a reservation), and not used since: a mount
            // answered its create with it before the masters made the node.
            let own = self.home.partition;
            if super::partitions::partition_of(ino) != own
                || ino >= *self.next_inode
                || self.inodes.contains_key(&ino)
            {
                return Err(MetaError::invalid(format!(
                    "{path}: inode {ino} is not one partition {own} reserved and has not used"
                )));
            }
        }
        let (kind, rdev, target, dir) = match node {
            NewNode::Directory => (NodeType::Directory, 0, String::new(), true),
            NewNode::Regular => (NodeType::Regular, 0, String::new(), false),
            NewNode::Symlink { target } => (NodeType::Symlink, 0, target.clone(), false),
            NewNode::Fifo => (NodeType::Fifo, 0, String::new(), false),
            NewNode::Socket => (NodeType::Socket, 0, String::new(), false),
            NewNode::CharDevice { rdev } => (NodeType::CharDevice, *rdev, String::new(), false),
            NewNode::BlockDevice { rdev } => (NodeType::BlockDevice, *rdev, String::new(), false),
        };
        let ns_kind = if dir {
            Kind::Dir
        } else {
            // No log of its own: a file's bytes are in segments, and `cairn fs append`
            // finds it sealed.
            Kind::File(FileMeta {
                policy: self.inherited_policy(path).unwrap_or_default(),
                sealed: true,
                chunks: Vec::new(),
                // The file service's hold (docs/files.md "A close that does not wait").
                lease: (!hold.is_empty() && kind == NodeType::Regular).then(|| Lease {
                    holder: hold.to_owned(),
                    expires_ms: now.as_ms().saturating_add(cairn_rpc::files::HOLD_MS),
                }),
                writer_epoch: 0,
            })
        };
        let id = if ino != 0 {
            self.insert_as(ino, parent, &name, now.as_ms(), ns_kind, Some(mode));
            ino
        } else {
            self.insert(parent, &name, now.as_ms(), ns_kind, Some(mode))
        };
        // A symbolic link's size is its target's bytes.
        let size = cairn_rpc::files::name_bytes(&target).len() as u64;
        let posix = Posix {
            kind,
            uid,
            gid,
            nlink: if dir { 2 } else { 1 },
            size,
            atime: now,
            mtime: now,
            ctime: now,
            rdev,
            target,
            extents: (kind == NodeType::Regular).then(Vec::new),
            xattrs: Default::default(),
            link: 0,
            links: Vec::new(),
            // A directory a mount made: its creates there may answer before they commit
            // (docs/files.md "A create that does not wait").
            hold: (!mount.is_empty() && dir && reserve > 0).then(|| Lease {
                holder: mount.to_owned(),
                expires_ms: now.as_ms().saturating_add(cairn_rpc::files::DIR_HOLD_MS),
            }),
        };
        self.inodes.get_mut(&id).expect("inserted").posix = Some(Box::new(posix));
        self.touch_dir(parent, now, i32::from(dir));
        let attr = self.node_attr(&self.ino(id));
        if reserve == 0 {
            return Ok(FileReply::Attr(attr));
        }
        let count = reserve.min(cairn_rpc::files::RESERVE_MAX);
        let first = *self.next_inode;
        *self.next_inode += u64::from(count);
        let policy = match self.inherited_policy(path) {
            Some(p) if dir && p != Policy::default() => p.text().to_string(),
            _ => String::new(),
        };
        Ok(FileReply::Made {
            attr,
            first,
            count,
            policy,
        })
    }

    /// Removes inode `id` (a file, or an empty directory) from its directory and the state.
    pub(super) fn drop_node(&mut self, id: InodeId) -> Inode {
        let ino = Arc::unwrap_or_clone(self.inodes.remove(&id).expect("exists"));
        self.dentries.remove(&(ino.parent, ino.name.clone()));
        self.dir_policies.remove(&id);
        if let Some(f) = ino.file() {
            for c in &f.chunks {
                self.chunk_owner.remove(&c.id);
            }
            let gone: Vec<ChunkId> = f.chunks.iter().map(|c| c.id).collect();
            self.drop_conversions(&gone);
        }
        ino
    }

    fn remove_node(&mut self, path: &str, ino: u64, dir: bool, now: Time) -> Result<(), MetaError> {
        let node = self.entry(path, ino)?.0;
        if node.id == ROOT || self.holds_subtree(path) {
            return Err(MetaError::invalid(format!("{path} cannot be removed")));
        }
        self.refuse_hashed(path, "removed")?;
        let is_dir = node.file().is_none();
        match (dir, is_dir) {
            (true, false) => {
                return Err(MetaError::new(
                    ErrorKind::NotADirectory,
                    format!("{path}: not a directory"),
                ));
            }
            (false, true) => {
                return Err(MetaError::new(
                    ErrorKind::IsADirectory,
                    format!("{path}: is a directory"),
                ));
            }
            (true, true) if self.has_entries(node.id) => {
                return Err(MetaError::new(
                    ErrorKind::DirectoryNotEmpty,
                    format!("{path}: directory not empty"),
                ));
            }
            _ => {}
        }
        let parent = node.parent;
        self.unlink_entry(node.id, Some(now));
        self.touch_dir(parent, now, -i32::from(is_dir));
        Ok(())
    }

    fn rename_node(
        &mut self,
        from: &str,
        ino: u64,
        to: &str,
        flags: RenameFlags,
        now: Time,
    ) -> Result<(), MetaError> {
        let (src, src_node) = self.entry(from, ino)?;
        let to_name = to.rsplit('/').next().unwrap_or_default();
        cairn_rpc::files::check_name(to_name)?;
        if src.id == ROOT || self.holds_subtree(from) || self.holds_subtree(to) {
            return Err(MetaError::invalid(format!(
                "{from} → {to}: the top of a partition's subtree does not move"
            )));
        }
        self.refuse_hashed(from, "renamed")?;
        self.refuse_hashed(to, "replaced")?;
        let src_dir = src.file().is_none();
        let dest = match self.lookup(to) {
            Ok(d) => Some(d),
            Err(e) if e.kind == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        if dest
            .as_ref()
            .is_some_and(|d| self.linked(d.clone()).id == src_node.id)
        {
            return Ok(()); // names of the same node: rename(2) does nothing
        }
        if flags.exchange && dest.is_none() {
            return Err(MetaError::not_found(format!("{to} (exchange)")));
        }
        if flags.noreplace && dest.is_some() {
            return Err(MetaError::new(
                ErrorKind::AlreadyExists,
                format!("{to}: already exists"),
            ));
        }
        let (new_parent, new_name) = match &dest {
            Some(d) => (d.parent, d.name.clone()),
            None => self.parent_for_new(to, false, now.as_ms())?,
        };
        // A directory may not move below itself.
        let guard = |moving: InodeId, into: InodeId, s: &Self| -> Result<(), MetaError> {
            let mut up = into;
            loop {
                if up == moving {
                    return Err(MetaError::invalid(format!(
                        "cannot move {from} below itself ({to})"
                    )));
                }
                if up == ROOT {
                    return Ok(());
                }
                up = s.ino(up).parent;
            }
        };
        guard(src.id, new_parent, self)?;
        let old_parent = src.parent;
        if flags.exchange {
            let d = dest.expect("checked");
            guard(d.id, old_parent, self)?;
            let d_dir = d.file().is_none();
            self.dentries.insert((old_parent, src.name.clone()), d.id);
            self.dentries.insert((new_parent, new_name.clone()), src.id);
            let (sname, dname) = (src.name.clone(), d.name.clone());
            for (id, parent, name) in [(src.id, new_parent, dname), (d.id, old_parent, sname)] {
                let i = self.inodes.get_mut(&id).expect("exists");
                i.parent = parent;
                i.name = name;
                let node = self.linked(self.ino(id)).id;
                self.posix_mut(node).ctime = now;
            }
            let moved = i32::from(src_dir) - i32::from(d_dir);
            self.touch_dir(old_parent, now, -moved);
            self.touch_dir(new_parent, now, moved);
            return Ok(());
        }
        let mut replaced_dir = false;
        if let Some(d) = dest {
            let d_dir = d.file().is_none();
            match (src_dir, d_dir) {
                (false, true) => {
                    return Err(MetaError::new(
                        ErrorKind::IsADirectory,
                        format!("{to}: is a directory"),
                    ));
                }
                (true, false) => {
                    return Err(MetaError::new(
                        ErrorKind::NotADirectory,
                        format!("{to}: not a directory"),
                    ));
                }
                (true, true) if self.has_entries(d.id) => {
                    return Err(MetaError::new(
                        ErrorKind::DirectoryNotEmpty,
                        format!("{to}: directory not empty"),
                    ));
                }
                _ => {}
            }
            replaced_dir = d_dir;
            self.unlink_entry(d.id, Some(now));
        }
        let i = self.inodes.get_mut(&src.id).expect("exists");
        let old = (i.parent, std::mem::replace(&mut i.name, new_name.clone()));
        i.parent = new_parent;
        self.dentries.remove(&old);
        self.dentries.insert((new_parent, new_name), src.id);
        self.posix_mut(src_node.id).ctime = now;
        let d = i32::from(src_dir);
        self.touch_dir(old_parent, now, -d);
        self.touch_dir(new_parent, now, d - i32::from(replaced_dir));
        Ok(())
    }

    fn set_node_attr(
        &mut self,
        path: &str,
        ino: u64,
        attr: &SetAttr,
        now: Time,
    ) -> Result<FileReply, MetaError> {
        perm::check_mode(attr.mode)?;
        let node = self.node(path, ino)?;
        let id = node.id;
        if let Some(size) = attr.size {
            if node_type(&node) != NodeType::Regular {
                return Err(MetaError::invalid(format!(
                    "{path}: only a regular file has a size to change"
                )));
            }
            if size > MAX_FILE_SIZE {
                return Err(MetaError::invalid(format!(
                    "{path}: {size} bytes is past the largest file"
                )));
            }
            self.own_to_extents(id);
        }
        let narrowed = attr.mode.is_some_and(|m| node.mode & !m != 0);
        if let Some(m) = attr.mode {
            self.inodes.get_mut(&id).expect("exists").mode = m;
        }
        let p = self.posix_mut(id);
        if let Some(u) = attr.uid {
            p.uid = u;
        }
        if let Some(g) = attr.gid {
            p.gid = g;
        }
        if let Some(a) = attr.atime {
            p.atime = a;
        }
        if let Some(m) = attr.mtime {
            p.mtime = m;
        }
        if let Some(size) = attr.size {
            if size < p.size
                && let Some(x) = p.extents.as_mut()
            {
                cut(x, size, u64::MAX);
            }
            if size != p.size && attr.mtime.is_none() {
                p.mtime = now;
            }
            p.size = size;
        }
        p.ctime = now;
        if narrowed {
            self.revoke_below(id);
        }
        Ok(FileReply::Attr(self.node_attr(&self.ino(id))))
    }

    /// A file whose bytes are its own log's gets them as one extent of it, so that writes can
    /// lay extents over them (segment 0 is the file's own log).
    fn own_to_extents(&mut self, id: InodeId) {
        let len = self.ino(id).file().map_or(0, FileMeta::committed_length);
        let p = self.posix_mut(id);
        if p.extents.is_none() {
            p.extents = Some(if len == 0 {
                Vec::new()
            } else {
                vec![Extent {
                    offset: 0,
                    len,
                    seg: 0,
                    seg_offset: 0,
                }]
            });
        }
    }

    fn write_node(
        &mut self,
        path: &str,
        ino: u64,
        extents: &[Extent],
        size: u64,
        now: Time,
    ) -> Result<FileReply, MetaError> {
        if extents.len() > cairn_rpc::files::MAX_WRITE_EXTENTS {
            return Err(MetaError::invalid(format!(
                "{} extents in one write: at most {}",
                extents.len(),
                cairn_rpc::files::MAX_WRITE_EXTENTS
            )));
        }
        let node = self.node(path, ino)?;
        if node_type(&node) != NodeType::Regular {
            return Err(MetaError::new(
                ErrorKind::IsADirectory,
                format!("{path}: not a regular file"),
            ));
        }
        for e in extents {
            if e.seg == 0
                || e.len == 0
                || e.offset
                    .checked_add(e.len)
                    .is_none_or(|end| end > MAX_FILE_SIZE)
            {
                return Err(MetaError::invalid(format!(
                    "{path}: extent {e:?} is empty, past the largest file or in no segment"
                )));
            }
        }
        if size > MAX_FILE_SIZE {
            return Err(MetaError::invalid(format!("{path}: size {size} too large")));
        }
        self.check_condemned(path, extents)?;
        self.own_to_extents(node.id);
        if node.file().is_some_and(|f| f.lease.is_some())
            && node.posix.as_ref().is_some_and(|p| p.extents.is_some())
            && let Some(i) = self.inodes.get_mut(&node.id)
            && let Kind::File(f) = &mut i.kind
        {
            // Committed: no mount holds it any more. (A file of its own log keeps its `cairn
            // fs` writer's lease.)
            f.lease = None;
        }
        let p = self.posix_mut(node.id);
        if extents.is_empty() && size <= p.size {
            // Nothing written: a held file's close that found no bytes to commit (its
            // hold ends; its times stay its create's).
            return Ok(FileReply::Attr(self.node_attr(&self.ino(node.id))));
        }
        let x = p.extents.as_mut().expect("made above");
        for e in extents {
            overlay(x, *e);
        }
        let end = extents.iter().map(Extent::end).max().unwrap_or(0);
        p.size = p.size.max(size).max(end);
        p.mtime = now;
        p.ctime = now;
        if let Some(i) = self.inodes.get_mut(&node.id) {
            i.mtime_ms = i.mtime_ms.max(now.as_ms());
        }
        Ok(FileReply::Attr(self.node_attr(&self.ino(node.id))))
    }

    /// Cuts `[offset, offset + len)` out of a regular file's extents: those bytes read as
    /// zeros (a hole); the size stays.
    fn punch_node(
        &mut self,
        path: &str,
        ino: u64,
        offset: u64,
        len: u64,
        now: Time,
    ) -> Result<FileReply, MetaError> {
        let node = self.node(path, ino)?;
        if node_type(&node) != NodeType::Regular {
            return Err(MetaError::new(
                ErrorKind::IsADirectory,
                format!("{path}: not a regular file"),
            ));
        }
        let Some(end) = offset.checked_add(len).filter(|_| len > 0) else {
            return Err(MetaError::invalid(format!(
                "{path}: a hole of {len} bytes at {offset}"
            )));
        };
        self.own_to_extents(node.id);
        let p = self.posix_mut(node.id);
        cut(p.extents.as_mut().expect("made above"), offset, end);
        p.mtime = now;
        p.ctime = now;
        if let Some(i) = self.inodes.get_mut(&node.id) {
            i.mtime_ms = i.mtime_ms.max(now.as_ms());
        }
        Ok(FileReply::Attr(self.node_attr(&self.ino(node.id))))
    }

    /// Sets (`value` some) or removes extended attribute `name` of the node at `path`.
    fn set_xattr(
        &mut self,
        path: &str,
        ino: u64,
        name: &str,
        value: Option<&[u8]>,
        flags: XattrSet,
        now: Time,
    ) -> Result<FileReply, MetaError> {
        cairn_rpc::files::check_xattr(name, value)?;
        let node = self.node(path, ino)?;
        let held = node
            .posix
            .as_ref()
            .is_some_and(|p| p.xattrs.contains_key(name));
        match (value, flags, held) {
            (None, _, false) | (Some(_), XattrSet::Replace, false) => {
                return Ok(FileReply::NoXattr);
            }
            (Some(_), XattrSet::Create, true) => {
                return Err(MetaError::new(
                    ErrorKind::AlreadyExists,
                    format!("{path}: extended attribute {name} exists"),
                ));
            }
            _ => {}
        }
        if let Some(v) = value {
            let others: usize = node.posix.as_ref().map_or(0, |p| {
                p.xattrs
                    .iter()
                    .filter(|(n, _)| n.as_str() != name)
                    .map(|(n, v)| n.len() + v.len())
                    .sum()
            });
            if others + name.len() + v.len() > cairn_rpc::files::XATTRS_MAX {
                return Err(MetaError::new(
                    ErrorKind::NoSpace,
                    format!(
                        "{path}: its extended attributes would hold more than {} bytes",
                        cairn_rpc::files::XATTRS_MAX
                    ),
                ));
            }
        }
        let p = self.posix_mut(node.id);
        match value {
            Some(v) => p.xattrs.insert(name.to_owned(), v.to_vec()),
            None => p.xattrs.remove(name),
        };
        p.ctime = now;
        Ok(FileReply::Attr(self.node_attr(&self.ino(node.id))))
    }
}

mod authorize;
mod links;
mod reads;
pub use links::TIES_CHECK_ROWS;

#[cfg(test)]
mod tests;
