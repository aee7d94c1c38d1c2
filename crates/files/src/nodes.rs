//! The nodes the kernel knows, by inode number, and where this mount last saw each: its
//! directory and name, and the other names (hard links) it learnt.
//!
//! Names are indexed both ways, so that what the kernel's calls need — a node's path, the
//! node at a name, a name gone — costs the same with a hundred known nodes as with a
//! million. (A scan of every node for each unlink made `rm -rf` of an 80 000-file tree
//! quadratic: BENCHMARKS.md "The file service, metadata at close".)

use std::collections::{HashMap, HashSet};

/// A node the kernel knows. `parent` 0: `name` is the node's whole path (a file moved to
/// `crate::shared::UNLINKED_DIR`).
pub(crate) struct Node {
    parent: u64,
    name: String,
    pub(crate) lookups: u64,
    /// The node's other names this mount learnt (hard links), the latest last: where it is
    /// found when its name is unlinked or replaced here.
    others: Vec<(u64, String)>,
    /// A regular file's policy (`Attr::policy`): its segments'.
    pub(crate) policy: String,
}

impl Node {
    pub(crate) fn parent(&self) -> u64 {
        self.parent
    }

    pub(crate) fn is(&self, parent: u64, name: &str) -> bool {
        self.parent == parent && self.name == name
    }
}

/// Most other names of one node a mount keeps.
const OTHER_NAMES: usize = 16;

#[derive(Default)]
pub(crate) struct Nodes {
    by_ino: HashMap<u64, Node>,
    /// Every node by its name: usually one, several while this mount holds a stale node
    /// (another mount put a new one at its name).
    by_name: HashMap<(u64, String), Vec<u64>>,
    /// The nodes with other names.
    linked: HashSet<u64>,
}

impl Nodes {
    pub(crate) fn get(&self, ino: u64) -> Option<&Node> {
        self.by_ino.get(&ino)
    }

    /// A node at `name` in `parent` (any one, if several are known there).
    pub(crate) fn at(&self, parent: u64, name: &str) -> Option<u64> {
        self.by_name
            .get(&(parent, name.to_owned()))
            .and_then(|v| v.first().copied())
    }

    fn unindex(&mut self, ino: u64, parent: u64, name: &str) {
        let key = (parent, name.to_owned());
        if let Some(v) = self.by_name.get_mut(&key) {
            v.retain(|i| *i != ino);
            if v.is_empty() {
                self.by_name.remove(&key);
            }
        }
    }

    fn index(&mut self, ino: u64, parent: u64, name: &str) {
        let v = self.by_name.entry((parent, name.to_owned())).or_default();
        if !v.contains(&ino) {
            v.push(ino);
        }
    }

    /// Node `ino` is now at `name` in `parent` (moved there, or learnt there), keeping the
    /// other names it has; `parent` 0: `name` is a whole path.
    pub(crate) fn place(&mut self, ino: u64, parent: u64, name: &str) {
        let Some(n) = self.by_ino.get_mut(&ino) else {
            return;
        };
        if n.is(parent, name) {
            return;
        }
        let (old_parent, old_name) = (n.parent, std::mem::replace(&mut n.name, name.to_owned()));
        n.parent = parent;
        self.unindex(ino, old_parent, &old_name);
        self.index(ino, parent, name);
    }

    /// The kernel learnt of node `ino` (`nlink` names) as `name` in `parent`.
    pub(crate) fn remember(&mut self, ino: u64, parent: u64, name: &str, nlink: u32, policy: &str) {
        let new = !self.by_ino.contains_key(&ino);
        let n = self.by_ino.entry(ino).or_insert_with(|| Node {
            parent,
            name: name.to_owned(),
            lookups: 0,
            others: Vec::new(),
            policy: String::new(),
        });
        policy.clone_into(&mut n.policy);
        n.lookups += 1;
        if new {
            self.index(ino, parent, name);
            return;
        }
        if n.is(parent, name) {
            return;
        }
        // Another name of a node with several: the old one may still be good.
        let old = (n.parent, n.name.clone());
        n.others
            .retain(|o| *o != old && !(o.0 == parent && o.1 == name));
        if nlink > 1 && old.0 != 0 {
            n.others.push(old);
            if n.others.len() > OTHER_NAMES {
                n.others.remove(0);
            }
        } else if nlink <= 1 {
            n.others.clear();
        }
        if n.others.is_empty() {
            self.linked.remove(&ino);
        } else {
            self.linked.insert(ino);
        }
        self.place(ino, parent, name);
    }

    /// The kernel forgot `nlookup` of its lookups of `ino`; gone at none.
    pub(crate) fn forget(&mut self, ino: u64, nlookup: u64) {
        if let Some(n) = self.by_ino.get_mut(&ino) {
            n.lookups = n.lookups.saturating_sub(nlookup);
            if n.lookups == 0 {
                self.remove(ino);
            }
        }
    }

    pub(crate) fn remove(&mut self, ino: u64) {
        if let Some(n) = self.by_ino.remove(&ino) {
            self.unindex(ino, n.parent, &n.name);
            self.linked.remove(&ino);
        }
    }

    /// The name `name` in `parent` is gone (unlinked, or replaced by a rename): a node known
    /// by it goes on by another name it has, if this mount knows one.
    pub(crate) fn name_gone(&mut self, parent: u64, name: &str) {
        let mut touched: Vec<u64> = self
            .by_name
            .get(&(parent, name.to_owned()))
            .cloned()
            .unwrap_or_default();
        touched.extend(self.linked.iter().copied());
        for ino in touched {
            let Some(n) = self.by_ino.get_mut(&ino) else {
                continue;
            };
            n.others.retain(|o| !(o.0 == parent && o.1 == name));
            let next = if n.is(parent, name) {
                n.others.pop()
            } else {
                None
            };
            if n.others.is_empty() {
                self.linked.remove(&ino);
            }
            if let Some((p, other)) = next {
                self.place(ino, p, &other);
            }
        }
    }

    /// The path of node `ino` as this mount last saw it.
    ///
    /// # Errors
    /// `ESTALE` for a node not known (or above one), `ELOOP` past 4 096 levels.
    pub(crate) fn path(&self, ino: u64) -> Result<String, fuser::Errno> {
        if ino == 1 {
            return Ok("/".into());
        }
        let mut names = Vec::new();
        let mut cur = ino;
        while cur != 1 {
            let n = self.by_ino.get(&cur).ok_or(fuser::Errno::ESTALE)?;
            if n.parent == 0 {
                names.push(n.name.trim_start_matches('/'));
                break;
            }
            names.push(n.name.as_str());
            cur = n.parent;
            if names.len() > 4096 {
                return Err(fuser::Errno::ELOOP);
            }
        }
        names.reverse();
        Ok(format!("/{}", names.join("/")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_index(n: &Nodes) {
        let mut count = 0;
        for (key, inos) in &n.by_name {
            for i in inos {
                assert!(n.by_ino[i].is(key.0, &key.1), "index names {i} at {key:?}");
                count += 1;
            }
        }
        assert_eq!(count, n.by_ino.len(), "every node indexed once");
        for (i, x) in &n.by_ino {
            assert_eq!(
                n.linked.contains(i),
                !x.others.is_empty(),
                "node {i} linked"
            );
        }
    }

    #[test]
    fn names_found_moved_and_gone() {
        let mut n = Nodes::default();
        n.remember(10, 1, "d", 1, "");
        n.remember(11, 10, "a", 1, "");
        n.remember(12, 10, "b", 1, "");
        assert_eq!(n.path(11).unwrap(), "/d/a");
        assert_eq!(n.at(10, "b"), Some(12));
        n.place(11, 1, "top");
        assert_eq!(n.path(11).unwrap(), "/top");
        assert_eq!(n.at(10, "a"), None);
        check_index(&n);
        // A hard link learnt: the node keeps its old name as another.
        n.remember(12, 1, "b2", 2, "");
        assert_eq!(n.path(12).unwrap(), "/b2");
        n.name_gone(1, "b2");
        assert_eq!(n.path(12).unwrap(), "/d/b", "back to its other name");
        check_index(&n);
        // A stale node and a new one at one name: both indexed, both found by name_gone.
        n.remember(13, 10, "b", 1, "");
        assert_eq!(n.by_name[&(10, "b".into())].len(), 2);
        n.name_gone(10, "b");
        check_index(&n);
        n.forget(13, 1);
        n.forget(12, 2);
        assert!(n.get(12).is_none() && n.get(13).is_none());
        assert_eq!(n.at(10, "b"), None);
        check_index(&n);
        assert_eq!(n.path(99), Err(fuser::Errno::ESTALE));
        // A file set aside: its whole path.
        n.place(11, 0, "/.fs/unlinked/x");
        assert_eq!(n.path(11).unwrap(), "/.fs/unlinked/x");
        check_index(&n);
    }
}
