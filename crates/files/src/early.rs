//! A create that does not wait (docs/files.md): in a directory this mount made a moment
//! ago, which the masters hold for it (`FileOp::Make::mount`, [`DIR_HOLD_MS`]), a regular
//! file's create is answered at once, with an inode number the masters reserved for this
//! mount, and its `FileOp::Make` follows behind. `tar -x` and `cp -r` make a directory and
//! then its files one after another: their creates no longer wait for a Raft write each, and
//! the makes that follow share Raft writes (the client's batches).
//!
//! Until the make is committed, the masters know nothing of the name; the hold keeps every
//! other mount from missing it (their lookups of names not in the directory, its listing and
//! names they add there wait: `lease-held`), and every call of this mount that names the file,
//! or a directory above it, waits for the make first ([`Shared::made`], [`Shared::made_under`],
//! which send it now if it still waits): a file's first commit, its rename, link or unlink, a
//! listing of its directory, an `fsync` of either. A make that fails (the mount cut off past
//! the hold, and another mount made the name meanwhile) loses the file, as a local file
//! system's crash before a sync may: nothing of it had been made durable.
//!
//! The make waits up to [`PARK_FOR`] for the file's first commit (tar's close comes a moment
//! after its create) and goes with it, on one call, as one Raft entry
//! ([`Shared::commit_with_make`]): one Raft write for a small new file where there were two.

use crate::shared::{Shared, errno, time_of};
use cairn_rpc::MetaError;
use cairn_rpc::files::{Attr, DIR_HOLD_MS, FileOp, FileReply, NewNode, NodeType};
use fuser::Errno;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;

/// How long after its `mkdir` was sent a directory's creates answer before their make: a
/// third of the hold, so that a make sent at the end of it has two thirds left to commit
/// (and renews the hold if it takes longer).
pub const EARLY_FOR: Duration = Duration::from_millis(DIR_HOLD_MS / 3);
/// Inode numbers a `mkdir` reserves, and a create asks for when fewer than half are left.
pub(crate) const RESERVE: u32 = 128;
/// How long a make waits for its file's first commit to go with; then it goes alone.
pub const PARK_FOR: Duration = Duration::from_millis(250);
/// Directories followed at most; a `mkdir` past it makes its files' creates wait.
const DIRS_MAX: usize = 4096;
/// Makes behind their creates at most; past it a create waits for its own.
const BEHIND_MAX: usize = 256;

type Done = watch::Receiver<Option<Result<(), Errno>>>;
type Tell = watch::Sender<Option<Result<(), Errno>>>;

/// The directories whose creates answer early, and the makes behind them.
#[derive(Default)]
pub(crate) struct Early {
    dirs: HashMap<u64, Held>,
    makes: HashMap<u64, Behind>,
}

/// A directory this mount made, held for it.
struct Held {
    /// Until when its creates answer early.
    until: Instant,
    /// The policy of the files made in it (`Attr::policy`).
    policy: String,
    /// Reserved inode numbers not used yet: `[first, end)` ranges, in order.
    inos: VecDeque<(u64, u64)>,
    /// A make that asks for more numbers is in flight.
    asking: bool,
}

impl Held {
    fn left(&self) -> u64 {
        self.inos.iter().map(|(a, b)| b - a).sum()
    }

    fn take(&mut self) -> Option<u64> {
        let (first, end) = self.inos.front_mut()?;
        let ino = *first;
        *first += 1;
        if first == end {
            self.inos.pop_front();
        }
        Some(ino)
    }
}

/// A create answered before its make.
struct Behind {
    path: String,
    done: Done,
    /// The make, while it waits to go with the file's first commit.
    parked: Option<Parked>,
}

/// A make not sent yet, and how to tell its waiters it is done.
pub(crate) struct Parked {
    pub(crate) op: FileOp,
    parent: u64,
    tell: Tell,
}

impl Early {
    /// Directory `dir` was made by a `mkdir` sent at `sent`, held for this mount, with
    /// `count` inode numbers from `first` on reserved; its files get `policy`.
    pub(crate) fn held(&mut self, dir: u64, sent: Instant, policy: String, first: u64, count: u32) {
        if self.dirs.len() >= DIRS_MAX {
            let now = Instant::now();
            self.dirs.retain(|_, h| h.until > now);
            if self.dirs.len() >= DIRS_MAX {
                return;
            }
        }
        self.dirs.insert(
            dir,
            Held {
                until: sent + EARLY_FOR,
                policy,
                inos: VecDeque::from([(first, first + u64::from(count))]),
                asking: false,
            },
        );
    }

    /// Directory `dir` is gone (removed, renamed): its creates wait from now on.
    pub(crate) fn forget(&mut self, dir: u64) {
        self.dirs.remove(&dir);
    }
}

/// Whether `path` is `top` or below it.
fn under(path: &str, top: &str) -> bool {
    top == "/"
        || path == top
        || (path.len() > top.len() && path.starts_with(top) && path.as_bytes()[top.len()] == b'/')
}

/// The paths a change names (its node's, and a rename's or link's other one).
pub(crate) fn op_paths(op: &FileOp) -> [&str; 2] {
    match op {
        FileOp::Rename { from, to, .. } | FileOp::Link { from, to, .. } => [from, to],
        _ => [op.path(), ""],
    }
}

impl Shared {
    /// `create(2)` of a regular file `name` in `parent`, answered now when `parent` is a
    /// directory this mount made a moment ago and holds (see the module's doc): the new
    /// node's attributes, and the make to run behind the answer. `None`: the create must
    /// go to the masters ([`Shared::make`]).
    pub(crate) fn create_early(
        self: &Arc<Self>,
        (uid, gid): (u32, u32),
        parent: u64,
        name: &str,
        path: String,
        mode: u16,
    ) -> Option<(Attr, impl Future<Output = ()> + Send + 'static)> {
        let sent = Instant::now();
        let now = time_of(SystemTime::now());
        let attr = {
            let mut e = self.early.lock();
            if e.makes.len() >= BEHIND_MAX {
                return None;
            }
            let h = e.dirs.get_mut(&parent)?;
            if sent >= h.until {
                e.dirs.remove(&parent);
                return None;
            }
            let ino = h.take()?;
            let reserve = if !h.asking && h.left() < u64::from(RESERVE / 2) {
                h.asking = true;
                RESERVE
            } else {
                0
            };
            let attr = Attr {
                ino,
                kind: NodeType::Regular,
                mode,
                uid,
                gid,
                nlink: 1,
                size: 0,
                atime: now,
                mtime: now,
                ctime: now,
                rdev: 0,
                owner: String::new(),
                policy: h.policy.clone(),
            };
            let op = FileOp::Make {
                path: path.clone(),
                node: NewNode::Regular,
                mode,
                uid,
                gid,
                now,
                hold: self.mount_id.clone(),
                mount: self.mount_id.clone(),
                ino,
                reserve,
            };
            let (tell, done) = watch::channel(None);
            e.makes.insert(
                ino,
                Behind {
                    path,
                    done,
                    parked: Some(Parked { op, parent, tell }),
                },
            );
            attr
        };
        let ino = attr.ino;
        self.remember(parent, name, &attr);
        self.xattr_cache.none(ino);
        self.listed.lock().created(parent, name, now);
        let s = self.clone();
        // Past PARK_FOR with no commit to go with, the make goes alone.
        let alone = async move {
            tokio::time::sleep(PARK_FOR).await;
            if let Some(p) = s.unpark(ino) {
                // A failure is logged, and answered to the file's next call.
                let _ = s.make_alone(ino, p).await;
            }
        };
        Some((attr, alone))
    }

    /// The make of `ino` if it has not gone yet: its sender's from now on.
    pub(crate) fn unpark(&self, ino: u64) -> Option<Parked> {
        self.early.lock().makes.get_mut(&ino)?.parked.take()
    }

    /// A make sent on its own.
    async fn make_alone(&self, ino: u64, p: Parked) -> Result<(), Errno> {
        let r = self.send_make(p.parent, &p.op).await;
        self.make_done(ino, p, r).await
    }

    /// Sends the make of a create answered early, renewing the directory's hold while it
    /// is slow (a third of the hold at a time).
    async fn send_make(&self, parent: u64, op: &FileOp) -> Result<FileReply, MetaError> {
        let make = self.client.masters().file_op(op);
        let renew = async {
            loop {
                tokio::time::sleep(Duration::from_millis(DIR_HOLD_MS / 3)).await;
                let Ok(path) = self.path(parent) else {
                    continue;
                };
                let hold = FileOp::Hold {
                    path,
                    ino: parent,
                    holder: self.mount_id.clone(),
                    now: time_of(SystemTime::now()),
                };
                if let Err(e) = self.client.masters().file_op(&hold).await {
                    tracing::warn!(dir = parent, error = %e, "renewing a directory's hold failed");
                }
            }
        };
        tokio::select! {
            r = make => r,
            never = renew => never,
        }
    }

    /// What a make answered (`r`), taken in: the numbers it reserved, its waiters told. A
    /// make answered `already-exists` whose node is the one it made (a retried call that
    /// had been applied) succeeded.
    pub(crate) async fn make_done(
        &self,
        ino: u64,
        p: Parked,
        r: Result<FileReply, MetaError>,
    ) -> Result<(), Errno> {
        let r = match r {
            Err(e) if e.kind == cairn_rpc::ErrorKind::AlreadyExists => {
                let q = self.lookup_query(p.op.path().to_owned());
                match self.client.masters().file_query(&q).await {
                    Ok(FileReply::Attr(a)) if a.ino == ino => Ok(FileReply::Attr(a)),
                    _ => Err(e),
                }
            }
            r => r,
        };
        let parent = p.parent;
        let reserved = matches!(p.op, FileOp::Make { reserve, .. } if reserve > 0);
        let result = {
            let mut e = self.early.lock();
            if reserved && let Some(h) = e.dirs.get_mut(&parent) {
                h.asking = false;
                if let Ok(FileReply::Made { first, count, .. }) = &r {
                    h.inos.push_back((*first, first + u64::from(*count)));
                }
            }
            e.makes.remove(&ino);
            match &r {
                Ok(_) => Ok(()),
                Err(e) => Err(errno(e)),
            }
        };
        if let Err(e) = &r {
            // The kernel was told the file exists; it does not. Whatever names it now
            // answers what the masters say (ENOENT), and the directory's listing here is
            // not to be trusted.
            tracing::warn!(path = p.op.path(), error = %e, "a create answered early failed");
            self.listed.lock().forget(parent);
        }
        let _ = p.tell.send(Some(result));
        result
    }

    /// Commits `write`, the first commit of file `ino`, with its make (`p`, which had not
    /// gone): one call, one Raft entry. `Err`: the make failed. When the call fails as a
    /// whole, the make goes alone (it may have been applied: [`Shared::make_done`]) and the
    /// commit answers the call's error, for its caller to send again.
    pub(crate) async fn commit_with_make(
        &self,
        ino: u64,
        p: Parked,
        write: &FileOp,
    ) -> Result<Result<FileReply, MetaError>, Errno> {
        let together = [p.op.clone(), write.clone()];
        match self.client.masters().file_ops_together(&together).await {
            Ok(mut answers) => {
                let w = answers.pop().expect("two answers");
                let m = answers.pop().expect("two answers");
                self.make_done(ino, p, m).await?;
                Ok(w)
            }
            Err(e) => {
                tracing::debug!(ino, error = %e, "a make with its commit failed; the make alone");
                self.make_alone(ino, p).await?;
                Ok(Err(e))
            }
        }
    }

    /// Waits for the make of `ino` if its create was answered early (sending it now if it
    /// still waits): EIO if it failed.
    pub(crate) async fn made(&self, ino: u64) -> Result<(), Errno> {
        let done = self.early.lock().makes.get(&ino).map(|b| b.done.clone());
        let Some(d) = done else { return Ok(()) };
        if let Some(p) = self.unpark(ino) {
            return self.make_alone(ino, p).await;
        }
        wait(d).await
    }

    /// Waits for the makes behind early creates at or below any of `paths` (empty ones
    /// ignored): what the masters answer after them knows those names. EIO if one failed.
    pub(crate) async fn made_under(&self, paths: &[&str]) -> Result<(), Errno> {
        let (waits, parked) = {
            let mut e = self.early.lock();
            if e.makes.is_empty() {
                return Ok(());
            }
            let mut parked = Vec::new();
            let waits: Vec<Done> = e
                .makes
                .iter_mut()
                .filter(|(_, b)| paths.iter().any(|p| !p.is_empty() && under(&b.path, p)))
                .map(|(ino, b)| {
                    if let Some(p) = b.parked.take() {
                        parked.push((*ino, p));
                    }
                    b.done.clone()
                })
                .collect();
            (waits, parked)
        };
        // Those still waiting go now, side by side (the client batches them).
        let mut r = Ok(());
        for done in
            futures::future::join_all(parked.into_iter().map(|(ino, p)| self.make_alone(ino, p)))
                .await
        {
            r = r.and(done);
        }
        for d in waits {
            r = r.and(wait(d).await);
        }
        r
    }
}

async fn wait(mut d: Done) -> Result<(), Errno> {
    match d.wait_for(Option::is_some).await {
        Ok(r) => (*r).unwrap_or(Err(Errno::EIO)),
        // The make's task is gone (the mount is ending): nothing was confirmed.
        Err(_) => Err(Errno::EIO),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_below_a_directory() {
        assert!(under("/a/b", "/a"));
        assert!(under("/a", "/a"));
        assert!(under("/a/b/c", "/"));
        assert!(!under("/ab", "/a"));
        assert!(!under("/a", "/a/b"));
    }

    #[test]
    fn reserved_numbers_are_taken_in_order_once() {
        let mut e = Early::default();
        let t = Instant::now();
        e.held(7, t, String::new(), 100, 2);
        let h = e.dirs.get_mut(&7).unwrap();
        h.inos.push_back((500, 501));
        assert_eq!(h.left(), 3);
        assert_eq!(
            [h.take(), h.take(), h.take(), h.take()],
            [Some(100), Some(101), Some(500), None]
        );
        assert_eq!(h.left(), 0);
    }
}
