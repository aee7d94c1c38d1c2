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
mod tests {
    use super::*;
    use crate::state::tests::{repaired, unavailable};
    use crate::state::{ChunkUpdate, Kind};
    use crate::view::{StateView, View};
    use std::collections::BTreeMap;

    fn mkdir(st: &mut State, path: &str, policy: Option<Policy>) -> Response {
        st.apply(&Command::Mkdir {
            path: path.into(),
            parents: true,
            now_ms: 1,
            policy,
            mode: None,
        })
    }

    fn create(st: &mut State, path: &str) -> Response {
        let dir = &path[..path.rfind('/').unwrap()];
        if !dir.is_empty() && st.lookup(dir).is_err() {
            mkdir(st, dir, None).unwrap();
        }
        crate::state::tests::create(st, path, Some("w"), 1)
    }

    /// A subtree below a partition's top moves out of that partition into another: the
    /// source freezes and gives the rows away, chunks allocated elsewhere (the root's, here:
    /// /a moved from the root) are forwarded by their allocator before, the source refuses
    /// the subtree's paths afterwards and the root's map sends them to the new partition.
    #[test]
    fn a_subtree_moves_out_of_a_partition_other_than_the_root() {
        let (mut root, mut p1) = setup(20);
        root.apply(&Command::BeginMove {
            path: "/a".into(),
            to: 1,
            now_ms: 5,
        })
        .unwrap();
        copy_and_finish(&mut root, &mut p1);
        // A file p1 allocates itself, in the subtree that moves on.
        create(&mut p1, "/a/x3/own").unwrap();
        let own_chunk = p1.lookup("/a/x3/own").unwrap().file().unwrap().chunks[0].id;
        let root_chunk = p1.lookup("/a/x3/f3").unwrap().file().unwrap().chunks[0].id;
        assert_eq!(partition_of(own_chunk), 1);
        assert_eq!(partition_of(root_chunk), ROOT_PARTITION);
        root.apply(&Command::AddPartition {
            members: vec![1],
            now_ms: 1,
        })
        .unwrap();
        let mut p2 = crate::state::tests::partition_state(2, "/a/x3");
        // Its top, and a path outside p1, cannot move from p1.
        for bad in ["/a", "/b/f"] {
            assert!(
                p1.apply(&Command::BeginMove {
                    path: bad.into(),
                    to: 2,
                    now_ms: 6
                })
                .is_err(),
                "{bad}"
            );
        }
        p1.apply(&Command::BeginMove {
            path: "/a/x3".into(),
            to: 2,
            now_ms: 6,
        })
        .unwrap();
        assert!(unavailable(crate::state::tests::create(
            &mut p1,
            "/a/x3/late",
            Some("w"),
            1
        )));
        create(&mut p1, "/a/x4/fine").unwrap();
        let mut cursor = RowsCursor::new(&p1, "/a/x3").unwrap();
        let mut foreign = Vec::new();
        while let Some((inodes, policies)) = p1.rows_batch(&mut cursor) {
            for i in &inodes {
                foreign.extend(
                    i.file()
                        .into_iter()
                        .flat_map(|f| f.chunks.iter().map(|c| c.id))
                        .filter(|c| partition_of(*c) != 1),
                );
            }
            p2.apply(&Command::LoadRows {
                top: "/a/x3".into(),
                inodes,
                policies,
            })
            .unwrap();
        }
        p2.apply(&Command::SealLoad {
            top: "/a/x3".into(),
        })
        .unwrap();
        assert!(foreign.contains(&root_chunk) && !foreign.contains(&own_chunk));
        root.apply(&Command::TxForward {
            chunks: foreign.clone(),
            to: 2,
        })
        .unwrap();
        p1.apply(&Command::FinishMove {
            path: "/a/x3".into(),
            to: 2,
        })
        .unwrap();
        // Between the source's finish and the root's map: the source refuses, retried.
        assert!(unavailable(crate::state::tests::create(
            &mut p1,
            "/a/x3/late",
            Some("w"),
            1
        )));
        assert!(unavailable(
            p1.lookup("/a/x3/f3")
                .map(|_| crate::state::Reply::default())
        ));
        // The map: only a subtree routed to the source, and only once.
        assert!(
            root.apply(&Command::DelegateSubtree {
                path: "/b".into(),
                from: 1,
                to: 2
            })
            .is_err()
        );
        for _ in 0..2 {
            root.apply(&Command::DelegateSubtree {
                path: "/a/x3".into(),
                from: 1,
                to: 2,
            })
            .unwrap();
        }
        assert_eq!(root.route("/a/x3/f3").partition, 2);
        assert_eq!(root.route("/a/x4/fine").partition, 1);
        assert_eq!(
            p2.lookup("/a/x3/own").unwrap().file().unwrap().chunks[0].id,
            own_chunk
        );
        create(&mut p2, "/a/x3/new").unwrap();
        // A directory above the subtree p1 gave away cannot be renamed in p1.
        assert!(
            p1.apply(&Command::Rename {
                from: "/a/x3".into(),
                to: "/a/y".into(),
                now_ms: 7
            })
            .is_err()
        );
        let view = View {
            root: &root,
            parts: BTreeMap::from([(1, &p1), (2, &p2)]),
        };
        assert_eq!(view.chunk(own_chunk).unwrap().0.name, "own");
        assert_eq!(view.chunk(root_chunk).unwrap().0.name, "f3");
        for st in [&root, &p1, &p2] {
            let r = st.check();
            assert_eq!(r.problems, 0, "{:?}", r.listed);
        }
    }

    /// The root with partition 1 and files in /a (some in a directory with a policy) and /b;
    /// partition 1 initialized to hold /a.
    fn setup(files: usize) -> (State, State) {
        let mut root = State::default();
        root.apply(&Command::AddPartition {
            members: vec![1],
            now_ms: 1,
        })
        .unwrap();
        let ec = Policy {
            replicas: 2,
            compression: true,
            min_copy: 2,
            ec: None,
        };
        mkdir(&mut root, "/a/d", Some(ec)).unwrap();
        for i in 0..files {
            create(&mut root, &format!("/a/x{}/f{i}", i % 7)).unwrap();
        }
        create(&mut root, "/a/d/g").unwrap();
        create(&mut root, "/a/top").unwrap();
        create(&mut root, "/b/f").unwrap();
        (root, crate::state::tests::partition_state(1, "/a"))
    }

    /// Steps 2 and 3 as the driver runs them; the number of `LoadRows` batches.
    fn copy_and_finish(root: &mut State, p1: &mut State) -> usize {
        let mut cursor = RowsCursor::new(root, "/a").unwrap();
        let mut batches = 0;
        while let Some((inodes, policies)) = root.rows_batch(&mut cursor) {
            batches += 1;
            let load = Command::LoadRows {
                top: "/a".into(),
                inodes,
                policies,
            };
            p1.apply(&load).unwrap();
            // A batch loaded twice changes nothing.
            p1.apply(&load).unwrap();
        }
        p1.apply(&Command::SealLoad { top: "/a".into() }).unwrap();
        root.apply(&Command::FinishMove {
            path: "/a".into(),
            to: 1,
        })
        .unwrap();
        batches
    }

    #[test]
    fn a_populated_subtree_moves_with_its_ids_and_its_chunks_forwarded() {
        let (mut root, mut p1) = setup(20);
        let f = root.lookup("/a/x3/f3").unwrap();
        let chunk = f.file().unwrap().chunks[0].id;
        let (files_before, dirs_before, _, _) = root.totals();
        root.apply(&Command::BeginMove {
            path: "/a".into(),
            to: 1,
            now_ms: 3,
        })
        .unwrap();
        // Frozen: every write at or below /a waits; reads and writes elsewhere go on.
        assert!(unavailable(create(&mut root, "/a/new")));
        assert!(unavailable(root.apply(&Command::Delete {
            path: "/a/top".into()
        })));
        assert!(unavailable(root.apply(&Command::Rename {
            from: "/b/f".into(),
            to: "/a/f".into(),
            now_ms: 4
        })));
        assert!(unavailable(root.apply(&Command::Commit {
            path: "/a/x3/f3".into(),
            holder: "w".into(),
            now_ms: 4,
            updates: vec![ChunkUpdate {
                chunk_id: chunk,
                length: 10,
                sealed: false
            }],
            trim: false,
            release: false,
            seal: false,
            lease_until_ms: 0,
            drops: vec![],
            remove: vec![],
        })));
        assert!(unavailable(root.apply(&repaired(chunk))));
        // Renaming a directory above it is refused outright, as for any partition's subtree.
        assert!(mkdir(&mut root, "/up/a2", None).is_ok());
        assert!(
            root.apply(&Command::Rename {
                from: "/a".into(),
                to: "/c".into(),
                now_ms: 4
            })
            .is_err()
        );
        assert!(root.lookup("/a/x3/f3").is_ok());
        create(&mut root, "/b/g").unwrap();
        // One move at a time; the same one again is a no-op.
        root.apply(&Command::AddPartition {
            members: vec![1],
            now_ms: 1,
        })
        .unwrap();
        assert!(unavailable(root.apply(&Command::BeginMove {
            path: "/b".into(),
            to: 2,
            now_ms: 3
        })));
        root.apply(&Command::BeginMove {
            path: "/a".into(),
            to: 1,
            now_ms: 5,
        })
        .unwrap();

        copy_and_finish(&mut root, &mut p1);
        // A late load (a driver that lost the root's leadership) is refused.
        assert!(
            p1.apply(&Command::LoadRows {
                top: "/a".into(),
                inodes: vec![(*f).clone()],
                policies: vec![],
            })
            .is_err()
        );
        assert!(root.moving().is_none());
        assert_eq!(root.route("/a/x3/f3").partition, 1);
        assert!(unavailable(
            root.lookup("/a/x3/f3").map(|_| Default::default())
        ));
        let moved = p1.lookup("/a/x3/f3").unwrap();
        assert_eq!((moved.id, moved.file()), (f.id, f.file()));
        // Counts moved: /a's files and its directories below the top.
        let (files, dirs, _, _) = p1.totals();
        let (root_files, root_dirs, _, _) = root.totals();
        assert_eq!(files, 22);
        assert_eq!(
            root_files + files,
            files_before + 1,
            "/b/g was created meanwhile"
        );
        assert_eq!(
            root_dirs + dirs,
            dirs_before + 2 + 1,
            "/up, /up/a2 and p1's top"
        );
        // The policy went with its directory.
        assert_eq!(p1.inherited_policy("/a/d/new").unwrap().replicas, 2);
        // Chunks: forwarded by the root, owned by the partition.
        assert_eq!(root.chunk_partition(chunk), 1);
        assert!(root.chunk(chunk).is_none() && p1.chunk(chunk).is_some());
        let view = View {
            root: &root,
            parts: BTreeMap::from([(1, &p1)]),
        };
        assert!(view.knows(chunk));
        assert_eq!(view.chunk(chunk).unwrap().0.id, f.id);
        assert!(chunk < view.next_chunk_of(chunk));
        let mut seen = 0;
        let mut cursor = None;
        loop {
            let (got, next) = view.inodes_after(cursor, 5);
            seen += got
                .iter()
                .filter(|i| matches!(i.kind, Kind::File(_)))
                .count();
            match next {
                Some(n) => cursor = Some(n),
                None => break,
            }
        }
        assert_eq!(seen, 24, "the scans' walk meets the moved files");
        let without = View {
            root: &root,
            parts: BTreeMap::new(),
        };
        assert!(
            !without.knows(chunk),
            "outside the view: kept, not an orphan"
        );
        // Both states check clean.
        for st in [&root, &p1] {
            let r = st.check();
            assert_eq!(r.problems, 0, "{:?}", r.listed);
        }
        // The files go on in the partition.
        p1.apply(&Command::Delete {
            path: "/a/top".into(),
        })
        .unwrap();
        create(&mut p1, "/a/x3/new").unwrap();
        assert_eq!(p1.check().problems, 0);
    }

    #[test]
    fn a_large_subtree_loads_in_bounded_batches() {
        let (mut root, mut p1) = setup(1500);
        root.apply(&Command::BeginMove {
            path: "/a".into(),
            to: 1,
            now_ms: 3,
        })
        .unwrap();
        let batches = copy_and_finish(&mut root, &mut p1);
        assert!(batches > 1, "{batches} batch(es)");
        assert_eq!(p1.totals().0, 1502);
        assert_eq!(p1.check().problems, 0, "{:?}", p1.check().listed);
        assert_eq!(root.check().problems, 0, "{:?}", root.check().listed);
    }

    #[test]
    fn loads_are_checked() {
        let (root, mut p1) = setup(2);
        let f = root.lookup("/a/x1/f1").unwrap();
        let load = |inodes: Vec<Inode>, policies| Command::LoadRows {
            top: "/a".into(),
            inodes,
            policies,
        };
        // Its parent (/a/x1) is not loaded.
        assert!(p1.apply(&load(vec![(*f).clone()], vec![])).is_err());
        // Another subtree's rows.
        let mut other = load(vec![], vec![]);
        if let Command::LoadRows { top, .. } = &mut other {
            *top = "/b".into();
        }
        assert!(p1.apply(&other).is_err());
        // An id of the partition's own range that it never allocated.
        let mut own = (*root.lookup("/a/x1").unwrap()).clone();
        own.id = p1.next_inode_id();
        own.parent = ROOT;
        assert!(p1.apply(&load(vec![own], vec![])).is_err());
        // A policy for a file.
        assert!(
            p1.apply(&load(vec![], vec![(f.id, Policy::default())]))
                .is_err()
        );
        assert_eq!(p1.totals(), (0, 1, 0, 0), "nothing loaded");
    }
}
