//! The metadata consistency check (`cairn admin check`; the nemesis runs it after every
//! scenario): one state's tables against each other — every inode reachable from the top by
//! its directory entry, every entry naming its inode, every chunk owned by exactly the file
//! that lists it, ids inside the state's range and below its counters, the stored totals and
//! row counts equal to a recount, the segments' tallies (bytes and extents of each segment
//! the file service's files name) equal to a recount, and the object index's extents naming files that hold them
//! with the packs' live counts equal to what the objects name (objects/check.rs).
//!
//! It reads the whole state under the state machine's lock: milliseconds for thousands of
//! files, about a second per million records (docs/operations.md).

use super::partitions::{ROOT_PARTITION, partition_of};
use super::{ChunkId, InodeId, Kind, ROOT, State};
use std::collections::{BTreeMap, BTreeSet};

/// Problems a report lists; past it they are counted only.
pub const MAX_LISTED: usize = 100;

/// What a check found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub inodes: u64,
    pub chunks: u64,
    pub objects: u64,
    /// Every problem found (`listed` holds the first [`MAX_LISTED`]).
    pub problems: u64,
    pub listed: Vec<String>,
}

impl Report {
    pub fn problem(&mut self, what: String) {
        self.problems += 1;
        if self.listed.len() < MAX_LISTED {
            self.listed.push(what);
        }
    }
}

impl State {
    /// Checks the state's tables against each other.
    pub fn check(&self) -> Report {
        let mut r = Report::default();
        let own = self.home.partition;
        // A partition also holds inodes and chunks that moved into it with their ids: a
        // subtree split from the root (moves.rs), files renamed from other partitions (txn.rs).
        let moved_in = |id: u64| partition_of(id) != own;
        let in_range = |id: u64| id == ROOT || partition_of(id) == own || moved_in(id);
        let mut sum = [0u64; 4];
        let mut rows = 0u64;
        let mut owners: BTreeMap<ChunkId, InodeId> = BTreeMap::new();
        let mut segments: BTreeMap<u64, crate::kv::Tally> = BTreeMap::new();
        for (k, ino) in self.inodes.iter() {
            rows += 1;
            super::disk::inode_segments(&ino, &mut |seg, t| {
                let s = segments.entry(seg).or_default();
                s[0] += t[0];
                s[1] += t[1];
            });
            if k != ino.id {
                r.problem(format!("inode row {k} holds inode {}", ino.id));
            }
            if !in_range(ino.id)
                || (ino.id != ROOT && !moved_in(ino.id) && ino.id >= *self.next_inode)
            {
                r.problem(format!(
                    "inode {} is outside partition {own}'s range or at or past its next id {}",
                    ino.id, *self.next_inode
                ));
            }
            if ino.id != ROOT {
                match self.inodes.get(&ino.parent) {
                    Some(p) if matches!(p.kind, Kind::Dir) => {}
                    Some(_) => r.problem(format!(
                        "inode {}'s parent {} is a file",
                        ino.id, ino.parent
                    )),
                    None => r.problem(format!(
                        "inode {}'s parent {} is missing",
                        ino.id, ino.parent
                    )),
                }
                if self
                    .dentries
                    .get(&(ino.parent, ino.name.clone()))
                    .as_deref()
                    != Some(&ino.id)
                {
                    r.problem(format!(
                        "inode {} ({}) has no entry {:?} in directory {}",
                        ino.id, ino.name, ino.name, ino.parent
                    ));
                }
                if ino.name.is_empty()
                    || ino.name.contains('/')
                    || ino.name == "."
                    || ino.name == ".."
                {
                    r.problem(format!("inode {} has the bad name {:?}", ino.id, ino.name));
                }
            }
            match ino.file() {
                Some(f) => {
                    sum[0] += 1;
                    sum[2] += f.chunks.len() as u64;
                    sum[3] += f.committed_length();
                    for c in &f.chunks {
                        r.chunks += 1;
                        if let Some(other) = owners.insert(c.id, ino.id) {
                            r.problem(format!(
                                "chunk {} is listed by files {other} and {}",
                                c.id, ino.id
                            ));
                        }
                        if self.chunk_owner.get(&c.id).as_deref() != Some(&ino.id) {
                            r.problem(format!(
                                "chunk {} of file {} is not indexed as the file's",
                                c.id, ino.id
                            ));
                        }
                        if !moved_in(c.id)
                            && (partition_of(c.id) != own || c.id >= *self.next_chunk)
                        {
                            r.problem(format!(
                                "chunk {} of file {} is outside partition {own}'s range or at \
                                 or past its next id {}",
                                c.id, ino.id, *self.next_chunk
                            ));
                        }
                        let distinct: BTreeSet<_> = c.servers.iter().collect();
                        if c.ec.is_none() && distinct.len() != c.servers.len() {
                            r.problem(format!(
                                "chunk {} lists a server twice: {:?}",
                                c.id, c.servers
                            ));
                        }
                    }
                }
                None => sum[1] += 1,
            }
        }
        r.inodes = rows;
        if rows != self.inodes.len() {
            r.problem(format!(
                "the inode table counts {} rows and holds {rows}",
                self.inodes.len()
            ));
        }
        if sum != self.inodes.sum() {
            r.problem(format!(
                "the stored totals (files, dirs, chunks, bytes) {:?} differ from a recount {sum:?}",
                self.inodes.sum()
            ));
        }
        let tallied = self.inodes.tallies();
        if tallied != segments {
            let differ: Vec<_> = tallied
                .keys()
                .chain(segments.keys())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .filter(|s| tallied.get(s) != segments.get(s))
                .map(|s| (*s, tallied.get(s), segments.get(s)))
                .collect();
            r.problem(format!(
                "the segments' stored tallies (bytes, extents) differ from a recount at {} \
                 segments, e.g. (segment, stored, recount) {:?}",
                differ.len(),
                &differ[..differ.len().min(3)]
            ));
        }
        let mut entries = 0u64;
        for ((parent, name), id) in self.dentries.iter() {
            entries += 1;
            match self.inodes.get(&*id) {
                Some(ino) if ino.parent == parent && ino.name == name => {}
                Some(ino) => r.problem(format!(
                    "entry {name:?} in directory {parent} names inode {id}, which is {:?} in {}",
                    ino.name, ino.parent
                )),
                None => r.problem(format!(
                    "entry {name:?} in directory {parent} names the missing inode {id}"
                )),
            }
        }
        if entries + 1 != rows.max(1) {
            r.problem(format!(
                "{entries} directory entries for {rows} inodes (every inode but the top has one)"
            ));
        }
        for (c, ino) in self.chunk_owner.iter() {
            if owners.get(&c) != Some(&*ino) {
                r.problem(format!(
                    "chunk {c} is indexed as file {ino}'s, which does not list it"
                ));
            }
        }
        // Reachable from the top: a walk down the entries meets every inode once.
        let mut seen = 1u64;
        let mut dirs = vec![ROOT];
        while let Some(d) = dirs.pop() {
            for ((p, _), id) in self.dentries.range((d, String::new())..) {
                if p != d {
                    break;
                }
                seen += 1;
                if seen > rows + 1 {
                    break;
                }
                if self.inodes.get(&*id).is_some_and(|i| i.file().is_none()) {
                    dirs.push(*id);
                }
            }
        }
        if seen != rows {
            r.problem(format!(
                "{seen} inodes are reachable from the top, of {rows} (a cycle or a detached \
                 subtree)"
            ));
        }
        for (group, conv) in self.conversions.iter() {
            if !owners.contains_key(&conv.chunk) {
                r.problem(format!(
                    "conversion {group} converts chunk {}, which no file lists",
                    conv.chunk
                ));
            }
        }
        for dir in self.dir_policies.keys() {
            if self.inodes.get(dir).is_none_or(|i| i.file().is_some()) {
                r.problem(format!("a default policy names {dir}, not a directory"));
            }
        }
        if own == ROOT_PARTITION {
            for (top, p) in self.subtrees.iter() {
                if !self.partitions.partitions.contains_key(p) {
                    r.problem(format!(
                        "subtree {top} is sent to partition {p}, not in the map"
                    ));
                }
                // Its directory is in the partition its parent is in (that one checks it
                // when it is not the root).
                let parent = top.rsplit_once('/').map_or("/", |(p, _)| p);
                if self
                    .route(if parent.is_empty() { "/" } else { parent })
                    .partition
                    != ROOT_PARTITION
                {
                    continue;
                }
                match self.lookup_here(top) {
                    Some(ino) if ino.file().is_none() && !self.has_entries(ino.id) => {}
                    Some(_) => r.problem(format!(
                        "subtree {top}'s directory in the root is a file or holds entries"
                    )),
                    None => r.problem(format!("subtree {top} has no directory in the root")),
                }
            }
            for (c, p) in self.forwards.iter() {
                if *p != ROOT_PARTITION && !self.partitions.partitions.contains_key(&*p) {
                    r.problem(format!(
                        "chunk {c} is forwarded to partition {}, not in the map",
                        *p
                    ));
                }
            }
        } else {
            if !self.partitions.partitions.is_empty() || !self.txns.open.is_empty() {
                r.problem(format!(
                    "partition {own} holds a partition map or renames' intents"
                ));
            }
            // Subtrees it moved out: below its top, their directories here and empty.
            for (top, p) in self.subtrees.iter() {
                let below =
                    super::moves::at_or_below(top, &self.home.path) && *top != self.home.path;
                match self.lookup_here(top) {
                    Some(ino) if below && ino.file().is_none() && !self.has_entries(ino.id) => {}
                    _ => r.problem(format!(
                        "subtree {top}, moved out to partition {p}, is not an empty directory \
                         below this partition's top"
                    )),
                }
            }
        }
        for (c, p) in self.forwards.iter() {
            if owners.contains_key(&c) || partition_of(c) != own || *p == own {
                r.problem(format!(
                    "chunk {c} is forwarded to partition {} but listed here, not allocated \
                     here, or forwarded here",
                    *p
                ));
            }
        }
        self.check_links(&mut r);
        self.check_objects(&mut r);
        r
    }

    /// The inode at `path` in this state's own tables (no routing by the partition map; a
    /// partition's paths below its top directory, which is its inode 1).
    pub(super) fn lookup_here(&self, path: &str) -> Option<std::sync::Arc<super::Inode>> {
        let top = self.home.path.trim_end_matches('/');
        let rest = if top.is_empty() {
            path
        } else if path == top {
            ""
        } else {
            path.strip_prefix(top)?.strip_prefix('/')?
        };
        let mut cur = ROOT;
        for name in rest.split('/').filter(|s| !s.is_empty()) {
            cur = *self.dentries.get(&(cur, name.to_owned()))?;
        }
        self.inodes.get(&cur)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;

    fn create(st: &mut State, path: &str) {
        let dir = &path[..path.rfind('/').unwrap()];
        if !dir.is_empty() {
            let r = st.apply(&Command::Mkdir {
                path: dir.into(),
                parents: true,
                now_ms: 1,
                policy: None,
                mode: None,
            });
            assert!(r.is_ok() || st.lookup(dir).is_ok(), "{r:?}");
        }
        let r = crate::state::tests::create(st, path, None, 1);
        assert!(r.is_ok(), "{r:?}");
    }

    #[test]
    fn a_state_built_by_commands_is_consistent() {
        let mut st = State::default();
        create(&mut st, "/a/b/f");
        create(&mut st, "/a/g");
        let r = st.check();
        assert_eq!(r.problems, 0, "{:?}", r.listed);
        assert_eq!((r.inodes, r.chunks), (5, 2));
    }

    /// Canary: each kind of damage is found.
    #[test]
    fn damage_is_found() {
        let mut st = State::default();
        create(&mut st, "/a/f");
        create(&mut st, "/a/g");
        let f = st.lookup("/a/f").unwrap();
        let chunk = f.file().unwrap().chunks[0].id;

        let mut lost_entry = st.clone();
        lost_entry.dentries.remove(&(f.parent, "f".into()));
        let r = lost_entry.check();
        assert!(r.problems >= 2, "{:?}", r.listed);
        assert!(
            r.listed.iter().any(|p| p.contains("reachable")),
            "{:?}",
            r.listed
        );

        let mut stray_chunk = st.clone();
        stray_chunk.chunk_owner.insert(chunk + 100, f.id);
        let r = stray_chunk.check();
        assert!(
            r.listed.iter().any(|p| p.contains("does not list it")),
            "{:?}",
            r.listed
        );

        let mut shared = st.clone();
        let g = shared.lookup("/a/g").unwrap().id;
        let Kind::File(meta) = &mut shared.inodes.get_mut(&g).unwrap().kind else {
            panic!("a file")
        };
        meta.chunks[0].id = chunk;
        let r = shared.check();
        assert!(
            r.listed.iter().any(|p| p.contains("listed by files")),
            "{:?}",
            r.listed
        );
    }
}
