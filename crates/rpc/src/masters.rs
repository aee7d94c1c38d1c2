//! A client of the master group that finds the leader and follows redirects.

use crate::auth::{Credential, Signed};
use crate::batch::Batcher;
use crate::pb::meta_client::MetaClient;
use crate::{ErrorKind, MetaError, pb};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// Calls go to the last known leader; a redirect switches to the leader it names, an
/// unreachable master or one without a leader makes the call try the next address, with a
/// short back-off, until `retry_for` has passed.
///
/// Creates, commits and deletes ([`Masters::create`], [`Masters::commit`], [`Masters::delete`])
/// of concurrent callers share `Batch` calls (see [`Masters::batch_in_flight`]).
pub struct Masters {
    shared: Arc<Shared>,
    batcher: Batcher,
}

pub(crate) struct Shared {
    addrs: Vec<String>,
    /// Where the next call starts: the last master that answered (possibly one not in
    /// `addrs`, learned from a redirect), or the one after a master that did not.
    leader: Mutex<Option<String>>,
    clients: Mutex<HashMap<String, MetaClient<Signed>>>,
    retry_for: Mutex<Duration>,
    /// How long a call keeps trying when no master answers at all (none: `retry_for`). A
    /// command-line tool sets a few seconds, so that a wrong address or a stopped cluster is
    /// reported at once; servers keep trying through elections.
    unreachable_for: Mutex<Option<Duration>>,
    /// What every call is signed with (none: the masters must run `--insecure`).
    cred: Mutex<Option<Arc<Credential>>>,
    /// TLS to the masters (none: plain TCP).
    tls: Mutex<Option<crate::tls::ClientTlsConfig>>,
}

impl Masters {
    /// # Errors
    /// No address, or one that is not a `host:port`.
    pub fn new(addrs: &[String]) -> Result<Self, MetaError> {
        if addrs.is_empty() {
            return Err(MetaError::invalid("no master address given"));
        }
        let s = Shared {
            addrs: addrs.to_vec(),
            leader: Mutex::new(None),
            clients: Mutex::new(HashMap::new()),
            retry_for: Mutex::new(Duration::from_secs(15)),
            unreachable_for: Mutex::new(None),
            cred: Mutex::new(None),
            tls: Mutex::new(None),
        };
        for a in addrs {
            s.client(a)?;
        }
        Ok(Self {
            shared: Arc::new(s),
            batcher: Batcher::new(crate::batch::DEFAULT_IN_FLIGHT),
        })
    }

    /// How long a call keeps trying through elections and restarts (default 15 s).
    #[must_use]
    pub fn retry_for(self, d: Duration) -> Self {
        *self.shared.retry_for.lock() = d;
        self
    }

    /// How long a call keeps trying while no master answers at all (default: `retry_for`).
    #[must_use]
    pub fn unreachable_for(self, d: Option<Duration>) -> Self {
        *self.shared.unreachable_for.lock() = d;
        self
    }

    /// Signs every call with `cred` (docs/security.md).
    #[must_use]
    pub fn credential(self, cred: Option<Credential>) -> Self {
        *self.shared.cred.lock() = cred.map(Arc::new);
        self.shared.clients.lock().clear();
        self
    }

    /// Talks TLS to the masters, checking them with `tls` (crate::tls).
    #[must_use]
    pub fn tls(self, tls: Option<crate::tls::ClientTlsConfig>) -> Self {
        *self.shared.tls.lock() = tls;
        self.shared.clients.lock().clear();
        self
    }

    /// `Batch` calls in flight at once (default 1); creates, commits and deletes that arrive
    /// while they all are gather into the next one. 0 sends each on its own call.
    #[must_use]
    pub fn batch_in_flight(mut self, n: usize) -> Self {
        self.batcher = Batcher::new(n);
        self
    }

    /// Calls and operations the batcher sent so far.
    pub fn batch_stats(&self) -> crate::BatchStats {
        self.batcher.stats()
    }

    pub fn addrs(&self) -> &[String] {
        &self.shared.addrs
    }

    /// Sends `req` to the leader with `f` (e.g. `|mut c, r| async move { c.stat(r).await }`),
    /// cloning it for each retry.
    ///
    /// # Errors
    /// As [`Masters::call`].
    pub async fn send<Req, T, F, Fut>(&self, req: Req, f: F) -> Result<T, MetaError>
    where
        Req: Clone,
        F: Fn(MetaClient<Signed>, Req) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.shared.send(req, f).await
    }

    /// Runs `f` against the leader.
    ///
    /// # Errors
    /// The typed error the leader answered, or `Unavailable` when no leader answered in time.
    pub async fn call<T, F, Fut>(&self, f: F) -> Result<T, MetaError>
    where
        F: Fn(MetaClient<Signed>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.shared.call(f).await
    }

    /// Creates a file (batched with concurrent callers').
    ///
    /// # Errors
    /// As the `Create` call.
    pub async fn create(&self, req: pb::CreateRequest) -> Result<pb::FileReply, MetaError> {
        file(self.batched(pb::batch_op::Op::Create(req)).await?)
    }

    /// Commits a writer's progress, renews or releases its lease, seals (batched).
    ///
    /// # Errors
    /// As the `Commit` call.
    pub async fn commit(&self, req: pb::CommitRequest) -> Result<pb::FileReply, MetaError> {
        file(self.batched(pb::batch_op::Op::Commit(req)).await?)
    }

    /// Deletes a file or an empty directory (batched).
    ///
    /// # Errors
    /// As the `Delete` call.
    pub async fn delete(&self, req: pb::PathRequest) -> Result<(), MetaError> {
        match self.batched(pb::batch_op::Op::Delete(req)).await? {
            pb::batch_result::Result::Done(_) => Ok(()),
            _ => Err(MetaError::internal("a delete answered without its result")),
        }
    }

    /// A change to the object index (batched with concurrent callers'). The outer error is
    /// the call's (masters unreachable); the inner one the index's answer.
    ///
    /// # Errors
    /// As the `Batch` call.
    pub async fn object_op(
        &self,
        op: &crate::object::ObjectOp,
    ) -> Result<crate::object::OpResult, MetaError> {
        match self
            .batched(pb::batch_op::Op::Object(crate::object::encode(op)))
            .await?
        {
            pb::batch_result::Result::Object(b) => crate::object::decode(&b),
            _ => Err(MetaError::internal(
                "an object change answered without its result",
            )),
        }
    }

    /// A read of the object index, answered by the leader.
    ///
    /// # Errors
    /// As the `ObjectRead` call.
    pub async fn object_query(
        &self,
        q: &crate::object::ObjectQuery,
    ) -> Result<crate::object::QueryResult, MetaError> {
        let req = pb::ObjectBytes {
            body: crate::object::encode(q),
        };
        let reply = self
            .send(req, |mut c, r| async move { c.object_read(r).await })
            .await?;
        crate::object::decode(&reply.body)
    }

    /// A change to the file service's nodes, batched with concurrent callers' changes.
    ///
    /// # Errors
    /// The change's typed failure, or the call's.
    pub async fn file_op(
        &self,
        op: &crate::files::FileOp,
    ) -> Result<crate::files::FileReply, MetaError> {
        match self
            .batched(pb::batch_op::Op::Fs(crate::files::encode(op)))
            .await?
        {
            pb::batch_result::Result::Fs(b) => crate::files::decode(&b),
            _ => Err(MetaError::internal(
                "a file service change answered without its result",
            )),
        }
    }

    /// File service changes on a call of their own, applied in their order — in one Raft
    /// entry when they are of one partition (a new file's make and its first commit): an
    /// answer per change. Retried as any call, so a change may find itself done already
    /// (a make answered `already-exists`): the caller checks.
    ///
    /// # Errors
    /// The call's, when no change was answered.
    pub async fn file_ops_together(
        &self,
        ops: &[crate::files::FileOp],
    ) -> Result<Vec<Result<crate::files::FileReply, MetaError>>, MetaError> {
        let req = pb::BatchRequest {
            ops: ops
                .iter()
                .map(|op| pb::BatchOp {
                    op: Some(pb::batch_op::Op::Fs(crate::files::encode(op))),
                })
                .collect(),
        };
        let reply = self
            .send(req, |mut c, r| async move { c.batch(r).await })
            .await?;
        if reply.results.len() != ops.len() {
            return Err(MetaError::internal(format!(
                "{} file service changes got {} results",
                ops.len(),
                reply.results.len()
            )));
        }
        Ok(reply
            .results
            .into_iter()
            .map(|r| match r.result {
                Some(pb::batch_result::Result::Fs(b)) => crate::files::decode(&b),
                Some(pb::batch_result::Result::Error(f)) => Err(MetaError::from(&f)),
                _ => Err(MetaError::internal(
                    "a file service change answered without its result",
                )),
            })
            .collect())
    }

    /// A read of the file service's nodes, answered by the leader.
    ///
    /// # Errors
    /// As the `FileRead` call.
    pub async fn file_query(
        &self,
        q: &crate::files::FileQuery,
    ) -> Result<crate::files::FileReply, MetaError> {
        let req = pb::ObjectBytes {
            body: crate::files::encode(q),
        };
        let reply = self
            .send(req, |mut c, r| async move { c.file_read(r).await })
            .await?;
        crate::files::decode(&reply.body)
    }

    /// One operation through the batcher, retried on its own while the failure is one a
    /// single call would retry (no chunkservers known yet after an election; a full cluster
    /// whose freed space is on its way back; `unavailable` or `not leader` for this operation
    /// alone — its path frozen by a move or locked by a rename, its partition's leadership
    /// moving — inside a call that itself succeeded). The same deadline as the call's: a
    /// call that gave up is not tried again.
    async fn batched(&self, op: pb::batch_op::Op) -> Result<pb::batch_result::Result, MetaError> {
        let mut backoff = self.shared.backoff();
        loop {
            match self.batcher.submit(&self.shared, op.clone()).await {
                Err(e)
                    if matches!(
                        e.kind,
                        ErrorKind::NoServers
                            | ErrorKind::Reclaiming
                            | ErrorKind::Unavailable
                            | ErrorKind::NotLeader
                    ) && !backoff.expired() =>
                {
                    backoff.wait().await;
                }
                r => return r,
            }
        }
    }
}

/// The file a create or commit answers with.
fn file(r: pb::batch_result::Result) -> Result<pb::FileReply, MetaError> {
    match r {
        pb::batch_result::Result::File(f) => Ok(f),
        _ => Err(MetaError::internal("answered without the file")),
    }
}

/// How often a connection to a master is pinged, and how long an unanswered ping waits
/// before the connection (and every call on it) is given up.
const KEEPALIVE_EVERY: Duration = Duration::from_secs(1);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// How calls are retried: 20 ms between tries, doubling up to 500 ms, until `retry_for`.
struct Backoff {
    deadline: Instant,
    next: Duration,
}

impl Backoff {
    fn expired(&self) -> bool {
        Instant::now() >= self.deadline
    }

    async fn wait(&mut self) {
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(Duration::from_millis(500));
    }
}

impl Shared {
    fn backoff(&self) -> Backoff {
        Backoff {
            deadline: Instant::now() + *self.retry_for.lock(),
            next: Duration::from_millis(20),
        }
    }

    fn client(&self, addr: &str) -> Result<MetaClient<Signed>, MetaError> {
        if let Some(c) = self.clients.lock().get(addr) {
            return Ok(c.clone());
        }
        let tls = self.tls.lock().clone();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut ep = Channel::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| MetaError::invalid(format!("master address {addr:?}: {e}")))?;
        if let Some(t) = tls {
            ep = ep
                .tls_config(t)
                .map_err(|e| MetaError::invalid(format!("TLS to {addr}: {e}")))?;
        }
        // A master that stops answering (a stopped process, a cut link: TCP still up) would
        // hold a call forever; HTTP/2 pings find it within seconds, the connection closes
        // and the call fails over to the next master (a long call that answers is not cut).
        let ch = ep
            .connect_timeout(Duration::from_secs(1))
            .http2_keep_alive_interval(KEEPALIVE_EVERY)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true)
            .connect_lazy();
        let c = MetaClient::new(Signed::new(ch, self.cred.lock().clone()))
            .max_decoding_message_size(256 << 20);
        self.clients.lock().insert(addr.to_owned(), c.clone());
        Ok(c)
    }

    pub(crate) async fn send<Req, T, F, Fut>(&self, req: Req, f: F) -> Result<T, MetaError>
    where
        Req: Clone,
        F: Fn(MetaClient<Signed>, Req) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call(|c| f(c, req.clone())).await
    }

    pub(crate) async fn call<T, F, Fut>(&self, f: F) -> Result<T, MetaError>
    where
        F: Fn(MetaClient<Signed>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut backoff = self.backoff();
        let started = Instant::now();
        let unreachable_for = *self.unreachable_for.lock();
        // No master process answered at all so far (every try was refused, cut or timed out).
        let mut none_answered = true;
        let mut idx = 0;
        let mut tries = 0;
        let mut target = self
            .leader
            .lock()
            .clone()
            .unwrap_or_else(|| self.addrs[0].clone());
        loop {
            let (err, answered) = match f(self.client(&target)?).await {
                Ok(r) => {
                    *self.leader.lock() = Some(target);
                    return Ok(r.into_inner());
                }
                Err(s) => {
                    let mut e = MetaError::from_status(&s);
                    if s.message().contains("h2 protocol error") && self.tls.lock().is_none() {
                        // A TLS server answers a plain HTTP/2 preface with bytes h2 cannot read.
                        e.message = format!(
                            "{target} does not speak gRPC over plain TCP ({}): it may serve \
                             TLS — give the cluster's TLS directory (--tls-dir or CAIRN_TLS_DIR; \
                             `cairn up` keeps it in DATA_DIR/tls)",
                            s.message()
                        );
                    }
                    (e, crate::error::answered(&s))
                }
            };
            let retry = match err.kind {
                ErrorKind::NotLeader | ErrorKind::Unavailable => true,
                // A new leader learns the chunkservers from their next heartbeat; freed space
                // reaches the chunkservers with theirs.
                ErrorKind::NoServers | ErrorKind::Reclaiming => true,
                _ => false,
            };
            tries += 1;
            // A master that answers `unavailable` (an election, a directory frozen for a move,
            // a path locked by a rename) is there: the call waits for `retry_for`, not for
            // `unreachable_for`.
            none_answered &= err.kind == ErrorKind::Unavailable && !answered;
            let given_up = none_answered
                && unreachable_for.is_some_and(|u| started.elapsed() >= u)
                && tries >= self.addrs.len();
            if err.kind == ErrorKind::Unavailable {
                // Unreachable or without a leader: the next call starts elsewhere (a master
                // that stopped answering would otherwise hold every call for its timeout).
                let mut leader = self.leader.lock();
                if leader.as_deref().is_none_or(|l| l == target) {
                    idx = self.addrs.iter().position(|a| *a == target).unwrap_or(idx);
                    *leader = Some(self.addrs[(idx + 1) % self.addrs.len()].clone());
                }
            }
            // Every master is tried once even when a slow failure used up the time.
            if !retry || given_up || (backoff.expired() && tries >= self.addrs.len()) {
                let mut err = err;
                if err.kind == ErrorKind::Unavailable {
                    // Say where: which masters were tried, for how long, and what to check.
                    let hint = if none_answered {
                        "; none answered: are they running, and are these the right addresses?"
                    } else {
                        ""
                    };
                    err.message = format!(
                        "{} (masters tried for {:.1} s: {}{hint})",
                        err.message,
                        started.elapsed().as_secs_f64(),
                        self.addrs.join(", ")
                    );
                }
                return Err(err);
            }
            match (&err.kind, &err.leader) {
                (ErrorKind::NotLeader, Some(l)) if *l != target => target = l.clone(),
                _ => {
                    backoff.wait().await;
                    idx += 1;
                    target = self.addrs[idx % self.addrs.len()].clone();
                }
            }
        }
    }
}
