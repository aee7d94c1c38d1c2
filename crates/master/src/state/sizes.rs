//! How many inodes each directory of a partition holds below it, for automatic splits
//! (docs/partitions.md "Automatic splits"): a scan of the partition's inodes in batches (the
//! state's lock is let go between them), then the subtree to split — the directory whose
//! subtree is nearest half the partition.

use super::{InodeId, ROOT, State};
use std::collections::HashMap;

/// A scan under way; memory is two map entries per directory.
#[derive(Debug, Default)]
pub struct SizeScan {
    after: Option<InodeId>,
    done: bool,
    /// Each directory's parent.
    parent: HashMap<InodeId, InodeId>,
    /// Each directory's entries (files and directories).
    entries: HashMap<InodeId, u64>,
    inodes: u64,
}

impl SizeScan {
    /// Reads up to `budget` more inodes of `st`; true once every inode was read.
    pub fn step(&mut self, st: &State, budget: usize) -> bool {
        if self.done {
            return true;
        }
        let (got, next) = st.inodes_after(self.after, budget);
        for ino in &got {
            if ino.id == ROOT {
                continue;
            }
            self.inodes += 1;
            *self.entries.entry(ino.parent).or_default() += 1;
            if ino.file().is_none() {
                self.parent.insert(ino.id, ino.parent);
            }
        }
        self.after = next;
        self.done = next.is_none();
        self.done
    }

    /// Inodes read so far (the partition's, top excluded, once done).
    pub fn inodes(&self) -> u64 {
        self.inodes
    }

    /// Every directory's subtree size (inodes below it), the top's excluded.
    fn subtree_sizes(&self) -> HashMap<InodeId, u64> {
        let depth = |mut d: InodeId| {
            let mut n = 0u32;
            while let Some(p) = self.parent.get(&d) {
                d = *p;
                n += 1;
                if n > 4096 {
                    break; // a cycle the scan saw mid-rename: deep enough
                }
            }
            n
        };
        let mut dirs: Vec<(u32, InodeId)> = self.parent.keys().map(|d| (depth(*d), *d)).collect();
        dirs.sort_unstable_by(|a, b| b.cmp(a));
        let mut size: HashMap<InodeId, u64> = HashMap::with_capacity(dirs.len());
        for (_, d) in dirs {
            let own =
                self.entries.get(&d).copied().unwrap_or(0) + size.get(&d).copied().unwrap_or(0);
            size.insert(d, own);
            if let Some(p) = self.parent.get(&d) {
                *size.entry(*p).or_default() += own;
            }
        }
        size.retain(|d, _| self.parent.contains_key(d));
        size
    }

    /// Directories of `st` to split off, best first: subtrees of `rows` inodes (a range),
    /// nearest half of the partition first; at most `max` of them, as paths.
    pub fn candidates(
        &self,
        st: &State,
        rows: std::ops::RangeInclusive<u64>,
        max: usize,
    ) -> Vec<(String, u64)> {
        let half = self.inodes / 2;
        let mut sized: Vec<(u64, InodeId, u64)> = self
            .subtree_sizes()
            .into_iter()
            .filter(|(_, n)| *n >= 1 && rows.contains(n))
            .map(|(d, n)| (n.abs_diff(half), d, n))
            .collect();
        sized.sort_unstable();
        sized
            .into_iter()
            .filter(|(_, d, _)| st.inodes.get(d).is_some())
            .map(|(_, d, n)| (st.path_of(d), n))
            .take(max)
            .collect()
    }
}

impl State {
    /// Inodes in this state, its top directory included.
    pub fn inode_count(&self) -> u64 {
        self.inodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_of(st: &State) -> SizeScan {
        let mut scan = SizeScan::default();
        while !scan.step(st, 100) {}
        scan
    }

    #[test]
    fn the_subtree_nearest_half_comes_first() {
        let mut st = State::default();
        // /a: 40 files in /a/x and 10 in /a/y; /b: 30 files; /c: 5.
        for i in 0..40 {
            crate::state::tests::create_file(&mut st, &format!("/a/x/f{i}"), 1);
        }
        for i in 0..10 {
            crate::state::tests::create_file(&mut st, &format!("/a/y/f{i}"), 1);
        }
        for i in 0..30 {
            crate::state::tests::create_file(&mut st, &format!("/b/f{i}"), 1);
        }
        for i in 0..5 {
            crate::state::tests::create_file(&mut st, &format!("/c/f{i}"), 1);
        }
        let mut scan = SizeScan::default();
        let mut steps = 0;
        while !scan.step(&st, 7) {
            steps += 1;
        }
        assert!(steps > 5);
        // 85 files and 5 directories.
        assert_eq!(scan.inodes(), 90);
        let c = scan.candidates(&st, 6..=u64::MAX, 10);
        // Half is 45: /a/x (40) is nearest, then /a (52), /b (30), /a/y (10); /c is too small.
        assert_eq!(
            c,
            vec![
                ("/a/x".to_owned(), 40),
                ("/a".to_owned(), 52),
                ("/b".to_owned(), 30),
                ("/a/y".to_owned(), 10)
            ]
        );
        let mut p = crate::state::tests::partition_state(1, "/p");
        crate::state::tests::create_file(&mut p, "/p/q/f", 1);
        let mut scan = SizeScan::default();
        while !scan.step(&p, 100) {}
        assert_eq!(
            scan.candidates(&p, 1..=10, 10),
            vec![("/p/q".to_owned(), 1)]
        );
        // At most 45 inodes: /a (52) is left out.
        let c = scan_of(&st).candidates(&st, 6..=45, 10);
        assert_eq!(
            c.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(),
            ["/a/x", "/b", "/a/y"]
        );
    }
}
