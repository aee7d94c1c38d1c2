//! Moving a populated subtree from the root partition into another one (docs/partitions.md,
//! "Split with copying"). Three commands, each idempotent, driven by the root's leader:
//!
//! 1. root, [`Command::BeginMove`]: records the move ([`Move`]); from then on every write at
//!    or below the subtree's top, by path or by chunk, answers `unavailable` (retried by
//!    clients), so the rows stop changing while they are copied; reads go on;
//! 2. the receiving partition, [`Command::LoadRows`] batches: the subtree's inodes (parents
//!    first; ids kept) and its directories' default policies, put as they are (loading a
//!    batch twice changes nothing);
//!    then [`Command::SealLoad`]: loading is closed there for good, so a load from a driver
//!    that lost the root's leadership cannot land after the subtree's users wrote to it;
//! 3. root, [`Command::FinishMove`]: the rows leave the root, each of their chunks gets a
//!    *forward* (`chunk → partition`; chunk ids name the partition that allocated them and
//!    chunkservers store chunks under them, so the ids stay), the map sends the top there
//!    and the freeze ends — one entry, so no write sees the subtree in both places or in
//!    neither.
//!
//! A driver that stops anywhere leaves the move record, and the next leader of the root runs
//! the steps again from 2 (from 3 when loading was sealed).

use super::partitions::{PartitionId, ROOT_PARTITION, partition_of};
use super::{ChunkId, Command, Inode, InodeId, Policy, ROOT, Response, State};
use cairn_rpc::{ErrorKind, MetaError, components};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// A subtree being moved into a partition (the root's `moving` cell).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    /// The subtree's top directory.
    pub path: String,
    /// The partition it moves into.
    pub to: PartitionId,
    pub started_ms: u64,
}

/// Whether `path` is `top` or below it.
pub fn at_or_below(path: &str, top: &str) -> bool {
    match (components(path), components(top)) {
        (Ok(p), Ok(t)) => p.len() >= t.len() && p[..t.len()] == t[..],
        _ => false,
    }
}

impl State {
    /// The move under way, if any (the root's state).
    pub fn moving(&self) -> Option<&Move> {
        self.moving.as_ref()
    }

    /// When the move under way hashes a directory, its shards (hashed.rs); else empty.
    pub fn move_shards(&self) -> &[PartitionId] {
        &self.move_shards
    }

    /// The partition that holds chunk `id`'s file, by this state: the one that allocated
    /// it, unless that is this one and its file moved (a forward here). Ask the allocating
    /// partition's state.
    pub fn chunk_partition(&self, id: ChunkId) -> PartitionId {
        match partition_of(id) {
            p if p == self.home.partition => self.forwards.get(&id).map_or(p, |f| *f),
            p => p,
        }
    }

    /// Chunks forwarded to other partitions.
    pub fn forwards(&self) -> impl Iterator<Item = (ChunkId, PartitionId)> + '_ {
        self.forwards.iter().map(|(c, p)| (c, *p))
    }

    /// Refuses a write at or below the subtree being moved: `Unavailable`, which clients
    /// retry; once the move ends the map routes it to the subtree's new partition.
    pub(super) fn refuse_moving(&self, path: &str) -> Result<(), MetaError> {
        match self.moving.as_ref() {
            Some(m) if at_or_below(path, &m.path) => Err(MetaError::new(
                ErrorKind::Unavailable,
                format!("{path} is being moved to partition {} (retry)", m.to),
            )),
            _ => Ok(()),
        }
    }

    /// A namespace command's paths against the move under way.
    /// A namespace command's paths against the move under way and the paths locked by
    /// renames across partitions (txn.rs).
    pub(super) fn check_moving(&self, cmd: &Command) -> Result<(), MetaError> {
        if self.moving.is_none() && self.locks.is_empty() {
            return Ok(());
        }
        let check = |path: &str| {
            self.refuse_moving(path)?;
            self.refuse_locked(path)
        };
        match cmd {
            Command::Mkdir { path, .. }
            | Command::Create { path, .. }
            | Command::OpenWrite { path, .. }
            | Command::Allocate { path, .. }
            | Command::Commit { path, .. }
            | Command::Delete { path }
            | Command::SetAttr { path, .. } => check(path),
            // A rename of a directory above the moving subtree is refused by `holds_subtree`.
            Command::Rename { from, to, .. } => {
                check(from)?;
                check(to)
            }
            Command::Files(op) => match op.as_ref() {
                cairn_rpc::files::FileOp::Rename { from, to, .. }
                | cairn_rpc::files::FileOp::Link { from, to, .. } => {
                    check(from)?;
                    check(to)
                }
                op => check(op.path()),
            },
            _ => Ok(()),
        }
    }

    /// Whether chunk `id` belongs to a file in the subtree being moved.
    pub(super) fn chunk_moving(&self, id: ChunkId) -> bool {
        let Some(m) = self.moving.as_ref() else {
            return false;
        };
        let (Ok(top), Some(owner)) = (self.lookup(&m.path), self.chunk_owner.get(&id)) else {
            return false;
        };
        let mut cur = *owner;
        loop {
            if cur == top.id {
                return true;
            }
            if cur == ROOT {
                return false;
            }
            cur = self.ino(cur).parent;
        }
    }

    /// Chunk `id`'s file is being moved, or renamed across partitions: refused (retried
    /// after).
    pub(super) fn refuse_chunk_moving(&self, id: ChunkId) -> Result<(), MetaError> {
        let locked = !self.locks.is_empty()
            && self
                .chunk_owner
                .get(&id)
                .is_some_and(|o| self.inode_locked(*o));
        if locked || self.chunk_moving(id) {
            return Err(MetaError::new(
                ErrorKind::Unavailable,
                format!("chunk {id}'s file is being moved to another partition (retry)"),
            ));
        }
        Ok(())
    }

    /// Step 1 (root): freezes the directory at `path` for its move into `to` — or, with
    /// `shards` (`to` their first), for its rows to be hashed over them (hashed.rs).
    /// Repeating it is a no-op; another move under way refuses it.
    pub(super) fn begin_move(
        &mut self,
        path: &str,
        to: PartitionId,
        shards: &[PartitionId],
        now_ms: u64,
    ) -> Response {
        if let Some(m) = self.moving.as_ref() {
            if m.path == path && m.to == to && self.move_shards.as_slice() == shards {
                return self.reply(self.lookup(path)?.id);
            }
            return Err(MetaError::new(
                ErrorKind::Unavailable,
                format!(
                    "{} is being moved to partition {} (one move at a time; retry)",
                    m.path, m.to
                ),
            ));
        }
        if !shards.is_empty() {
            super::hashed::check_shards(shards)?;
            if self.hashed.contains_key(path) {
                return Err(MetaError::new(
                    ErrorKind::AlreadyExists,
                    format!("{path} is hashed already"),
                ));
            }
        }
        let targets = if shards.is_empty() { &[to][..] } else { shards };
        for &t in targets {
            if self.home.partition == ROOT_PARTITION {
                self.check_target(t)?;
            } else if t == self.home.partition {
                return Err(MetaError::invalid(format!(
                    "{path} is in partition {t} already"
                )));
            }
        }
        // A rename across partitions holding a path below: its install or removal would
        // land behind the copy (the freeze refuses only new locks).
        if let Some(l) = self
            .locks
            .values()
            .find(|l| at_or_below(l.path(), path) || at_or_below(path, l.path()))
        {
            return Err(MetaError::new(
                ErrorKind::Unavailable,
                format!("{} is being renamed across partitions (retry)", l.path()),
            ));
        }
        let Some(top) = self.check_movable(path)? else {
            return Err(MetaError::not_found(path));
        };
        *self.moving = Some(Move {
            path: path.to_owned(),
            to,
            started_ms: now_ms,
        });
        *self.move_shards = shards.to_vec();
        self.reply(top.id)
    }

    /// Step 2 (the receiving partition): puts the rows of a subtree moving into it.
    ///
    /// # Errors
    /// This partition does not hold `top`; an inode from outside the root's id range, the
    /// top itself, or whose parent is in neither this state nor the batch; a policy of a
    /// directory not loaded, or out of bounds. Nothing is changed then.
    pub(super) fn load_rows(
        &mut self,
        top: &str,
        inodes: &[Inode],
        policies: &[(InodeId, Policy)],
    ) -> Response {
        self.check_loading(top)?;
        self.put_rows(inodes, policies, ROOT)?;
        self.reply(ROOT)
    }

    /// Puts rows of a subtree moving in (a split's [`Command::LoadRows`], a directory's
    /// rename's [`Command::TxLoad`]): inodes whose parents are `anchor`, come before them in
    /// the batch, or are directories here; policies of directories among them or of
    /// `anchor` (when it is not inode 1). Nothing is changed when one is refused.
    pub(super) fn put_rows(
        &mut self,
        inodes: &[Inode],
        policies: &[(InodeId, Policy)],
        anchor: InodeId,
    ) -> Result<(), MetaError> {
        let mut batch: BTreeSet<InodeId> = BTreeSet::new();
        for ino in inodes {
            // Ids are the cluster's (the allocating partition's in their top bits), so a moved
            // inode keeps its id wherever it came from; only a partition's top directory is
            // inode 1 of its own state.
            if ino.id == ROOT || ino.id == anchor {
                return Err(MetaError::invalid(format!(
                    "inode {} cannot move in as a row: it is a partition's top directory or \
                     the top of the rows",
                    ino.id
                )));
            }
            // Back from where it went, an id of this partition's range was allocated here:
            // one past the counters would be handed out again.
            let own = self.home.partition;
            let chunks = ino.file().map(|f| f.chunks.as_slice()).unwrap_or_default();
            if (partition_of(ino.id) == own && ino.id >= *self.next_inode)
                || chunks
                    .iter()
                    .any(|c| partition_of(c.id) == own && c.id >= *self.next_chunk)
            {
                return Err(MetaError::invalid(format!(
                    "inode {} or a chunk of it is of partition {own}'s range but was never \
                     allocated here",
                    ino.id
                )));
            }
            let parent_here = ino.parent == anchor
                || batch.contains(&ino.parent)
                || self
                    .inodes
                    .get(&ino.parent)
                    .is_some_and(|p| p.file().is_none());
            if !parent_here {
                return Err(MetaError::invalid(format!(
                    "inode {}'s parent {} is not loaded (parents come first)",
                    ino.id, ino.parent
                )));
            }
            if ino.file().is_none() {
                batch.insert(ino.id);
            }
        }
        for (id, p) in policies {
            let anchored = *id == anchor && anchor != ROOT;
            if !anchored
                && !batch.contains(id)
                && self.inodes.get(id).is_none_or(|i| i.file().is_some())
            {
                return Err(MetaError::invalid(format!(
                    "a policy for inode {id}, which is not a directory loaded here"
                )));
            }
            p.check()?;
        }
        for ino in inodes {
            if let Some(old) = self.inodes.get(&ino.id) {
                self.dentries.remove(&(old.parent, old.name.clone()));
                for c in old.file().map(|f| f.chunks.as_slice()).unwrap_or_default() {
                    self.chunk_owner.remove(&c.id);
                }
            }
            self.dentries.insert((ino.parent, ino.name.clone()), ino.id);
            for c in ino.file().map(|f| f.chunks.as_slice()).unwrap_or_default() {
                self.chunk_owner.insert(c.id, ino.id);
            }
            self.inodes.insert(ino.id, ino.clone());
        }
        for (id, p) in policies {
            self.dir_policies.insert(*id, *p);
        }
        Ok(())
    }

    /// Whether the rows moved into this partition are all loaded.
    pub fn load_sealed(&self) -> bool {
        *self.load_sealed
    }

    fn check_loading(&self, top: &str) -> Result<(), MetaError> {
        if self.home.partition == ROOT_PARTITION || self.home.path != top {
            return Err(MetaError::invalid(format!(
                "partition {} holds {:?}, not {top}: rows moving there cannot load here",
                self.home.partition, self.home.path
            )));
        }
        if *self.load_sealed {
            return Err(MetaError::new(
                ErrorKind::AlreadyExists,
                format!("the rows of {top} are loaded already; loading is closed"),
            ));
        }
        Ok(())
    }

    /// Step 2, end (the receiving partition): closes loading. Repeating it is a no-op.
    pub(super) fn seal_load(&mut self, top: &str) -> Response {
        if !*self.load_sealed {
            self.check_loading(top)?;
            *self.load_sealed = true;
        }
        self.reply(ROOT)
    }

    /// The next batch of rows of the subtree being moved, as [`Command::LoadRows`] carries
    /// them: parents first, about [`ROWS_BATCH_BYTES`] of inodes (as JSON), from where
    /// `cursor` stands; `None` when it has walked the whole subtree. The root's state, while
    /// the subtree is frozen (the lock is let go between batches: memory is one batch and the
    /// directories still to walk).
    pub fn rows_batch(&self, cursor: &mut RowsCursor) -> Option<LoadBatch> {
        let (mut inodes, mut policies, mut bytes) = (Vec::new(), Vec::new(), 0usize);
        while let Some(d) = cursor.dirs.front().copied() {
            let after = cursor.after.take().unwrap_or_default();
            for ((_, name), child) in self
                .dentries
                .range((d, after.clone())..)
                .take_while(|((p, _), _)| *p == d)
            {
                if !after.is_empty() && name == after {
                    continue;
                }
                let mut ino = (*self.ino(*child)).clone();
                if ino.parent == cursor.top {
                    ino.parent = cursor.anchor;
                }
                if ino.file().is_none() {
                    cursor.dirs.push_back(ino.id);
                    if let Some(p) = self.dir_policies.get(&ino.id) {
                        policies.push((ino.id, *p));
                    }
                }
                bytes += serde_json::to_vec(&ino).map_or(0, |v| v.len());
                inodes.push(ino);
                if bytes >= ROWS_BATCH_BYTES {
                    cursor.after = Some(name);
                    return Some((inodes, policies));
                }
            }
            cursor.dirs.pop_front();
        }
        (!inodes.is_empty() || !policies.is_empty()).then_some((inodes, policies))
    }

    /// Step 3 (root): the subtree's rows leave this state, its chunks are forwarded to `to`
    /// (conversions of them under way are dropped: their groups' members become orphans, and
    /// `to` converts the chunks again), and the map sends `path` to `to`.
    pub(super) fn finish_move(&mut self, path: &str, to: PartitionId) -> Response {
        match self.moving.as_ref() {
            Some(m) if m.path == path && m.to == to => {}
            _ => {
                return Err(MetaError::new(
                    ErrorKind::NotFound,
                    format!("no move of {path} to partition {to} is under way"),
                ));
            }
        }
        let top = self.lookup(path)?.id;
        let moved = self.remove_below(top);
        let shards = std::mem::take(&mut *self.move_shards);
        // A chunk another partition allocated is forwarded there (the driver's `TxForward`,
        // before this); a hashed directory's, every chunk, to its file's shard.
        if shards.is_empty() {
            for c in moved
                .iter()
                .filter(|c| partition_of(**c) == self.home.partition)
            {
                self.forwards.insert(*c, to);
            }
        }
        self.drop_conversions(&moved);
        if !shards.is_empty() {
            // Hashed, not delegated: the directory's entry stays, the names below it go
            // to their shards (in the root, the map).
            self.hashed.insert(path.to_owned(), shards);
            *self.moving = None;
            return self.reply(top);
        }
        // The root's map; in another partition, the subtree it gave away (it refuses paths
        // there from now on, and the root's map is told: `DelegateSubtree`).
        self.subtrees.insert(path.to_owned(), to);
        *self.moving = None;
        self.reply(top)
    }

    /// Removes every row below directory `top` (not `top` itself): entries, inodes, chunk
    /// index, directories' policies. The chunks of the files removed.
    pub(super) fn remove_below(&mut self, top: InodeId) -> Vec<ChunkId> {
        let mut gone: BTreeSet<ChunkId> = BTreeSet::new();
        let mut dirs = vec![top];
        while let Some(d) = dirs.pop() {
            let children: Vec<(String, InodeId)> = self
                .dentries
                .range((d, String::new())..)
                .take_while(|((p, _), _)| *p == d)
                .map(|((_, name), c)| (name, *c))
                .collect();
            for (name, c) in children {
                self.dentries.remove(&(d, name));
                let Some(ino) = self.inodes.remove(&c) else {
                    continue;
                };
                match ino.file() {
                    Some(f) => {
                        for ch in &f.chunks {
                            self.chunk_owner.remove(&ch.id);
                            gone.insert(ch.id);
                        }
                    }
                    None => {
                        self.dir_policies.remove(&c);
                        dirs.push(c);
                    }
                }
            }
        }
        gone.into_iter().collect()
    }

    /// After partition `from` moved `path` out to `to` (root's state): the map sends `path`
    /// to `to`. Repeating it is a no-op.
    ///
    /// # Errors
    /// `from` is the root (its own `FinishMove` changes the map), `path` is not routed to
    /// `from`, or `to` is not a partition.
    pub(super) fn delegate_subtree(
        &mut self,
        path: &str,
        from: PartitionId,
        to: PartitionId,
    ) -> Response {
        if self.home.partition != ROOT_PARTITION || from == ROOT_PARTITION {
            return Err(MetaError::invalid(
                "a subtree is delegated in the root's map, from a partition other than the root",
            ));
        }
        if self.subtrees.get(path).is_some_and(|p| *p == to) {
            return self.reply(ROOT);
        }
        if !self.partitions.partitions.contains_key(&to) {
            return Err(MetaError::not_found(format!("partition {to}")));
        }
        let r = self.route(path);
        if r.partition != from || r.top == path {
            return Err(MetaError::invalid(format!(
                "{path} is in partition {} (at {}), not below partition {from}'s top",
                r.partition, r.top
            )));
        }
        self.subtrees.insert(path.to_owned(), to);
        self.reply(ROOT)
    }
}

/// Inodes and directories' policies of one [`Command::LoadRows`].
pub type LoadBatch = (Vec<Inode>, Vec<(InodeId, Policy)>);

/// Where [`State::rows_batch`] goes on: the directories whose entries are still to copy, the
/// first from after the entry named `after`.
#[derive(Debug, Clone)]
pub struct RowsCursor {
    top: InodeId,
    /// What the top's own entries name as their parent where the rows go: inode 1 (a
    /// partition's top) for a split, the top itself for a rename.
    anchor: InodeId,
    dirs: std::collections::VecDeque<InodeId>,
    after: Option<String>,
}

impl RowsCursor {
    /// A walk of the subtree at `path` of `state`, for a split (the top's entries name inode
    /// 1, the receiving partition's top, as their parent).
    pub fn new(state: &State, path: &str) -> Result<Self, MetaError> {
        let top = state.lookup(path)?.id;
        Ok(Self {
            top,
            anchor: ROOT,
            dirs: std::collections::VecDeque::from([top]),
            after: None,
        })
    }

    /// A walk of the directory at `path` of `state` for its rename across partitions: the
    /// rows below it as they are (the top keeps its id where it goes).
    pub fn for_rename(state: &State, path: &str) -> Result<Self, MetaError> {
        let top = state.lookup(path)?.id;
        Ok(Self {
            top,
            anchor: top,
            dirs: std::collections::VecDeque::from([top]),
            after: None,
        })
    }
}

/// Bytes of inodes (as JSON) per [`Command::LoadRows`]: well inside a Raft message even when
/// a lagging follower is sent many entries at once.
pub const ROWS_BATCH_BYTES: usize = 128 << 10;

#[cfg(test)]
mod tests;
