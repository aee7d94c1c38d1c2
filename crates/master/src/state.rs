//! The masters' replicated state: namespace, stream meta and chunkserver registry.
//!
//! Everything here is deterministic: a [`Command`] carries every decision that needs a clock or
//! randomness (the leader's time, the chunkservers it chose), so every master applying the same
//! log reaches the same state. Heartbeats, loads and "which chunks did a server report" are
//! not replicated; they live in the leader's memory (`registry.rs`).
//!
//! The namespace is an inode table plus a directory-entry table keyed by (parent, name), so a
//! rename moves one entry and a listing is one range scan.

use crate::kv::{Cell, Table};
use cairn_rpc::{ErrorKind, MetaError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

mod check;
pub use check::Report as CheckReport;
pub(crate) mod disk;
pub use disk::TABLES;
mod objects;
pub mod partitions;
pub mod perm;
pub mod revoke;
mod volumes;
pub use objects::{ObjectIndex, PackUse};
pub use perm::Actor;
mod command;
mod types;
pub use command::{Command, Reply, Response};
pub use types::{
    Chunk, ChunkUpdate, Config, Conversion, DEFAULT_BACKGROUND_BYTES_PER_SEC, DEFAULT_CELL,
    DEFAULT_CONVERT_AFTER_SECS, DEFAULT_REPAIR_BYTES_PER_SEC, Ec, FileMeta, Group, Inode,
    KEYS_KEPT, KeyRecord, Kind, LZ4_BLOCK, Lease, Lz4, MemberMove, Policy, ServerRecord,
};

pub type ServerId = u64;
pub type ChunkId = u64;
pub type InodeId = u64;

/// The root directory's inode.
pub const ROOT: InodeId = 1;

/// The replicated state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    #[serde(deserialize_with = "disk::inodes_from_rows")]
    inodes: Table<InodeId, Inode>,
    next_inode: Cell<InodeId>,
    next_chunk: Cell<ChunkId>,
    servers: Cell<BTreeMap<ServerId, ServerRecord>>,
    #[serde(default)]
    config: Cell<Config>,
    /// The object service's buckets, objects, uploads and users.
    #[serde(default)]
    objects: ObjectIndex,
    /// Directories' default policies for new files below them (`cairn fs mkdir --policy`).
    #[serde(default)]
    dir_policies: Cell<BTreeMap<InodeId, Policy>>,
    /// Replica→EC conversions under way, by the new group's id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    conversions: Cell<BTreeMap<ChunkId, Conversion>>,
    /// The keys capabilities are signed with, oldest first (docs/security.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    cap_keys: Cell<Vec<KeyRecord>>,
    /// The permission generation and the capability revocations (revoke.rs).
    #[serde(default, skip_serializing_if = "revoke::Revocations::is_empty")]
    revocations: Cell<revoke::Revocations>,
    /// The partitions besides this one (the root's state only; docs/partitions.md).
    #[serde(default)]
    partitions: Cell<partitions::PartitionMap>,
    /// Subtrees held by other partitions, by top directory (the root's state only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    subtrees: Cell<BTreeMap<String, partitions::PartitionId>>,
    /// The subtree this state holds (a partition's; the root's is the default).
    #[serde(default)]
    home: Cell<partitions::Home>,
    /// (parent, name) → child; rebuilt from `inodes` after a snapshot is loaded.
    #[serde(skip, default = "disk::dentries_table")]
    dentries: Table<(InodeId, String), InodeId>,
    /// chunk → owning file; rebuilt likewise.
    #[serde(skip, default = "disk::chunk_owner_table")]
    chunk_owner: Table<ChunkId, InodeId>,
    /// While a [`Command::As`] applies: the user who owns what it creates.
    #[serde(skip)]
    acting: Option<String>,
}

impl Default for State {
    fn default() -> Self {
        let mut inodes = Table::memory(disk::INODES).summed(disk::inode_sum);
        inodes.insert(
            ROOT,
            Inode {
                id: ROOT,
                parent: ROOT,
                name: String::new(),
                ctime_ms: 0,
                mtime_ms: 0,
                kind: Kind::Dir,
                owner: String::new(),
                mode: perm::DEFAULT_DIR_MODE,
            },
        );
        Self {
            inodes,
            next_inode: Cell::new(ROOT + 1),
            next_chunk: Cell::new(1),
            servers: Cell::default(),
            config: Cell::default(),
            objects: ObjectIndex::default(),
            dir_policies: Cell::default(),
            conversions: Cell::default(),
            cap_keys: Cell::default(),
            revocations: Cell::default(),
            partitions: Cell::default(),
            subtrees: Cell::default(),
            home: Cell::default(),
            dentries: disk::dentries_table(),
            chunk_owner: disk::chunk_owner_table(),
            acting: None,
        }
    }
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

/// Opens `f`'s last chunk again for a new writer to continue (returns its id) when it is a
/// sealed replicated chunk holding fewer than `below` bytes, in a file whose policy converts
/// nothing. Its replicas were never sealed by a writer that closed cleanly, so they take
/// appends at its length under the new writer epoch; a replica sealed meanwhile (a repair's
/// copy) refuses them and is dropped by the writer, which seals the chunk and moves on as
/// after any failure. Without it, every short-lived writer (`cairn fs append`) left a short
/// sealed chunk holding an extent on each replica.
fn continue_last(f: &mut FileMeta, below: u64) -> Option<ChunkId> {
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

fn lease_held(lease: Option<&Lease>, holder: &str, now_ms: u64) -> Option<MetaError> {
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

impl State {
    /// The default policy for a new file or directory at `path`: that of the nearest existing
    /// ancestor directory that has one (`path` itself included when it is a directory).
    pub fn inherited_policy(&self, path: &str) -> Option<Policy> {
        let mut id = ROOT;
        let mut found = self.dir_policies.get(&ROOT).copied();
        for name in self.local_components(path).unwrap_or_default() {
            match self.dentries.get(&(id, name.to_owned())).map(|c| *c) {
                Some(child) if self.inodes.get(&child).is_some_and(|i| i.file().is_none()) => {
                    id = child;
                    if let Some(p) = self.dir_policies.get(&id) {
                        found = Some(*p);
                    }
                }
                _ => break,
            }
        }
        found
    }

    /// Rebuilds the derived indexes (after deserializing a snapshot).
    pub fn rebuild(&mut self) {
        self.revocations.rebuild();
        self.objects.rebuild();
        self.dentries = disk::dentries_table();
        self.chunk_owner = disk::chunk_owner_table();
        for (_, ino) in self.inodes.iter() {
            if ino.id != ROOT {
                self.dentries.insert((ino.parent, ino.name.clone()), ino.id);
            }
            if let Some(f) = ino.file() {
                for c in &f.chunks {
                    self.chunk_owner.insert(c.id, ino.id);
                }
            }
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Files the object index freed, not yet deleted (their space comes back soon).
    pub fn trash_len(&self) -> usize {
        self.objects.trash_len()
    }

    pub fn objects(&self) -> &ObjectIndex {
        &self.objects
    }

    /// Up to `budget` inodes after inode `after` (from the first when `None`), in id order,
    /// and where the next call goes on (`None`: this one reached the end). Scans that run
    /// every second (repair, conversion) walk the inodes this way, a bounded slice per tick.
    pub fn inodes_after(
        &self,
        after: Option<InodeId>,
        budget: usize,
    ) -> (Vec<Arc<Inode>>, Option<InodeId>) {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut out: Vec<Arc<Inode>> = Vec::new();
        for (_, ino) in self.inodes.range((from, Bound::Unbounded)) {
            if out.len() == budget.max(1) {
                let last = out.last().map(|i| i.id);
                return (out, last);
            }
            out.push(ino);
        }
        (out, None)
    }

    /// Every file's chunks with the file's policy (for the repair scan).
    pub fn chunks_with_policy(&self) -> impl Iterator<Item = (Policy, Chunk)> + '_ {
        self.inodes.iter().flat_map(|(_, ino)| match ino.file() {
            Some(f) => f.chunks.iter().map(|c| (f.policy, c.clone())).collect(),
            None => Vec::new(),
        })
    }

    pub fn servers(&self) -> &BTreeMap<ServerId, ServerRecord> {
        &self.servers
    }

    /// The capability keys, oldest first.
    pub fn cap_keys(&self) -> &[KeyRecord] {
        &self.cap_keys
    }

    /// The permission generation and the capability revocations (revoke.rs).
    pub fn revocations(&self) -> &revoke::Revocations {
        &self.revocations
    }

    pub fn inode(&self, id: InodeId) -> Option<Arc<Inode>> {
        self.inodes.get(&id)
    }

    /// An inode the state holds (a dentry or a chunk names it).
    pub(crate) fn ino(&self, id: InodeId) -> Arc<Inode> {
        self.inodes
            .get(&id)
            .unwrap_or_else(|| panic!("inode {id} is named but missing"))
    }

    /// Counts for `cairn status`: (files, dirs, chunks, logical bytes known to the master).
    pub fn totals(&self) -> (u64, u64, u64, u64) {
        let [files, dirs, chunks, bytes] = self.inodes.sum();
        (files, dirs, chunks, bytes)
    }

    /// The chunk and the file that owns it.
    pub fn chunk(&self, id: ChunkId) -> Option<(Arc<Inode>, Chunk)> {
        let ino = self.inodes.get(&*self.chunk_owner.get(&id)?)?;
        let c = ino.file()?.chunks.iter().find(|c| c.id == id)?.clone();
        Some((ino, c))
    }

    pub fn owns_chunk(&self, id: ChunkId) -> bool {
        self.chunk_owner.contains_key(&id)
    }

    /// Every file's inode.
    pub fn files(&self) -> impl Iterator<Item = Arc<Inode>> + '_ {
        self.inodes
            .iter()
            .map(|(_, i)| i)
            .filter(|i| i.file().is_some())
    }

    /// Conversions under way, by group id.
    pub fn conversions(&self) -> &BTreeMap<ChunkId, Conversion> {
        &self.conversions
    }

    /// Whether `server` is being written member `group` of a conversion.
    pub fn converting_on(&self, group: ChunkId, server: ServerId) -> bool {
        self.conversions
            .get(&group)
            .is_some_and(|c| c.servers.contains(&server))
    }

    /// Every chunk (id, expected servers, sealed, length) — for reconciling chunk reports.
    pub fn chunks(&self) -> impl Iterator<Item = Chunk> + '_ {
        self.chunks_with_policy().map(|(_, c)| c)
    }

    /// The next chunk id the state machine will hand out (ids below it were allocated once).
    pub fn next_chunk_id(&self) -> ChunkId {
        *self.next_chunk
    }

    pub fn lookup(&self, path: &str) -> Result<Arc<Inode>, MetaError> {
        let mut cur = ROOT;
        for name in self.local_components(path)? {
            let ino = self.ino(cur);
            if ino.file().is_some() {
                return Err(MetaError::new(
                    ErrorKind::NotADirectory,
                    format!("{path}: a component is a file"),
                ));
            }
            cur = *self
                .dentries
                .get(&(cur, name.to_owned()))
                .ok_or_else(|| MetaError::not_found(path))?;
        }
        Ok(self.ino(cur))
    }

    /// Whether directory `id` has any entry.
    pub(crate) fn has_entries(&self, id: InodeId) -> bool {
        self.dentries
            .range((id, String::new())..)
            .next()
            .is_some_and(|((p, _), _)| p == id)
    }

    /// Entries of a directory, by name.
    pub fn list(&self, path: &str) -> Result<Vec<Arc<Inode>>, MetaError> {
        let dir = self.lookup(path)?;
        if dir.file().is_some() {
            return Err(MetaError::new(
                ErrorKind::NotADirectory,
                format!("{path}: not a directory"),
            ));
        }
        Ok(self
            .dentries
            .range((dir.id, String::new())..)
            .take_while(|((p, _), _)| *p == dir.id)
            .map(|(_, id)| self.ino(*id))
            .collect())
    }

    /// The parent directory's inode and the new entry's name; `parents` makes missing
    /// directories on the way.
    fn parent_for_new(
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

    fn insert(
        &mut self,
        parent: InodeId,
        name: &str,
        now_ms: u64,
        kind: Kind,
        mode: Option<u16>,
    ) -> InodeId {
        let mode = mode.unwrap_or(match kind {
            Kind::Dir => perm::DEFAULT_DIR_MODE,
            Kind::File(_) => perm::DEFAULT_FILE_MODE,
        });
        let id = *self.next_inode;
        *self.next_inode += 1;
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
            },
        );
        self.dentries.insert((parent, name.to_owned()), id);
        if let Some(p) = self.inodes.get_mut(&parent) {
            p.mtime_ms = p.mtime_ms.max(now_ms);
        }
        id
    }

    /// New chunks on `placements`; chunk groups of layout `group` when it is set.
    fn new_chunks(&mut self, placements: &[Vec<ServerId>], group: Option<Group>) -> Vec<Chunk> {
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
    fn group_of(
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
    fn add_chunks(&mut self, id: InodeId, placements: &[Vec<ServerId>], group: Option<Group>) {
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

    fn file_mut(&mut self, path: &str) -> Result<(InodeId, &mut FileMeta), MetaError> {
        let id = self.lookup(path)?.id;
        match &mut self.inodes.get_mut(&id).expect("looked up").kind {
            Kind::File(f) => Ok((id, f)),
            Kind::Dir => Err(MetaError::new(
                ErrorKind::IsADirectory,
                format!("{path}: is a directory"),
            )),
        }
    }

    fn reply(&self, id: InodeId) -> Response {
        Ok(Reply {
            inode: self.inodes.get(&id).map(|i| (*i).clone()),
            ..Reply::default()
        })
    }

    /// Applies one command. Errors leave the state unchanged.
    fn convert_begin(&mut self, chunk_id: ChunkId, servers: &[ServerId], now_ms: u64) -> Response {
        let (ino, c) = self
            .chunk(chunk_id)
            .ok_or_else(|| MetaError::not_found(format!("chunk {chunk_id}")))?;
        let policy = ino.file().expect("chunks belong to files").policy;
        let Some(ec) = policy.ec.filter(|e| e.then) else {
            return Err(MetaError::invalid(format!(
                "chunk {chunk_id}: its file's policy converts nothing"
            )));
        };
        if !c.sealed || c.ec.is_some() || c.length == 0 {
            return Err(MetaError::invalid(format!(
                "chunk {chunk_id} is not a sealed replicated chunk"
            )));
        }
        let mut distinct = servers.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        if servers.len() != usize::from(ec.k) + usize::from(ec.m) || distinct.len() != servers.len()
        {
            return Err(MetaError::invalid(format!(
                "a conversion to ec:{}+{} needs {} distinct servers, got {servers:?}",
                ec.k,
                ec.m,
                usize::from(ec.k) + usize::from(ec.m)
            )));
        }
        if self.conversions.values().any(|v| v.chunk == chunk_id) {
            return Err(MetaError::new(
                ErrorKind::AlreadyExists,
                format!("chunk {chunk_id} is being converted"),
            ));
        }
        let length = c.length;
        let group = *self.next_chunk;
        *self.next_chunk += 1;
        self.conversions.insert(
            group,
            Conversion {
                chunk: chunk_id,
                length,
                group: Group {
                    k: ec.k,
                    m: ec.m,
                    cell: DEFAULT_CELL,
                    lz4: None,
                },
                lz4_block: if policy.compression { LZ4_BLOCK } else { 0 },
                servers: servers.to_vec(),
                started_ms: now_ms,
            },
        );
        Ok(Reply {
            chunk: Some(group),
            ..Reply::default()
        })
    }

    fn convert_end(&mut self, group_id: ChunkId, switch: bool, stream: u64) {
        let Some(conv) = self.conversions.remove(&group_id) else {
            return;
        };
        if !switch {
            return;
        }
        let mut group = conv.group;
        if conv.lz4_block > 0 {
            // The blocks of the chunk's bytes (each at least its 16-byte header) and their
            // index (8 bytes a block, a 24-byte trailer).
            let blocks = conv.length.div_ceil(u64::from(conv.lz4_block));
            if stream < blocks * 24 + 24 {
                return;
            }
            group.lz4 = Some(Lz4 {
                stream,
                block: conv.lz4_block,
            });
        }
        let Some(owner) = self.chunk_owner.get(&conv.chunk).map(|o| *o) else {
            return; // the file or the chunk went meanwhile
        };
        let Some(Inode {
            kind: Kind::File(f),
            ..
        }) = self.inodes.get_mut(&owner)
        else {
            return;
        };
        let Some(c) = f.chunks.iter_mut().find(|c| c.id == conv.chunk) else {
            return;
        };
        if !c.sealed || c.ec.is_some() || c.length != conv.length {
            return;
        }
        c.id = group_id;
        c.ec = Some(group);
        c.servers = conv.servers;
        self.chunk_owner.remove(&conv.chunk);
        self.chunk_owner.insert(group_id, owner);
    }

    pub fn apply(&mut self, cmd: &Command) -> Response {
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
                if ino.file().is_none() && self.has_entries(id) {
                    return Err(MetaError::new(
                        ErrorKind::DirectoryNotEmpty,
                        format!("{path}: directory not empty"),
                    ));
                }
                let ino = Arc::unwrap_or_clone(self.inodes.remove(&id).expect("exists"));
                self.dentries.remove(&(ino.parent, ino.name.clone()));
                self.dir_policies.remove(&id);
                if let Some(f) = ino.file() {
                    for c in &f.chunks {
                        self.chunk_owner.remove(&c.id);
                    }
                }
                Ok(Reply {
                    inode: Some(ino),
                    ..Reply::default()
                })
            }
            Command::SetAttr { path, mode, owner } => {
                perm::check_mode(*mode)?;
                let id = self.lookup(path)?.id;
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
            Command::As { actor, cmd } => {
                if matches!(**cmd, Command::As { .. }) {
                    return Err(MetaError::invalid(
                        "a command on behalf of a user inside another",
                    ));
                }
                if !actor.admin {
                    self.authorize(actor, cmd)?;
                }
                self.acting = Some(actor.user.clone());
                let r = self.apply(cmd);
                self.acting = None;
                r
            }
            Command::Register { server } => {
                let draining = self.servers.get(&server.id).is_some_and(|s| s.draining);
                let mut s = server.clone();
                s.draining = draining;
                self.servers.insert(s.id, s);
                Ok(Reply::default())
            }
            Command::SetDraining {
                server_id,
                draining,
            } => {
                let s = self
                    .servers
                    .get_mut(server_id)
                    .ok_or_else(|| MetaError::not_found(format!("chunkserver {server_id}")))?;
                s.draining = *draining;
                Ok(Reply::default())
            }
            Command::Repaired {
                chunk_id,
                length,
                server,
                remove,
                member,
            } => {
                let Some(owner) = self.chunk_owner.get(chunk_id).map(|o| *o) else {
                    return Ok(Reply::default());
                };
                let Some(Inode {
                    kind: Kind::File(f),
                    ..
                }) = self.inodes.get_mut(&owner)
                else {
                    return Ok(Reply::default());
                };
                if let Some(c) = f.chunks.iter_mut().find(|c| c.id == *chunk_id)
                    && c.sealed
                    && c.length == *length
                {
                    match (member, c.ec) {
                        (None, None) => {
                            if !c.servers.contains(server) {
                                c.servers.push(*server);
                            }
                            c.servers.retain(|s| s == server || !remove.contains(s));
                        }
                        (Some(mv), Some(_)) => {
                            let i = usize::from(mv.index);
                            // Members stay on distinct servers.
                            let fresh = *server == mv.from || !c.servers.contains(server);
                            if c.servers.get(i) == Some(&mv.from) && fresh {
                                c.servers[i] = *server;
                            }
                        }
                        // A replica's repair recorded for a group, or the reverse: stale.
                        _ => {}
                    }
                }
                Ok(Reply::default())
            }
            Command::SetConfig { config } => {
                *self.config = config.clone();
                Ok(Reply::default())
            }
            Command::RotateKey { secret, now_ms } => {
                let id = self
                    .cap_keys
                    .last()
                    .map_or(1, |k| k.id.wrapping_add(1).max(1));
                self.cap_keys.push(KeyRecord {
                    id,
                    secret: *secret,
                    created_ms: *now_ms,
                });
                let extra = self.cap_keys.len().saturating_sub(KEYS_KEPT);
                self.cap_keys.drain(..extra);
                Ok(Reply::default())
            }
            Command::ConvertBegin {
                chunk_id,
                servers,
                now_ms,
            } => self.convert_begin(*chunk_id, servers, *now_ms),
            Command::ConvertEnd {
                group_id,
                switch,
                stream,
            } => {
                self.convert_end(*group_id, *switch, *stream);
                Ok(Reply::default())
            }
            Command::Object(op) => Ok(Reply {
                object: Some(self.apply_object(op)),
                ..Reply::default()
            }),
            Command::SealSecrets { sealed } => {
                self.objects.seal_secrets(sealed);
                Ok(Reply::default())
            }
            Command::AddPartition { members, now_ms } => self.add_partition(members, *now_ms),
            Command::InitPartition {
                partition,
                path,
                owner,
                mode,
                now_ms,
            } => self.init_partition(*partition, path, owner, *mode, *now_ms),
            Command::AssignSubtree {
                path,
                partition,
                owner,
                mode,
                now_ms,
            } => self.assign_subtree(path, *partition, owner, *mode, *now_ms),
            Command::Revoke { files } => {
                self.revoke_files(files);
                Ok(Reply::default())
            }
            Command::PruneRevocations { upto } => {
                self.revocations.prune(*upto);
                Ok(Reply::default())
            }
            Command::Batch(cmds) => Ok(Reply {
                batch: cmds
                    .iter()
                    .map(|c| match c {
                        Command::Batch(_) => Err(MetaError::invalid("a batch inside a batch")),
                        c => self.apply(c),
                    })
                    .collect(),
                ..Reply::default()
            }),
        }
    }
}

fn check_writer(path: &str, f: &FileMeta, holder: &str, now_ms: u64) -> Result<(), MetaError> {
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

#[cfg(test)]
mod tests;
