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
//!
//! While the only changes to such a directory are this mount's creates answered early
//! (early.rs), its attributes are known here too — the `mkdir`'s answer, with the time of
//! the last create — and its `stat` is answered here ([`Listed::attr`]). The kernel asks for
//! them after every create (a create ends what it knew of its directory's attributes): had
//! the masters answered, each would wait for the makes behind the creates, and every file
//! of a `tar -x` would cost a read of the masters and a make of its own. Any other change to
//! the directory through this mount (a name added otherwise, or removed, its mode, owners,
//! times or xattrs) sends its `stat` to the masters again. Another mount's change to the
//! directory's own attributes is missed for as long as the kernel's attribute cache may
//! miss it anyway ([`LISTED_FOR`]).

use cairn_rpc::files::{Attr, Time};
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
    /// Its attributes, while only this mount's early creates changed it.
    attr: Option<Attr>,
}

impl Listed {
    /// Directory `attr.ino` was made by this mount, empty, by a call sent at `sent`; `attr`
    /// is what the masters answered.
    pub(crate) fn made(&mut self, attr: &Attr, sent: Instant) {
        let ino = attr.ino;
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
                attr: Some(attr.clone()),
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

    /// The attributes of directory `dir`, when only this mount's early creates changed it
    /// since this mount made it (see the module's doc).
    pub(crate) fn attr(&mut self, dir: u64) -> Option<Attr> {
        let l = self.dirs.get(&dir)?;
        if l.since.elapsed() >= LISTED_FOR {
            self.dirs.remove(&dir);
            return None;
        }
        l.attr.clone()
    }

    /// This mount made a regular file `name` in `dir` at `now`, answered early (early.rs):
    /// the masters will apply the directory's change as this does.
    pub(crate) fn created(&mut self, dir: u64, name: &str, now: Time) {
        if let Some(l) = self.dirs.get_mut(&dir) {
            if let Some(a) = &mut l.attr {
                a.mtime = now;
                a.ctime = now;
            }
            self.insert(dir, name);
        }
    }

    /// This mount changed directory `dir`'s own attributes (mode, owners, times, xattrs):
    /// the masters answer for them from now on.
    pub(crate) fn changed(&mut self, dir: u64) {
        if let Some(l) = self.dirs.get_mut(&dir) {
            l.attr = None;
        }
    }

    /// This mount added `name` to `dir` (a make, a link, a rename's destination).
    pub(crate) fn added(&mut self, dir: u64, name: &str) {
        self.changed(dir);
        self.insert(dir, name);
    }

    fn insert(&mut self, dir: u64, name: &str) {
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
        self.changed(dir);
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
    use cairn_rpc::files::NodeType;

    fn dir(ino: u64) -> Attr {
        crate::test_attr(ino, NodeType::Directory)
    }

    #[test]
    fn a_made_directory_answers_for_its_attributes_while_only_early_creates_change_it() {
        let mut l = Listed::default();
        assert_eq!(l.attr(7), None, "not made here");
        l.made(&dir(7), Instant::now());
        assert_eq!(l.attr(7), Some(dir(7)));
        let t = Time { secs: 5, nanos: 6 };
        l.created(7, "a", t);
        let a = l.attr(7).expect("still known");
        assert_eq!((a.mtime, a.ctime, a.nlink), (t, t, 2));
        assert!(!l.absent(7, "a"), "the name is listed");
        // Any other change of it: the masters answer (its listing stays).
        l.added(7, "b");
        assert_eq!(l.attr(7), None);
        assert!(l.absent(7, "c"));
        l.made(&dir(8), Instant::now());
        l.removed(8, "x");
        assert_eq!(l.attr(8), None);
        l.made(&dir(9), Instant::now());
        l.changed(9);
        assert_eq!(l.attr(9), None);
        assert!(l.absent(9, "c"));
        // Made long enough ago: no longer trusted.
        l.made(&dir(10), Instant::now() - LISTED_FOR);
        assert_eq!(l.attr(10), None);
    }

    #[test]
    fn a_made_directory_answers_for_its_names_until_it_expires() {
        let mut l = Listed::default();
        assert!(
            !l.absent(7, "a"),
            "a directory not made here is asked of the masters"
        );
        l.made(&dir(7), Instant::now());
        assert!(l.absent(7, "a"));
        l.added(7, "a");
        assert!(!l.absent(7, "a"));
        l.removed(7, "a");
        assert!(l.absent(7, "a"));
        // A remove of a name never listed: someone else made it; the listing is dropped.
        l.removed(7, "b");
        assert!(!l.absent(7, "c"));
        // Made long enough ago: no longer trusted.
        l.made(&dir(8), Instant::now() - LISTED_FOR);
        assert!(!l.absent(8, "a"));
        assert_eq!(l.len(), 0);
        l.made(&dir(9), Instant::now());
        l.forget(9);
        assert!(!l.absent(9, "a"));
    }

    #[test]
    fn a_rename_is_followed_only_to_a_name_known_absent() {
        let mut l = Listed::default();
        let now = Instant::now();
        l.made(&dir(1), now);
        l.made(&dir(2), now);
        l.added(1, "a");
        l.renamed(1, "a", 2, "b");
        assert!(l.absent(1, "a") && !l.absent(2, "b"));
        // Over an existing name (perhaps the same node's other name): both dropped.
        l.added(1, "c");
        l.renamed(1, "c", 2, "b");
        assert!(!l.absent(1, "zz") && !l.absent(2, "zz"));
        // Into a directory not listed: whether the name existed is not known.
        l.made(&dir(3), now);
        l.added(3, "x");
        l.renamed(3, "x", 99, "y");
        assert!(!l.absent(3, "x") && !l.absent(3, "zz"));
    }

    #[test]
    fn listings_are_bounded() {
        let mut l = Listed::default();
        let now = Instant::now();
        for d in 0..DIRS_MAX as u64 {
            l.made(&dir(d), now);
        }
        l.made(&dir(u64::MAX), now);
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
            l.made(&dir(d), now - LISTED_FOR);
        }
        l.made(&dir(u64::MAX), now);
        assert!(l.absent(u64::MAX, "a"));
        assert_eq!(l.len(), 1);
    }
}
