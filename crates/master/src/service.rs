//! The `Meta` gRPC service: every call is answered by the leader; followers redirect.

use crate::convert;
use crate::registry::Registry;
use crate::state::{Command, Policy, Reply};
use crate::store::{Applied, Raft};
use cairn_proto::cap;
use cairn_rpc::auth::Principal;
use cairn_rpc::{ErrorKind, MetaError, pb};
use openraft::async_runtime::WatchReceiver;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tonic::{Request, Response, Status};

pub mod autosplit;
mod batch;
mod buckets;
mod files;
mod hashed;
mod moves;
mod namespace;
mod operators;
mod partitions;
mod principal;
pub mod segments;
mod status;
mod txn;

pub(crate) use principal::prove_connection;
use principal::{as_user, check_read};

type Rpc<T> = Result<Response<T>, Status>;

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[derive(Clone)]
pub struct MetaService {
    inner: Arc<Inner>,
}

/// Whether applying `cmd` frees space (a file deleted; an object deleted or replaced, a
/// bucket's uploads aborted, freed files deleted): allocations refused for a while after are
/// `Reclaiming`, which clients retry, not `NoSpace`.
fn frees(cmd: &Command) -> bool {
    use cairn_rpc::object::ObjectOp as O;
    match cmd {
        Command::Delete { .. } => true,
        Command::Batch(cmds) => cmds.iter().any(frees),
        Command::Object(op) => matches!(
            op.as_ref(),
            O::PutObject { .. }
                | O::DeleteObject { .. }
                | O::DeleteBucket { .. }
                | O::AbortUpload { .. }
                | O::CompleteUpload { .. }
                | O::EmptyTrash { .. }
                | O::DropPack { .. }
        ),
        _ => false,
    }
}

pub(crate) struct Inner {
    pub id: u64,
    /// The root partition's Raft node and state (docs/partitions.md).
    pub raft: Raft,
    pub sm: Arc<Mutex<Applied>>,
    /// Every partition this master hosts, the root included.
    pub groups: Arc<crate::groups::Groups>,
    /// Held while partitions are being opened (one opening at a time).
    pub hosting: tokio::sync::Mutex<()>,
    /// Held while a subtree's move is driven (one driver per master; state/moves.rs).
    pub moving: tokio::sync::Mutex<()>,
    /// Renames across partitions driven here (service/txn.rs).
    pub renaming: Mutex<std::collections::BTreeSet<u64>>,
    /// Placed buckets whose deletion is driven here (service/buckets.rs).
    pub deleting_buckets: Mutex<std::collections::BTreeSet<String>>,
    /// TLS to the other masters (for partitions' groups).
    pub tls: Option<cairn_rpc::tls::ClientTlsConfig>,
    /// How this master runs (partitions open with the same settings as the root).
    pub opts: crate::node::MasterOptions,
    pub registry: Mutex<Registry>,
    pub lease: Duration,
    /// Set once the state machine caught up with the cluster's commit after a start (until
    /// then it may be older than what this master served before a restart).
    pub recovered: Arc<std::sync::atomic::AtomicBool>,
    /// Checks who sends each call (cairn_rpc::auth).
    pub auth: Arc<cairn_rpc::auth::Verifier>,
    /// The last term this master led (`Registry::lead`).
    pub led_term: std::sync::atomic::AtomicU64,
    /// Seals users' secret keys before they enter the log (cairn_rpc::seal); `None` on an
    /// insecure master (no cluster secret to derive its key from).
    pub sealer: Option<cairn_rpc::seal::Sealer>,
    /// The term in which this master, leading, found no plain secret left: new secrets enter
    /// the log sealed, so one pass per term suffices.
    pub sealed_term: std::sync::atomic::AtomicU64,
    /// The audit log: accepted mutating calls and refusals.
    pub audit: cairn_rpc::audit::Audit,
    /// How many refusals are recorded one by one.
    pub refusals: crate::audit::RefusalBudget,
    /// The load counted for automatic splits (service/autosplit.rs).
    pub auto_split: autosplit::AutoSplit,
    /// Segment collection's memory (service/segments.rs).
    pub segments: segments::Collector,
}

use crate::audit::Call;

impl MetaService {
    pub(crate) fn new(inner: Inner) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }

    /// One pass of the leader's repair scan.
    pub(crate) fn scan_repairs(&self) {
        self.inner.scan_repairs();
    }

    /// One pass of the leader's conversion scan.
    pub(crate) async fn scan_conversions(&self) {
        self.inner.ensure_cap_key().await;
        self.inner.seal_plain_secrets().await;
        self.inner.prune_revocations().await;
        self.inner.scan_conversions().await;
    }

    /// Sets the process's gauges (docs/operations.md) from the leader's view; a follower only
    /// says it is one.
    pub(crate) fn export_metrics(&self) {
        use metrics::gauge;
        let m = self.inner.raft.metrics().borrow_watched().clone();
        gauge!("cairn_master_term").set(m.current_term as f64);
        let leader = self.inner.leader_check().is_ok();
        gauge!("cairn_master_is_leader").set(if leader { 1.0 } else { 0.0 });
        if !leader {
            return;
        }
        let a = self.inner.sm.lock();
        let reg = self.inner.registry.lock();
        let now = Instant::now();
        let mut by_state: BTreeMap<&'static str, u64> =
            ["up", "suspect", "down", "draining"].map(|s| (s, 0)).into();
        for s in a.state.servers().values() {
            *by_state.entry(reg.state_of(s, now).name()).or_default() += 1;
        }
        for (state, n) in by_state {
            gauge!("cairn_master_chunkservers", "state" => state).set(n as f64);
        }
        let r = &reg.repairs;
        gauge!("cairn_master_under_replicated_chunks").set(r.under_replicated as f64);
        gauge!("cairn_master_under_replicated_bytes").set(r.under_replicated_bytes as f64);
        gauge!("cairn_master_lost_chunks").set(r.lost as f64);
        gauge!("cairn_master_repairs_running").set(r.running() as f64);
        gauge!("cairn_master_repairs_finished", "result" => "ok").set(r.done as f64);
        gauge!("cairn_master_repairs_finished", "result" => "failed").set(r.failed as f64);
        gauge!("cairn_master_repaired_bytes").set(r.bytes as f64);
        gauge!("cairn_master_repair_rate_bytes_per_second").set(r.rate(now) as f64);
        gauge!("cairn_master_repair_cap_bytes_per_second")
            .set(a.state.config().repair_bytes_per_sec as f64);
        gauge!("cairn_master_conversions_running").set(r.conversions_running() as f64);
        gauge!("cairn_master_conversions_waiting").set(r.conversions_waiting as f64);
        gauge!("cairn_master_conversions_finished", "result" => "ok")
            .set(r.conversions_done as f64);
        gauge!("cairn_master_conversions_finished", "result" => "failed")
            .set(r.conversions_failed as f64);
        gauge!("cairn_master_converted_bytes").set(r.converted_bytes as f64);
        gauge!("cairn_master_reporting_clients").set(reg.reports.active(now) as f64);
        let reporters = reg.reports.reporters(now);
        let avoided = reg.reports.avoided(a.state.servers().len(), now);
        for id in a.state.servers().keys() {
            let server = id.to_string();
            gauge!("cairn_master_server_reported_by", "server" => server.clone())
                .set(f64::from(reporters.get(id).copied().unwrap_or(0)));
            gauge!("cairn_master_server_avoided", "server" => server)
                .set(if avoided.contains(id) { 1.0 } else { 0.0 });
        }
        drop(reg);
        drop(a);
        // Over the root and every partition this master leads.
        let (files, chunks) = self.inner.with_view(|_, v| {
            v.all().fold((0, 0), |(f, c), (_, s)| {
                let (files, _dirs, chunks, _bytes) = s.totals();
                (f + files, c + chunks)
            })
        });
        gauge!("cairn_master_files").set(files as f64);
        gauge!("cairn_master_chunks").set(chunks as f64);
        // Every partition this master hosts (the root is partition 0), led here or not.
        for h in self.inner.groups.all() {
            let reports = h.sm.lock().state.table_reports();
            let p = h.id.to_string();
            for t in reports {
                let labels = [("table", t.name.to_string()), ("partition", p.clone())];
                gauge!("cairn_master_state_rows", &labels).set(t.rows as f64);
                gauge!("cairn_master_state_cache_bytes", &labels).set(t.cached_bytes as f64);
                metrics::counter!("cairn_master_state_cache_hits_total", &labels).absolute(t.hits);
                metrics::counter!("cairn_master_state_cache_misses_total", &labels)
                    .absolute(t.misses);
            }
        }
    }
}

impl Inner {
    /// When a lease granted or renewed at `now_ms` expires.
    fn lease_until(&self, now_ms: u64) -> u64 {
        now_ms + self.lease.as_millis() as u64
    }

    /// The term this master leads; otherwise the redirect.
    fn leader_check(&self) -> Result<u64, MetaError> {
        if !self.recovered.load(std::sync::atomic::Ordering::Acquire) {
            return Err(MetaError::new(
                ErrorKind::Unavailable,
                "this master is still recovering its state after a start",
            ));
        }
        let metrics = self.raft.metrics();
        // Checked under the borrow: the common case (this master leads) clones nothing.
        let (leads, term) = {
            let m = metrics.borrow_watched();
            (m.current_leader == Some(self.id), m.current_term)
        };
        if leads {
            // A term this master did not lead before: its view of the servers is stale.
            if self.led_term.load(std::sync::atomic::Ordering::Acquire) != term {
                self.registry.lock().lead(term);
                self.led_term
                    .store(term, std::sync::atomic::Ordering::Release);
            }
            return Ok(term);
        }
        Err(crate::groups::not_leader(&metrics.borrow_watched()))
    }

    /// A linearizable read point: this master leads (the term returned) and its state
    /// machine has applied everything committed before the read.
    async fn read_barrier(&self) -> Result<u64, MetaError> {
        let term = self.leader_check()?;
        crate::groups::lease_read(&self.raft).await?;
        Ok(term)
    }

    async fn write(&self, cmd: Command) -> Result<Reply, MetaError> {
        if frees(&cmd) {
            self.registry.lock().freed(Instant::now());
        }
        crate::groups::write(&self.raft, cmd).await
    }

    /// Places `count` new chunks of a file with `policy`: replicated chunks, or for a file
    /// written as EC chunk groups (every member placed: MinCopy is K+M) or, with `tail`, tail
    /// chunks of M+1 copies. Returns the placements and whether they are groups.
    fn place(
        &self,
        policy: &Policy,
        tail: bool,
        count: usize,
        exclude: &BTreeSet<u64>,
    ) -> Result<(Vec<Vec<u64>>, bool), MetaError> {
        if count == 0 {
            return Ok((Vec::new(), false));
        }
        let (replicas, min_copy, groups) = match policy.direct_ec() {
            Some(e) if !tail => {
                let w = usize::from(e.k) + usize::from(e.m);
                (w, w, true)
            }
            _ => (
                usize::from(policy.replicas),
                usize::from(policy.min_copy()),
                false,
            ),
        };
        let servers = self.sm.lock().state.servers().clone();
        let reg = self.registry.lock();
        let now = Instant::now();
        // Servers many clients report are avoided like ones this writer saw fail.
        let mut exclude = exclude.clone();
        exclude.extend(reg.reports.avoided(servers.len(), now));
        let placements = match reg.place(&servers, replicas, min_copy, count, &exclude, now) {
            // Full, but what was freed a moment ago is on its way back: retried by clients.
            Err(e) if e.kind == ErrorKind::NoSpace => {
                let trash = self.sm.lock().state.trash_len();
                let pending = reg.pending_deletes();
                if reg.reclaiming(now) || pending > 0 || trash > 0 {
                    return Err(MetaError::new(
                        ErrorKind::Reclaiming,
                        format!(
                            "{}; {pending} chunk(s) pending delete and {trash} freed S3 file(s) \
                             are being reclaimed",
                            e.message
                        ),
                    ));
                }
                return Err(e);
            }
            r => r?,
        };
        Ok((placements, groups))
    }

    /// Refuses an EC policy the cluster cannot place: more members (K+M) than chunkservers
    /// registered is a mistake (`InvalidArgument`, at once); more than are up now may pass
    /// (`NoServers`, which callers retry for a while). A group is never written with fewer
    /// members than it names. (Replicated chunks keep their rule: placed once MinCopy servers
    /// are up, the missing copies added by repair.)
    fn check_placeable(&self, policy: &Policy) -> Result<(), MetaError> {
        let Some(ec) = policy.ec else {
            return Ok(());
        };
        let width = usize::from(ec.k) + usize::from(ec.m);
        let servers = self.sm.lock().state.servers().clone();
        let known = servers.values().filter(|s| !s.draining).count();
        let up = self.registry.lock().up_count(&servers, Instant::now());
        let (kind, have) = if width > known {
            (
                ErrorKind::InvalidArgument,
                format!("the cluster has {known}"),
            )
        } else if width > up {
            (ErrorKind::NoServers, format!("{up} are up"))
        } else {
            return Ok(());
        };
        Err(MetaError::new(
            kind,
            format!(
                "policy {} needs {width} chunkservers (one per cell of a stripe), {have}",
                policy.text()
            ),
        ))
    }

    /// The leader drops the capability revocations every capability they revoked has
    /// outlived (state/revoke.rs).
    async fn prune_revocations(&self) {
        if self.leader_check().is_err() {
            return;
        }
        let upto = self
            .sm
            .lock()
            .state
            .revocations()
            .prunable(Instant::now(), cairn_proto::cap::REVOCATION_KEEP);
        if let Some(upto) = upto
            && let Err(e) = self.write(Command::PruneRevocations { upto }).await
        {
            tracing::warn!(error = %e, "pruning capability revocations failed");
        }
    }

    /// One leader pass of the conversion scan (crate::conversion): abandons conversions no
    /// task runs, begins new ones and hands them out.
    pub(crate) async fn scan_conversions(&self) {
        if self.leader_check().is_err() {
            return;
        }
        let plan = self.with_view(|_, v| {
            self.registry
                .lock()
                .plan_conversions(v, Instant::now(), now_ms())
        });
        for group in plan.abandon {
            tracing::info!(group, "conversion abandoned (no task runs it)");
            let end = crate::conversion::end(group, false, 0);
            if let Err(e) = self.write_for_chunk(group, end).await {
                tracing::warn!(group, error = %e, "abandoning a conversion failed");
                return;
            }
        }
        for b in plan.begin {
            let cmd = Command::ConvertBegin {
                chunk_id: b.chunk_id,
                servers: b.servers.clone(),
                now_ms: now_ms(),
            };
            match self.write_for_chunk(b.chunk_id, cmd).await {
                Ok(Reply {
                    chunk: Some(group), ..
                }) => {
                    self.with_view(|_, v| {
                        self.registry
                            .lock()
                            .conversion_started(group, &b, v, Instant::now());
                    });
                }
                Ok(_) => tracing::warn!(chunk = b.chunk_id, "conversion begin returned no group"),
                Err(e) => {
                    tracing::warn!(chunk = b.chunk_id, error = %e, "conversion not begun");
                }
            }
        }
    }

    /// One leader pass of the repair scan (docs/masters.md, "Repair").
    pub(crate) fn scan_repairs(&self) {
        if self.leader_check().is_err() {
            // A follower keeps no tasks: a new leader starts from the targets' reports.
            let mut reg = self.registry.lock();
            if reg.repairs.running() + reg.repairs.conversions_running() > 0 {
                reg.repairs = Default::default();
            }
            return;
        }
        self.with_view(|_, v| self.registry.lock().scan_repairs(v, Instant::now()));
    }
}

fn ok<T>(r: Result<T, MetaError>) -> Rpc<T> {
    r.map(Response::new).map_err(Status::from)
}

#[tonic::async_trait]
impl pb::meta_server::Meta for MetaService {
    async fn mkdir(&self, req: Request<pb::MkdirRequest>) -> Rpc<pb::NodeReply> {
        let (who, call) = self.inner.call(&req, "Mkdir")?;
        let r = req.into_inner();
        let target = serde_json::json!(r.path);
        self.inner
            .audited(&call, target, self.inner.mkdir(&who, r).await)
    }

    async fn create(&self, req: Request<pb::CreateRequest>) -> Rpc<pb::FileReply> {
        let (who, call) = self.inner.call(&req, "Create")?;
        let target = serde_json::json!(req.get_ref().path);
        self.inner.audited(
            &call,
            target,
            async {
                let (routed, cmd) = self.inner.create_command(req.into_inner(), &who).await?;
                let reply = self.inner.write_to(&routed.h, cmd).await?;
                self.inner.file_reply(reply.inode, &who)
            }
            .await,
        )
    }

    async fn open_write(&self, req: Request<pb::OpenWriteRequest>) -> Rpc<pb::FileReply> {
        let (who, call) = self.inner.call(&req, "OpenWrite")?;
        let r = req.into_inner();
        let target = serde_json::json!(r.path);
        self.inner
            .audited(&call, target, self.inner.open_write(&who, r).await)
    }

    async fn stat(&self, req: Request<pb::PathRequest>) -> Rpc<pb::NodeReply> {
        let who = self.inner.who(&req, "Stat")?;
        ok(self.inner.stat(&who, req.into_inner()).await)
    }

    async fn object_read(&self, req: Request<pb::ObjectBytes>) -> Rpc<pb::ObjectBytes> {
        let who = self.inner.who(&req, "ObjectRead")?;
        let r = req.into_inner();
        ok(async {
            // The index holds users' secret keys: servers, admins, and each service for its
            // own part (crate::confine).
            let q: cairn_rpc::object::ObjectQuery = cairn_rpc::object::decode(&r.body)?;
            crate::confine::object_query(&who, &q)?;
            let mut result = self.inner.object_query(&q).await?;
            // The gateway checks SigV4 with the secret itself.
            if let Ok(cairn_rpc::object::QueryReply::User(user)) = &mut result
                && let Some(u) = user.as_mut()
            {
                match self.inner.open_secret(u) {
                    Some(k) => u.secret_key = k,
                    None => *user = None,
                }
            }
            Ok(pb::ObjectBytes {
                body: cairn_rpc::object::encode(&result),
            })
        }
        .await)
    }

    async fn file_read(&self, req: Request<pb::ObjectBytes>) -> Rpc<pb::ObjectBytes> {
        let who = self.inner.who(&req, "FileRead")?;
        let r = req.into_inner();
        ok(self.inner.file_read(&who, &r.body).await)
    }

    async fn list(&self, req: Request<pb::ListRequest>) -> Rpc<pb::ListReply> {
        let who = self.inner.who(&req, "List")?;
        ok(self.inner.list(&who, req.into_inner()).await)
    }

    async fn rename(&self, req: Request<pb::RenameRequest>) -> Rpc<pb::Empty> {
        let (who, call) = self.inner.call(&req, "Rename")?;
        let r = req.into_inner();
        let target = serde_json::json!({"from": r.from, "to": r.to});
        let res = self.inner.rename(&who, r).await.map(|()| pb::Empty {});
        self.inner.audited(&call, target, res)
    }

    async fn delete(&self, req: Request<pb::PathRequest>) -> Rpc<pb::Empty> {
        let (who, call) = self.inner.call(&req, "Delete")?;
        let target = serde_json::json!(req.get_ref().path);
        self.inner.audited(
            &call,
            target,
            async {
                let (routed, cmd) = self.inner.delete_command(&req.into_inner(), &who).await?;
                self.inner.write_to(&routed.h, cmd).await?;
                Ok(pb::Empty {})
            }
            .await,
        )
    }

    async fn set_attr(&self, req: Request<pb::SetAttrRequest>) -> Rpc<pb::NodeReply> {
        let (who, call) = self.inner.call(&req, "SetAttr")?;
        let r = req.into_inner();
        let target = serde_json::json!({"path": r.path, "mode": r.mode, "owner": r.owner});
        self.inner
            .audited(&call, target, self.inner.set_attr(&who, r).await)
    }

    async fn allocate_chunks(&self, req: Request<pb::AllocateRequest>) -> Rpc<pb::FileReply> {
        let (who, call) = self.inner.call(&req, "AllocateChunks")?;
        let r = req.into_inner();
        let target = serde_json::json!(r.path);
        self.inner
            .audited(&call, target, self.inner.allocate(&who, r).await)
    }

    async fn commit(&self, req: Request<pb::CommitRequest>) -> Rpc<pb::FileReply> {
        let (who, call) = self.inner.call(&req, "Commit")?;
        let target = serde_json::json!({"path": req.get_ref().path, "seal": req.get_ref().seal, "release": req.get_ref().release});
        self.inner.audited(
            &call,
            target,
            async {
                let (routed, cmd) = self.inner.commit_command(&req.into_inner(), &who).await?;
                let reply = self.inner.write_to(&routed.h, cmd).await?;
                self.inner.file_reply(reply.inode, &who)
            }
            .await,
        )
    }

    async fn batch(&self, req: Request<pb::BatchRequest>) -> Rpc<pb::BatchReply> {
        let (who, call) = self.inner.call(&req, "Batch")?;
        let r = req.into_inner();
        let ops: Vec<_> = r.ops.iter().map(crate::audit::describe_op).collect();
        let result = self.inner.batch(r.ops, &who).await;
        crate::audit::batch(&self.inner.audit, &call, &ops, &result);
        ok(result)
    }

    async fn locate(&self, req: Request<pb::LocateRequest>) -> Rpc<pb::LocateReply> {
        let who = self.inner.who(&req, "Locate")?;
        ok(self.inner.locate(&who, req.into_inner()).await)
    }

    async fn register(&self, req: Request<pb::RegisterRequest>) -> Rpc<pb::RegisterReply> {
        let (who, call) = self.inner.call(&req, "Register")?;
        let r = req.into_inner();
        let target = serde_json::json!({"server_id": r.server_id, "addr": r.addr, "host": r.host, "rack": r.rack});
        self.inner.audited(
            &call,
            target,
            async {
                who.require_server("Register")?;
                let rec = convert::server_record(&r)?;
                self.inner.read_barrier().await?;
                let known = self.inner.sm.lock().state.servers().get(&rec.id).cloned();
                let same = known.is_some_and(|k| {
                    k.addr == rec.addr && k.host == rec.host && k.rack == rec.rack
                });
                if !same {
                    self.inner.write(Command::Register { server: rec }).await?;
                }
                Ok(pb::RegisterReply {})
            }
            .await,
        )
    }

    async fn heartbeat(&self, req: Request<pb::HeartbeatRequest>) -> Rpc<pb::HeartbeatReply> {
        self.inner
            .who(&req, "Heartbeat")?
            .require_server("Heartbeat")?;
        let r = req.into_inner();
        ok(async {
            let hb = convert::heartbeat(&r)?;
            let revocations_seen = r.revocations_seen;
            // Not only "this master thinks it leads": one just resumed from a pause (or cut
            // off) may not have heard of the next term yet, and its answer names chunks to
            // delete from an older state. Its lease has run out, so the barrier refuses.
            let term = self.inner.read_barrier().await?;
            // The same for each partition: a chunk of one whose leadership this master cannot
            // confirm is unknown to the view, and kept.
            let confirmed = self.inner.confirmed_partitions().await;
            let (answer, masters) = self.inner.with_view_of(Some(&confirmed), |a, view| {
                if !a.state.servers().contains_key(&hb.server_id) {
                    return Err(MetaError::not_found(format!(
                        "chunkserver {} (register first)",
                        hb.server_id
                    )));
                }
                let mut reg = self.inner.registry.lock();
                // Orphans are deleted only once the state holds all that was committed before
                // this leader's term (an entry it has not applied may make one a location).
                reg.settled = a
                    .last_applied
                    .is_some_and(|l| l.committed_leader_id().term == term);
                let answer = reg.heartbeat(hb, view, Instant::now());
                drop(reg);
                let masters: Vec<String> = a
                    .membership
                    .membership()
                    .nodes()
                    .map(|(_, n)| n.addr.clone())
                    .collect();
                Ok((answer, masters))
            })?;
            // Finished repairs become locations (through Raft) before the task is forgotten,
            // so the new copy is never taken for an orphan. In a task of its own: a heartbeat
            // call dropped half way must not leave a repair waiting for its record forever.
            if !answer.finished.is_empty() {
                let inner = self.inner.clone();
                let record = tokio::spawn(async move {
                    for cmd in answer.finished {
                        let chunk_id = match cmd {
                            Command::Repaired { chunk_id, .. } => chunk_id,
                            Command::ConvertEnd { group_id, .. } => group_id,
                            _ => continue,
                        };
                        let r = inner.write_for_chunk(chunk_id, cmd).await;
                        if let Err(e) = &r {
                            tracing::warn!(chunk = chunk_id, error = %e, "recording a repair or conversion failed");
                        }
                        inner
                            .registry
                            .lock()
                            .repairs
                            .committed(chunk_id, r.is_ok(), Instant::now());
                    }
                });
                let _ = record.await;
            }
            let (cap_keys, repairs, (revocations, revocations_upto)) = {
                let a = self.inner.sm.lock();
                let mut repairs = answer.repairs;
                if let Some(s) = crate::caps::Signer::of(&a.state, now_ms(), &Principal::Open) {
                    // A repair reads the source or the group's members; a rebuild or a
                    // conversion writes the group's members.
                    for t in &mut repairs {
                        t.caps = vec![s.sign(t.chunk_id, t.version, cap::WRITE, 0)];
                    }
                }
                let revoked = crate::caps::revocations_pb(&a.state, revocations_seen);
                (crate::caps::keys_pb(&a.state), repairs, revoked)
            };
            Ok(pb::HeartbeatReply {
                send_full_report: answer.send_full_report,
                delete_chunks: answer.delete,
                masters,
                cap_keys,
                repairs,
                repair_bytes_per_sec: answer.repair_bytes_per_sec,
                background_bytes_per_sec: answer.background_bytes_per_sec,
                revocations,
                revocations_upto,
            })
        }
        .await)
    }

    async fn create_partition(&self, req: Request<pb::PartitionRequest>) -> Rpc<pb::StatusReply> {
        MetaService::create_partition(self, req).await
    }

    async fn split_partition(&self, req: Request<pb::SplitRequest>) -> Rpc<pb::StatusReply> {
        MetaService::split_partition(self, req).await
    }

    async fn check_metadata(&self, req: Request<pb::Empty>) -> Rpc<pb::CheckReply> {
        MetaService::check_metadata(self, req).await
    }

    async fn state_digest(&self, req: Request<pb::Empty>) -> Rpc<pb::DigestReply> {
        MetaService::state_digest(self, req).await
    }

    async fn status(&self, req: Request<pb::Empty>) -> Rpc<pb::StatusReply> {
        self.inner.who(&req, "Status")?;
        self.status_reply().await
    }

    async fn change_membership(&self, req: Request<pb::MembershipRequest>) -> Rpc<pb::StatusReply> {
        self.membership(req).await
    }

    async fn set_server_state(&self, req: Request<pb::ServerStateRequest>) -> Rpc<pb::Empty> {
        self.server_state(req).await
    }

    async fn report(&self, req: Request<pb::ClientReport>) -> Rpc<pb::Empty> {
        let who = self.inner.who(&req, "Report")?;
        let r = req.into_inner();
        ok(async {
            self.inner.leader_check()?;
            if r.client_id.is_empty() || r.client_id.len() > 128 {
                return Err(MetaError::invalid(
                    "a report needs a client id of 1 to 128 bytes",
                ));
            }
            // Only servers the cluster has, each once.
            let listed: Vec<_> = {
                let a = self.inner.sm.lock();
                let servers = a.state.servers();
                let set: std::collections::BTreeSet<_> = r
                    .servers
                    .iter()
                    .filter(|s| (s.failed || s.slow) && servers.contains_key(&s.server_id))
                    .map(|s| s.server_id)
                    .collect();
                set.into_iter().collect()
            };
            let voter = crate::reports::voter(&who, &r.client_id);
            self.inner
                .registry
                .lock()
                .reports
                .record(voter, listed, Instant::now())
                .map_err(|_| {
                    MetaError::new(
                        ErrorKind::Unavailable,
                        format!(
                            "{} clients report already; this one's report is not counted",
                            crate::reports::MAX_VOTERS
                        ),
                    )
                })?;
            Ok(pb::Empty {})
        }
        .await)
    }

    async fn rotate_key(&self, req: Request<pb::Empty>) -> Rpc<pb::RotateKeyReply> {
        self.rotate(req).await
    }

    async fn set_config(&self, req: Request<pb::ConfigRequest>) -> Rpc<pb::Empty> {
        self.settings(req).await
    }
}
