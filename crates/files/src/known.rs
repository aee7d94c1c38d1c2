//! What the masters answered a moment ago of a file this mount committed, kept for the rest
//! of the kernel's attribute time (docs/files.md "Consistency between mounts").
//!
//! The kernel forgets a file's attributes when it writes to it, so the `stat` after a
//! `write` and `close` asks the mount, which asked the masters — a call each, though the
//! commit of those bytes had just answered the file's attributes. Those answers are kept
//! here, by inode, until [`ATTR_TTL`] after the commit was *sent*, and answered for the rest
//! of that time (the kernel then keeps them only for what is left): another mount's change
//! shows within `ATTR_TTL`, the same bound as the kernel's own cache.
//!
//! Only files, not directories (a directory's attributes change with every name made in it;
//! listed.rs keeps those of the directories this mount just made). Any change this mount
//! sends that may change a kept file's attributes other than through its own commit — a
//! remove, rename, link, `setattr`, xattr or hole — makes everything kept here stale
//! ([`Known::changing`], before it is sent and after it answers), and so does an answer
//! learnt while one was in flight: each answer is kept only if no such change began after
//! its call was sent.

use crate::shared::ATTR_TTL;
use cairn_rpc::files::{Attr, NodeType};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Most files kept; past it the expired ones go, and if none has, all of them.
const KNOWN_MAX: usize = 1 << 16;

/// A commit's answer, and when its call was sent.
struct Entry {
    attr: Attr,
    asked: Instant,
}

/// The attributes kept (see the module's doc).
#[derive(Default)]
pub(crate) struct Known {
    /// Bumped by every change that may make a kept answer stale (which empties the map).
    epoch: u64,
    map: HashMap<u64, Entry>,
}

/// A call about to be sent: what [`Known::learnt`] needs of it afterwards.
#[derive(Clone, Copy)]
pub(crate) struct Asked {
    at: Instant,
    epoch: u64,
}

impl Known {
    /// Before a call whose answer may be kept.
    pub(crate) fn asking(&self) -> Asked {
        Asked {
            at: Instant::now(),
            epoch: self.epoch,
        }
    }

    /// `attr`, answered to a call [`Known::asking`] began: kept when it is a file's and no
    /// change began since the call was sent.
    pub(crate) fn learnt(&mut self, attr: &Attr, asked: Asked) {
        if attr.kind == NodeType::Directory || asked.epoch != self.epoch {
            return;
        }
        if asked.at.elapsed() >= ATTR_TTL {
            return;
        }
        if self.map.len() >= KNOWN_MAX {
            self.map.retain(|_, e| e.asked.elapsed() < ATTR_TTL);
            if self.map.len() >= KNOWN_MAX {
                self.map.clear();
            }
        }
        self.map.insert(
            attr.ino,
            Entry {
                attr: attr.clone(),
                asked: asked.at,
            },
        );
    }

    /// File `ino`'s kept attributes and how much longer they hold, if they do.
    pub(crate) fn get(&self, ino: u64) -> Option<(Attr, Duration)> {
        let e = self.map.get(&ino)?;
        let left = ATTR_TTL.checked_sub(e.asked.elapsed())?;
        if left.is_zero() {
            return None;
        }
        Some((e.attr.clone(), left))
    }

    /// File `ino` is open or changing here: what was kept of it no longer holds.
    pub(crate) fn drop_ino(&mut self, ino: u64) {
        self.map.remove(&ino);
    }

    /// A change that may make any kept answer stale is about to be sent, or has answered.
    pub(crate) fn changing(&mut self) {
        self.epoch += 1;
        self.map.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_attr as attr;

    #[test]
    fn a_files_answer_holds_for_the_rest_of_the_attribute_time() {
        let mut k = Known::default();
        let asked = k.asking();
        k.learnt(&attr(7, NodeType::Regular), asked);
        let (a, left) = k.get(7).expect("kept");
        assert_eq!(a.ino, 7);
        assert!(left <= ATTR_TTL && left > ATTR_TTL / 2, "{left:?}");
        assert!(k.get(8).is_none());
        // Directories are not kept.
        let asked = k.asking();
        k.learnt(&attr(9, NodeType::Directory), asked);
        assert!(k.get(9).is_none());
        k.drop_ino(7);
        assert!(k.get(7).is_none());
    }

    #[test]
    fn a_change_makes_every_answer_stale_and_one_learnt_during_it_is_not_kept() {
        let mut k = Known::default();
        let asked = k.asking();
        k.learnt(&attr(1, NodeType::Regular), asked);
        k.changing();
        assert!(k.get(1).is_none(), "stale after a change began");
        // Asked before the change answered: not kept.
        let during = k.asking();
        k.changing();
        k.learnt(&attr(2, NodeType::Regular), during);
        assert!(k.get(2).is_none());
        let after = k.asking();
        k.learnt(&attr(2, NodeType::Regular), after);
        assert!(k.get(2).is_some());
    }

    #[test]
    fn an_answer_older_than_the_attribute_time_is_not_kept() {
        let mut k = Known::default();
        let mut asked = k.asking();
        asked.at -= ATTR_TTL;
        k.learnt(&attr(3, NodeType::Regular), asked);
        assert!(k.get(3).is_none());
    }
}
