//! Directories hashed over several partitions (docs/partitions.md, "Hashed directories"): a
//! directory whose entries are too many or too busy for one partition keeps its own entry
//! where it was (its *source* partition) and spreads what is below it over K partitions of
//! its own, its *shards*: the entry `name` right below it, with everything under that entry,
//! lives in shard `shards[fnv1a64(name) mod K]` (`cairn_rpc::object::shard_of`, the hash S3
//! buckets' keys use). Each shard's state holds the directory as its top (inode 1), with the
//! entries that hash to it.
//!
//! The source records the directory in its `hashed` cell (`path → shards`) and from then on
//! refuses paths below it (`unavailable`: routed anew) and deleting or renaming it; in the
//! root that cell is part of the map, so the root's [`State::route`] sends a path below the
//! directory to its shard. An empty directory is hashed in one step ([`Command::HashDir`]); a
//! populated one's rows move to their shards by the split's copy (moves.rs:
//! [`Command::BeginHashMove`], `LoadRows` into each shard, `SealLoad`, `TxForward` of every
//! chunk to its file's shard, and a [`Command::FinishMove`] that records the directory hashed
//! rather than delegated).

use super::partitions::{PartitionId, ROOT_PARTITION};
use super::{Kind, Response, State};
use cairn_rpc::{ErrorKind, MetaError};
use std::collections::BTreeMap;

/// Most shards a directory is hashed over.
pub const MAX_DIR_SHARDS: usize = 64;

/// The shard of the entry `name` right below a directory hashed over `shards`.
pub fn shard_for(shards: &[PartitionId], name: &str) -> PartitionId {
    cairn_rpc::object::shard_of(name, shards).unwrap_or(ROOT_PARTITION)
}

impl State {
    /// Directories hashed over shards: in the root, every one (the map); in another
    /// partition, those it hashed away.
    pub fn hashed(&self) -> &BTreeMap<String, Vec<PartitionId>> {
        &self.hashed
    }

    /// The partition (source) holding the directory at `path` hashes it over `shards`:
    /// it must be missing (it is made, with `mode`) or an empty directory, movable as a
    /// split's top is, and every shard (root: checked here; elsewhere by the root's
    /// [`Command::DelegateHashed`]) a partition that holds nothing yet. In the root the map
    /// routes below `path` by hash from this entry on. Repeating it is a no-op.
    pub(super) fn hash_dir(
        &mut self,
        path: &str,
        shards: &[PartitionId],
        mode: u16,
        now_ms: u64,
    ) -> Response {
        if let Some(have) = self.hashed.get(path) {
            if have.as_slice() == shards {
                return self.reply(self.lookup(path)?.id);
            }
            return Err(MetaError::new(
                ErrorKind::AlreadyExists,
                format!("{path} is hashed over partitions {have:?} already"),
            ));
        }
        check_shards(shards)?;
        if self.home.partition == ROOT_PARTITION {
            for s in shards {
                self.check_target(*s)?;
            }
        } else if shards.contains(&self.home.partition) {
            return Err(MetaError::invalid(format!(
                "partition {} cannot be a shard of its own directory",
                self.home.partition
            )));
        }
        let id = match self.check_splittable(path)? {
            Some(ino) => ino.id,
            None => {
                let (parent, name) = self.parent_for_new(path, true, now_ms)?;
                self.insert(parent, &name, now_ms, Kind::Dir, Some(mode))
            }
        };
        self.hashed.insert(path.to_owned(), shards.to_vec());
        self.reply(id)
    }

    /// After partition `from` hashed `path` over `shards` (root's state): the map routes
    /// below `path` to them. Repeating it is a no-op.
    ///
    /// # Errors
    /// `from` is the root (its own `HashDir` changes the map), `path` is not below partition
    /// `from`'s top, or a shard is not a partition that holds nothing.
    pub(super) fn delegate_hashed(
        &mut self,
        path: &str,
        from: PartitionId,
        shards: &[PartitionId],
    ) -> Response {
        if self.home.partition != ROOT_PARTITION || from == ROOT_PARTITION {
            return Err(MetaError::invalid(
                "a hashed directory is delegated in the root's map, from a partition other \
                 than the root",
            ));
        }
        if self
            .hashed
            .get(path)
            .is_some_and(|s| s.as_slice() == shards)
        {
            return self.reply(super::ROOT);
        }
        check_shards(shards)?;
        let r = self.route(path);
        if r.partition != from || r.top == path {
            return Err(MetaError::invalid(format!(
                "{path} is in partition {} (at {}), not below partition {from}'s top",
                r.partition, r.top
            )));
        }
        for s in shards {
            self.check_target(*s)?;
        }
        self.hashed.insert(path.to_owned(), shards.to_vec());
        self.reply(super::ROOT)
    }

    /// Refuses deleting the directory at `path` when it is hashed over shards.
    pub(super) fn refuse_hashed(&self, path: &str, what: &str) -> Result<(), MetaError> {
        match self.hashed.get(path) {
            Some(s) => Err(MetaError::invalid(format!(
                "{path} is hashed over partitions {s:?}: it cannot be {what}"
            ))),
            None => Ok(()),
        }
    }
}

pub(super) fn check_shards(shards: &[PartitionId]) -> Result<(), MetaError> {
    let distinct: std::collections::BTreeSet<_> = shards.iter().collect();
    if shards.len() < 2 || shards.len() > MAX_DIR_SHARDS || distinct.len() != shards.len() {
        return Err(MetaError::invalid(format!(
            "a directory is hashed over 2 to {MAX_DIR_SHARDS} distinct partitions, not {shards:?}"
        )));
    }
    if shards.contains(&ROOT_PARTITION) {
        return Err(MetaError::invalid("the root partition cannot be a shard"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;
    use crate::state::tests::{partition_state, unavailable};

    fn add_partitions(root: &mut State, n: usize) {
        for _ in 0..n {
            root.apply(&Command::AddPartition {
                members: vec![1],
                now_ms: 1,
            })
            .unwrap();
        }
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

    fn hash(path: &str, shards: &[u32]) -> Command {
        Command::HashDir {
            path: path.into(),
            shards: shards.to_vec(),
            mode: 0o755,
            now_ms: 1,
        }
    }

    #[test]
    fn a_hashed_directory_routes_each_name_below_it_to_its_shard() {
        let mut root = State::default();
        add_partitions(&mut root, 3);
        mkdir(&mut root, "/h/full/x").unwrap();
        // Populated, a single shard, a shard twice, the root as a shard: refused.
        for (path, shards) in [
            ("/h/full", &[1, 2][..]),
            ("/h/new", &[1][..]),
            ("/h/new", &[1, 1][..]),
            ("/h/new", &[0, 1][..]),
        ] {
            assert!(
                root.apply(&hash(path, shards)).is_err(),
                "{path} {shards:?}"
            );
        }
        root.apply(&hash("/h/new", &[1, 2])).unwrap();
        root.apply(&hash("/h/new", &[1, 2])).unwrap(); // repeated: a no-op
        assert!(root.apply(&hash("/h/new", &[1, 3])).is_err());
        // A shard takes no other subtree, nor is it a shard twice.
        assert!(root.apply(&hash("/h/other", &[2, 3])).is_err());
        assert!(
            root.apply(&Command::AssignSubtree {
                path: "/s".into(),
                partition: 1,
                owner: String::new(),
                mode: 0o755,
                now_ms: 1,
            })
            .is_err()
        );
        let shards = [1, 2];
        let mut seen = std::collections::BTreeSet::new();
        for name in ["a", "b", "c", "d", "e", "f"] {
            let r = root.route(&format!("/h/new/{name}/deeper"));
            assert_eq!(r.partition, shard_for(&shards, name));
            assert_eq!(r.top, "/h/new");
            seen.insert(r.partition);
        }
        assert_eq!(seen.len(), 2, "names spread over both shards");
        // The directory itself is its source's: listed, stat'ed, never deleted or renamed.
        assert_eq!(root.route("/h/new").partition, ROOT_PARTITION);
        assert!(root.lookup("/h/new").is_ok());
        assert!(unavailable(mkdir(&mut root, "/h/new/a")));
        assert!(
            root.apply(&Command::Delete {
                path: "/h/new".into()
            })
            .is_err()
        );
        for (from, to) in [("/h/new", "/h/moved"), ("/h", "/h2")] {
            let r = root.apply(&Command::Rename {
                from: from.into(),
                to: to.into(),
                now_ms: 1,
            });
            assert!(r.is_err(), "{from}");
        }
        // A shard holds the names that hash to it.
        let mut s = partition_state(shard_for(&shards, "a"), "/h/new");
        mkdir(&mut s, "/h/new/a/deeper").unwrap();
        assert!(s.lookup("/h/new/a/deeper").is_ok());
    }

    /// A populated directory of the root hashes over two shards: frozen, its rows loaded into
    /// the shard of their first name below it (as the driver does), every chunk forwarded by
    /// the root to its file's shard, then finished: hashed, not delegated.
    #[test]
    fn a_populated_directory_moves_to_its_shards_by_name() {
        use crate::view::{StateView, View};
        let mut root = State::default();
        add_partitions(&mut root, 2);
        let files: Vec<(String, u64)> = ["/h/a/x", "/h/a/y/z", "/h/b", "/h/c/d", "/h/e"]
            .iter()
            .map(|p| {
                let ino = crate::state::tests::create_file(&mut root, p, 1);
                (p.to_string(), ino.id)
            })
            .collect();
        let shards = [1, 2];
        let mut parts = [partition_state(1, "/h"), partition_state(2, "/h")];
        root.apply(&Command::BeginHashMove {
            path: "/h".into(),
            shards: shards.to_vec(),
            now_ms: 1,
        })
        .unwrap();
        assert!(unavailable(mkdir(&mut root, "/h/new")), "frozen");
        assert!(root.lookup("/h/a/x").is_ok(), "reads go on");
        // The driver's walk.
        let mut cursor = crate::state::moves::RowsCursor::new(&root, "/h").unwrap();
        let mut dir_shard = std::collections::HashMap::new();
        let mut forwards: Vec<(u64, PartitionId)> = Vec::new();
        while let Some((inodes, policies)) = root.rows_batch(&mut cursor) {
            assert!(policies.is_empty());
            for ino in inodes {
                let to = if ino.parent == crate::state::ROOT {
                    shard_for(&shards, &ino.name)
                } else {
                    dir_shard[&ino.parent]
                };
                if ino.file().is_none() {
                    dir_shard.insert(ino.id, to);
                }
                for c in ino.file().iter().flat_map(|f| f.chunks.iter()) {
                    forwards.push((c.id, to));
                }
                let st = &mut parts[(to - 1) as usize];
                st.apply(&Command::LoadRows {
                    top: "/h".into(),
                    inodes: vec![ino],
                    policies: vec![],
                })
                .unwrap();
            }
        }
        for st in &mut parts {
            st.apply(&Command::SealLoad { top: "/h".into() }).unwrap();
        }
        for (c, to) in &forwards {
            root.apply(&Command::TxForward {
                chunks: vec![*c],
                to: *to,
            })
            .unwrap();
        }
        root.apply(&Command::FinishMove {
            path: "/h".into(),
            to: 1,
        })
        .unwrap();
        assert_eq!(
            root.hashed().get("/h").map(Vec::as_slice),
            Some(&shards[..])
        );
        assert!(root.subtrees().get("/h").is_none(), "hashed, not delegated");
        assert!(root.moving().is_none() && root.move_shards().is_empty());
        let view = View {
            root: &root,
            parts: std::collections::BTreeMap::from([(1, &parts[0]), (2, &parts[1])]),
        };
        for (path, id) in &files {
            let r = root.route(path);
            let name = path.split('/').nth(2).unwrap();
            assert_eq!(r.partition, shard_for(&shards, name), "{path}");
            let st = &parts[(r.partition - 1) as usize];
            assert_eq!(st.lookup(path).unwrap().id, *id, "{path}");
            let chunk = st.inode(*id).unwrap().file().unwrap().chunks[0].id;
            assert_eq!(
                view.chunk(chunk).unwrap().0.id,
                *id,
                "{path}: its chunk resolves"
            );
        }
        assert!(root.lookup("/h").is_ok(), "the directory's entry stays");
        for st in [&root, &parts[0], &parts[1]] {
            let r = st.check();
            assert_eq!(r.problems, 0, "{:?}", r.listed);
        }
    }

    #[test]
    fn a_directory_inside_a_partition_hashes_and_the_root_is_told() {
        let mut root = State::default();
        add_partitions(&mut root, 3);
        root.apply(&Command::AssignSubtree {
            path: "/p".into(),
            partition: 1,
            owner: String::new(),
            mode: 0o755,
            now_ms: 1,
        })
        .unwrap();
        let mut p1 = partition_state(1, "/p");
        assert!(
            p1.apply(&hash("/p/h", &[1, 2])).is_err(),
            "not its own shard"
        );
        p1.apply(&hash("/p/h", &[2, 3])).unwrap();
        assert!(unavailable(mkdir(&mut p1, "/p/h/x")));
        assert!(mkdir(&mut p1, "/p/other").is_ok());
        let delegate = |from| Command::DelegateHashed {
            path: "/p/h".into(),
            from,
            shards: vec![2, 3],
        };
        assert!(root.apply(&delegate(0)).is_err());
        assert!(
            root.apply(&delegate(2)).is_err(),
            "not below partition 2's top"
        );
        root.apply(&delegate(1)).unwrap();
        root.apply(&delegate(1)).unwrap();
        assert_eq!(root.route("/p/h/x").partition, shard_for(&[2, 3], "x"));
        assert_eq!(root.route("/p/h").partition, 1);
        assert_eq!(root.route("/p/other").partition, 1);
    }
}
