//! Creates, commits, deletes and object-index changes of concurrent callers, checked one by
//! one and applied as one Raft entry (`Batch`), and the commands they become.

use super::{Inner, as_user, now_ms};
use crate::convert;
use crate::state::{Command, Lease, Policy};
use cairn_rpc::auth::Principal;
use cairn_rpc::{ErrorKind, MetaError, pb};
use std::collections::BTreeSet;

/// What a batched operation answers with.
#[derive(Clone, Copy)]
enum Answer {
    File,
    Done,
    Object,
}

impl Inner {
    /// A create's command: placement of its first chunks happens here, on the leader.
    pub(super) fn create_command(&self, r: pb::CreateRequest) -> Result<Command, MetaError> {
        let path = convert::path(&r.path)?;
        let policy = match &r.policy {
            Some(p) => convert::policy(Some(p))?,
            None => self
                .sm
                .lock()
                .state
                .inherited_policy(&path)
                .unwrap_or_default(),
        };
        let count = convert::chunk_count(r.chunks)?;
        let now = now_ms();
        let lease = if r.client_id.is_empty() {
            None
        } else {
            Some(Lease {
                holder: convert::client_id(&r.client_id)?,
                expires_ms: self.lease_until(now),
            })
        };
        self.leader_check()?;
        self.check_placeable(&policy)?;
        let (placements, groups) = self.place(&policy, false, count, &BTreeSet::new())?;
        Ok(Command::Create {
            path,
            policy,
            parents: r.parents,
            now_ms: now,
            lease,
            placements,
            groups,
            mode: convert::mode(r.mode)?,
        })
    }

    pub(super) fn commit_command(&self, r: &pb::CommitRequest) -> Result<Command, MetaError> {
        let now = now_ms();
        Ok(Command::Commit {
            path: convert::path(&r.path)?,
            holder: convert::client_id(&r.client_id)?,
            now_ms: now,
            updates: convert::updates(&r.updates)?,
            trim: r.trim,
            release: r.release,
            seal: r.seal,
            lease_until_ms: self.lease_until(now),
            drops: convert::drops(&r.drops)?,
            remove: convert::remove(&r.remove)?,
        })
    }

    /// Independent operations of concurrent callers: each is checked and becomes a command
    /// on its own (a bad one fails alone), and all that pass go into one Raft entry.
    pub(super) async fn batch(
        &self,
        ops: Vec<pb::BatchOp>,
        who: &Principal,
    ) -> Result<pb::BatchReply, MetaError> {
        use pb::batch_op::Op;
        use pb::batch_result::Result as Outcome;
        convert::batch_len(ops.len())?;
        self.leader_check()?;
        metrics::histogram!("cairn_master_batch_ops").record(ops.len() as f64);
        let mut results: Vec<Option<Outcome>> = vec![None; ops.len()];
        let mut cmds = Vec::with_capacity(ops.len());
        // (index in the request, what it answers with)
        let mut at = Vec::with_capacity(ops.len());
        for (i, op) in ops.into_iter().enumerate() {
            let prepared = match op.op {
                Some(Op::Create(r)) => self
                    .create_command(r)
                    .and_then(|c| Ok((as_user(who, c)?, Answer::File))),
                Some(Op::Commit(r)) => self
                    .commit_command(&r)
                    .and_then(|c| Ok((as_user(who, c)?, Answer::File))),
                Some(Op::Delete(r)) => {
                    delete_command(&r).and_then(|c| Ok((as_user(who, c)?, Answer::Done)))
                }
                Some(Op::Object(b)) => cairn_rpc::object::decode(&b)
                    .and_then(|op| {
                        crate::confine::object_op(who, &op)?;
                        crate::confine::on_behalf(who, &op, |user| {
                            self.sm.lock().state.objects().user_named(user).is_some()
                        })?;
                        Ok(op)
                    })
                    .map(|mut op| {
                        self.seal_op(&mut op);
                        (Command::Object(Box::new(op)), Answer::Object)
                    }),
                None => Err(MetaError::invalid("a batch operation without an operation")),
            };
            match prepared {
                Ok((cmd, file)) => {
                    cmds.push(cmd);
                    at.push((i, file));
                }
                Err(e) => results[i] = Some(Outcome::Error((&e).into())),
            }
        }
        if !cmds.is_empty() {
            let reply = self.write(Command::Batch(cmds)).await?;
            if reply.batch.len() != at.len() {
                return Err(MetaError::internal(format!(
                    "a batch of {} commands returned {} results",
                    at.len(),
                    reply.batch.len()
                )));
            }
            for ((i, answer), r) in at.into_iter().zip(reply.batch) {
                let out = r.and_then(|reply| match answer {
                    Answer::File => self.file_reply(reply.inode, who).map(Outcome::File),
                    Answer::Done => Ok(Outcome::Done(pb::Empty {})),
                    Answer::Object => match reply.object {
                        Some(o) => Ok(Outcome::Object(cairn_rpc::object::encode(&o))),
                        None => Err(MetaError::internal("an object change without its answer")),
                    },
                });
                results[i] = Some(out.unwrap_or_else(|e| Outcome::Error((&e).into())));
            }
        }
        Ok(pb::BatchReply {
            results: results
                .into_iter()
                .map(|result| pb::BatchResult { result })
                .collect(),
        })
    }

    pub(super) fn policy_of(&self, path: &str) -> Result<Policy, MetaError> {
        let a = self.sm.lock();
        let ino = a.state.lookup(path)?;
        ino.file().map(|f| f.policy).ok_or_else(|| {
            MetaError::new(ErrorKind::IsADirectory, format!("{path}: is a directory"))
        })
    }
}

pub(super) fn delete_command(r: &pb::PathRequest) -> Result<Command, MetaError> {
    Ok(Command::Delete {
        path: convert::path(&r.path)?,
    })
}
