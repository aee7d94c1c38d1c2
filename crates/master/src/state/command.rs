//! The replicated changes ([`Command`]) and what applying one answers ([`Reply`]).

use super::{
    Actor, ChunkId, ChunkUpdate, Config, Inode, Lease, MemberMove, Policy, ServerId, ServerRecord,
    is_zero_u64,
};
use cairn_rpc::MetaError;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One replicated change. `now_ms` is the leader's clock when it proposed the command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Mkdir {
        path: String,
        parents: bool,
        now_ms: u64,
        /// The default policy of files created below the new directory.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        policy: Option<Policy>,
        /// Permission bits of the new directory (default 0o755).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u16>,
    },
    Create {
        path: String,
        policy: Policy,
        parents: bool,
        now_ms: u64,
        lease: Option<Lease>,
        /// Chunkservers of each chunk to allocate, in order.
        placements: Vec<Vec<ServerId>>,
        /// The placements are chunk groups of the file's EC policy.
        #[serde(default)]
        groups: bool,
        /// Permission bits of the new file (default 0o644).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u16>,
    },
    OpenWrite {
        path: String,
        now_ms: u64,
        lease: Lease,
        placements: Vec<Vec<ServerId>>,
        /// The placements are chunk groups of the file's EC policy.
        #[serde(default)]
        groups: bool,
        /// When the last writer released the file cleanly and its last chunk is a replicated
        /// chunk shorter than this, the chunk is opened again for the new writer to continue
        /// (0: never; see [`continue_last`]).
        #[serde(default, skip_serializing_if = "is_zero_u64")]
        continue_below: u64,
    },
    Allocate {
        path: String,
        holder: String,
        now_ms: u64,
        placements: Vec<Vec<ServerId>>,
        /// The placements are chunk groups of the file's EC policy.
        #[serde(default)]
        groups: bool,
    },
    Commit {
        path: String,
        holder: String,
        now_ms: u64,
        updates: Vec<ChunkUpdate>,
        trim: bool,
        release: bool,
        seal: bool,
        /// New lease expiry (ignored with `release`).
        lease_until_ms: u64,
        /// (chunk, server): replicas the writer gave up on; no longer locations.
        #[serde(default)]
        drops: Vec<(ChunkId, ServerId)>,
        /// Tail chunks of an EC file whose bytes are in a group now: leave the file.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        remove: Vec<ChunkId>,
    },
    Rename {
        from: String,
        to: String,
        now_ms: u64,
    },
    Delete {
        path: String,
    },
    /// Changes the permission bits and/or the owner of a file or directory.
    SetAttr {
        path: String,
        mode: Option<u16>,
        owner: Option<String>,
    },
    /// `cmd` on behalf of a user: checked against owners and permission bits (perm.rs), and
    /// what it creates is theirs.
    As {
        actor: Actor,
        cmd: Box<Command>,
    },
    Register {
        server: ServerRecord,
    },
    SetDraining {
        server_id: ServerId,
        draining: bool,
    },
    /// A repair copied a sealed chunk to `server`: it becomes a location and `remove` (the
    /// copies that were down, draining or stale) stop being locations. Ignored when the chunk
    /// is gone or its length changed meanwhile.
    ///
    /// For a chunk group, `member` names the rebuilt member: its position moves from the
    /// server it names to `server` (the same server when rebuilt in place), `remove` is empty,
    /// and nothing changes unless that position still holds that server.
    Repaired {
        chunk_id: ChunkId,
        length: u64,
        server: ServerId,
        remove: Vec<ServerId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        member: Option<MemberMove>,
    },
    SetConfig {
        config: Config,
    },
    /// Starts converting sealed replicated chunk `chunk_id` to a group of `servers` (K+M of
    /// them, the file's policy's geometry): allocates the group's id (in the reply's
    /// `chunk`) and records the conversion, so that the members being written are not
    /// orphans.
    ConvertBegin {
        chunk_id: ChunkId,
        servers: Vec<ServerId>,
        now_ms: u64,
    },
    /// Ends the conversion to group `group_id`: with `switch`, the file's chunk becomes the
    /// group (same length, sealed) in this one step and its replicas are no longer locations;
    /// without, or when the chunk changed meanwhile, the conversion is dropped and the
    /// replicas stay the data.
    ///
    /// `stream` is the length of the LZ4 stream the worker wrote when the conversion
    /// compresses (it must then be non-zero and fit the members).
    ConvertEnd {
        group_id: ChunkId,
        switch: bool,
        #[serde(default)]
        stream: u64,
    },
    /// Adds a capability key (the leader drew `secret`); the oldest past [`KEYS_KEPT`] is
    /// dropped, and with it every capability it signed.
    RotateKey {
        secret: [u8; cairn_proto::cap::KEY_BYTES],
        now_ms: u64,
    },
    /// Independent commands of concurrent callers in one Raft entry, applied in order; each
    /// has its own result in [`Reply::batch`]. A batch inside a batch is refused.
    Batch(Vec<Command>),
    /// A change to the object index (the S3 gateway's); its answer is in [`Reply::object`].
    Object(Box<cairn_rpc::object::ObjectOp>),
    /// A file service change (state/files.rs; docs/files.md).
    Files(Box<cairn_rpc::files::FileOp>),
    /// Segments being collected (segments.rs): from now on a write naming one is refused
    /// here. Condemning one already condemned changes nothing.
    CondemnSegments {
        segs: Vec<u64>,
        now_ms: u64,
    },
    /// Replaces users' plain secret keys (from before secrets were sealed) with their sealed
    /// form (access key, sealed secret; cairn_rpc::seal). A user whose secret is sealed
    /// already, or who is gone, is left alone.
    SealSecrets {
        sealed: Vec<(String, String)>,
    },
    /// Drops the capability revocations numbered up to `upto` (revoke.rs): every capability
    /// they revoked has expired.
    PruneRevocations {
        upto: u64,
    },
    /// Adds a partition hosted by `members` (the root's command; docs/partitions.md); its
    /// number is in [`Reply::partition`].
    AddPartition {
        members: Vec<u64>,
        now_ms: u64,
    },
    /// Makes a new partition's state the holder of the subtree at `path` (applied in that
    /// partition before the root's [`Command::AssignSubtree`]): ids from its range, its top
    /// directory with `owner` and `mode`.
    InitPartition {
        partition: u32,
        path: String,
        owner: String,
        mode: u16,
        now_ms: u64,
    },
    /// Revokes capabilities on files of a partition whose mode or owner a change narrowed
    /// (the root's command: it signs and revokes capabilities): (inode, holder kept, 0 for
    /// none), one generation.
    Revoke {
        files: Vec<(u64, u64)>,
    },
    /// Sends the subtree at `path` (missing, or an empty directory with `owner` and `mode`)
    /// to `partition` in the root's map.
    AssignSubtree {
        path: String,
        partition: u32,
        owner: String,
        mode: u16,
        now_ms: u64,
    },
    /// Freezes the populated directory at `path` for its move into partition `to` (the
    /// root's command; moves.rs): writes below it answer unavailable until
    /// [`Command::FinishMove`].
    BeginMove {
        path: String,
        to: u32,
        now_ms: u64,
    },
    /// [`Command::BeginMove`] of a populated directory being hashed over `shards`
    /// (state/hashed.rs): its rows go to the shard of their first name below it, and
    /// [`Command::FinishMove`] records it hashed rather than delegated.
    BeginHashMove {
        path: String,
        shards: Vec<u32>,
        now_ms: u64,
    },
    /// Rows of the subtree moving into this partition, whose top is `top` (the receiving
    /// partition's command): inodes as the root holds them, except that the moved
    /// directory's own entries name this partition's top (inode 1) as their parent; and the
    /// default policies of directories among them.
    LoadRows {
        top: String,
        inodes: Vec<Inode>,
        policies: Vec<(u64, Policy)>,
    },
    /// Hashes the directory at `path` (made with `mode` if missing; else empty) over the
    /// partitions `shards` (the partition holding `path`'s command; state/hashed.rs): the
    /// entries below it go to `shards[fnv1a64(name) mod K]`.
    HashDir {
        path: String,
        shards: Vec<u32>,
        mode: u16,
        now_ms: u64,
    },
    /// The root's map: partition `from` hashed `path` over `shards`.
    DelegateHashed {
        path: String,
        from: u32,
        shards: Vec<u32>,
    },
    /// Closes loading in the partition that holds `top` (after its last
    /// [`Command::LoadRows`], before the root's [`Command::FinishMove`]): a load sent later —
    /// by a driver that lost the root's leadership — is refused, so it cannot put back rows
    /// the subtree's users changed once it was theirs.
    SealLoad {
        top: String,
    },
    /// Ends the move of `path` into `to` (the root's command, once `to` holds every row):
    /// the subtree's rows leave the root, its chunks are forwarded to `to`, and the map
    /// sends `path` there.
    FinishMove {
        path: String,
        to: u32,
    },
    /// Sends `path`, which partition `from` (not the root) has moved out to `to` (its
    /// [`Command::FinishMove`] recorded it), to `to` in the root's map (the root's command).
    DelegateSubtree {
        path: String,
        from: u32,
        to: u32,
    },
    /// Logs the intent of a rename across partitions, `from` in `src` to `to` in `dst` (the
    /// root's; txn.rs): its transaction id is in [`Reply::txid`].
    TxBegin {
        from: String,
        to: String,
        src: u32,
        dst: u32,
        now_ms: u64,
    },
    /// Locks the file or directory at `path` for `txid` (the source partition's; a
    /// directory's whole subtree); its record is in the reply.
    TxLockSource {
        txid: u64,
        path: String,
    },
    /// Locks `path` for `txid` (the destination partition's): absent or a file for a file,
    /// absent for a directory (`dir`).
    TxLockDest {
        txid: u64,
        path: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        dir: bool,
    },
    /// Rows below a directory renamed into this partition (the destination's, between the
    /// decision and [`Command::TxInstall`]): inodes as the source holds them, parents first
    /// (the directory's own entries name `top`, its inode, which the install puts last), and
    /// the default policies of `top` and of directories among them.
    TxLoad {
        txid: u64,
        top: u64,
        inodes: Vec<Inode>,
        policies: Vec<(u64, Policy)>,
    },
    /// Decides `txid` (the root's): commit with the file's record, or abort (`None`). A
    /// decision made already stands; the reply holds it.
    TxDecide {
        txid: u64,
        record: Option<Inode>,
    },
    /// Installs the file at the path locked for `txid` and unlocks (the destination's).
    TxInstall {
        txid: u64,
        inode: Inode,
    },
    /// The chunks this partition allocated now live in partition `to` (forwards).
    TxForward {
        chunks: Vec<ChunkId>,
        to: u32,
    },
    /// Drops the file locked for `txid` and unlocks (the source's).
    TxRemove {
        txid: u64,
    },
    /// Unlocks what `txid` locked here (after an abort).
    TxUnlock {
        txid: u64,
    },
    /// Forgets the intent `txid` (the root's).
    TxEnd {
        txid: u64,
    },
    /// Where a bucket's objects live (objects/buckets.rs).
    Bucket(super::objects::buckets::BucketCommand),
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Mkdir { path, .. } => write!(f, "mkdir {path}"),
            Command::Create { path, .. } => write!(f, "create {path}"),
            Command::OpenWrite { path, .. } => write!(f, "open-write {path}"),
            Command::Allocate {
                path, placements, ..
            } => {
                write!(f, "allocate {path} +{}", placements.len())
            }
            Command::Commit { path, .. } => write!(f, "commit {path}"),
            Command::Rename { from, to, .. } => write!(f, "rename {from} {to}"),
            Command::Delete { path } => write!(f, "delete {path}"),
            Command::SetAttr { path, mode, owner } => {
                write!(f, "set-attr {path} mode={mode:?} owner={owner:?}")
            }
            Command::As { actor, cmd } => write!(f, "{cmd} as {}", actor.user),
            Command::Register { server } => write!(f, "register {} {}", server.id, server.addr),
            Command::SetDraining {
                server_id,
                draining,
            } => write!(f, "set-draining {server_id} {draining}"),
            Command::Repaired {
                chunk_id, server, ..
            } => write!(f, "repaired {chunk_id} on {server}"),
            Command::SetConfig { config } => write!(f, "set-config {config:?}"),
            Command::ConvertBegin { chunk_id, .. } => write!(f, "convert-begin {chunk_id}"),
            Command::ConvertEnd {
                group_id, switch, ..
            } => {
                write!(f, "convert-end {group_id} switch={switch}")
            }
            // Never the secret.
            Command::RotateKey { .. } => write!(f, "rotate-key"),
            Command::Batch(cmds) => write!(f, "batch of {}", cmds.len()),
            // Never the op itself: a user's creation carries its secret.
            Command::Object(op) => write!(f, "object {}", object_op_name(op)),
            Command::Files(op) => write!(f, "file {}", op.name()),
            Command::CondemnSegments { segs, .. } => {
                write!(f, "condemn-segments of {}", segs.len())
            }
            Command::Bucket(b) => write!(f, "{b}"),
            Command::SealSecrets { sealed } => write!(f, "seal-secrets of {}", sealed.len()),
            Command::PruneRevocations { upto } => write!(f, "prune-revocations to {upto}"),
            Command::AddPartition { members, .. } => write!(f, "add-partition on {members:?}"),
            Command::InitPartition {
                partition, path, ..
            } => write!(f, "init-partition {partition} {path}"),
            Command::AssignSubtree {
                path, partition, ..
            } => write!(f, "assign-subtree {path} {partition}"),
            Command::Revoke { files } => write!(f, "revoke {} file(s)", files.len()),
            Command::BeginMove { path, to, .. } => write!(f, "begin-move {path} {to}"),
            Command::BeginHashMove { path, shards, .. } => {
                write!(f, "begin-hash-move {path} {shards:?}")
            }
            Command::LoadRows { top, inodes, .. } => {
                write!(f, "load-rows {top} +{}", inodes.len())
            }
            Command::SealLoad { top } => write!(f, "seal-load {top}"),
            Command::FinishMove { path, to } => write!(f, "finish-move {path} {to}"),
            Command::DelegateSubtree { path, from, to } => {
                write!(f, "delegate-subtree {path} {from} {to}")
            }
            Command::HashDir { path, shards, .. } => write!(f, "hash-dir {path} {shards:?}"),
            Command::DelegateHashed { path, from, shards } => {
                write!(f, "delegate-hashed {path} {from} {shards:?}")
            }
            Command::TxBegin { from, to, .. } => write!(f, "tx-begin {from} {to}"),
            Command::TxLockSource { txid, path } => write!(f, "tx-lock-source {txid} {path}"),
            Command::TxLockDest { txid, path, .. } => write!(f, "tx-lock-dest {txid} {path}"),
            Command::TxLoad { txid, inodes, .. } => {
                write!(f, "tx-load {txid} ({} rows)", inodes.len())
            }
            Command::TxDecide { txid, record } => {
                write!(f, "tx-decide {txid} commit={}", record.is_some())
            }
            Command::TxInstall { txid, .. } => write!(f, "tx-install {txid}"),
            Command::TxForward { chunks, to } => {
                write!(f, "tx-forward {} chunk(s) to {to}", chunks.len())
            }
            Command::TxRemove { txid } => write!(f, "tx-remove {txid}"),
            Command::TxUnlock { txid } => write!(f, "tx-unlock {txid}"),
            Command::TxEnd { txid } => write!(f, "tx-end {txid}"),
        }
    }
}

/// What a command returns: the inode it touched (with its file meta).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Reply {
    pub inode: Option<Inode>,
    /// For [`Command::Batch`]: one result per command, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch: Vec<Response>,
    /// For [`Command::Object`]: the object index's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<cairn_rpc::object::OpResult>,
    /// For [`Command::Files`]: the file service's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<cairn_rpc::files::FileReply>,
    /// For [`Command::ConvertBegin`]: the new group's id; for [`Command::OpenWrite`]: the
    /// last chunk opened again for the new writer to continue, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk: Option<ChunkId>,
    /// For [`Command::AddPartition`]: the new partition's number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    /// For [`Command::TxBegin`] and [`Command::TxDecide`]: the transaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txid: Option<u64>,
}

fn object_op_name(op: &cairn_rpc::object::ObjectOp) -> &'static str {
    use cairn_rpc::object::ObjectOp as O;
    match op {
        O::CreateUser { .. } => "create-user",
        O::DeleteUser { .. } => "delete-user",
        O::SetUserKeys { .. } => "set-user-keys",
        O::AddUserCert { .. } => "add-user-cert",
        O::RevokeUserCerts { .. } => "revoke-user-certs",
        O::SetVolumeAttr { .. } => "set-volume-attr",
        O::CreateBucket { .. } => "create-bucket",
        O::DeleteBucket { .. } => "delete-bucket",
        O::PutObject { .. } => "put",
        O::DeleteObject { .. } => "delete",
        O::CreateUpload { .. } => "create-upload",
        O::PutPart { .. } => "put-part",
        O::CompleteUpload { .. } => "complete-upload",
        O::AbortUpload { .. } => "abort-upload",
        O::GatewaySeen { .. } => "gateway-seen",
        O::MoveExtent { .. } => "move-extent",
        O::DropPack { .. } => "drop-pack",
        O::EmptyTrash { .. } => "empty-trash",
        O::CreateVolume { .. } => "create-volume",
        O::ResizeVolume { .. } => "resize-volume",
        O::DeleteVolume { .. } => "delete-volume",
        O::CreateSnapshot { .. } => "create-snapshot",
        O::SnapshotReady { .. } => "snapshot-ready",
        O::DeleteSnapshot { .. } => "delete-snapshot",
    }
}

pub type Response = Result<Reply, MetaError>;
