//! Directories whose every name this mount knows, for a short while: a lookup of a name
//! not among them is answered here (ENOENT) instead of by the masters (docs/files.md
//! "Negative lookups").
//!
//! A directory this mount made was empty when the masters made it; every name this mount
//! adds, removes or renames in it since is applied here too, so for [`LISTED_FOR`] after
//! the `mkdir` left this mount the names here are the directory's names, but for those
//! another mount added meanwhile — none while the masters hold the directory for this mount
//! (early.rs), which they do for longer than that unless `--sync-create`. That is the bound
//! the kernel's entry cache already has ("a new name may be missed for up to a second"), and
//! it saves each new file's lookup: `tar` and `cp -r` look every name up before they create
//! it.
//!
//! Anything unexpected — a make answered "exists", a remove of a name not listed, a
//! rename that failed — drops the directory's listing: from then on the masters answer.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How long a directory's names are trusted after its `mkdir` was sent.
pub const LISTED_FOR: Duration = crate::shared::ATTR_TTL;
/// Directories listed at most; a `mkdir` past it is not listed.
const DIRS_MAX: usize = 4096;
/// Names of one directory at most; past it the directory is dropped.
const NAMES_MAX: usize = 16_384;

#[derive(Default)]
pub(crate) struct Listed {
    dirs: HashMap<u64, Listing>,
}

struct Listing {
    /// When the `mkdir` that made the directory was sent (before the masters made it).
    since: Instant,
    names: HashSet<String>,
}

impl Listed {
    /// Directory `ino` was made by this mount, empty, by a call sent at `sent`.
    pub(crate) fn made(&mut self, ino: u64, sent: Instant) {
        if self.dirs.len() >= DIRS_MAX {
            let now = Instant::now();
            self.dirs
                .retain(|_, l| now.duration_since(l.since) < LISTED_FOR);
            if self.dirs.len() >= DIRS_MAX {
                return;
            }
        }
        self.dirs.insert(
            ino,
            Listing {
                since: sent,
                names: HashSet::new(),
            },
        );
    }

    /// Whether `name` is known not to be in directory `dir` now.
    pub(crate) fn absent(&mut self, dir: u64, name: &str) -> bool {
        let Some(l) = self.dirs.get(&dir) else {
            return false;
        };
        if l.since.elapsed() >= LISTED_FOR {
            self.dirs.remove(&dir);
            return false;
        }
        !l.names.contains(name)
    }

    /// This mount added `name` to `dir` (a make, a link, a rename's destination).
    pub(crate) fn added(&mut self, dir: u64, name: &str) {
        if let Some(l) = self.dirs.get_mut(&dir) {
            l.names.insert(name.to_owned());
            if l.names.len() > NAMES_MAX {
                self.dirs.remove(&dir);
            }
        }
    }

    /// This mount removed `name` from `dir` (an unlink, a rmdir, a rename's source). A
    /// name that was not listed was added by someone else: the listing was wrong.
    pub(crate) fn removed(&mut self, dir: u64, name: &str) {
        if let Some(l) = self.dirs.get_mut(&dir)
            && !l.names.remove(name)
        {
            self.dirs.remove(&dir);
        }
    }

    /// This mount renamed `from` in `from_dir` to `to` in `to_dir` (not an exchange). Only
    /// a rename to a name known absent is followed: over an existing name — which may be
    /// another name of the same node, when rename(2) does nothing — both listings go.
    pub(crate) fn renamed(&mut self, from_dir: u64, from: &str, to_dir: u64, to: &str) {
        if self.absent(to_dir, to) {
            self.added(to_dir, to);
            self.removed(from_dir, from);
        } else {
            self.forget(from_dir);
            self.forget(to_dir);
        }
    }

    /// What this mount knew of `dir`'s names is not to be trusted (or `dir` is gone).
    pub(crate) fn forget(&mut self, dir: u64) {
        self.dirs.remove(&dir);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.dirs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_made_directory_answers_for_its_names_until_it_expires() {
        let mut l = Listed::default();
        assert!(
            !l.absent(7, "a"),
            "a directory not made here is asked of the masters"
        );
        l.made(7, Instant::now());
        assert!(l.absent(7, "a"));
        l.added(7, "a");
        assert!(!l.absent(7, "a"));
        l.removed(7, "a");
        assert!(l.absent(7, "a"));
        // A remove of a name never listed: someone else made it; the listing is dropped.
        l.removed(7, "b");
        assert!(!l.absent(7, "c"));
        // Made long enough ago: no longer trusted.
        l.made(8, Instant::now() - LISTED_FOR);
        assert!(!l.absent(8, "a"));
        assert_eq!(l.len(), 0);
        l.made(9, Instant::now());
        l.forget(9);
        assert!(!l.absent(9, "a"));
    }

    #[test]
    fn a_rename_is_followed_only_to_a_name_known_absent() {
        let mut l = Listed::default();
        let now = Instant::now();
        l.made(1, now);
        l.made(2, now);
        l.added(1, "a");
        l.renamed(1, "a", 2, "b");
        assert!(l.absent(1, "a") && !l.absent(2, "b"));
        // Over an existing name (perhaps the same node's other name): both dropped.
        l.added(1, "c");
        l.renamed(1, "c", 2, "b");
        assert!(!l.absent(1, "zz") && !l.absent(2, "zz"));
        // Into a directory not listed: whether the name existed is not known.
        l.made(3, now);
        l.added(3, "x");
        l.renamed(3, "x", 99, "y");
        assert!(!l.absent(3, "x") && !l.absent(3, "zz"));
    }

    #[test]
    fn listings_are_bounded() {
        let mut l = Listed::default();
        let now = Instant::now();
        for d in 0..DIRS_MAX as u64 {
            l.made(d, now);
        }
        l.made(u64::MAX, now);
        assert!(
            !l.absent(u64::MAX, "a"),
            "past the bound a directory is not listed"
        );
        for n in 0..=NAMES_MAX {
            l.added(0, &n.to_string());
        }
        assert!(
            !l.absent(0, "x"),
            "a directory past its names' bound is dropped"
        );
        // Expired listings make room.
        let mut l = Listed::default();
        for d in 0..DIRS_MAX as u64 {
            l.made(d, now - LISTED_FOR);
        }
        l.made(u64::MAX, now);
        assert!(l.absent(u64::MAX, "a"));
        assert_eq!(l.len(), 1);
    }
}
