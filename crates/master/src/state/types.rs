//! The records of the replicated state: files' policies and chunks, inodes, servers,
//! capability keys and the cluster's settings (serialized into the Raft log and snapshots:
//! docs/masters.md).

use super::{ChunkId, InodeId, ServerId, perm};
use cairn_rpc::MetaError;
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Copies of a replicated chunk. For a file written as EC, the copies of its tail (M+1:
    /// docs/erasure-coding.md §3).
    pub replicas: u8,
    /// LZ4 per block.
    pub compression: bool,
    /// Copies durable before an append is acknowledged (chasing): `2 * min_copy > replicas`.
    /// 0 (snapshots from before issue 5) means the least majority.
    #[serde(default)]
    pub min_copy: u8,
    /// Erasure coding, if the policy has it (snapshots from before issue 26 have none).
    #[serde(default)]
    pub ec: Option<Ec>,
}

/// The erasure coding of a policy: K data and M parity cells per stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ec {
    pub k: u8,
    pub m: u8,
    /// Written with `replicas` copies and converted once sealed (`replicas:N,then:ec:K+M`),
    /// rather than written as EC.
    pub then: bool,
}

impl Policy {
    /// The least majority of `replicas`: 1 of 1, 2 of 2, 2 of 3, 3 of 4, 3 of 5.
    pub fn majority(replicas: u8) -> u8 {
        replicas / 2 + 1
    }

    /// The effective MinCopy.
    pub fn min_copy(&self) -> u8 {
        if self.min_copy == 0 {
            Self::majority(self.replicas)
        } else {
            self.min_copy
        }
    }

    /// `ec:K+M` written as EC (not converted later).
    pub fn direct_ec(&self) -> Option<Ec> {
        self.ec.filter(|e| !e.then)
    }

    /// The policy in the text form users write (`cairn_ec::Policy`).
    pub fn text(&self) -> cairn_ec::Policy {
        use cairn_ec::Redundancy as R;
        let ec = self.ec.map(|e| R::Ec { k: e.k, m: e.m });
        let (write, then) = match self.ec {
            Some(e) if !e.then => (ec.unwrap_or(R::Replicas(self.replicas)), None),
            _ => (R::Replicas(self.replicas), ec),
        };
        cairn_ec::Policy {
            write,
            then,
            lz4: self.compression,
        }
    }

    /// Checks the bounds a replicated command must keep (the leader checked them already;
    /// a follower applying the log checks again rather than trusting).
    pub fn check(&self) -> Result<(), MetaError> {
        if self.replicas == 0 || u32::from(self.replicas) > cairn_rpc::MAX_REPLICAS {
            return Err(MetaError::invalid(format!(
                "replicas must be 1..={}",
                cairn_rpc::MAX_REPLICAS
            )));
        }
        let m = self.min_copy();
        if m > self.replicas || 2 * m <= self.replicas {
            return Err(MetaError::invalid(format!(
                "min_copy {m} of {} replicas: it must be a majority",
                self.replicas
            )));
        }
        if let Some(e) = self.ec
            && (e.k < cairn_ec::policy::MIN_EC_DATA
                || e.m == 0
                || u16::from(e.k) + u16::from(e.m) > u16::from(cairn_ec::policy::MAX_EC_WIDTH))
        {
            return Err(MetaError::invalid(format!(
                "ec:{}+{}: EC needs K >= {}, M >= 1 and K+M <= {}",
                e.k,
                e.m,
                cairn_ec::policy::MIN_EC_DATA,
                cairn_ec::policy::MAX_EC_WIDTH
            )));
        }
        Ok(())
    }
}

impl Default for Policy {
    /// Three replicas, MinCopy 2, uncompressed.
    fn default() -> Self {
        Self {
            replicas: 3,
            compression: false,
            min_copy: 2,
            ec: None,
        }
    }
}

/// Cluster-wide settings changed at run time (`cairn admin set`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// Bytes/s all repairs together may copy.
    pub repair_bytes_per_sec: u64,
    /// A sealed chunk of a `then:ec` file is converted once its file was last changed this
    /// long ago.
    #[serde(default = "default_convert_after")]
    pub convert_after_secs: u64,
    /// Bytes/s each chunkserver's background work (repair, conversion, scrub) may move
    /// together.
    #[serde(default = "default_background")]
    pub background_bytes_per_sec: u64,
}

/// Default age before conversion: an hour.
pub const DEFAULT_CONVERT_AFTER_SECS: u64 = 3600;
/// Default background bandwidth of a chunkserver: 200 MiB/s.
pub const DEFAULT_BACKGROUND_BYTES_PER_SEC: u64 = 200 << 20;

fn default_convert_after() -> u64 {
    DEFAULT_CONVERT_AFTER_SECS
}

fn default_background() -> u64 {
    DEFAULT_BACKGROUND_BYTES_PER_SEC
}

/// Default repair bandwidth cap: 64 MiB/s.
pub const DEFAULT_REPAIR_BYTES_PER_SEC: u64 = 64 << 20;

impl Default for Config {
    fn default() -> Self {
        Self {
            repair_bytes_per_sec: DEFAULT_REPAIR_BYTES_PER_SEC,
            convert_after_secs: DEFAULT_CONVERT_AFTER_SECS,
            background_bytes_per_sec: DEFAULT_BACKGROUND_BYTES_PER_SEC,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub holder: String,
    pub expires_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    pub id: ChunkId,
    /// The length the master knows: final once sealed; for the chunk being written, the last
    /// committed length (the replicas may hold more). For a chunk group, user bytes: whole
    /// stripes, each `k * cell` bytes.
    pub length: u64,
    pub sealed: bool,
    pub version: u64,
    /// The replicas; for a chunk group its K+M members in order, data members first (each
    /// server holds its member under the group's id).
    pub servers: Vec<ServerId>,
    /// Set for a chunk group (erasure coded, docs/erasure-coding.md §2).
    #[serde(default)]
    pub ec: Option<Group>,
}

/// The layout of a chunk group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub k: u8,
    pub m: u8,
    /// Bytes per cell.
    pub cell: u32,
    /// Set when the group holds LZ4 blocks (a conversion of an `lz4` file): the stripes hold a
    /// stream of compressed blocks and their index (docs/formats/compressed-block.md), not the
    /// user's bytes.
    #[serde(default)]
    pub lz4: Option<Lz4>,
}

/// The stream of LZ4 blocks in a compressed group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lz4 {
    /// Bytes of the stream: blocks, index, trailer (the stripes past it are zeros).
    pub stream: u64,
    /// User bytes per block (the last may hold fewer).
    pub block: u32,
}

/// User bytes per LZ4 block of converted groups.
pub const LZ4_BLOCK: u32 = 64 << 10;

/// A chunk group's member rebuilt by a repair: position `index` of the group's servers,
/// held by `from` before the repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberMove {
    pub index: u8,
    pub from: ServerId,
}

/// A replica→EC conversion under way (docs/erasure-coding.md §5): the group's members are
/// being written to `servers` under the group's id; until `ConvertEnd` the replicated chunk
/// is the data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conversion {
    /// The replicated chunk being converted.
    pub chunk: ChunkId,
    pub length: u64,
    pub group: Group,
    pub servers: Vec<ServerId>,
    pub started_ms: u64,
    /// User bytes per LZ4 block when the file's policy compresses (0: it does not).
    #[serde(default)]
    pub lz4_block: u32,
}

/// Cell size of new chunk groups.
pub const DEFAULT_CELL: u32 = 64 << 10;

impl Chunk {
    /// Bytes each holder of the chunk stores: the length, or a group member's length.
    pub fn stored_length(&self) -> u64 {
        match self.ec {
            // A converted group's last stripe may be partial (padded with zeros).
            Some(g) => {
                let stripe = u64::from(g.k) * u64::from(g.cell);
                let bytes = g.lz4.map_or(self.length, |z| z.stream);
                bytes.div_ceil(stripe) * u64::from(g.cell)
            }
            None => self.length,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMeta {
    pub policy: Policy,
    pub sealed: bool,
    pub chunks: Vec<Chunk>,
    pub lease: Option<Lease>,
    /// Bumped each time a writer takes the file (create with a lease, open for write):
    /// writers' capabilities carry it, so chunkservers refuse a superseded writer
    /// (docs/security.md).
    #[serde(default)]
    pub writer_epoch: u32,
}

/// A key that signs capabilities, in the replicated state (docs/security.md).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    pub id: u32,
    pub secret: [u8; cairn_proto::cap::KEY_BYTES],
    pub created_ms: u64,
}

impl fmt::Debug for KeyRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRecord")
            .field("id", &self.id)
            .field("created_ms", &self.created_ms)
            .finish_non_exhaustive()
    }
}

/// Capability keys kept: the newest and the one before it (the overlap of a rotation).
pub const KEYS_KEPT: usize = 2;

impl FileMeta {
    pub fn committed_length(&self) -> u64 {
        self.chunks.iter().map(|c| c.length).sum()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    Dir,
    File(FileMeta),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inode {
    pub id: InodeId,
    pub parent: InodeId,
    pub name: String,
    pub ctime_ms: u64,
    pub mtime_ms: u64,
    pub kind: Kind,
    /// The owning user; empty: the cluster itself (perm.rs).
    #[serde(default)]
    pub owner: String,
    /// Permission bits (perm.rs); inodes from before owners existed get 0o755.
    #[serde(default = "perm::default_mode")]
    pub mode: u16,
    /// POSIX attributes, for a node the file service made or changed (state/files.rs);
    /// `None` for one only `cairn fs` touched, whose attributes are derived. Records of
    /// version 1 (before the file service) have none.
    #[serde(default)]
    pub posix: Option<Box<Posix>>,
}

/// What a POSIX file system keeps of a node beyond the namespace's owner and mode
/// (docs/files.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Posix {
    pub kind: cairn_rpc::files::NodeType,
    pub uid: u32,
    pub gid: u32,
    /// Links: a file's names (1 plus its `links`); a directory's 2 plus its subdirectories.
    pub nlink: u32,
    /// A regular file's length (its extents may end before: a sparse tail).
    pub size: u64,
    pub atime: cairn_rpc::files::Time,
    pub mtime: cairn_rpc::files::Time,
    pub ctime: cairn_rpc::files::Time,
    pub rdev: u32,
    /// A symbolic link's target.
    pub target: String,
    /// A regular file's bytes, in offset order, none overlapping; `None`: the file's own
    /// FlatLogFile holds them (a file `cairn fs` wrote, then touched by a mount).
    pub extents: Option<Vec<cairn_rpc::files::Extent>>,
    /// Extended attributes by name (`user.`, `trusted.`, `security.`; at most
    /// [`cairn_rpc::files::XATTRS_MAX`] bytes of names and values). Version 3 of `inodes`.
    #[serde(default)]
    pub xattrs: std::collections::BTreeMap<String, Vec<u8>>,
    /// A hard link: this entry is another name of inode `link` (in the same partition), whose
    /// record holds everything else; 0 for a node (docs/files.md "Hard links"). Version 4.
    #[serde(default)]
    pub link: InodeId,
    /// A node's other names: the link entries that name it, oldest first (`nlink` is one
    /// more). Version 4.
    #[serde(default)]
    pub links: Vec<InodeId>,
    /// A directory a mount made, held for it ([`cairn_rpc::files::DIR_HOLD_MS`]): other
    /// mounts' lookups of names not in it, listings of it and new names in it wait while
    /// the mount's creates in it commit behind their answers (docs/files.md "A create that
    /// does not wait"). Version 5.
    #[serde(default)]
    pub hold: Option<Lease>,
}

impl Inode {
    pub fn file(&self) -> Option<&FileMeta> {
        match &self.kind {
            Kind::File(f) => Some(f),
            Kind::Dir => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerRecord {
    pub id: ServerId,
    pub addr: String,
    pub host: String,
    pub rack: String,
    pub draining: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkUpdate {
    pub chunk_id: ChunkId,
    pub length: u64,
    pub sealed: bool,
}
