//! The namespace's commands: directories, files and their writers (create, open, allocate,
//! commit, rename, delete, attributes), applied to the inode and directory-entry tables.

use super::*;

/// Opens `f`'s last chunk again for a new writer to continue (returns its id) when it is a
/// sealed replicated chunk holding fewer than `below` bytes, in a file whose policy converts
/// nothing. Its replicas were never sealed by a writer that closed cleanly, so they take
/// appends at its length under the new writer epoch; a replica sealed meanwhile (a repair's
/// copy) refuses them and is dropped by the writer, which seals the chunk and moves on as
/// after any failure. Without it, every short-lived writer (`cairn fs append`) left a short
/// sealed chunk holding an extent on each replica.
pub(super) fn continue_last(f: &mut FileMeta, below: u64) -> Option<ChunkId> {
    if below == 0 || f.policy.ec.is_some() {
        return None;
    }
    let c = f.chunks.last_mut()?;
    let usable = c.sealed && c.ec.is_none() && c.length > 0 && c.length < below;
    usable.then(|| {
        c.sealed = false;
        c.id
    })
}

pub(super) fn lease_held(lease: Option<&Lease>, holder: &str, now_ms: u64) -> Option<MetaError> {
    match lease {
        Some(l) if l.holder != holder && l.expires_ms > now_ms => Some(MetaError::new(
            ErrorKind::LeaseHeld,
            format!(
                "another writer ({}) holds the file for {} ms more",
                l.holder,
                l.expires_ms - now_ms
            ),
        )),
        _ => None,
    }
}

pub(super) fn check_writer(
    path: &str,
    f: &FileMeta,
    holder: &str,
    now_ms: u64,
) -> Result<(), MetaError> {
    if f.sealed {
        return Err(MetaError::new(ErrorKind::Sealed, format!("{path}: sealed")));
    }
    match &f.lease {
        Some(l) if l.holder == holder => Ok(()),
        Some(l) if l.expires_ms > now_ms => Err(MetaError::new(
            ErrorKind::LeaseLost,
            format!("{path}: the write lease belongs to {}", l.holder),
        )),
        _ => Err(MetaError::new(
            ErrorKind::LeaseLost,
            format!("{path}: not open for writing by {holder}"),
        )),
    }
}

impl State {
    /// Applies a namespace command; [`State::apply`] sends only those here.
    pub(super) fn apply_namespace(&mut self, cmd: &Command) -> Response {
        self.check_moving(cmd)?;
        match cmd {
            Command::Mkdir {
                path,
                parents,
                now_ms,
                policy,
                mode,
            } => {
                perm::check_mode(*mode)?;
                if let Some(p) = policy {
                    p.check()?;
                }
                let (parent, name) = match self.parent_for_new(path, *parents, *now_ms) {
                    Err(e) if e.kind == ErrorKind::AlreadyExists && *parents => {
                        let ino = self.lookup(path)?;
                        if ino.file().is_some() {
                            return Err(e);
                        }
                        // `mkdir -p --policy` of an existing directory sets its default.
                        let id = ino.id;
                        if let Some(p) = policy {
                            self.dir_policies.insert(id, *p);
                        }
                        return self.reply(id);
                    }
                    r => r?,
                };
                let id = self.insert(parent, &name, *now_ms, Kind::Dir, *mode);
                if let Some(p) = policy {
                    self.dir_policies.insert(id, *p);
                }
                self.reply(id)
            }
            Command::Create {
                path,
                policy,
                parents,
                now_ms,
                lease,
                placements,
                groups,
                mode,
            } => {
                policy.check()?;
                perm::check_mode(*mode)?;
                let group = Self::group_of(policy, placements, *groups)?;
                let (parent, name) = self.parent_for_new(path, *parents, *now_ms)?;
                let chunks = self.new_chunks(placements, group);
                let id = self.insert(
                    parent,
                    &name,
                    *now_ms,
                    Kind::File(FileMeta {
                        policy: *policy,
                        sealed: false,
                        chunks,
                        lease: lease.clone(),
                        writer_epoch: u32::from(lease.is_some()),
                    }),
                    *mode,
                );
                self.reply(id)
            }
            Command::OpenWrite {
                path,
                now_ms,
                lease,
                placements,
                groups,
                continue_below,
            } => {
                let (_, f) = self.file_mut(path)?;
                if f.sealed {
                    return Err(MetaError::new(ErrorKind::Sealed, format!("{path}: sealed")));
                }
                if let Some(e) = lease_held(f.lease.as_ref(), &lease.holder, *now_ms) {
                    return Err(e);
                }
                let group = Self::group_of(&f.policy, placements, *groups)?;
                let (id, f) = self.file_mut(path)?;
                // No lease: the last writer closed (a crashed one's lease stays until taken).
                let released = f.lease.is_none();
                f.lease = Some(lease.clone());
                f.writer_epoch = f.writer_epoch.wrapping_add(1).max(1);
                let continued = if released {
                    continue_last(f, *continue_below)
                } else {
                    None
                };
                self.add_chunks(id, placements, group);
                let mut r = self.reply(id)?;
                r.chunk = continued;
                Ok(r)
            }
            Command::Allocate {
                path,
                holder,
                now_ms,
                placements,
                groups,
            } => {
                let (_, f) = self.file_mut(path)?;
                check_writer(path, f, holder, *now_ms)?;
                let group = Self::group_of(&f.policy, placements, *groups)?;
                let id = self.lookup(path)?.id;
                self.add_chunks(id, placements, group);
                self.inodes.get_mut(&id).expect("exists").mtime_ms = *now_ms;
                self.reply(id)
            }
            Command::Commit {
                path,
                holder,
                now_ms,
                updates,
                trim,
                release,
                seal,
                lease_until_ms,
                drops,
                remove,
            } => {
                let (id, f) = self.file_mut(path)?;
                check_writer(path, f, holder, *now_ms)?;
                // Validate everything before changing anything.
                for chunk in remove {
                    match f.chunks.iter().find(|c| c.id == *chunk) {
                        Some(c) if c.ec.is_none() && f.policy.direct_ec().is_some() => {}
                        Some(_) => {
                            return Err(MetaError::invalid(format!(
                                "{path}: chunk {chunk} is not the tail of an EC file"
                            )));
                        }
                        // Gone already: the retry of a commit that was applied (its answer
                        // lost with a master), so removing is idempotent.
                        None => {}
                    }
                }
                for (chunk, _) in drops {
                    if !f.chunks.iter().any(|c| c.id == *chunk) {
                        return Err(MetaError::invalid(format!(
                            "{path}: chunk {chunk} is not in it"
                        )));
                    }
                }
                for u in updates {
                    let c = f
                        .chunks
                        .iter()
                        .find(|c| c.id == u.chunk_id)
                        .ok_or_else(|| {
                            MetaError::invalid(format!("{path}: chunk {} is not in it", u.chunk_id))
                        })?;
                    if c.sealed && (u.length != c.length || !u.sealed) {
                        return Err(MetaError::new(
                            ErrorKind::Sealed,
                            format!("{path}: chunk {} is sealed at {} bytes", c.id, c.length),
                        ));
                    }
                    if u.length < c.length {
                        return Err(MetaError::invalid(format!(
                            "{path}: chunk {} cannot shrink from {} to {} bytes",
                            c.id, c.length, u.length
                        )));
                    }
                }
                for u in updates {
                    let c = f
                        .chunks
                        .iter_mut()
                        .find(|c| c.id == u.chunk_id)
                        .expect("validated");
                    c.length = u.length;
                    c.sealed |= u.sealed;
                }
                for (chunk, server) in drops {
                    let c = f
                        .chunks
                        .iter_mut()
                        .find(|c| c.id == *chunk)
                        .expect("validated");
                    // The last location is never dropped: a chunk keeps one copy to repair from.
                    if c.servers.len() > 1 {
                        c.servers.retain(|s| s != server);
                    }
                }
                let mut dropped = remove.clone();
                f.chunks.retain(|c| !remove.contains(&c.id));
                if *trim || *seal {
                    while let Some(c) = f.chunks.last() {
                        if c.length == 0 && !c.sealed {
                            dropped.push(f.chunks.pop().expect("last").id);
                        } else {
                            break;
                        }
                    }
                }
                if *seal {
                    f.sealed = true;
                    for c in &mut f.chunks {
                        c.sealed = true;
                    }
                }
                if *release || *seal {
                    f.lease = None;
                } else if let Some(l) = &mut f.lease {
                    l.expires_ms = l.expires_ms.max(*lease_until_ms);
                }
                for c in dropped {
                    self.chunk_owner.remove(&c);
                }
                self.inodes.get_mut(&id).expect("exists").mtime_ms = *now_ms;
                self.reply(id)
            }
            Command::Rename { from, to, now_ms } => {
                let src = self.lookup(from)?.id;
                if src == ROOT {
                    return Err(MetaError::invalid(format!("cannot rename {from}")));
                }
                if self.holds_subtree(from) {
                    return Err(MetaError::invalid(format!(
                        "{from} holds a subtree of another partition: it cannot be renamed yet"
                    )));
                }
                let (parent, name) = self.parent_for_new(to, false, *now_ms)?;
                // A directory may not move under itself.
                let mut up = parent;
                loop {
                    if up == src {
                        return Err(MetaError::invalid(format!(
                            "cannot move {from} into itself ({to})"
                        )));
                    }
                    if up == ROOT {
                        break;
                    }
                    up = self.ino(up).parent;
                }
                let ino = self.inodes.get_mut(&src).expect("exists");
                let old = (ino.parent, std::mem::replace(&mut ino.name, name.clone()));
                ino.parent = parent;
                self.dentries.remove(&old);
                self.dentries.insert((parent, name), src);
                for p in [old.0, parent] {
                    if let Some(p) = self.inodes.get_mut(&p) {
                        p.mtime_ms = p.mtime_ms.max(*now_ms);
                    }
                }
                self.reply(src)
            }
            Command::Delete { path } => {
                let ino = self.lookup(path)?;
                let id = ino.id;
                if id == ROOT {
                    return Err(MetaError::invalid(format!("cannot delete {path}")));
                }
                self.refuse_hashed(path, "deleted")?;
                if ino.file().is_none() && self.has_entries(id) {
                    return Err(MetaError::new(
                        ErrorKind::DirectoryNotEmpty,
                        format!("{path}: directory not empty"),
                    ));
                }
                // A hard link's entry, or a node with links, leaves the node in place.
                let ino = self.unlink_entry(id, None);
                Ok(Reply {
                    inode: ino,
                    ..Reply::default()
                })
            }
            Command::SetAttr { path, mode, owner } => {
                perm::check_mode(*mode)?;
                let id = self.linked(self.lookup(path)?).id;
                let ino = self.inodes.get_mut(&id).expect("looked up");
                // Bits cleared or another owner: rights may have gone (revoke.rs).
                let narrowed = mode.is_some_and(|m| ino.mode & !m != 0)
                    || owner.as_ref().is_some_and(|o| *o != ino.owner);
                if let Some(m) = mode {
                    ino.mode = *m;
                }
                if let Some(o) = owner {
                    ino.owner.clone_from(o);
                }
                if narrowed {
                    self.revoke_below(id);
                }
                self.reply(id)
            }
            _ => unreachable!("not a namespace command: {cmd}"),
        }
    }

    /// The parent directory's inode and the new entry's name; `parents` makes missing
    /// directories on the way.
    pub(super) fn parent_for_new(
        &mut self,
        path: &str,
        parents: bool,
        now_ms: u64,
    ) -> Result<(InodeId, String), MetaError> {
        let comps = self.local_components(path)?;
        let Some((last, dirs)) = comps.split_last() else {
            return Err(MetaError::new(
                ErrorKind::AlreadyExists,
                format!("{path} already exists"),
            ));
        };
        let mut cur = ROOT;
        for name in dirs {
            if self.ino(cur).file().is_some() {
                return Err(MetaError::new(
                    ErrorKind::NotADirectory,
                    format!("{path}: a component is a file"),
                ));
            }
            cur = match self.dentries.get(&(cur, (*name).to_owned())) {
                Some(id) => *id,
                None if parents => self.insert(cur, name, now_ms, Kind::Dir, None),
                None => return Err(MetaError::not_found(format!("{path}: parent"))),
            };
        }
        if self.ino(cur).file().is_some() {
            return Err(MetaError::new(
                ErrorKind::NotADirectory,
                format!("{path}: parent is a file"),
            ));
        }
        if self.dentries.contains_key(&(cur, (*last).to_owned())) {
            return Err(MetaError::new(
                ErrorKind::AlreadyExists,
                format!("{path}: already exists"),
            ));
        }
        Ok((cur, (*last).to_owned()))
    }

    pub(super) fn insert(
        &mut self,
        parent: InodeId,
        name: &str,
        now_ms: u64,
        kind: Kind,
        mode: Option<u16>,
    ) -> InodeId {
        let id = *self.next_inode;
        *self.next_inode += 1;
        self.insert_as(id, parent, name, now_ms, kind, mode);
        id
    }

    /// [`State::insert`] under inode number `id`, one this partition handed out before
    /// (`FileOp::Make::reserve`) and no inode has.
    pub(super) fn insert_as(
        &mut self,
        id: InodeId,
        parent: InodeId,
        name: &str,
        now_ms: u64,
        kind: Kind,
        mode: Option<u16>,
    ) {
        let mode = mode.unwrap_or(match kind {
            Kind::Dir => perm::DEFAULT_DIR_MODE,
            Kind::File(_) => perm::DEFAULT_FILE_MODE,
        });
        if let Kind::File(f) = &kind {
            for c in &f.chunks {
                self.chunk_owner.insert(c.id, id);
            }
        }
        self.inodes.insert(
            id,
            Inode {
                id,
                parent,
                name: name.to_owned(),
                ctime_ms: now_ms,
                mtime_ms: now_ms,
                kind,
                owner: self.acting.clone().unwrap_or_default(),
                mode,
                posix: None,
            },
        );
        self.dentries.insert((parent, name.to_owned()), id);
        if let Some(p) = self.inodes.get_mut(&parent) {
            p.mtime_ms = p.mtime_ms.max(now_ms);
        }
    }

    /// New chunks on `placements`; chunk groups of layout `group` when it is set.
    pub(super) fn new_chunks(
        &mut self,
        placements: &[Vec<ServerId>],
        group: Option<Group>,
    ) -> Vec<Chunk> {
        placements
            .iter()
            .map(|servers| {
                let id = *self.next_chunk;
                *self.next_chunk += 1;
                Chunk {
                    id,
                    length: 0,
                    sealed: false,
                    version: 1,
                    servers: servers.clone(),
                    ec: group,
                }
            })
            .collect()
    }

    /// The group layout of new chunk groups of a file with `policy`, checking that each
    /// placement has a server per member.
    pub(super) fn group_of(
        policy: &Policy,
        placements: &[Vec<ServerId>],
        groups: bool,
    ) -> Result<Option<Group>, MetaError> {
        if !groups {
            return Ok(None);
        }
        let e = policy
            .direct_ec()
            .ok_or_else(|| MetaError::invalid("chunk groups for a file not written as EC"))?;
        let width = usize::from(e.k) + usize::from(e.m);
        if placements.iter().any(|p| p.len() != width) {
            return Err(MetaError::invalid(format!(
                "a chunk group of ec:{}+{} needs {width} servers",
                e.k, e.m
            )));
        }
        Ok(Some(Group {
            k: e.k,
            m: e.m,
            cell: DEFAULT_CELL,
            lz4: None,
        }))
    }

    /// Appends newly allocated chunks to a file.
    pub(super) fn add_chunks(
        &mut self,
        id: InodeId,
        placements: &[Vec<ServerId>],
        group: Option<Group>,
    ) {
        let chunks = self.new_chunks(placements, group);
        for c in &chunks {
            self.chunk_owner.insert(c.id, id);
        }
        if let Some(Inode {
            kind: Kind::File(f),
            ..
        }) = self.inodes.get_mut(&id)
        {
            f.chunks.extend(chunks);
        }
    }

    pub(super) fn file_mut(&mut self, path: &str) -> Result<(InodeId, &mut FileMeta), MetaError> {
        let id = self.lookup(path)?.id;
        match &mut self.inodes.get_mut(&id).expect("looked up").kind {
            Kind::File(f) => Ok((id, f)),
            Kind::Dir => Err(MetaError::new(
                ErrorKind::IsADirectory,
                format!("{path}: is a directory"),
            )),
        }
    }
}
