//! Batching of the masters' mutating calls: creates, commits and deletes of concurrent callers
//! share one `Batch` call (and the leader puts them in one Raft entry).
//!
//! Natural batching, as a disk's group commit: at most `in_flight` calls are out at once. A
//! caller that finds a free slot sends its operation itself, at once, on its own task (a lone
//! caller never waits for company nor changes threads); one that finds every slot taken queues
//! its operation, and the next call — sent by whoever frees a slot — takes every operation
//! queued (up to [`crate::MAX_BATCH_OPS`]). Operations in one call are independent — each
//! caller has at most one outstanding — so their order inside the call does not matter.

use crate::masters::Shared;
use crate::pb::batch_op::Op;
use crate::pb::batch_result::Result as Outcome;
use crate::{ErrorKind, MetaError, pb};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

pub(crate) const DEFAULT_IN_FLIGHT: usize = 1;

/// After a master answered that it does not know `Batch` (an older version), operations go
/// out on their own calls for this long before batching is tried again.
const UNSUPPORTED_BACKOFF: Duration = Duration::from_secs(60);

type Answer = Result<Outcome, MetaError>;

struct Pending {
    op: Op,
    reply: oneshot::Sender<Answer>,
}

/// How well operations shared calls.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchStats {
    /// `Batch` calls sent.
    pub calls: u64,
    /// Operations they carried.
    pub ops: u64,
}

pub(crate) struct Batcher {
    max_in_flight: usize,
    inner: Arc<Inner>,
}

struct Inner {
    queue: Mutex<Queue>,
    unsupported_at: Mutex<Option<Instant>>,
    calls: AtomicU64,
    ops: AtomicU64,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Pending>,
    in_flight: usize,
}

impl Batcher {
    pub(crate) fn new(max_in_flight: usize) -> Self {
        Self {
            max_in_flight,
            inner: Arc::new(Inner {
                queue: Mutex::default(),
                unsupported_at: Mutex::new(None),
                calls: AtomicU64::new(0),
                ops: AtomicU64::new(0),
            }),
        }
    }

    pub(crate) fn stats(&self) -> BatchStats {
        BatchStats {
            calls: self.inner.calls.load(Ordering::Relaxed),
            ops: self.inner.ops.load(Ordering::Relaxed),
        }
    }

    /// One operation; its own result (a failure of this operation alone, or of the whole call).
    pub(crate) async fn submit(&self, shared: &Arc<Shared>, op: Op) -> Answer {
        let recent_unsupported = self
            .inner
            .unsupported_at
            .lock()
            .is_some_and(|t| t.elapsed() < UNSUPPORTED_BACKOFF);
        if self.max_in_flight == 0 || recent_unsupported {
            return single(shared, op).await;
        }
        let queued = {
            let mut q = self.inner.queue.lock();
            if q.in_flight >= self.max_in_flight {
                let (tx, rx) = oneshot::channel();
                q.waiting.push(Pending { op, reply: tx });
                Err(rx)
            } else {
                q.in_flight += 1;
                Ok((op, take(&mut q.waiting, crate::MAX_BATCH_OPS - 1)))
            }
        };
        let (op, others) = match queued {
            Ok(mine) => mine,
            Err(rx) => {
                return rx.await.unwrap_or_else(|_| {
                    Err(MetaError::new(
                        ErrorKind::Unavailable,
                        "the call carrying this operation was abandoned",
                    ))
                });
            }
        };
        // A slot is ours: send this operation (and any queued) from this task.
        let slot = Slot {
            inner: self.inner.clone(),
            shared: shared.clone(),
        };
        let (replies, mut ops): (Vec<_>, Vec<_>) =
            others.into_iter().map(|p| (p.reply, p.op)).unzip();
        ops.push(op);
        let mut answers = self.inner.send(shared, ops).await;
        let mine = answers.pop().expect("one answer per operation");
        for (r, a) in replies.into_iter().zip(answers) {
            let _ = r.send(a);
        }
        drop(slot);
        mine
    }
}

/// A call slot; freeing it hands whatever queued meanwhile to a task that sends it.
struct Slot {
    inner: Arc<Inner>,
    shared: Arc<Shared>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut q = self.inner.queue.lock();
        if q.waiting.is_empty() {
            q.in_flight -= 1;
            return;
        }
        // Keep the slot for the queued operations.
        let batch = take(&mut q.waiting, crate::MAX_BATCH_OPS);
        drop(q);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime to send from: the queued callers get an error (their senders drop).
            self.inner.queue.lock().in_flight -= 1;
            return;
        };
        let slot = Slot {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        };
        rt.spawn(async move {
            let (replies, ops): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|p| (p.reply, p.op)).unzip();
            let answers = slot.inner.send(&slot.shared, ops).await;
            for (r, a) in replies.into_iter().zip(answers) {
                let _ = r.send(a);
            }
            drop(slot);
        });
    }
}

fn take(waiting: &mut Vec<Pending>, most: usize) -> Vec<Pending> {
    let n = waiting.len().min(most);
    waiting.drain(..n).collect()
}

impl Inner {
    /// One `Batch` call; an answer per operation, in order.
    async fn send(&self, shared: &Shared, ops: Vec<Op>) -> Vec<Answer> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.ops.fetch_add(ops.len() as u64, Ordering::Relaxed);
        let n = ops.len();
        let req = pb::BatchRequest {
            ops: ops
                .iter()
                .map(|op| pb::BatchOp {
                    op: Some(op.clone()),
                })
                .collect(),
        };
        match shared
            .send(req, |mut c, r| async move { c.batch(r).await })
            .await
        {
            Ok(reply) if reply.results.len() == n => {
                reply.results.into_iter().map(outcome).collect()
            }
            Ok(reply) => {
                let e = MetaError::internal(format!(
                    "a batch of {n} operations got {} results",
                    reply.results.len()
                ));
                vec![Err(e); n]
            }
            Err(e) if e.kind == ErrorKind::Unsupported => {
                *self.unsupported_at.lock() = Some(Instant::now());
                let mut answers = Vec::with_capacity(n);
                for op in ops {
                    answers.push(single(shared, op).await);
                }
                answers
            }
            Err(e) => vec![Err(e); n],
        }
    }
}

fn outcome(r: pb::BatchResult) -> Answer {
    match r.result {
        Some(Outcome::Error(f)) => Err(MetaError::from(&f)),
        Some(o) => Ok(o),
        None => Err(MetaError::internal("a batch result without a result")),
    }
}

/// One operation on its own call (no batching, or a master without `Batch`).
async fn single(shared: &Shared, op: Op) -> Answer {
    match op {
        Op::Create(r) => shared
            .send(r, |mut c, r| async move { c.create(r).await })
            .await
            .map(Outcome::File),
        Op::Commit(r) => shared
            .send(r, |mut c, r| async move { c.commit(r).await })
            .await
            .map(Outcome::File),
        Op::Delete(r) => shared
            .send(r, |mut c, r| async move { c.delete(r).await })
            .await
            .map(Outcome::Done),
        // Object index and file service changes exist only in batches: a batch of one.
        op @ (Op::Object(_) | Op::Fs(_)) => {
            let req = pb::BatchRequest {
                ops: vec![pb::BatchOp { op: Some(op) }],
            };
            let reply = shared
                .send(req, |mut c, r| async move { c.batch(r).await })
                .await?;
            match reply.results.into_iter().next() {
                Some(r) => outcome(r),
                None => Err(MetaError::internal("a batch of one got no result")),
            }
        }
    }
}
