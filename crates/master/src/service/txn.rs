//! Renames across partitions at the service (state/txn.rs): the root's leader drives each
//! two-phase commit; its once-a-second tick takes over those no driver here runs (a driver
//! that stopped, or one at a master that lost the root's leadership).

use super::{Inner, MetaService, as_user, now_ms};
use crate::groups::Hosted;
use crate::state::partitions::{PartitionId, partition_of};
use crate::state::txn::{Decision, Intent};
use crate::state::{Command, Inode};
use cairn_rpc::auth::Principal;
use cairn_rpc::{ErrorKind, MetaError};
use std::collections::BTreeMap;

/// An intent older than this with no driver here is taken over by the tick.
const ORPHANED_AFTER_MS: u64 = 5_000;

/// The most files and directories below a directory renamed across partitions. Writes
/// below it wait (retried by clients for 15 s) while its rows are copied (~24 000 a second
/// here: BENCHMARKS.md "A directory renamed across partitions"); the same bound as an
/// automatic split's (service/autosplit.rs), which copies slower.
pub const RENAME_DIR_ROWS: u64 = super::autosplit::AUTO_MOVE_ROWS;

impl Inner {
    /// Renames the file `from` (in partition `src`) to `to` (in `dst`) for `who`.
    pub(super) async fn rename_across(
        &self,
        who: &Principal,
        from: String,
        to: String,
        src: PartitionId,
        dst: PartitionId,
    ) -> Result<(), MetaError> {
        let begin = Command::TxBegin {
            from,
            to,
            src,
            dst,
            now_ms: now_ms(),
        };
        let txid = self
            .write(begin)
            .await?
            .txid
            .ok_or_else(|| MetaError::internal("a rename's intent got no transaction id"))?;
        self.renaming.lock().insert(txid);
        let r = self.drive_rename(txid, Some(who)).await;
        self.renaming.lock().remove(&txid);
        r
    }

    /// Drives transaction `txid` to its end. With `who` (its caller) an undecided one is
    /// prepared and decided; without (a takeover) it is aborted. The caller's error is a
    /// prepare's refusal (the source is missing, the destination a directory, no right…),
    /// or `Unavailable` when the transaction ended other than its caller asked.
    pub(crate) async fn drive_rename(
        &self,
        txid: u64,
        who: Option<&Principal>,
    ) -> Result<(), MetaError> {
        self.read_barrier().await?;
        let Some(intent) = self.sm.lock().state.txns().open.get(&txid).cloned() else {
            return Ok(());
        };
        let src = self.led_soon(intent.src).await?;
        let dst = self.led_soon(intent.dst).await?;
        let mut refused = None;
        let decided = match (&intent.decision, who) {
            (Some(d), _) => d.clone(),
            (None, None) => Decision::Abort,
            (None, Some(who)) => {
                let lock_source = Command::TxLockSource {
                    txid,
                    path: intent.from.clone(),
                };
                let prepared: Result<Inode, MetaError> = async {
                    let r = self.write_to(&src, as_user(who, lock_source)?).await?;
                    let record = r
                        .inode
                        .ok_or_else(|| MetaError::internal("a locked source without its record"))?;
                    let dir = record.file().is_none();
                    let lock_dest = Command::TxLockDest {
                        txid,
                        path: intent.to.clone(),
                        dir,
                    };
                    self.write_to(&dst, as_user(who, lock_dest)?).await?;
                    if dir {
                        let rows = self
                            .rows_below(intent.src, &intent.from, RENAME_DIR_ROWS)
                            .await;
                        if rows > RENAME_DIR_ROWS {
                            return Err(MetaError::invalid(format!(
                                "{} holds more than {RENAME_DIR_ROWS} files and directories: \
                                 too many to rename into another partition at once (its \
                                 writes wait while they are copied); rename within the \
                                 partition, or move its contents in parts",
                                intent.from
                            )));
                        }
                    }
                    Ok(record)
                }
                .await;
                match prepared {
                    Ok(record) => Decision::Commit(Box::new(record)),
                    Err(e) if e.kind == ErrorKind::NotLeader => return Err(e),
                    Err(e) => {
                        refused = Some(e);
                        Decision::Abort
                    }
                }
            }
        };
        let record = match &decided {
            Decision::Commit(r) => Some((**r).clone()),
            Decision::Abort => None,
        };
        let wanted = record.is_some();
        // A decision made already (by another driver) stands: the reply holds it.
        let record = self.write(Command::TxDecide { txid, record }).await?.inode;
        // A commit whose destination holds no lock any more was carried out but for the end
        // (the lock goes last): its forwards are not written again, since a move may have
        // taken the file's directory on since.
        let done = match &record {
            Some(_) => {
                dst.read_barrier().await?;
                !dst.sm.lock().state.locks().contains_key(&txid)
            }
            None => false,
        };
        match &record {
            Some(_) if done => {}
            Some(inode) if inode.file().is_none() => {
                self.carry_dir(txid, &intent, inode, &src, &dst).await?;
                self.write_to(&dst, Command::TxUnlock { txid }).await?;
            }
            Some(inode) => {
                let install = Command::TxInstall {
                    txid,
                    inode: inode.clone(),
                };
                self.write_to(&dst, install).await?;
                // The allocating partitions forward the chunks to the destination before the
                // source lets the file go: a chunk always resolves to a file that lists it.
                let mut by_alloc: BTreeMap<PartitionId, Vec<u64>> = BTreeMap::new();
                for c in inode
                    .file()
                    .map(|f| f.chunks.as_slice())
                    .unwrap_or_default()
                {
                    by_alloc
                        .entry(crate::state::partitions::partition_of(c.id))
                        .or_default()
                        .push(c.id);
                }
                for (p, chunks) in by_alloc {
                    let h = self.led_soon(p).await?;
                    let fwd = Command::TxForward {
                        chunks,
                        to: intent.dst,
                    };
                    self.write_to(&h, fwd).await?;
                }
                self.write_to(&src, Command::TxRemove { txid }).await?;
                // Only now the destination's lock goes: until the forwards are written, no
                // move may take the file's directory away (its driver would forward the
                // chunks there, and this one's forwards, written after, would send them back
                // to a partition that no longer holds the file: nemesis seed 56).
                self.write_to(&dst, Command::TxUnlock { txid }).await?;
            }
            None => {
                self.write_to(&src, Command::TxUnlock { txid }).await?;
                self.write_to(&dst, Command::TxUnlock { txid }).await?;
            }
        }
        self.write(Command::TxEnd { txid }).await?;
        tracing::info!(txid, from = %intent.from, to = %intent.to, src = intent.src,
            dst = intent.dst, committed = record.is_some(), "rename across partitions");
        if let Some(e) = refused {
            return Err(e);
        }
        if wanted && record.is_none() {
            return Err(MetaError::new(
                ErrorKind::Unavailable,
                format!(
                    "rename {} → {}: aborted by a takeover (retry)",
                    intent.from, intent.to
                ),
            ));
        }
        Ok(())
    }
}

impl Inner {
    /// The commit of a directory's rename, up to the destination's unlock: the rows below it
    /// are loaded at the destination (parents first, not reachable yet), the directory is
    /// installed (all at once visible; loading closes), the partitions that allocated their
    /// chunks forward them to the destination, and the source drops the subtree. Every step
    /// repeats safely: the source's lock is there until its removal (its rows are frozen till
    /// then, so a takeover walks them again), and a destination that holds the directory
    /// already takes no more rows.
    async fn carry_dir(
        &self,
        txid: u64,
        intent: &Intent,
        top: &Inode,
        src: &Hosted,
        dst: &Hosted,
    ) -> Result<(), MetaError> {
        let started = std::time::Instant::now();
        src.read_barrier().await?;
        if !src.sm.lock().state.locks().contains_key(&txid) {
            return Ok(()); // removed: loaded, installed and forwarded before
        }
        dst.read_barrier().await?;
        let installed = dst
            .sm
            .lock()
            .state
            .lookup(&intent.to)
            .is_ok_and(|i| i.id == top.id);
        let (mut cursor, mut top_policy) = {
            let a = src.sm.lock();
            (
                crate::state::moves::RowsCursor::for_rename(&a.state, &intent.from)?,
                a.state.dir_policy(top.id).map(|p| (top.id, p)),
            )
        };
        let mut by_alloc: BTreeMap<PartitionId, Vec<u64>> = BTreeMap::new();
        let mut rows = 0usize;
        loop {
            let batch = src.sm.lock().state.rows_batch(&mut cursor);
            let (inodes, mut policies) = match batch {
                Some(b) => b,
                None if top_policy.is_some() => Default::default(),
                None => break,
            };
            policies.extend(top_policy.take());
            rows += inodes.len();
            for i in &inodes {
                for c in i.file().map(|f| f.chunks.as_slice()).unwrap_or_default() {
                    by_alloc.entry(partition_of(c.id)).or_default().push(c.id);
                }
            }
            if !installed {
                let load = Command::TxLoad {
                    txid,
                    top: top.id,
                    inodes,
                    policies,
                };
                self.write_to(dst, load).await?;
            }
        }
        let install = Command::TxInstall {
            txid,
            inode: top.clone(),
        };
        self.write_to(dst, install).await?;
        let mut forwarded = 0usize;
        for (p, chunks) in by_alloc {
            let h = self.led_soon(p).await?;
            for part in chunks.chunks(super::moves::FORWARDS_PER_ENTRY) {
                let fwd = Command::TxForward {
                    chunks: part.to_vec(),
                    to: intent.dst,
                };
                self.write_to(&h, fwd).await?;
                forwarded += part.len();
            }
        }
        self.write_to(src, Command::TxRemove { txid }).await?;
        tracing::info!(txid, from = %intent.from, to = %intent.to, rows, chunks = forwarded,
            ms = started.elapsed().as_millis() as u64, "directory renamed across partitions");
        Ok(())
    }

    /// Releases, in every partition led here, locks whose transaction the root no longer
    /// holds open (ids are never reused, so such a lock belongs to no one).
    async fn release_stale_locks(&self) {
        if self.read_barrier().await.is_err() {
            return;
        }
        for h in self.groups.all() {
            if h.leader_check().is_err() {
                continue;
            }
            // The locks first, then the intents: a lock seen is of a transaction begun
            // before, so one not open after has ended.
            let locked: Vec<u64> = h.sm.lock().state.locks().keys().copied().collect();
            if locked.is_empty() {
                continue;
            }
            let stale: Vec<u64> = {
                let root = self.sm.lock();
                let open = &root.state.txns().open;
                locked
                    .into_iter()
                    .filter(|t| !open.contains_key(t))
                    .collect()
            };
            for txid in stale {
                tracing::info!(
                    txid,
                    partition = h.id,
                    "releasing a lock whose rename ended"
                );
                if let Err(e) = self.write_to(&h, Command::TxUnlock { txid }).await {
                    tracing::warn!(txid, error = %e, "releasing a stale lock failed");
                }
            }
        }
    }
}

impl MetaService {
    /// At the root's leader, takes over renames across partitions that no driver here runs
    /// and that began more than a few seconds ago: decided ones are finished, undecided ones
    /// aborted.
    pub(crate) fn resume_renames(&self) {
        if self.inner.leader_check().is_err() {
            return;
        }
        let now = now_ms();
        let orphaned: Vec<u64> = {
            let a = self.inner.sm.lock();
            let driving = self.inner.renaming.lock();
            a.state
                .txns()
                .open
                .iter()
                .filter(|(tx, i)| {
                    !driving.contains(tx) && now.saturating_sub(i.started_ms) > ORPHANED_AFTER_MS
                })
                .map(|(tx, _)| *tx)
                .collect()
        };
        // Locks of transactions that ended (a driver that lost the root's leadership and
        // locked after its intent was aborted): released.
        let inner = self.inner.clone();
        tokio::spawn(async move { inner.release_stale_locks().await });
        for txid in orphaned {
            self.inner.renaming.lock().insert(txid);
            let inner = self.inner.clone();
            tokio::spawn(async move {
                if let Err(e) = inner.drive_rename(txid, None).await {
                    tracing::warn!(txid, error = %e, "taking over a rename: not finished (retried)");
                }
                inner.renaming.lock().remove(&txid);
            });
        }
    }
}
