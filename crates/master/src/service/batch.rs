//! Creates, commits, deletes and object-index changes of concurrent callers, checked one by
//! one and applied as one Raft entry (`Batch`) per partition they are in, the partitions'
//! entries written concurrently.

use super::Inner;
use crate::convert;
use crate::groups::Hosted;
use crate::state::Command;
use crate::state::partitions::PartitionId;
use cairn_rpc::auth::Principal;
use cairn_rpc::{MetaError, pb};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a batched operation answers with.
#[derive(Clone, Copy)]
enum Answer {
    File,
    Done,
    Object,
    Fs,
}

impl Inner {
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
        // By partition: its group, then (index in the request, what it answers with) and the
        // command of each of its operations.
        type Part = (Arc<Hosted>, Vec<(usize, Answer)>, Vec<Command>);
        let mut parts: BTreeMap<PartitionId, Part> = BTreeMap::new();
        for (i, op) in ops.into_iter().enumerate() {
            let prepared = match op.op {
                Some(Op::Create(r)) => self
                    .create_command(r, who)
                    .await
                    .map(|(r, c)| (r.h, c, Answer::File)),
                Some(Op::Commit(r)) => self
                    .commit_command(&r, who)
                    .await
                    .map(|(r, c)| (r.h, c, Answer::File)),
                Some(Op::Delete(r)) => self
                    .delete_command(&r, who)
                    .await
                    .map(|(r, c)| (r.h, c, Answer::Done)),
                Some(Op::Object(b)) => match cairn_rpc::object::decode(&b)
                    .and_then(|op| {
                        crate::confine::object_op(who, &op)?;
                        crate::confine::on_behalf(who, &op, |user| {
                            self.sm.lock().state.objects().user_named(user).is_some()
                        })?;
                        Ok(op)
                    })
                    .map(|mut op| {
                        self.seal_op(&mut op);
                        op
                    }) {
                    Ok(op) => match self.prepare_object(op).await {
                        Ok(super::buckets::Prepared::Write(h, cmd)) => Ok((h, cmd, Answer::Object)),
                        Ok(super::buckets::Prepared::Done(result)) => {
                            let encoded = cairn_rpc::object::encode(&result);
                            results[i] = Some(Outcome::Object(encoded));
                            continue;
                        }
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                },
                Some(Op::Fs(b)) => match self.prepare_file(&b, who).await {
                    Ok(super::files::Prepared::Write(h, cmd)) => Ok((h, cmd, Answer::Fs)),
                    Ok(super::files::Prepared::Done(reply)) => {
                        results[i] = Some(Outcome::Fs(cairn_rpc::files::encode(&reply)));
                        continue;
                    }
                    Err(e) => Err(e),
                },
                None => Err(MetaError::invalid("a batch operation without an operation")),
            };
            match prepared {
                Ok((h, cmd, answer)) => {
                    let part = parts
                        .entry(h.id)
                        .or_insert_with(|| (h.clone(), Vec::new(), Vec::new()));
                    part.1.push((i, answer));
                    part.2.push(cmd);
                }
                Err(e) => results[i] = Some(Outcome::Error((&e).into())),
            }
        }
        let single = parts.len() == 1;
        let writes = parts.into_values().map(|(h, at, cmds)| async move {
            let r = self.write_to(&h, Command::Batch(cmds)).await;
            (at, r)
        });
        for (at, reply) in futures::future::join_all(writes).await {
            let reply = match reply {
                Ok(r) => r,
                // One partition: its error is the call's (a redirect the client follows).
                Err(e) if single => return Err(e),
                Err(e) => {
                    for (i, _) in at {
                        results[i] = Some(Outcome::Error((&e).into()));
                    }
                    continue;
                }
            };
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
                    Answer::Fs => match reply.file {
                        Some(f) => Ok(Outcome::Fs(cairn_rpc::files::encode(&f))),
                        None => Err(MetaError::internal("a file change without its answer")),
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
}
