//! Renaming a file or a directory across partitions (docs/partitions.md, "Operations across
//! partitions"): two-phase commit with the root as the coordinator. The root logs the intent
//! ([`Command::TxBegin`]); the source partition locks the file or directory and hands out its
//! record ([`Command::TxLockSource`]); the destination locks the new path
//! ([`Command::TxLockDest`]); the root logs the decision ([`Command::TxDecide`]: commit with
//! the record, or abort); then, for a directory, the destination takes the rows below it
//! ([`Command::TxLoad`], not reachable until the install); the destination installs the
//! record ([`Command::TxInstall`]), the partitions that allocated the chunks forward them to
//! the destination ([`Command::TxForward`]), the source drops the file or the subtree
//! ([`Command::TxRemove`]) — or, on abort, both unlock ([`Command::TxUnlock`]) — and the
//! root forgets the intent ([`Command::TxEnd`]).
//!
//! A lock makes every write at, above or below its path answer `unavailable` (retried), and
//! the chunks of a locked source file, or of the files below a locked source directory,
//! refuse repairs and conversions, so the rows the root decides on and the driver copies are
//! the ones that stay until they move. Every step after the decision is
//! idempotent (a lock that is gone means the step was done), so the next leader of the root
//! repeats them; an intent not decided when its driver stopped is aborted.

use super::moves::at_or_below;
use super::partitions::{PartitionId, partition_of};
use super::{ChunkId, Inode, InodeId, ROOT, Reply, Response, State};
use cairn_rpc::{ErrorKind, MetaError, components};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A rename across partitions, in the root's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    pub from: String,
    pub to: String,
    /// The partitions holding `from` and `to`.
    pub src: PartitionId,
    pub dst: PartitionId,
    pub started_ms: u64,
    /// `None` until decided.
    pub decision: Option<Decision>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// The file as the source locked it: the destination installs it.
    Commit(Box<Inode>),
    Abort,
}

/// The root's renames across partitions: the next transaction id and those under way.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Txns {
    pub next: u64,
    pub open: BTreeMap<u64, Intent>,
}

/// What a partition holds locked for a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Lock {
    /// The file leaving: inode `inode` at `path`.
    Source { path: String, inode: InodeId },
    /// The path a file arrives at (absent, or a file it replaces).
    Dest { path: String },
}

impl Lock {
    pub fn path(&self) -> &str {
        match self {
            Lock::Source { path, .. } | Lock::Dest { path } => path,
        }
    }
}

/// The directory above `path` (`/` for a top-level name) and the last name.
fn split_last(path: &str) -> Result<(String, String), MetaError> {
    let comps = components(path)?;
    let Some((last, dirs)) = comps.split_last() else {
        return Err(MetaError::invalid("/ cannot be renamed"));
    };
    Ok((format!("/{}", dirs.join("/")), (*last).to_owned()))
}

impl State {
    /// Renames across partitions under way (the root's state).
    pub fn txns(&self) -> &Txns {
        &self.txns
    }

    /// What this partition holds locked, by transaction.
    pub fn locks(&self) -> &BTreeMap<u64, Lock> {
        &self.locks
    }

    /// Refuses a write at, above or below a path locked by a rename across partitions.
    pub(super) fn refuse_locked(&self, path: &str) -> Result<(), MetaError> {
        for (tx, l) in self.locks.iter() {
            if at_or_below(path, l.path()) || at_or_below(l.path(), path) {
                return Err(MetaError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "{path}: {} is being renamed across partitions (tx {tx}; retry)",
                        l.path()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether inode `id` is locked as the source of a rename, or is below a directory that
    /// is.
    pub(super) fn inode_locked(&self, id: InodeId) -> bool {
        let locked: Vec<InodeId> = self
            .locks
            .values()
            .filter_map(|l| match l {
                Lock::Source { inode, .. } => Some(*inode),
                Lock::Dest { .. } => None,
            })
            .collect();
        if locked.is_empty() {
            return false;
        }
        let mut cur = id;
        loop {
            if locked.contains(&cur) {
                return true;
            }
            match self.inodes.get(&cur) {
                Some(i) if cur != ROOT => cur = i.parent,
                _ => return false,
            }
        }
    }

    /// Root: logs the intent; its transaction id is in the reply.
    pub(super) fn tx_begin(
        &mut self,
        from: &str,
        to: &str,
        src: PartitionId,
        dst: PartitionId,
        now_ms: u64,
    ) -> Response {
        if self.home.partition != super::partitions::ROOT_PARTITION {
            return Err(MetaError::invalid(
                "renames across partitions are the root's",
            ));
        }
        let txid = self.txns.next.max(1);
        self.txns.next = txid + 1;
        self.txns.open.insert(
            txid,
            Intent {
                from: from.to_owned(),
                to: to.to_owned(),
                src,
                dst,
                started_ms: now_ms,
                decision: None,
            },
        );
        Ok(Reply {
            txid: Some(txid),
            ..Reply::default()
        })
    }

    /// Source: locks the file or directory at `path` for `txid` (a directory with all below
    /// it; not one that holds another partition's subtree); its record is in the reply.
    /// Repeating it answers the same.
    pub(super) fn tx_lock_source(&mut self, txid: u64, path: &str) -> Response {
        if let Some(l) = self.locks.get(&txid) {
            return match l {
                Lock::Source { inode, .. } => self.reply(*inode),
                Lock::Dest { .. } => Err(MetaError::invalid(format!(
                    "tx {txid} is not a source here"
                ))),
            };
        }
        self.refuse_locked(path)?;
        self.refuse_moving(path)?;
        let ino = self.lookup(path)?;
        if ino.id == ROOT {
            return Err(MetaError::invalid(format!("{path} cannot be renamed")));
        }
        if ino.file().is_none() && self.holds_subtree(path) {
            return Err(MetaError::invalid(format!(
                "{path} holds another partition's subtree (or one moving out): it does not \
                 move across partitions"
            )));
        }
        // Hard links stay in their node's partition (files/links.rs).
        self.refuse_tied(&ino, path)?;
        if ino.file().is_none() {
            self.refuse_ties(path, false)?;
        }
        self.locks.insert(
            txid,
            Lock::Source {
                path: path.to_owned(),
                inode: ino.id,
            },
        );
        self.reply(ino.id)
    }

    /// Destination: locks `path` for `txid` (its directory must exist; it must be absent or,
    /// unless a directory arrives (`dir`), a file, which the rename replaces). Repeating it is
    /// a no-op.
    pub(super) fn tx_lock_dest(&mut self, txid: u64, path: &str, is_dir: bool) -> Response {
        if let Some(l) = self.locks.get(&txid) {
            return match l {
                Lock::Dest { .. } => Ok(Reply::default()),
                Lock::Source { .. } => Err(MetaError::invalid(format!(
                    "tx {txid} is not a destination here"
                ))),
            };
        }
        self.refuse_locked(path)?;
        self.refuse_moving(path)?;
        let (dir, _) = split_last(path)?;
        match self.lookup(path) {
            Ok(_) if is_dir => {
                return Err(MetaError::new(
                    ErrorKind::AlreadyExists,
                    format!("{path} exists"),
                ));
            }
            Ok(ino) if ino.file().is_some() => self.refuse_tied(&ino, path)?,
            Ok(_) => {
                return Err(MetaError::new(
                    ErrorKind::AlreadyExists,
                    format!("{path} is a directory"),
                ));
            }
            Err(e) if e.kind == ErrorKind::NotFound => {
                if self.lookup(&dir)?.file().is_some() {
                    return Err(MetaError::new(
                        ErrorKind::NotADirectory,
                        format!("{dir}: not a directory"),
                    ));
                }
            }
            Err(e) => return Err(e),
        }
        self.locks.insert(
            txid,
            Lock::Dest {
                path: path.to_owned(),
            },
        );
        Ok(Reply::default())
    }

    /// Root: decides `txid` (commit with `record`, or abort) unless it is decided already;
    /// the reply holds the record of a commit, whoever decided it, and none for an abort.
    pub(super) fn tx_decide(&mut self, txid: u64, record: Option<&Inode>) -> Response {
        let Some(intent) = self.txns.open.get(&txid) else {
            return Err(MetaError::not_found(format!("tx {txid}")));
        };
        let decision = match &intent.decision {
            Some(d) => d.clone(),
            None => {
                let d = match record {
                    Some(r) => Decision::Commit(Box::new(r.clone())),
                    None => Decision::Abort,
                };
                if let Some(i) = self.txns.open.get_mut(&txid) {
                    i.decision = Some(d.clone());
                }
                d
            }
        };
        Ok(Reply {
            txid: Some(txid),
            inode: match decision {
                Decision::Commit(r) => Some(*r),
                Decision::Abort => None,
            },
            ..Reply::default()
        })
    }

    /// Destination of a directory's rename, after the decision: puts rows below the
    /// directory (inode `top`). They are reachable only once [`Command::TxInstall`] puts `top`
    /// at the locked path; from then on loading is closed, so a load from a driver that lost
    /// the root's leadership cannot put back rows changed since.
    ///
    /// # Errors
    /// No destination lock of `txid` here (ended), `top` installed already, or a row refused
    /// by [`State::put_rows`]; nothing is changed then.
    pub(super) fn tx_load(
        &mut self,
        txid: u64,
        top: InodeId,
        inodes: &[Inode],
        policies: &[(InodeId, super::Policy)],
    ) -> Response {
        let Some(Lock::Dest { path }) = self.locks.get(&txid).cloned() else {
            return Err(MetaError::invalid(format!(
                "tx {txid} holds no destination here: its rows cannot load"
            )));
        };
        if self.lookup(&path).is_ok_and(|i| i.id == top) {
            return Err(MetaError::new(
                ErrorKind::AlreadyExists,
                format!("{path} is installed already; loading is closed"),
            ));
        }
        self.put_rows(inodes, policies, top)?;
        Ok(Reply::default())
    }

    /// Destination: installs the file at the locked path (replacing a file there). The lock
    /// stays until the driver's `TxUnlock`, after the forwards and the source's removal: a
    /// move of the directory must not begin in between. Installed already (the file is at
    /// the path), or without the lock (done), a no-op.
    pub(super) fn tx_install(&mut self, txid: u64, inode: &Inode) -> Response {
        let Some(Lock::Dest { path }) = self.locks.get(&txid).cloned() else {
            return Ok(Reply::default());
        };
        let (dir, name) = split_last(&path)?;
        let parent = self.lookup(&dir)?.id;
        if self
            .dentries
            .get(&(parent, name.clone()))
            .is_some_and(|id| *id == inode.id)
        {
            return self.reply(inode.id);
        }
        if let Some(old) = self.dentries.get(&(parent, name.clone())).map(|o| *o) {
            if let Some(o) = self.inodes.remove(&old) {
                let chunks = o.file().map(|f| f.chunks.as_slice()).unwrap_or_default();
                for c in chunks {
                    self.chunk_owner.remove(&c.id);
                }
                let gone: Vec<ChunkId> = chunks.iter().map(|c| c.id).collect();
                self.drop_conversions(&gone);
            }
            self.dentries.remove(&(parent, name.clone()));
        }
        let mut ino = inode.clone();
        ino.parent = parent;
        ino.name = name.clone();
        for c in ino.file().map(|f| f.chunks.as_slice()).unwrap_or_default() {
            self.chunk_owner.insert(c.id, ino.id);
        }
        self.dentries.insert((parent, name), ino.id);
        let id = ino.id;
        self.inodes.insert(id, ino);
        self.reply(id)
    }

    /// The partition that allocated `chunks`: each now lives in partition `to` (a forward; none
    /// when `to` is this partition). Chunks this partition did not allocate are left alone.
    pub(super) fn tx_forward(&mut self, chunks: &[ChunkId], to: PartitionId) -> Response {
        let own = self.home.partition;
        for c in chunks.iter().filter(|c| partition_of(**c) == own) {
            if to == own {
                self.forwards.remove(c);
            } else {
                self.forwards.insert(*c, to);
            }
        }
        Ok(Reply::default())
    }

    /// Source: drops the locked file, or the locked directory with everything below it, and
    /// unlocks. Without the lock (done already) a no-op.
    pub(super) fn tx_remove(&mut self, txid: u64) -> Response {
        let Some(Lock::Source { inode, .. }) = self.locks.get(&txid).cloned() else {
            return Ok(Reply::default());
        };
        if let Some(ino) = self.inodes.remove(&inode) {
            self.dentries.remove(&(ino.parent, ino.name.clone()));
            let gone: Vec<ChunkId> = match ino.file() {
                Some(f) => {
                    for c in &f.chunks {
                        self.chunk_owner.remove(&c.id);
                    }
                    f.chunks.iter().map(|c| c.id).collect()
                }
                None => {
                    self.dir_policies.remove(&inode);
                    self.remove_below(inode)
                }
            };
            // The destination converts them again.
            self.drop_conversions(&gone);
        }
        self.locks.remove(&txid);
        Ok(Reply::default())
    }

    /// Source or destination after an abort, or the destination once a commit's forwards
    /// and removal are written: the lock goes.
    pub(super) fn tx_unlock(&mut self, txid: u64) -> Response {
        if self.locks.contains_key(&txid) {
            self.locks.remove(&txid);
        }
        Ok(Reply::default())
    }

    /// Root: the intent is done.
    pub(super) fn tx_end(&mut self, txid: u64) -> Response {
        if self.txns.open.contains_key(&txid) {
            self.txns.open.remove(&txid);
        }
        Ok(Reply::default())
    }
}

#[cfg(test)]
mod tests;
