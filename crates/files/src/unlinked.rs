//! Files unlinked while open, in [`UNLINKED_DIR`] (NFS's "silly rename"): the mount that
//! holds one keeps it fresh, and any mount removes those nobody kept fresh — left by a
//! mount that was killed before their last close (docs/files.md "Unlinked while open").
//!
//! Fresh is the entry's ctime: the holder sets the entry's atime every
//! [`touch_every`] (a setattr, which sets the ctime too); an entry whose ctime is older
//! than the stale age (`Options::unlinked_stale`, [`UNLINKED_STALE`] by default) has no live
//! holder, and the sweep — at the mount's start and every half of that age — removes it,
//! naming its inode (a name reused meanwhile is not touched). A mount stopped or cut off for
//! longer than the stale age loses such files: its reads go on from the extents it knows
//! (for the segments' collection grace), its last close's remove finds nothing.

use crate::shared::{Shared, UNLINKED_DIR, time_of};
use cairn_rpc::files::{FileOp, FileQuery, FileReply, SetAttr};
use fuser::Errno;
use std::time::{Duration, SystemTime};

/// Default age past which an entry of [`UNLINKED_DIR`] nobody kept fresh is removed.
pub const UNLINKED_STALE: Duration = Duration::from_secs(600);

/// How often a holder refreshes its entries: well inside the stale age.
pub(crate) fn touch_every(stale: Duration) -> Duration {
    (stale / 4).min(Duration::from_secs(60))
}

impl Shared {
    /// The paths this mount holds below [`UNLINKED_DIR`].
    async fn held_unlinked(&self) -> Vec<(u64, String)> {
        let files: Vec<_> = self
            .files
            .lock()
            .iter()
            .map(|(ino, st)| (*ino, st.clone()))
            .collect();
        let mut held = Vec::new();
        for (ino, st) in files {
            if let Some(p) = st.lock().await.unlinked.clone() {
                held.push((ino, p));
            }
        }
        held
    }

    /// Refreshes every entry this mount holds below [`UNLINKED_DIR`].
    pub(crate) async fn touch_unlinked(&self) {
        for (ino, path) in self.held_unlinked().await {
            let now = time_of(SystemTime::now());
            let op = FileOp::SetAttr {
                path: path.clone(),
                ino,
                attr: SetAttr {
                    atime: Some(now),
                    ..SetAttr::default()
                },
                now,
            };
            match self.op(&op).await {
                Ok(_) => {}
                // Another user's file, opened for reading: its times are not this user's
                // to set (docs/files.md "Unlinked while open").
                Err(Errno::EPERM | Errno::EACCES) => {
                    tracing::debug!(%path, "may not keep an unlinked open file fresh");
                }
                Err(e) => {
                    tracing::warn!(%path, errno = e.code(), "could not keep an unlinked open file fresh");
                }
            }
        }
    }

    /// Removes the entries of [`UNLINKED_DIR`] whose ctime is older than `stale` and that
    /// this mount does not hold (those its user may remove); how many it removed.
    pub(crate) async fn sweep_unlinked(&self, stale: Duration) -> usize {
        let held: Vec<String> = self
            .held_unlinked()
            .await
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        let cutoff = time_of(SystemTime::now() - stale);
        let mut after = String::new();
        let mut removed = 0;
        loop {
            let q = FileQuery::Readdir {
                path: UNLINKED_DIR.into(),
                ino: 0,
                after: after.clone(),
                limit: cairn_rpc::files::READDIR_MAX,
                mount: self.mount_id.clone(),
            };
            let (entries, more) = match self.query(&q).await {
                Ok(FileReply::Readdir { entries, more }) => (entries, more),
                // None made yet, or not readable by this mount's user.
                Ok(_) | Err(_) => return removed,
            };
            for e in &entries {
                let path = format!("{UNLINKED_DIR}/{}", e.name);
                if e.attr.ctime >= cutoff || held.contains(&path) {
                    continue;
                }
                let op = FileOp::Remove {
                    path: path.clone(),
                    ino: e.attr.ino,
                    dir: e.attr.kind == cairn_rpc::files::NodeType::Directory,
                    now: time_of(SystemTime::now()),
                    mount: self.mount_id.clone(),
                };
                match self.op(&op).await {
                    Ok(_) => {
                        removed += 1;
                        tracing::info!(%path, "removed a file a dead mount left unlinked while open");
                    }
                    // Another user's (the directory is sticky), or gone meanwhile.
                    Err(Errno::EACCES | Errno::EPERM | Errno::ENOENT | Errno::ENOTEMPTY) => {}
                    Err(e) => {
                        tracing::warn!(%path, errno = e.code(), "could not remove a stale unlinked file");
                    }
                }
            }
            match entries.last() {
                Some(last) if more => after = last.name.clone(),
                _ => return removed,
            }
        }
    }
}
