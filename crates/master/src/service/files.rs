//! The file service's calls (docs/files.md): a mount's changes, batched with other callers'
//! (`BatchOp.fs`), and its reads (`FileRead`). Each is routed by path to the partition that
//! holds it, as the namespace's calls are (namespace.rs).

use super::namespace::Routed;
use super::{Inner, as_user, now_ms};
use crate::convert;
use crate::groups::Hosted;
use crate::state::Command;
use cairn_rpc::auth::Principal;
use cairn_rpc::files::{FileOp, FileQuery, FileReply, Time};
use cairn_rpc::{MetaError, pb};
use std::sync::Arc;

/// A file service change, ready for its partition's batch or done already.
pub(super) enum Prepared {
    Write(Arc<Hosted>, Command),
    Done(FileReply),
}

fn now() -> Time {
    Time::from_ms(now_ms())
}

impl Inner {
    /// Checks a change and makes it the command its partition applies, with the leader's
    /// time; a rename across partitions is driven here (txn.rs) and answered done.
    pub(super) async fn prepare_file(
        &self,
        body: &[u8],
        who: &Principal,
    ) -> Result<Prepared, MetaError> {
        let mut op: FileOp = cairn_rpc::files::decode(body)?;
        if matches!(who, Principal::Service(_) | Principal::Open) {
            return Err(MetaError::new(
                cairn_rpc::ErrorKind::PermissionDenied,
                "the file service's changes are a user's (a mount's credentials)",
            ));
        }
        let t = now();
        match &mut op {
            FileOp::Make { path, now, .. }
            | FileOp::Remove { path, now, .. }
            | FileOp::SetAttr { path, now, .. }
            | FileOp::Write { path, now, .. }
            | FileOp::Punch { path, now, .. }
            | FileOp::Hold { path, now, .. }
            | FileOp::SetXattr { path, now, .. } => {
                *path = convert::path(path)?;
                *now = t;
            }
            FileOp::Rename { from, to, now, .. } | FileOp::Link { from, to, now, .. } => {
                *from = convert::path(from)?;
                *to = convert::path(to)?;
                *now = t;
            }
        }
        let routed = self.route(op.path()).await?;
        self.check_above(&routed, who)?;
        // A directory another mount made a moment ago: its creates there may not have
        // reached the masters yet (docs/files.md "A create that does not wait").
        routed.h.sm.lock().state.check_dir_holds(&op, now_ms())?;
        if let FileOp::Rename {
            from, to, flags, ..
        } = &op
        {
            routed.not_top(from, "renamed")?;
            let dest = self.sm.lock().state.route(to);
            if dest.partition != routed.h.id {
                if flags.exchange || flags.noreplace {
                    return Err(MetaError::invalid(format!(
                        "{from} → {to}: an exchange or a no-replace rename across partitions \
                         is not built yet (docs/files.md)"
                    )));
                }
                let dest = Routed {
                    h: self.led_soon(dest.partition).await?,
                    top: dest.top,
                };
                dest.not_top(to, "replaced")?;
                self.check_above(&dest, who)?;
                dest.h.sm.lock().state.check_dir_holds(&op, now_ms())?;
                self.rename_across(who, from.clone(), to.clone(), routed.h.id, dest.h.id)
                    .await?;
                return Ok(Prepared::Done(FileReply::Done));
            }
        }
        let cmd = as_user(who, Command::Files(Box::new(op)))?;
        Ok(Prepared::Write(routed.h, cmd))
    }

    /// Answers a file service read from the partition that holds its path.
    pub(super) async fn file_read(
        &self,
        who: &Principal,
        body: &[u8],
    ) -> Result<pb::ObjectBytes, MetaError> {
        let q: FileQuery = cairn_rpc::files::decode(body)?;
        let reply = match &q {
            FileQuery::Statfs => {
                self.leader_check()?;
                self.statfs()
            }
            FileQuery::Lookup { path, .. }
            | FileQuery::Readdir { path, .. }
            | FileQuery::Map { path, .. }
            | FileQuery::Xattrs { path, .. } => {
                let path = convert::path(path)?;
                let routed = self.route(&path).await?;
                self.check_above(&routed, who)?;
                self.barrier(&routed).await?;
                let st = &routed.h.sm.lock().state;
                if let Principal::User { name, admin: false } = who {
                    // Search on the way; read on a directory listed.
                    let ino = st.lookup(&path)?;
                    st.check_reach(ino.id, name)?;
                    // Read on an extended attribute's node (the kernel asks the same of
                    // the process for user.*).
                    if matches!(q, FileQuery::Readdir { .. } | FileQuery::Xattrs { .. }) {
                        st.check_inode(ino.id, name, crate::state::perm::READ)?;
                    }
                }
                let q = match q {
                    FileQuery::Lookup { mount, .. } => FileQuery::Lookup { path, mount },
                    FileQuery::Readdir {
                        ino,
                        after,
                        limit,
                        mount,
                        ..
                    } => FileQuery::Readdir {
                        path,
                        ino,
                        after,
                        limit,
                        mount,
                    },
                    FileQuery::Map { ino, mount, .. } => FileQuery::Map { path, ino, mount },
                    FileQuery::Xattrs { ino, .. } => FileQuery::Xattrs { path, ino },
                    FileQuery::Statfs => FileQuery::Statfs,
                };
                // A file another mount closed and still commits: the asker retries.
                st.file_query_at(&q, Some(now_ms()))?
            }
        };
        Ok(pb::ObjectBytes {
            body: cairn_rpc::files::encode(&reply),
        })
    }

    /// The cluster's size and free space as a file system shows them: the chunkservers'
    /// bytes divided by the default policy's copies.
    fn statfs(&self) -> FileReply {
        let a = self.sm.lock();
        let reg = self.registry.lock();
        let (mut total, mut used) = (0u64, 0u64);
        for s in a.state.servers().values() {
            if let Some(l) = reg.live.get(&s.id) {
                total += l.capacity;
                used += l.used.min(l.capacity);
            }
        }
        let copies = u64::from(crate::state::Policy::default().replicas);
        let (files, dirs, _, _) = a.state.totals();
        FileReply::Statfs {
            total: total / copies,
            free: (total - used) / copies,
            files: files + dirs,
        }
    }
}
