//! Raft between masters: openraft's messages as JSON inside one gRPC call (`Raft.Call`),
//! each naming the partition whose group it is for (docs/partitions.md);
//! snapshots as the bytes of a snapshot file (docs/formats/master-state.md), written from the
//! leader's tables as they are sent, in chunks of [`CHUNK`] bytes (each a call whose body is
//! a little-endian `u32` length, the JSON of a [`ChunkHeader`], then the chunk's bytes),
//! which the receiver appends to a file of its own and installs after the last one.

use crate::store::{SnapshotData, SnapshotFile, TypeConfig};
use cairn_rpc::pb::{self, raft_client::RaftClient};
use openraft::BasicNode;
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::{SnapshotMetaOf, SnapshotOf, VoteOf};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;
use tonic::transport::Channel;

pub const APPEND: u32 = 1;
pub const VOTE: u32 = 2;
/// A whole snapshot as JSON in one call (masters before snapshot files; refused now).
pub const SNAPSHOT: u32 = 3;
pub const SNAPSHOT_CHUNK: u32 = 4;
/// A leader hands its leadership to the receiver.
pub const TRANSFER: u32 = 5;
/// Added to the kind of every message for a partition other than the root: a master from
/// before partitions, which would take the message for its root group's, refuses the kind
/// as unknown instead.
pub const PARTITIONED: u32 = 0x100;

/// Bytes of a snapshot file per call.
pub const CHUNK: usize = 1 << 20;

/// What travels with each chunk of a snapshot file.
#[derive(Serialize, Deserialize)]
pub struct ChunkHeader {
    pub vote: VoteOf<TypeConfig>,
    pub meta: SnapshotMetaOf<TypeConfig>,
    /// Where the chunk's bytes go in the file.
    pub offset: u64,
    /// The file ends with this chunk.
    pub last: bool,
}

/// Makes one client per peer master; its calls prove the cluster secret when there is one.
#[derive(Clone, Default)]
pub struct Network {
    /// This master's id (named in its proofs).
    pub id: u64,
    /// The partition whose group this is.
    pub group: crate::state::partitions::PartitionId,
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
            group: self.group,
            who: format!("master-{}", self.id),
            secret: self.secret.clone(),
        }
    }
}

pub struct Peer {
    client: Option<RaftClient<Channel>>,
    addr: String,
    group: crate::state::partitions::PartitionId,
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
        let body = serde_json::to_vec(req).map_err(|e| NetworkError::new(&e))?;
        self.call_raw(kind, body, ttl).await
    }

    async fn call_raw<Resp: for<'a> Deserialize<'a>>(
        &mut self,
        kind: u32,
        body: Vec<u8>,
        ttl: std::time::Duration,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| unreachable(format!("bad master address {}", self.addr)))?;
        let msg = pb::RaftMessage {
            kind: if self.group == 0 {
                kind
            } else {
                kind | PARTITIONED
            },
            body,
            group: self.group,
        };
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

/// A chunk call's body: header length, header, bytes.
fn chunk_body(header: &ChunkHeader, data: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    let h = serde_json::to_vec(header)?;
    let mut body = Vec::with_capacity(4 + h.len() + data.len());
    body.extend_from_slice(&(h.len() as u32).to_le_bytes());
    body.extend_from_slice(&h);
    body.extend_from_slice(data);
    Ok(body)
}

/// Splits a chunk call's body.
pub fn parse_chunk(body: &[u8]) -> Result<(ChunkHeader, &[u8]), String> {
    let len = body
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or("snapshot chunk shorter than its header length")?;
    let h = body
        .get(4..4 + len)
        .ok_or("snapshot chunk shorter than its header")?;
    let header = serde_json::from_slice(h).map_err(|e| format!("snapshot chunk header: {e}"))?;
    Ok((header, &body[4 + len..]))
}

impl RaftNetworkV2<TypeConfig> for Peer {
    type SnapshotData = SnapshotData;

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

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(TRANSFER, &req, option.hard_ttl()).await
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, SnapshotData>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let storage = |e: io::Error| StreamingError::Unreachable(unreachable(e));
        // The bytes come from a blocking thread (the tables' rows, or a file), a chunk at a
        // time; one is held back until the next shows whether it is the last.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(2);
        let meta = snapshot.meta.clone();
        let mut producer =
            tokio::task::spawn_blocking(move || produce(snapshot.snapshot, &meta, tx));
        let ttl = option.hard_ttl();
        tokio::pin!(cancel);
        let mut offset = 0u64;
        let mut held = rx.recv().await;
        loop {
            let Some(data) = held.take() else {
                return Err(storage(finished(&mut producer).await.err().unwrap_or_else(
                    || io::Error::other("snapshot ended without bytes"),
                )));
            };
            held = rx.recv().await;
            let last = held.is_none();
            if last {
                // The producer is done: its last bytes are whole only if it finished well.
                finished(&mut producer).await.map_err(storage)?;
            }
            let header = ChunkHeader {
                vote,
                meta: snapshot.meta.clone(),
                offset,
                last,
            };
            let body = chunk_body(&header, &data).map_err(|e| storage(io::Error::other(e)))?;
            let sent = tokio::select! {
                r = self.call_raw::<Option<SnapshotResponse<TypeConfig>>>(SNAPSHOT_CHUNK, body, ttl) => r,
                closed = &mut cancel => return Err(StreamingError::Closed(closed)),
            };
            let reply = sent.map_err(|e| match e {
                RPCError::Unreachable(u) => StreamingError::Unreachable(u),
                other => StreamingError::Unreachable(unreachable(other)),
            })?;
            if last {
                metrics::counter!("cairn_master_snapshots_total", "how" => "sent").increment(1);
                return reply.ok_or_else(|| {
                    StreamingError::Unreachable(unreachable("no answer to a snapshot's last chunk"))
                });
            }
            offset += data.len() as u64;
        }
    }
}

/// The result of a snapshot's producer thread.
async fn finished(p: &mut tokio::task::JoinHandle<io::Result<()>>) -> io::Result<()> {
    p.await.map_err(io::Error::other)?
}

/// Sends the bytes of a snapshot file in chunks of [`CHUNK`]: written from the tables as a
/// read transaction sees them, or read from a file.
fn produce(
    data: SnapshotData,
    meta: &SnapshotMetaOf<TypeConfig>,
    tx: tokio::sync::mpsc::Sender<Vec<u8>>,
) -> io::Result<()> {
    let mut sink = Chunks {
        tx,
        buf: Vec::with_capacity(CHUNK),
    };
    match data {
        SnapshotData::Tables(rx) => {
            let header = serde_json::to_vec(meta).map_err(io::Error::other)?;
            crate::snapshot::write_to(&mut sink, &header, &rx, crate::state::disk::TABLES)?;
        }
        SnapshotData::File(f) => {
            io::copy(&mut io::BufReader::with_capacity(CHUNK, f.file), &mut sink)?;
            sink.flush()?;
        }
    }
    Ok(())
}

/// A writer that sends every [`CHUNK`] bytes down a channel (and the rest at `flush`).
struct Chunks {
    tx: tokio::sync::mpsc::Sender<Vec<u8>>,
    buf: Vec<u8>,
}

impl Chunks {
    fn send(&mut self) -> io::Result<()> {
        let full = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx
            .blocking_send(full)
            .map_err(|_| io::Error::other("snapshot transfer cancelled"))
    }
}

impl Write for Chunks {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let n = bytes.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&bytes[..n]);
        if self.buf.len() == CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.send()?;
        }
        Ok(())
    }
}

/// The snapshot a master is receiving: chunks are appended in order to a file in `dir`.
pub struct Incoming {
    dir: PathBuf,
    current: tokio::sync::Mutex<Option<Receiving>>,
}

struct Receiving {
    name: String,
    path: PathBuf,
    file: std::fs::File,
    len: u64,
}

impl Incoming {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            current: Default::default(),
        }
    }

    /// Takes one chunk; returns the whole file (synced) after the last.
    async fn take(&self, h: &ChunkHeader, data: &[u8]) -> Result<Option<SnapshotFile>, String> {
        let name = crate::store::snapshot_name(&h.meta);
        let mut cur = self.current.lock().await;
        if h.offset == 0 {
            if let Some(old) = cur.take() {
                let _ = std::fs::remove_file(&old.path);
            }
            let path = self.dir.join(format!("{name}.part"));
            let file = std::fs::File::create(&path).map_err(|e| e.to_string())?;
            *cur = Some(Receiving {
                name: name.clone(),
                path,
                file,
                len: 0,
            });
        }
        let r = match cur.as_mut() {
            Some(r) if r.name == name && r.len == h.offset => r,
            _ => {
                return Err(format!(
                    "snapshot chunk at {} of {name} is not the next one expected",
                    h.offset
                ));
            }
        };
        r.file.write_all(data).map_err(|e| e.to_string())?;
        r.len += data.len() as u64;
        if !h.last {
            return Ok(None);
        }
        let r = cur.take().expect("checked above");
        r.file.sync_all().map_err(|e| e.to_string())?;
        let path = r.path.clone();
        let checked = tokio::task::spawn_blocking(move || {
            crate::snapshot::verify(&path, crate::state::disk::TABLES)
        })
        .await
        .map_err(|e| e.to_string())?;
        if let Err(e) = checked {
            let _ = std::fs::remove_file(&r.path);
            return Err(format!("received snapshot {name}: {e}"));
        }
        Ok(Some(SnapshotFile {
            path: r.path,
            file: r.file,
        }))
    }
}

/// The receiving side: hands a peer's message to the local Raft node of the partition it
/// names.
pub struct RaftService {
    pub groups: Arc<crate::groups::Groups>,
    /// Only masters that prove they hold the cluster secret may append, vote or install a
    /// snapshot.
    pub auth: Arc<cairn_rpc::auth::Verifier>,
    /// Rate of the warnings about refused messages (a flood must not fill the log).
    pub refusals: cairn_rpc::admission::LogBudget,
}

/// A Raft message's body, decoded by its kind (what a peer sent; nothing acted on yet).
pub enum Message<'a> {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<TypeConfig>),
    Transfer(TransferLeaderRequest<TypeConfig>),
    SnapshotChunk(ChunkHeader, &'a [u8]),
}

/// Decodes a message of `kind` (the partition flag removed) from `body`.
///
/// # Errors
/// An unknown kind, or a body that is not the kind's JSON (or chunk framing).
pub fn decode_message(kind: u32, body: &[u8]) -> Result<Message<'_>, String> {
    fn json<T: for<'a> Deserialize<'a>>(body: &[u8]) -> Result<T, String> {
        serde_json::from_slice(body).map_err(|e| e.to_string())
    }
    Ok(match kind {
        APPEND => Message::Append(json(body)?),
        VOTE => Message::Vote(json(body)?),
        TRANSFER => Message::Transfer(json(body)?),
        SNAPSHOT_CHUNK => {
            let (header, data) = parse_chunk(body)?;
            Message::SnapshotChunk(header, data)
        }
        k => return Err(format!("unknown raft message {k}")),
    })
}

fn answer<T: Serialize, E: std::fmt::Display>(r: Result<T, E>) -> Result<Vec<u8>, tonic::Status> {
    serde_json::to_vec(&r.map_err(|e| e.to_string()))
        .map_err(|e| tonic::Status::internal(e.to_string()))
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
        let kind = m.kind & !PARTITIONED;
        if (m.kind & PARTITIONED != 0) != (m.group != 0) {
            return Err(tonic::Status::invalid_argument(format!(
                "raft message kind {} does not match partition {}",
                m.kind, m.group
            )));
        }
        // A partition this master does not host (yet: it starts a group when its root
        // replica applies the partition's creation) is unavailable to the sender, who retries.
        let g = self.groups.get(m.group).ok_or_else(|| {
            tonic::Status::unavailable(format!("partition {} is not hosted here", m.group))
        })?;
        let msg = decode_message(kind, &m.body).map_err(tonic::Status::invalid_argument)?;
        let body = match msg {
            Message::Append(r) => answer(g.raft.append_entries(r).await)?,
            Message::Vote(r) => answer(g.raft.vote(r).await)?,
            Message::Transfer(r) => answer(g.raft.handle_transfer_leader(r).await)?,
            Message::SnapshotChunk(header, data) => match g.incoming.take(&header, data).await {
                Err(e) => answer::<(), _>(Err(e))?,
                Ok(None) => answer::<Option<()>, String>(Ok(None))?,
                Ok(Some(file)) => {
                    let path = file.path.clone();
                    let snap = SnapshotOf::<TypeConfig, SnapshotData> {
                        meta: header.meta,
                        snapshot: SnapshotData::File(file),
                    };
                    let r = g.raft.install_full_snapshot(header.vote, snap).await;
                    // Installed: moved into the snapshots; refused: not wanted.
                    let _ = std::fs::remove_file(&path);
                    answer(r.map(Some))?
                }
            },
        };
        Ok(tonic::Response::new(pb::RaftMessage {
            kind: m.kind,
            body,
            group: m.group,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;
    use openraft::testing::log_id;
    use openraft::type_config::alias::{EntryOf, VoteOf};

    /// Messages of each kind, as a peer encodes them: decoded back to their kind. With
    /// `CAIRN_FUZZ_SEEDS=DIR` they are written there as the `raft_messages` fuzz target's
    /// seeds (its first byte is the kind).
    #[test]
    fn messages_decode_by_kind() {
        let vote = VoteOf::<TypeConfig>::new_committed(3, 1);
        let entry = EntryOf::<TypeConfig> {
            log_id: log_id::<TypeConfig>(3, 1, 7),
            payload: openraft::EntryPayload::Normal(Command::Delete { path: "/a".into() }),
        };
        let append = AppendEntriesRequest::<TypeConfig> {
            vote,
            prev_log_id: Some(log_id::<TypeConfig>(3, 1, 6)),
            entries: vec![entry],
            leader_commit: Some(log_id::<TypeConfig>(3, 1, 6)),
        };
        let vote_req = VoteRequest::<TypeConfig> {
            vote: VoteOf::<TypeConfig>::new(4, 2),
            last_log_id: Some(log_id::<TypeConfig>(3, 1, 7)),
            leadership_transfer: false,
        };
        let transfer =
            TransferLeaderRequest::<TypeConfig>::new(vote, 2, Some(log_id::<TypeConfig>(3, 1, 7)));
        let header = ChunkHeader {
            vote,
            meta: SnapshotMetaOf::<TypeConfig>::default(),
            offset: 0,
            last: true,
        };
        let cases = [
            (APPEND, serde_json::to_vec(&append).unwrap()),
            (VOTE, serde_json::to_vec(&vote_req).unwrap()),
            (TRANSFER, serde_json::to_vec(&transfer).unwrap()),
            (SNAPSHOT_CHUNK, chunk_body(&header, b"bytes").unwrap()),
        ];
        for (kind, body) in &cases {
            let ok = match decode_message(*kind, body).unwrap() {
                Message::Append(r) => *kind == APPEND && r.entries.len() == 1,
                Message::Vote(r) => *kind == VOTE && r.vote == vote_req.vote,
                Message::Transfer(_) => *kind == TRANSFER,
                Message::SnapshotChunk(h, data) => {
                    *kind == SNAPSHOT_CHUNK && h.last && data == b"bytes"
                }
            };
            assert!(ok, "kind {kind}");
        }
        assert!(decode_message(APPEND, b"{}").is_err());
        assert!(decode_message(9, b"{}").is_err());
        if let Ok(dir) = std::env::var("CAIRN_FUZZ_SEEDS") {
            for (kind, body) in &cases {
                let mut seed = vec![*kind as u8];
                seed.extend_from_slice(body);
                std::fs::write(format!("{dir}/kind-{kind}"), seed).unwrap();
            }
        }
    }
}
