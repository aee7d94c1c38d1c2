//! Raft between masters: openraft's messages as JSON inside one gRPC call (`Raft.Call`).

use crate::store::{Raft, TypeConfig};
use cairn_rpc::pb::{self, raft_client::RaftClient};
use openraft::BasicNode;
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::{SnapshotMetaOf, SnapshotOf, VoteOf};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::io;
use std::sync::Arc;
use tonic::transport::Channel;

pub const APPEND: u32 = 1;
pub const VOTE: u32 = 2;
pub const SNAPSHOT: u32 = 3;

#[derive(Serialize, Deserialize)]
struct SnapshotMessage {
    vote: VoteOf<TypeConfig>,
    meta: SnapshotMetaOf<TypeConfig>,
    data: Vec<u8>,
}

/// Makes one client per peer master; its calls prove the cluster secret when there is one.
#[derive(Clone, Default)]
pub struct Network {
    /// This master's id (named in its proofs).
    pub id: u64,
    pub secret: Option<cairn_rpc::auth::ClusterSecret>,
    /// TLS to the peers, checked with the cluster's CA (cairn_rpc::tls).
    pub tls: Option<cairn_rpc::tls::ClientTlsConfig>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, _target: u64, node: &BasicNode) -> Peer {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let channel = Channel::from_shared(format!("{scheme}://{}", node.addr))
            .ok()
            .and_then(|e| match &self.tls {
                Some(t) => e.tls_config(t.clone()).ok(),
                None => Some(e),
            })
            .map(|e| {
                e.connect_timeout(std::time::Duration::from_secs(1))
                    .tcp_nodelay(true)
                    .connect_lazy()
            });
        Peer {
            client: channel.map(RaftClient::new),
            addr: node.addr.clone(),
            who: format!("master-{}", self.id),
            secret: self.secret.clone(),
        }
    }
}

pub struct Peer {
    client: Option<RaftClient<Channel>>,
    addr: String,
    who: String,
    secret: Option<cairn_rpc::auth::ClusterSecret>,
}

fn unreachable(e: impl std::fmt::Display) -> Unreachable<TypeConfig> {
    Unreachable::new(&io::Error::other(e.to_string()))
}

impl Peer {
    async fn call<Req: Serialize, Resp: for<'a> Deserialize<'a>>(
        &mut self,
        kind: u32,
        req: &Req,
        ttl: std::time::Duration,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| unreachable(format!("bad master address {}", self.addr)))?;
        let body = serde_json::to_vec(req).map_err(|e| NetworkError::new(&e))?;
        let msg = pb::RaftMessage { kind, body };
        let call = client.call(match &self.secret {
            Some(secret) => cairn_rpc::auth::Credential::Server {
                secret: secret.clone(),
                who: self.who.clone(),
            }
            .sign(msg, "raft"),
            None => tonic::Request::new(msg),
        });
        let reply = match tokio::time::timeout(ttl, call).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(status)) => return Err(unreachable(status.message()).into()),
            Err(_) => {
                return Err(unreachable(format!("{} did not answer in {ttl:?}", self.addr)).into());
            }
        };
        let r: Result<Resp, String> =
            serde_json::from_slice(&reply.body).map_err(|e| NetworkError::new(&e))?;
        r.map_err(|e| NetworkError::new(&io::Error::other(e)).into())
    }
}

impl RaftNetworkV2<TypeConfig> for Peer {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(APPEND, &rpc, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(VOTE, &rpc, option.hard_ttl()).await
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, Vec<u8>>,
        _cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let msg = SnapshotMessage {
            vote,
            meta: snapshot.meta,
            data: snapshot.snapshot,
        };
        self.call(SNAPSHOT, &msg, option.hard_ttl())
            .await
            .map_err(|e| match e {
                RPCError::Unreachable(u) => StreamingError::Unreachable(u),
                other => StreamingError::Unreachable(unreachable(other)),
            })
    }
}

/// The receiving side: hands a peer's message to the local Raft node.
pub struct RaftService {
    pub raft: Raft,
    /// Only masters that prove they hold the cluster secret may append, vote or install a
    /// snapshot.
    pub auth: Arc<cairn_rpc::auth::Verifier>,
    /// Rate of the warnings about refused messages (a flood must not fill the log).
    pub refusals: cairn_rpc::admission::LogBudget,
}

fn answer<T: Serialize, E: std::fmt::Display>(r: Result<T, E>) -> Result<Vec<u8>, tonic::Status> {
    serde_json::to_vec(&r.map_err(|e| e.to_string()))
        .map_err(|e| tonic::Status::internal(e.to_string()))
}

fn parse<T: for<'a> Deserialize<'a>>(body: &[u8]) -> Result<T, tonic::Status> {
    serde_json::from_slice(body).map_err(|e| tonic::Status::invalid_argument(e.to_string()))
}

#[tonic::async_trait]
impl pb::raft_server::Raft for RaftService {
    async fn call(
        &self,
        req: tonic::Request<pb::RaftMessage>,
    ) -> Result<tonic::Response<pb::RaftMessage>, tonic::Status> {
        if let Err(e) = self.auth.check_server(&req, "raft") {
            metrics::counter!("cairn_master_calls_refused_total", "method" => "Raft").increment(1);
            if self.refusals.allow() {
                tracing::warn!(error = %e, "raft message refused");
            }
            return Err(tonic::Status::unauthenticated(e.message));
        }
        crate::service::prove_connection(&req)?;
        let m = req.into_inner();
        let body = match m.kind {
            APPEND => answer(self.raft.append_entries(parse(&m.body)?).await)?,
            VOTE => answer(self.raft.vote(parse(&m.body)?).await)?,
            SNAPSHOT => {
                let s: SnapshotMessage = parse(&m.body)?;
                let snap = SnapshotOf::<TypeConfig, Vec<u8>> {
                    meta: s.meta,
                    snapshot: s.data,
                };
                answer(self.raft.install_full_snapshot(s.vote, snap).await)?
            }
            k => {
                return Err(tonic::Status::invalid_argument(format!(
                    "unknown raft message {k}"
                )));
            }
        };
        Ok(tonic::Response::new(pb::RaftMessage { kind: m.kind, body }))
    }
}
