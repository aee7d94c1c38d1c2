//! A file this mount made a moment ago (docs/files.md "Attributes of a new file" and "A
//! close that does not wait"): its `chmod`, `chown` and `utimens` wait for its first commit,
//! and its close answers before its flush while the masters hold the file for this mount.

use crate::shared::{FileState, Shared, time_of};
use cairn_rpc::files::{Attr, FileOp, HOLD_MS, SetAttr, Time};
use fuser::Errno;
use std::time::{Duration, Instant, SystemTime};

/// Closes answered before their flush that may be in flight at once; past it a close
/// waits for its flush (docs/files.md "A close that does not wait").
pub const CLOSES_BEHIND: usize = 64;

/// A file this mount made whose bytes no one can read yet (none committed): its `chmod`,
/// `chown` and `utimens` wait here and go to the masters in the same change as its first
/// bytes (`FileOp::Write::then`) — one Raft write where `tar`, `cp -p` and `rsync` would
/// make four (docs/files.md "Attributes of a new file"). No byte of the file is ever
/// readable under attributes it did not have.
pub(crate) struct Fresh {
    /// The node as its create answered.
    pub(crate) attr: Attr,
    /// Until when a close may answer before its flush: the masters hold the file for this
    /// mount (`FileOp::Make::hold`) for [`HOLD_MS`] from before the create was sent; half
    /// of it is left for the flush to start and renew the hold.
    pub(crate) behind_until: Instant,
    /// What the changes set (all `None`: nothing waits).
    pub(crate) changes: SetAttr,
    /// When the last change was taken: the ctime this mount shows.
    pub(crate) ctime: Option<Time>,
}

impl Fresh {
    /// A file whose create was sent at `sent`.
    pub(crate) fn new(attr: Attr, sent: Instant) -> Self {
        Self {
            attr,
            behind_until: sent + Duration::from_millis(HOLD_MS / 2),
            changes: SetAttr::default(),
            ctime: None,
        }
    }

    pub(crate) fn waiting(&self) -> bool {
        self.changes != SetAttr::default()
    }

    /// Takes a change of attributes (no size) made at `now`.
    pub(crate) fn take(&mut self, a: &SetAttr, now: Time) {
        let c = &mut self.changes;
        c.mode = a.mode.or(c.mode);
        c.uid = a.uid.or(c.uid);
        c.gid = a.gid.or(c.gid);
        c.atime = a.atime.or(c.atime);
        c.mtime = a.mtime.or(c.mtime);
        self.ctime = Some(now);
    }

    /// `attr` with the changes that wait.
    pub(crate) fn overlay(&self, attr: &mut Attr) {
        let c = &self.changes;
        if let Some(m) = c.mode {
            attr.mode = m;
        }
        if let Some(u) = c.uid {
            attr.uid = u;
        }
        if let Some(g) = c.gid {
            attr.gid = g;
        }
        if let Some(t) = c.atime {
            attr.atime = t;
        }
        if let Some(t) = c.mtime {
            attr.mtime = t;
        }
        if let Some(t) = self.ctime {
            attr.ctime = t;
        }
    }
}

/// What `stat` shows of a new file whose bytes are not committed yet (its create's answer,
/// the changes waiting, the size written), or `None`.
pub(crate) fn fresh_attr(st: &FileState) -> Option<Attr> {
    let f = st.fresh.as_ref().filter(|_| st.unlinked.is_none())?;
    let mut a = f.attr.clone();
    f.overlay(&mut a);
    if let Some(size) = st.size {
        a.size = size;
    }
    Some(a)
}

/// Takes a `setattr` of a new file that is open here (not a truncate) into its
/// [`Fresh`] changes; the attributes it answers. `None`: not such a file or change.
pub(crate) fn defer_attr(st: &mut FileState, attr: &SetAttr) -> Option<Attr> {
    if attr.size.is_some() || st.opens == 0 {
        return None;
    }
    let size = st.size;
    let f = st.fresh.as_mut()?;
    // The kernel checked that the caller may; the masters check the mount's user at the
    // commit.
    f.take(attr, time_of(SystemTime::now()));
    let mut a = f.attr.clone();
    f.overlay(&mut a);
    if let Some(size) = size {
        a.size = size;
    }
    st.dirty_since.get_or_insert_with(Instant::now);
    Some(a)
}

impl Shared {
    /// `setattr` of a new file's mode, owners or times, answered here (docs/files.md
    /// "Attributes of a new file"). `None`: it needs [`Shared::setattr`].
    pub(crate) fn setattr_now(&self, ino: u64, attr: &SetAttr) -> Option<Attr> {
        defer_attr(&mut *self.state_now(ino)?, attr)
    }

    /// `getattr` of a new file whose bytes are not committed yet: answered here, from its
    /// create's answer and the changes waiting (another mount's change to it meanwhile
    /// shows after the close); or of a directory this mount just made ([`Listed::attr`]).
    /// `None`: it needs [`Shared::getattr`].
    ///
    /// [`Listed::attr`]: crate::listed::Listed::attr
    pub(crate) fn getattr_now(&self, ino: u64) -> Option<Attr> {
        // A directory this mount made a moment ago that only its early creates changed
        // (listed.rs).
        if let Some(a) = self.listed.lock().attr(ino) {
            return Some(a);
        }
        fresh_attr(&*self.state_now(ino)?)
    }

    /// What a commit of `ino` by this mount answered a moment ago, and how much longer it
    /// holds (known.rs), while the mount keeps no state of the file (no open, nothing
    /// dirty, no flush in flight).
    pub(crate) fn known_attr(&self, ino: u64) -> Option<(Attr, Duration)> {
        let files = self.files.lock();
        if files.contains_key(&ino) {
            return None;
        }
        self.known.lock().get(ino)
    }

    /// Waits for a flush of `ino` in flight (a close's, behind it): what the masters answer
    /// after it includes what it committed.
    pub(crate) async fn flushed(&self, ino: u64) {
        let st = self.files.lock().get(&ino).cloned();
        if let Some(st) = st {
            drop(st.lock().await);
        }
    }

    /// A close (FUSE flush) of a file this mount made a moment ago, which answers before
    /// its flush: the permit the flush holds ([`Shared::flush_behind`]). `None`: the close
    /// waits for its flush (an older file, the lock busy, too many closes behind already).
    pub(crate) fn close_behind(&self, ino: u64) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if self.sync_close {
            return None;
        }
        let st = self.state_now(ino)?;
        let f = st.fresh.as_ref()?;
        if st.unlinked.is_some() || Instant::now() >= f.behind_until {
            return None;
        }
        self.closing.clone().try_acquire_owned().ok()
    }

    /// The flush of a close that answered before it: the file's first commit, which ends
    /// the masters' hold; the hold is renewed while the flush runs. A failure is logged and
    /// the flush tried again by the release and the background flush.
    pub(crate) async fn flush_behind(&self, ino: u64, _permit: tokio::sync::OwnedSemaphorePermit) {
        let Some(st) = self.files.lock().get(&ino).cloned() else {
            return;
        };
        let flush = async {
            let mut g = st.lock().await;
            self.flush_locked(ino, &mut g).await
        };
        let renew = async {
            loop {
                tokio::time::sleep(Duration::from_millis(HOLD_MS / 3)).await;
                let Ok(path) = self.path(ino) else { continue };
                let op = FileOp::Hold {
                    path,
                    ino,
                    holder: self.mount_id.clone(),
                    now: time_of(SystemTime::now()),
                };
                if self.op(&op).await.is_err() {
                    tracing::warn!(ino, "renewing a closed file's hold failed");
                }
            }
        };
        let r = tokio::select! {
            r = flush => r,
            never = renew => never,
        };
        if let Err(e) = r {
            tracing::warn!(ino, errno = ?e, "a flush after its close failed; will try again");
        }
    }

    /// Waits for the flush of a close that answered before it, if `ino` has one, or makes it
    /// now: a rename, link or unlink of the file comes after its bytes (as ext4 commits a
    /// file's data before a rename over another).
    pub(crate) async fn settle(&self, ino: u64) -> Result<(), Errno> {
        let Some(st) = self.files.lock().get(&ino).cloned() else {
            return Ok(());
        };
        let mut g = st.lock().await;
        if g.fresh.is_some() && g.unlinked.is_none() {
            self.flush_locked(ino, &mut g).await?;
        }
        Ok(())
    }

    /// [`Shared::settle`] of the node this mount knows as `name` in `parent`, if any.
    pub(crate) async fn settle_name(&self, parent: u64, name: &str) -> Result<(), Errno> {
        let ino = self.nodes.lock().at(parent, name);
        match ino {
            Some(ino) => self.settle(ino).await,
            None => Ok(()),
        }
    }
}
