//! The block service's volumes as the masters keep them: their snapshots, clones' parents,
//! owners and modes (docs/block.md).

use serde::{Deserialize, Serialize};

/// A snapshot of a volume: the index as one FLUSH left it, kept as the sealed checkpoint
/// `snap-ID` in the volume's directory; the segments it names are never collected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub name: String,
    /// 16 hex digits, fresh for every snapshot (names its file).
    pub id: String,
    /// The volume's size when it was taken (a clone's size).
    pub size: u64,
    pub created_ms: u64,
    /// Its index is written; until then it cannot be cloned.
    #[serde(default)]
    pub ready: bool,
}

/// Where a clone came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parent {
    /// The volume's name and id, and the snapshot's name and id.
    pub volume: String,
    pub volume_id: String,
    pub snapshot: String,
    pub snapshot_id: String,
}

/// A block volume (docs/block.md): its data and index live in FlatLogFiles under
/// `/.block/ID/`; this record is what the masters keep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    pub name: String,
    /// 16 hex digits, fresh for every volume: names its directory, so a volume deleted and
    /// created again under the same name never sees the old one's files.
    pub id: String,
    /// Bytes; a multiple of `block_size`.
    pub size: u64,
    /// The unit of the index and of NBD requests (a power of two, 512..=64 KiB).
    pub block_size: u32,
    /// The redundancy of its files (`cairn_client::Policy` syntax, e.g. `r3`, `ec:4+2`);
    /// empty: the cluster's default.
    #[serde(default)]
    pub policy: String,
    pub created_ms: u64,
    /// Its snapshots, oldest first.
    #[serde(default)]
    pub snapshots: Vec<Snapshot>,
    /// A clone's snapshot.
    #[serde(default)]
    pub parent: Option<Parent>,
    /// A clone's ancestors' ids, nearest first: a segment of origin `k` in its index is in
    /// the directory of `lineage[k - 1]` (docs/block.md).
    #[serde(default)]
    pub lineage: Vec<String>,
    /// The user it belongs to; empty: the cluster's (admins only).
    #[serde(default)]
    pub owner: String,
    /// `rwx` of its owner (0o700) and of everyone else (0o007), as files': `r` opens it for
    /// reading and lists it, `w` for writing too. Group bits are kept and checked for no one.
    #[serde(default = "default_volume_mode")]
    pub mode: u16,
}

/// The mode of a volume made without one: its owner's alone.
pub const fn default_volume_mode() -> u16 {
    0o600
}

/// What a user may do with a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeAccess {
    None,
    Read,
    ReadWrite,
}

impl Volume {
    /// What `user` (an admin: `admin`) may do with this volume.
    pub fn access(&self, user: &str, admin: bool) -> VolumeAccess {
        let bits = if admin {
            0o7
        } else if !self.owner.is_empty() && self.owner == user {
            (self.mode >> 6) & 0o7
        } else {
            self.mode & 0o7
        };
        match (bits & 0o4 != 0, bits & 0o2 != 0) {
            (true, true) => VolumeAccess::ReadWrite,
            (true, false) => VolumeAccess::Read,
            // Write without read is not a way to use a block device.
            _ => VolumeAccess::None,
        }
    }

    pub fn snapshot(&self, name: &str) -> Option<&Snapshot> {
        self.snapshots.iter().find(|s| s.name == name)
    }
}

/// Volume names: 1–63 of `[a-z0-9._-]`, starting with a letter or digit.
pub fn valid_volume_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(&c))
}
