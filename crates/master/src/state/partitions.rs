//! The partition map (docs/partitions.md): which partitions exist, which masters host them
//! and which subtrees they hold. It lives in the root partition's state, changed only by root
//! commands, so every master has it (in its root replica) with every change in log order. A
//! partition's own state knows its subtree ([`Home`]) and allocates ids carrying its number.

use super::{InodeId, Kind, ROOT, Reply, Response, State};
use cairn_rpc::{ErrorKind, MetaError, components};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// A partition's number; 0 is the root.
pub type PartitionId = u32;

/// The root partition: the group every cluster had before partitions.
pub const ROOT_PARTITION: PartitionId = 0;

/// At most this many partitions besides the root (ids carry the partition in 16 bits).
pub const MAX_PARTITIONS: usize = 4096;

/// Inode and chunk ids carry the partition that allocated them in their top 16 bits.
pub const ID_SHIFT: u32 = 48;

/// The partition that allocated inode or chunk `id`.
pub fn partition_of(id: u64) -> PartitionId {
    (id >> ID_SHIFT) as PartitionId
}

/// The first id of partition `p`'s range.
pub fn id_base(p: PartitionId) -> u64 {
    u64::from(p) << ID_SHIFT
}

/// The subtree a partition's state holds: the root's is partition 0 at `/` (path empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Home {
    pub partition: PartitionId,
    /// The subtree's top directory (`/a/b`); empty for the root partition's `/`.
    pub path: String,
}

/// A partition in the map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRecord {
    /// The masters that host it (its Raft group's members).
    pub members: BTreeSet<u64>,
    pub created_ms: u64,
}

/// The partitions besides the root, by number.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionMap {
    pub partitions: BTreeMap<PartitionId, PartitionRecord>,
}

/// Where a path lives: its partition and that partition's top directory (`/` for the root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub partition: PartitionId,
    pub top: String,
}

impl State {
    pub fn partitions(&self) -> &PartitionMap {
        &self.partitions
    }

    /// Subtrees held by partitions other than the root, by top directory (root's state).
    pub fn subtrees(&self) -> &BTreeMap<String, PartitionId> {
        &self.subtrees
    }

    /// The subtree this state holds.
    pub fn home(&self) -> &Home {
        &self.home
    }

    /// The partition `path` lives in by this (the root's) map: the subtree with the longest
    /// top directory that is `path` or above it, or the shard of a hashed directory that
    /// `path` is below (by the name right below it: hashed.rs); the root's when none.
    pub fn route(&self, path: &str) -> Route {
        if (!self.subtrees.is_empty() || !self.hashed.is_empty())
            && let Ok(comps) = components(path)
        {
            for n in (1..=comps.len()).rev() {
                let top = format!("/{}", comps[..n].join("/"));
                if let Some(p) = self.subtrees.get(&top) {
                    return Route { partition: *p, top };
                }
                if n < comps.len()
                    && let Some(shards) = self.hashed.get(&top)
                {
                    let partition = super::hashed::shard_for(shards, comps[n]);
                    return Route { partition, top };
                }
            }
        }
        Route {
            partition: super::partitions::ROOT_PARTITION,
            top: "/".to_owned(),
        }
    }

    /// The id a reply shows for inode `id`: a partition's top directory is inode 1 in its
    /// state and shows as the first id of the partition's range.
    pub fn public_id(&self, id: InodeId) -> InodeId {
        if id == ROOT && self.home.partition != ROOT_PARTITION {
            id_base(self.home.partition) | ROOT
        } else {
            id
        }
    }

    /// `path`'s components below this state's top directory.
    ///
    /// # Errors
    /// A bad path; `Unavailable` when `path` is not in this partition (the map changed since
    /// the call was routed: the caller retries, routed anew).
    pub(super) fn local_components<'p>(&self, path: &'p str) -> Result<Vec<&'p str>, MetaError> {
        let comps = components(path)?;
        let moved = |p: PartitionId| {
            MetaError::new(
                ErrorKind::Unavailable,
                format!("{path} is in partition {p}, not this one (retry)"),
            )
        };
        if self.home.partition == ROOT_PARTITION {
            let r = self.route(path);
            if r.partition != ROOT_PARTITION {
                return Err(moved(r.partition));
            }
            return Ok(comps);
        }
        let top = components(&self.home.path)?;
        if comps.len() < top.len() || comps[..top.len()] != top[..] {
            return Err(moved(ROOT_PARTITION));
        }
        // A subtree this partition moved out (moves.rs) is another's.
        if let Some(p) = self.delegated(path) {
            return Err(moved(p));
        }
        Ok(comps[top.len()..].to_vec())
    }

    /// The partition a subtree this (non-root) partition moved out went to, when `path` is
    /// at or below it.
    fn delegated(&self, path: &str) -> Option<PartitionId> {
        if self.subtrees.is_empty() && self.hashed.is_empty() {
            return None;
        }
        let comps = components(path).ok()?;
        (1..=comps.len()).rev().find_map(|n| {
            let top = format!("/{}", comps[..n].join("/"));
            if let Some(p) = self.subtrees.get(&top) {
                return Some(*p);
            }
            let shards = self.hashed.get(&top).filter(|_| n < comps.len())?;
            Some(super::hashed::shard_for(shards, comps[n]))
        })
    }

    /// Whether a subtree held by another partition, or being moved into one, is at `path`
    /// or below it (root's state).
    pub(super) fn holds_subtree(&self, path: &str) -> bool {
        let below = format!("{}/", path.trim_end_matches('/'));
        self.moving()
            .is_some_and(|m| super::moves::at_or_below(&m.path, path))
            || self.subtrees.contains_key(path)
            || self
                .subtrees
                .range(below.clone()..)
                .next()
                .is_some_and(|(k, _)| k.starts_with(&below))
            || self.hashed.contains_key(path)
            || self
                .hashed
                .range(below.clone()..)
                .next()
                .is_some_and(|(k, _)| k.starts_with(&below))
    }

    /// Makes this state partition `partition`'s, holding the subtree at `path` (applied in
    /// that partition, before the root's map sends anything to it): ids from the partition's
    /// range, the top directory with `owner` and `mode`. Repeating it is a no-op.
    pub(super) fn init_partition(
        &mut self,
        partition: PartitionId,
        path: &str,
        owner: &str,
        mode: u16,
        now_ms: u64,
    ) -> Response {
        if partition == ROOT_PARTITION || partition as usize > MAX_PARTITIONS {
            return Err(MetaError::invalid(format!(
                "partition {partition} cannot hold a subtree"
            )));
        }
        let home = Home {
            partition,
            path: path.to_owned(),
        };
        if *self.home == home {
            return self.reply(ROOT);
        }
        if self.home.partition != ROOT_PARTITION || self.has_entries(ROOT) {
            return Err(MetaError::new(
                ErrorKind::AlreadyExists,
                format!(
                    "this partition holds {} already",
                    if self.home.path.is_empty() {
                        "entries"
                    } else {
                        &self.home.path
                    }
                ),
            ));
        }
        if components(path)?.is_empty() {
            return Err(MetaError::invalid("/ stays in the root partition"));
        }
        super::perm::check_mode(Some(mode))?;
        *self.home = home;
        let base = id_base(partition);
        *self.next_inode = (*self.next_inode).max(base | (ROOT + 1));
        *self.next_chunk = (*self.next_chunk).max(base | 1);
        let top = self
            .inodes
            .get_mut(&ROOT)
            .expect("the top directory exists");
        top.owner = owner.to_owned();
        top.mode = mode;
        top.ctime_ms = now_ms;
        top.mtime_ms = now_ms;
        self.reply(ROOT)
    }

    /// Sends the subtree at `path` to `partition` (the root's command, after that partition
    /// applied [`Command::InitPartition`](super::Command::InitPartition)). The directory is
    /// made when missing; an existing one must be empty (moving what is in it is a split
    /// with copying: docs/partitions.md) and still have the `owner` and `mode` the partition
    /// took for its top.
    pub(super) fn assign_subtree(
        &mut self,
        path: &str,
        partition: PartitionId,
        owner: &str,
        mode: u16,
        now_ms: u64,
    ) -> Response {
        if self.home.partition != ROOT_PARTITION {
            return Err(MetaError::invalid(
                "subtrees are assigned by the root partition",
            ));
        }
        self.check_target(partition)?;
        if let Some(n) = cairn_rpc::object::data_dir_shard(path)
            && n != partition
        {
            return Err(MetaError::invalid(format!(
                "{path} is partition {n}'s bucket shard directory, not partition {partition}'s"
            )));
        }
        let id = match self.check_splittable(path)? {
            Some(ino) => {
                if ino.owner != owner || ino.mode != mode {
                    return Err(MetaError::new(
                        ErrorKind::Unavailable,
                        format!("{path}: its owner or mode changed during the split (retry)"),
                    ));
                }
                ino.id
            }
            None => {
                let (parent, name) = self.parent_for_new(path, true, now_ms)?;
                self.insert(parent, &name, now_ms, Kind::Dir, Some(mode))
            }
        };
        if let Some(ino) = self.inodes.get_mut(&id) {
            ino.owner = owner.to_owned();
        }
        self.subtrees.insert(path.to_owned(), partition);
        self.reply(id)
    }

    /// Adds a partition hosted by `members`; its number is the lowest unused one.
    pub(super) fn add_partition(&mut self, members: &[u64], now_ms: u64) -> Response {
        if members.is_empty() || members.contains(&0) {
            return Err(MetaError::invalid(
                "a partition needs masters to host it (ids ≥ 1)",
            ));
        }
        if self.partitions.partitions.len() >= MAX_PARTITIONS {
            return Err(MetaError::invalid(format!(
                "there are {MAX_PARTITIONS} partitions already"
            )));
        }
        let id = (1..)
            .find(|i| !self.partitions.partitions.contains_key(i))
            .expect("fewer than MAX_PARTITIONS are taken");
        self.partitions.partitions.insert(
            id,
            PartitionRecord {
                members: members.iter().copied().collect(),
                created_ms: now_ms,
            },
        );
        Ok(Reply {
            partition: Some(id),
            ..Reply::default()
        })
    }

    /// Whether the subtree at `path` can go to another partition as it is (root's state):
    /// [`State::check_movable`], and missing (`None`) or an empty directory (returned).
    ///
    /// # Errors
    /// Why not; `DirectoryNotEmpty` for a populated directory (which moves by copying:
    /// moves.rs).
    pub fn check_splittable(
        &self,
        path: &str,
    ) -> Result<Option<std::sync::Arc<super::Inode>>, MetaError> {
        let ino = self.check_movable(path)?;
        if let Some(i) = &ino
            && self.has_entries(i.id)
        {
            return Err(MetaError::new(
                ErrorKind::DirectoryNotEmpty,
                format!("{path} is not empty: its rows move by copying"),
            ));
        }
        Ok(ino)
    }

    /// Whether the subtree at `path` can go to another partition (root's state): not `/`,
    /// not a service's directory, not inside or above another partition's subtree (or the
    /// one being moved), and missing (`None`) or a directory (returned).
    ///
    /// # Errors
    /// Why not.
    pub fn check_movable(
        &self,
        path: &str,
    ) -> Result<Option<std::sync::Arc<super::Inode>>, MetaError> {
        let comps = components(path)?;
        if comps.is_empty() {
            return Err(MetaError::invalid("/ stays in the root partition"));
        }
        // A bucket shard's data directory, `/.s3/p/N`, is the one service directory that
        // goes (to partition N: objects/buckets.rs).
        let shard_dir = cairn_rpc::object::data_dir_shard(path)
            .is_some_and(|n| cairn_rpc::object::data_dir(Some(n)) == path);
        if comps[0].starts_with('.') && !shard_dir {
            return Err(MetaError::invalid(format!(
                "{path}: the services' own directories (/.name) stay in the root partition"
            )));
        }
        if self.home.partition == ROOT_PARTITION {
            let r = self.route(path);
            if r.partition != ROOT_PARTITION {
                return Err(MetaError::invalid(format!(
                    "{path} is inside {}, held by partition {}: split it there",
                    r.top, r.partition
                )));
            }
        } else {
            // Strictly below this partition's top (its top moves with the partition), and
            // not in a subtree it gave away.
            let top = components(&self.home.path)?;
            if comps.len() <= top.len() || comps[..top.len()] != top[..] {
                return Err(MetaError::invalid(format!(
                    "{path} is not below {}, partition {}'s top",
                    self.home.path, self.home.partition
                )));
            }
            if let Some(p) = self.delegated(path) {
                return Err(MetaError::invalid(format!(
                    "{path} is held by partition {p}: split it there"
                )));
            }
        }
        if self.holds_subtree(path) {
            return Err(MetaError::invalid(format!(
                "{path} holds another partition's subtree"
            )));
        }
        if let Some(m) = self.moving()
            && super::moves::at_or_below(path, &m.path)
        {
            return Err(MetaError::new(
                ErrorKind::Unavailable,
                format!("{path} is inside {}, being moved (retry)", m.path),
            ));
        }
        match self.lookup(path) {
            Ok(ino) => {
                if ino.file().is_some() {
                    return Err(MetaError::new(
                        ErrorKind::NotADirectory,
                        format!("{path}: not a directory"),
                    ));
                }
                // Hard links stay in their node's partition (files/links.rs).
                self.refuse_ties(path, false)?;
                Ok(Some(ino))
            }
            Err(e) if e.kind == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether partition `to` can take a subtree (root's state): it is in the map and holds
    /// none, nor is one moving into it.
    pub(crate) fn check_target(&self, to: PartitionId) -> Result<(), MetaError> {
        if !self.partitions.partitions.contains_key(&to) {
            return Err(MetaError::not_found(format!("partition {to}")));
        }
        if let Some((top, _)) = self.subtrees.iter().find(|(_, p)| **p == to) {
            return Err(MetaError::new(
                ErrorKind::AlreadyExists,
                format!("partition {to} holds {top} already"),
            ));
        }
        if let Some(m) = self.moving()
            && (m.to == to || self.move_shards.contains(&to))
        {
            return Err(MetaError::new(
                ErrorKind::AlreadyExists,
                format!("{} is moving into partition {to}", m.path),
            ));
        }
        if let Some((top, _)) = self.hashed.iter().find(|(_, s)| s.contains(&to)) {
            return Err(MetaError::new(
                ErrorKind::AlreadyExists,
                format!("partition {to} is a shard of {top} already"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;

    #[test]
    fn partitions_take_the_lowest_free_number() {
        let mut st = State::default();
        let add = |st: &mut State, members: Vec<u64>| {
            st.apply(&Command::AddPartition { members, now_ms: 7 })
        };
        assert_eq!(add(&mut st, vec![1, 2, 3]).unwrap().partition, Some(1));
        assert_eq!(add(&mut st, vec![2]).unwrap().partition, Some(2));
        let p = &st.partitions().partitions;
        assert_eq!(p[&1].members, BTreeSet::from([1, 2, 3]));
        assert_eq!(p[&2].created_ms, 7);
        assert!(add(&mut st, vec![]).is_err());
        assert!(add(&mut st, vec![0, 1]).is_err());
        assert_eq!(st.partitions().partitions.len(), 2);
    }

    fn mkdir(st: &mut State, path: &str) -> Response {
        st.apply(&Command::Mkdir {
            path: path.into(),
            parents: true,
            now_ms: 1,
            policy: None,
            mode: None,
        })
    }

    fn assign(st: &mut State, path: &str, partition: u32, mode: u16) -> Response {
        st.apply(&Command::AssignSubtree {
            path: path.into(),
            partition,
            owner: String::new(),
            mode,
            now_ms: 2,
        })
    }

    #[test]
    fn a_subtree_routes_to_its_partition_by_longest_top() {
        let mut root = State::default();
        for m in [vec![1], vec![1]] {
            root.apply(&Command::AddPartition {
                members: m,
                now_ms: 1,
            })
            .unwrap();
        }
        mkdir(&mut root, "/a/full/x").unwrap();
        mkdir(&mut root, "/a/empty").unwrap();
        // Refused: a populated directory, a file's path, `/`, a service directory, a
        // partition that does not exist, a changed mode.
        let e = assign(&mut root, "/a/full", 1, 0o755).unwrap_err();
        assert_eq!(e.kind, ErrorKind::DirectoryNotEmpty);
        assert!(assign(&mut root, "/", 1, 0o755).is_err());
        assert!(assign(&mut root, "/.s3/b", 1, 0o755).is_err());
        assert_eq!(
            assign(&mut root, "/new", 9, 0o755).unwrap_err().kind,
            ErrorKind::NotFound
        );
        assert_eq!(
            assign(&mut root, "/a/empty", 1, 0o700).unwrap_err().kind,
            ErrorKind::Unavailable
        );
        assert!(root.subtrees().is_empty());
        assign(&mut root, "/a/empty", 1, 0o755).unwrap();
        // A missing directory is made.
        assign(&mut root, "/b/c", 2, 0o755).unwrap();
        assert!(root.lookup("/b").is_ok());
        // One subtree per partition; no subtree inside another's.
        assert!(assign(&mut root, "/z", 1, 0o755).is_err());
        let r = |p: &str| root.route(p);
        assert_eq!(r("/a/empty").partition, 1);
        assert_eq!(r("/a/empty/x/y").partition, 1);
        assert_eq!(r("/a/empty/x/y").top, "/a/empty");
        assert_eq!(r("/a/emptyx").partition, 0);
        assert_eq!(r("/a").partition, 0);
        assert_eq!(r("/b/c/d").partition, 2);
        // The root refuses paths it no longer holds, and renaming what holds a subtree.
        assert_eq!(
            mkdir(&mut root, "/a/empty/late").unwrap_err().kind,
            ErrorKind::Unavailable
        );
        assert!(root.lookup("/a/empty").is_err());
        let rename = Command::Rename {
            from: "/a".into(),
            to: "/q".into(),
            now_ms: 3,
        };
        assert!(root.apply(&rename).is_err());
        assert!(root.holds_subtree("/a") && root.holds_subtree("/a/empty"));
        assert!(!root.holds_subtree("/a/full"));
    }

    #[test]
    fn a_partition_holds_its_subtree_with_ids_of_its_range() {
        let mut p = State::default();
        let init = Command::InitPartition {
            partition: 3,
            path: "/a/b".into(),
            owner: "alice".into(),
            mode: 0o750,
            now_ms: 5,
        };
        p.apply(&init).unwrap();
        // Again: a no-op; another subtree: refused.
        p.apply(&init).unwrap();
        let other = Command::InitPartition {
            partition: 3,
            path: "/c".into(),
            owner: String::new(),
            mode: 0o755,
            now_ms: 5,
        };
        assert_eq!(p.apply(&other).unwrap_err().kind, ErrorKind::AlreadyExists);
        let top = p.lookup("/a/b").unwrap();
        assert_eq!((top.owner.as_str(), top.mode), ("alice", 0o750));
        assert_eq!(p.public_id(top.id), id_base(3) | 1);
        mkdir(&mut p, "/a/b/x/y").unwrap();
        let y = p.lookup("/a/b/x/y").unwrap();
        assert_eq!(partition_of(y.id), 3);
        assert_eq!(p.path_of(y.id), "/a/b/x/y");
        assert_eq!(p.path_of(top.id), "/a/b");
        assert_eq!(p.list("/a/b").unwrap().len(), 1);
        p.apply(&Command::Create {
            path: "/a/b/x/f".into(),
            policy: crate::state::Policy::default(),
            parents: false,
            now_ms: 6,
            lease: None,
            placements: vec![vec![1, 2, 3]],
            groups: false,
            mode: None,
        })
        .unwrap();
        let c = p.chunks().next().unwrap();
        assert_eq!(partition_of(c.id), 3);
        // Paths outside the subtree are not here.
        assert_eq!(p.lookup("/a").unwrap_err().kind, ErrorKind::Unavailable);
        assert_eq!(
            mkdir(&mut p, "/c").unwrap_err().kind,
            ErrorKind::Unavailable
        );
        assert!(
            p.apply(&Command::Delete {
                path: "/a/b".into()
            })
            .is_err()
        );
    }
}
