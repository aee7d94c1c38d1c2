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
mod convert;
pub mod files;
mod namespace;
pub use check::{MAX_LISTED, Report as CheckReport};
pub(crate) mod disk;
pub use disk::{TABLES, inode_from_old, txns_from_old};
pub mod hashed;
pub mod moves;
pub mod objects;
pub mod partitions;
pub mod perm;
pub mod revoke;
pub mod segments;
pub mod sizes;
pub mod txn;
mod volumes;
pub use objects::{ObjectIndex, PackUse};
pub use perm::Actor;
mod command;
mod types;
pub use command::{Command, Reply, Response};
pub use types::{
    Chunk, ChunkUpdate, Config, Conversion, DEFAULT_BACKGROUND_BYTES_PER_SEC, DEFAULT_CELL,
    DEFAULT_CONVERT_AFTER_SECS, DEFAULT_REPAIR_BYTES_PER_SEC, Ec, FileMeta, Group, Inode,
    KEYS_KEPT, KeyRecord, Kind, LZ4_BLOCK, Lease, Lz4, MemberMove, Policy, Posix, ServerRecord,
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
    /// Directories hashed over shards (hashed.rs): the root's every one; another
    /// partition's, those it hashed away.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    hashed: Cell<BTreeMap<String, Vec<partitions::PartitionId>>>,
    /// The subtree this state holds (a partition's; the root's is the default).
    #[serde(default)]
    home: Cell<partitions::Home>,
    /// A populated subtree being moved into a partition (the root's only; moves.rs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    moving: Cell<Option<moves::Move>>,
    /// When the move under way hashes a directory: its shards (hashed.rs); else empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    move_shards: Cell<Vec<partitions::PartitionId>>,
    /// A partition's: the rows of the subtree moved into it are all loaded (moves.rs); no
    /// more load.
    #[serde(default, skip_serializing_if = "is_false")]
    load_sealed: Cell<bool>,
    /// Renames across partitions under way (the root's only; txn.rs).
    #[serde(default, skip_serializing_if = "no_txns")]
    txns: Cell<txn::Txns>,
    /// What this partition holds locked for renames across partitions (txn.rs).
    #[serde(default, skip_serializing_if = "no_locks")]
    locks: Cell<BTreeMap<u64, txn::Lock>>,
    /// Chunks this partition allocated whose files moved to another partition, and where
    /// they went (moves.rs).
    #[serde(skip, default = "disk::forwards_table")]
    forwards: Table<ChunkId, partitions::PartitionId>,
    /// Segments being collected: writes naming them are refused (segments.rs).
    #[serde(skip, default = "segments::condemned_table")]
    condemned: Table<u64, u64>,
    /// How many times rows arrived from another partition (segments.rs).
    #[serde(skip, default)]
    segment_arrivals: segments::Arrivals,
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
        let mut inodes = Table::memory(disk::INODES)
            .summed(disk::inode_sum)
            .tallied(disk::inode_segments);
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
                posix: None,
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
            hashed: Cell::default(),
            move_shards: Cell::default(),
            home: Cell::default(),
            moving: Cell::default(),
            load_sealed: Cell::default(),
            txns: Cell::default(),
            locks: Cell::default(),
            forwards: disk::forwards_table(),
            condemned: segments::condemned_table(),
            segment_arrivals: Cell::default(),
            dentries: disk::dentries_table(),
            chunk_owner: disk::chunk_owner_table(),
            acting: None,
        }
    }
}

fn no_txns(v: &Cell<txn::Txns>) -> bool {
    v.open.is_empty() && v.next == 0
}

fn no_locks(v: &Cell<BTreeMap<u64, txn::Lock>>) -> bool {
    v.is_empty()
}

fn is_false(v: &Cell<bool>) -> bool {
    !**v
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
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

    /// The default policy set on directory `id` itself.
    pub fn dir_policy(&self, id: InodeId) -> Option<Policy> {
        self.dir_policies.get(&id).copied()
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

    /// The next inode id the state machine will hand out.
    pub fn next_inode_id(&self) -> InodeId {
        *self.next_inode
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

    /// Up to `limit` entries of the directory at `path` after the name `after` (from the
    /// first when empty), in name order, and whether more follow.
    ///
    /// # Errors
    /// As [`State::list`].
    pub fn list_page(
        &self,
        path: &str,
        after: &str,
        limit: usize,
    ) -> Result<(Vec<Arc<Inode>>, bool), MetaError> {
        let dir = self.lookup(path)?;
        if dir.file().is_some() {
            return Err(MetaError::new(
                ErrorKind::NotADirectory,
                format!("{path}: not a directory"),
            ));
        }
        let mut page: Vec<Arc<Inode>> = self
            .dentries
            .range((dir.id, after.to_owned())..)
            .take_while(|((p, _), _)| *p == dir.id)
            .filter(|((_, name), _)| after.is_empty() || name != after)
            .take(limit.saturating_add(1))
            .map(|(_, id)| self.ino(*id))
            .collect();
        let more = page.len() > limit;
        page.truncate(limit);
        Ok((page, more))
    }

    fn reply(&self, id: InodeId) -> Response {
        Ok(Reply {
            inode: self.inodes.get(&id).map(|i| (*i).clone()),
            ..Reply::default()
        })
    }

    /// Applies one command. Errors leave the state unchanged.
    pub fn apply(&mut self, cmd: &Command) -> Response {
        match cmd {
            c @ (Command::Mkdir { .. }
            | Command::Create { .. }
            | Command::OpenWrite { .. }
            | Command::Allocate { .. }
            | Command::Commit { .. }
            | Command::Rename { .. }
            | Command::Delete { .. }
            | Command::SetAttr { .. }) => self.apply_namespace(c),
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
                self.refuse_chunk_moving(*chunk_id)?;
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
            } => {
                self.refuse_chunk_moving(*chunk_id)?;
                self.convert_begin(*chunk_id, servers, *now_ms)
            }
            Command::ConvertEnd {
                group_id,
                switch,
                stream,
            } => {
                if *switch && let Some(c) = self.conversions.get(group_id) {
                    self.refuse_chunk_moving(c.chunk)?;
                }
                self.convert_end(*group_id, *switch, *stream);
                Ok(Reply::default())
            }
            Command::Object(op) => {
                self.object_guard(op)?;
                Ok(Reply {
                    object: Some(self.apply_object(op)),
                    ..Reply::default()
                })
            }
            Command::Files(op) => {
                self.check_moving(cmd)?;
                self.apply_files(op)
            }
            Command::Bucket(b) => self.apply_bucket(b),
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
            Command::BeginMove { path, to, now_ms } => self.begin_move(path, *to, &[], *now_ms),
            Command::BeginHashMove {
                path,
                shards,
                now_ms,
            } => match shards.first() {
                Some(to) => self.begin_move(path, *to, shards, *now_ms),
                None => Err(MetaError::invalid("a hashed move needs its shards")),
            },
            Command::LoadRows {
                top,
                inodes,
                policies,
            } => self
                .load_rows(top, inodes, policies)
                .inspect(|_| self.rows_arrived()),
            Command::SealLoad { top } => self.seal_load(top),
            Command::FinishMove { path, to } => self.finish_move(path, *to),
            Command::DelegateSubtree { path, from, to } => self.delegate_subtree(path, *from, *to),
            Command::HashDir {
                path,
                shards,
                mode,
                now_ms,
            } => self.hash_dir(path, shards, *mode, *now_ms),
            Command::DelegateHashed { path, from, shards } => {
                self.delegate_hashed(path, *from, shards)
            }
            Command::TxBegin {
                from,
                to,
                src,
                dst,
                now_ms,
            } => self.tx_begin(from, to, *src, *dst, *now_ms),
            Command::TxLockSource { txid, path } => self.tx_lock_source(*txid, path),
            Command::TxLockDest { txid, path, dir } => self.tx_lock_dest(*txid, path, *dir),
            Command::TxLoad {
                txid,
                top,
                inodes,
                policies,
            } => self
                .tx_load(*txid, *top, inodes, policies)
                .inspect(|_| self.rows_arrived()),
            Command::TxDecide { txid, record } => self.tx_decide(*txid, record.as_ref()),
            Command::TxInstall { txid, inode } => self
                .tx_install(*txid, inode)
                .inspect(|_| self.rows_arrived()),
            Command::CondemnSegments { segs, now_ms } => self.condemn_segments(segs, *now_ms),
            Command::TxForward { chunks, to } => self.tx_forward(chunks, *to),
            Command::TxRemove { txid } => self.tx_remove(*txid),
            Command::TxUnlock { txid } => self.tx_unlock(*txid),
            Command::TxEnd { txid } => self.tx_end(*txid),
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

#[cfg(test)]
pub(crate) mod tests;
