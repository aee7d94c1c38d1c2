//! The object index's API: what the S3 gateway asks of the masters (docs/object.md).
//!
//! The masters keep buckets, objects, multipart uploads, users and small-object log ("pack")
//! usage in their replicated state. Object *data* never comes here: it lives in FlatLogFiles
//! and an object names the byte ranges ([`Extent`]s) that hold it. A gateway writes the data
//! first, durably, and only then sends the index change that makes it visible, so an object is
//! never visible without its data.
//!
//! Changes ([`ObjectOp`]) travel in `Batch` calls (concurrent PUTs share one Raft entry);
//! reads ([`ObjectQuery`]) in `ObjectRead`. Both are JSON in protobuf `bytes`.
//!
//! Retries are safe: a PUT carries a `put_id` unique to it, and a PUT whose `put_id` is the
//! current object's (the first try applied, its answer was lost) changes nothing.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub mod compact;
mod place;
mod volume;
pub use place::{data_dir, data_dir_shard, shard_of, shards_dir};
pub use volume::{Parent, Snapshot, Volume, VolumeAccess, default_volume_mode, valid_volume_name};

/// Longest object key, in bytes (S3's limit).
pub const MAX_KEY_BYTES: usize = 1024;
/// Most keys one listing returns (S3's limit).
pub const MAX_LIST_KEYS: usize = 1000;
/// Most parts of one multipart upload (S3's limit).
pub const MAX_PARTS: u32 = 10_000;
/// Smallest part but the last of a completed multipart upload (S3's limit).
pub const MIN_PART_BYTES: u64 = 5 << 20;

/// A byte range of a FlatLogFile that holds (part of) an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    pub path: String,
    pub offset: u64,
    pub len: u64,
    /// In a shared small-object log (a pack): freeing it marks the bytes dead in the pack's
    /// usage; otherwise the file is the extent's alone and is deleted with it.
    pub shared: bool,
}

/// An object's entry in the index.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    pub size: u64,
    /// Without quotes: hex MD5 for a single PUT, `md5-of-md5s-N` for a multipart upload.
    /// Stored as its bytes when it is hex ([`compact`]).
    #[serde(with = "compact")]
    pub etag: String,
    pub mtime_ms: u64,
    /// Unique to the PUT (or upload) that made this version; retries carry the same. Stored
    /// as its bytes when it is hex ([`compact`]).
    #[serde(with = "compact")]
    pub put_id: String,
    /// Content-Type, Content-Encoding, Content-Disposition, Content-Language, Cache-Control,
    /// Expires, as given.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// `x-amz-meta-*`, without the prefix.
    #[serde(default)]
    pub user_meta: BTreeMap<String, String>,
    /// Algorithm (`CRC32`, `CRC32C`, `SHA1`, `SHA256`, `CRC64NVME`) → base64 value.
    #[serde(default)]
    pub checksums: BTreeMap<String, String>,
    /// The data, in order; their lengths add up to `size`.
    pub extents: Vec<Extent>,
    /// A multipart object's part sizes, in order (GET with `partNumber`); empty otherwise.
    #[serde(default)]
    pub part_sizes: Vec<u64>,
    /// `COMPOSITE` (a checksum of the parts' checksums, `-N` appended) or `FULL_OBJECT` (of
    /// the whole object) for the checksum in `checksums`; none when it has none.
    #[serde(default)]
    pub checksum_type: Option<String>,
    /// A multipart object's parts' checksums in its checksum algorithm, in order (GET with
    /// `partNumber`); empty when it has none.
    #[serde(default)]
    pub part_checksums: Vec<String>,
}

/// One part of a multipart upload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub number: u32,
    pub size: u64,
    /// Hex MD5 of the part, without quotes.
    pub etag: String,
    pub mtime_ms: u64,
    pub extent: Extent,
    #[serde(default)]
    pub checksums: BTreeMap<String, String>,
}

/// A multipart upload in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upload {
    pub id: String,
    pub bucket: String,
    pub key: String,
    pub owner: String,
    pub initiated_ms: u64,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub user_meta: BTreeMap<String, String>,
    #[serde(default)]
    pub parts: BTreeMap<u32, Part>,
    /// The checksum algorithm every part carries and the object gets (`x-amz-checksum-algorithm`
    /// at creation), and its type (`COMPOSITE` or `FULL_OBJECT`).
    #[serde(default)]
    pub checksum_algorithm: Option<String>,
    #[serde(default)]
    pub checksum_type: Option<String>,
}

/// A user of the object service. The secret is stored by the masters and handed to gateways
/// (which check signatures); it is never logged.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub name: String,
    pub access_key: String,
    pub secret_key: String,
    pub created_ms: u64,
    /// May run `cairn admin`, manage users, and passes every permission check.
    #[serde(default)]
    pub admin: bool,
    /// The client certificates issued to this user (`cairn user cert`), by fingerprint
    /// ([`cert_fingerprint`]): the NBD server asks whose a certificate is.
    #[serde(default)]
    pub certs: Vec<String>,
}

/// Most certificates one user may hold at once.
pub const MAX_USER_CERTS: usize = 32;

/// A certificate's fingerprint: the hex digits of SHA-256 of its DER bytes.
pub fn cert_fingerprint(der: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("access_key", &self.access_key)
            .field("secret_key", &"<hidden>")
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketInfo {
    pub name: String,
    pub owner: String,
    pub created_ms: u64,
    /// The partitions its objects are hashed over ([`shard_of`]); empty: the root's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<u32>,
}

/// A change to the object index. `user` is the authenticated user the gateway acts for; the
/// masters check it against the bucket's owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ObjectOp {
    CreateUser {
        user: User,
    },
    /// Removes a user (refused while it owns buckets); its keys stop working at once.
    DeleteUser {
        name: String,
    },
    /// Records a client certificate issued to a user (its fingerprint); at most
    /// [`MAX_USER_CERTS`] per user.
    AddUserCert {
        name: String,
        fingerprint: String,
    },
    /// Forgets every certificate issued to a user: they stop opening volumes at once (NBD
    /// servers within 5 s).
    RevokeUserCerts {
        name: String,
    },
    /// Changes a volume's mode bits (`rwx` of its owner and of everyone else, as files') or
    /// its owner.
    SetVolumeAttr {
        name: String,
        mode: Option<u16>,
        owner: Option<String>,
    },
    /// Gives a user new keys (made by the caller, so that every master applies the same);
    /// the old ones stop working at once.
    SetUserKeys {
        name: String,
        access_key: String,
        secret_key: String,
    },
    CreateBucket {
        user: String,
        bucket: String,
        now_ms: u64,
    },
    DeleteBucket {
        user: String,
        bucket: String,
    },
    /// Makes `meta` the object at `key` (last writer wins); frees the old version's data.
    /// With a condition, only if the current version meets it (S3's conditional writes,
    /// checked where the write is ordered, so two racing writers cannot both pass).
    PutObject {
        user: String,
        bucket: String,
        key: String,
        meta: ObjectMeta,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        condition: Option<PutCondition>,
    },
    /// Deleting a missing key succeeds (S3).
    DeleteObject {
        user: String,
        bucket: String,
        key: String,
    },
    CreateUpload {
        user: String,
        upload: Upload,
    },
    /// Adds or replaces a part (freeing the replaced part's data).
    PutPart {
        user: String,
        upload_id: String,
        part: Part,
        /// The upload's bucket and key, which route the change to the partition that holds
        /// the upload (log entries of older gateways lack them: empty, the root's).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        bucket: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        key: String,
    },
    /// Makes the listed parts (number, etag) the object, in order, and frees unlisted parts.
    /// `meta.extents` and `meta.part_sizes` are filled by the masters from the parts.
    CompleteUpload {
        user: String,
        upload_id: String,
        /// The upload's bucket and key (log entries of older gateways lack them: empty).
        #[serde(default)]
        bucket: String,
        #[serde(default)]
        key: String,
        parts: Vec<(u32, String)>,
        meta: ObjectMeta,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        condition: Option<PutCondition>,
    },
    AbortUpload {
        user: String,
        upload_id: String,
        /// As for [`ObjectOp::PutPart`].
        #[serde(default, skip_serializing_if = "String::is_empty")]
        bucket: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        key: String,
    },
    /// A gateway says it serves `endpoint` (at start and then every
    /// [`GATEWAY_HEARTBEAT_MS`]); gateways not heard from for [`GATEWAY_FORGET_MS`] are
    /// forgotten.
    GatewaySeen {
        gateway: Gateway,
    },
    /// Compaction moved a live pack record: the object at `key`, if it is still the version
    /// `put_id` and still names `from`, names `to` instead (`NoSuchKey` otherwise).
    MoveExtent {
        bucket: String,
        key: String,
        put_id: String,
        from: Extent,
        to: Extent,
    },
    /// Retires a pack no object names any more, if no writer holds it (refused otherwise):
    /// it goes to the trash like every freed file.
    DropPack {
        path: String,
        now_ms: u64,
    },
    /// Deletes these files if they are in the trash. A file is freed into the trash (not
    /// deleted) so that GETs already reading it finish; gateways empty what they saw there
    /// a grace period ago.
    EmptyTrash {
        paths: Vec<String>,
    },
    /// The block service (docs/block.md): a new volume; refused if the name is taken.
    CreateVolume {
        volume: Volume,
    },
    /// Grows a volume to `size` bytes (a shrink is refused: blocks past it may hold data).
    ResizeVolume {
        name: String,
        size: u64,
    },
    /// Forgets a volume (its files are deleted by the caller, after this). Refused while it
    /// has snapshots.
    DeleteVolume {
        name: String,
    },
    /// Asks for a snapshot of a volume: recorded not ready; whoever serves the volume (or
    /// opens it next) writes its index and marks it ready.
    CreateSnapshot {
        volume: String,
        snapshot: Snapshot,
    },
    /// The snapshot's index is written (`snap-ID` in the volume's directory).
    SnapshotReady {
        volume: String,
        snapshot: String,
    },
    /// Forgets a snapshot (its file is deleted by the caller, after this). Refused while a
    /// clone was made from it.
    DeleteSnapshot {
        volume: String,
        snapshot: String,
    },
}

impl ObjectOp {
    /// For audit records: the change's name, what it touches, and the user a gateway acts
    /// for (never a secret).
    pub fn audit(&self) -> (&'static str, String, Option<&str>) {
        match self {
            Self::CreateUser { user } => ("CreateUser", user.name.clone(), None),
            Self::DeleteUser { name } => ("DeleteUser", name.clone(), None),
            Self::AddUserCert { name, fingerprint } => {
                ("AddUserCert", format!("{name} {fingerprint}"), None)
            }
            Self::RevokeUserCerts { name } => ("RevokeUserCerts", name.clone(), None),
            Self::SetVolumeAttr { name, mode, owner } => (
                "SetVolumeAttr",
                format!(
                    "{name}{}{}",
                    mode.map(|m| format!(" mode {m:o}")).unwrap_or_default(),
                    owner
                        .as_ref()
                        .map(|o| format!(" owner {o}"))
                        .unwrap_or_default()
                ),
                None,
            ),
            Self::SetUserKeys { name, .. } => ("SetUserKeys", name.clone(), None),
            Self::CreateBucket { user, bucket, .. } => {
                ("CreateBucket", bucket.clone(), Some(user.as_str()))
            }
            Self::DeleteBucket { user, bucket } => {
                ("DeleteBucket", bucket.clone(), Some(user.as_str()))
            }
            Self::PutObject {
                user, bucket, key, ..
            } => ("PutObject", format!("{bucket}/{key}"), Some(user.as_str())),
            Self::DeleteObject { user, bucket, key } => (
                "DeleteObject",
                format!("{bucket}/{key}"),
                Some(user.as_str()),
            ),
            Self::CreateUpload { user, upload } => (
                "CreateUpload",
                format!("{}/{} {}", upload.bucket, upload.key, upload.id),
                Some(user.as_str()),
            ),
            Self::PutPart {
                user,
                upload_id,
                part,
                ..
            } => (
                "PutPart",
                format!("{upload_id} part {}", part.number),
                Some(user.as_str()),
            ),
            Self::CompleteUpload {
                user, upload_id, ..
            } => ("CompleteUpload", upload_id.clone(), Some(user.as_str())),
            Self::AbortUpload {
                user, upload_id, ..
            } => ("AbortUpload", upload_id.clone(), Some(user.as_str())),
            Self::GatewaySeen { gateway } => ("GatewaySeen", gateway.endpoint.clone(), None),
            Self::MoveExtent { bucket, key, .. } => ("MoveExtent", format!("{bucket}/{key}"), None),
            Self::DropPack { path, .. } => ("DropPack", path.clone(), None),
            Self::EmptyTrash { paths } => ("EmptyTrash", format!("{} files", paths.len()), None),
            Self::CreateVolume { volume } => ("CreateVolume", volume.name.clone(), None),
            Self::ResizeVolume { name, size } => ("ResizeVolume", format!("{name} {size}"), None),
            Self::DeleteVolume { name } => ("DeleteVolume", name.clone(), None),
            Self::CreateSnapshot { volume, snapshot } => (
                "CreateSnapshot",
                format!("{volume}@{}", snapshot.name),
                None,
            ),
            Self::SnapshotReady { volume, snapshot } => {
                ("SnapshotReady", format!("{volume}@{snapshot}"), None)
            }
            Self::DeleteSnapshot { volume, snapshot } => {
                ("DeleteSnapshot", format!("{volume}@{snapshot}"), None)
            }
        }
    }
}

/// How often a gateway tells the masters it is there.
pub const GATEWAY_HEARTBEAT_MS: u64 = 30_000;
/// A gateway silent this long is listed as down.
pub const GATEWAY_DOWN_MS: u64 = 3 * GATEWAY_HEARTBEAT_MS;
/// A gateway silent this long is no longer listed.
pub const GATEWAY_FORGET_MS: u64 = 24 * 3600 * 1000;

/// An S3 gateway serving the cluster (for `cairn status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gateway {
    /// `http://HOST:PORT`.
    pub endpoint: String,
    /// The machine's host name and the process id there.
    pub host: String,
    pub pid: u32,
    pub started_ms: u64,
    pub seen_ms: u64,
}

/// What a change answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpReply {
    Done,
    /// The object a PUT or a completed upload made.
    Object(ObjectMeta),
    /// A volume as a change left it.
    Volume(Volume),
}

pub type OpResult = Result<OpReply, ObjectError>;

/// A read of the object index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ObjectQuery {
    /// The user with this access key (for signature checks).
    User {
        access_key: String,
    },
    /// The user a client certificate was issued to (by [`cert_fingerprint`]), without its
    /// secret key.
    CertUser {
        fingerprint: String,
    },
    ListBuckets {
        user: String,
    },
    HeadBucket {
        user: String,
        bucket: String,
    },
    HeadObject {
        user: String,
        bucket: String,
        key: String,
    },
    ListObjects {
        user: String,
        bucket: String,
        list: ListRequest,
    },
    ListUploads {
        user: String,
        bucket: String,
        list: ListRequest,
    },
    ListParts {
        user: String,
        upload_id: String,
        after: u32,
        max: u32,
        /// As for [`ObjectOp::PutPart`].
        #[serde(default, skip_serializing_if = "String::is_empty")]
        bucket: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        key: String,
    },
    /// Uploads started before `before_ms` (any bucket): the gateway's cleaner aborts them.
    StaleUploads {
        before_ms: u64,
        max: u32,
    },
    /// The gateways that said they serve the cluster, and the object index's totals.
    Gateways,
    /// Every user, without secret keys.
    Users,
    /// Which of `paths` (files of the gateway's blob directory) no object and no upload's
    /// part names: the sweeper deletes those that are also idle.
    Unnamed {
        paths: Vec<String>,
    },
    /// Files freed into the trash (up to `max`).
    Trash {
        max: u32,
    },
    /// For compaction: the object at `key`, whoever owns it.
    Locate {
        bucket: String,
        key: String,
    },
    /// Packs in `dir` that no writer holds (at `now_ms`) whose live bytes are under
    /// `live_pct` percent of their length, most dead bytes first.
    CompactionCandidates {
        dir: String,
        now_ms: u64,
        live_pct: u8,
        max: u32,
    },
    /// A volume by name.
    Volume {
        name: String,
    },
    /// Every volume, by name.
    Volumes,
    /// The partitions a bucket's objects are hashed over (empty: the root's), for the
    /// gateway to put their data files where the index entries go.
    Layout {
        bucket: String,
    },
    /// A volume by name, asked on `user`'s behalf (the NBD server, for a client that proved
    /// the user): answered only if the user may open it (an unknown user or one without
    /// rights: [`ObjectError::AccessDenied`]).
    VolumeFor {
        name: String,
        user: String,
    },
    /// The volumes `user` may open, by name.
    VolumesFor {
        user: String,
    },
}

/// A pack worth compacting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackCandidate {
    pub path: String,
    pub length: u64,
    pub live_bytes: u64,
    pub live_objects: u64,
}

/// A listing in key order: keys after `after` with `prefix`; with a `delimiter`, keys that
/// hold it past the prefix are rolled up into one common prefix each.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListRequest {
    pub prefix: String,
    pub delimiter: Option<String>,
    /// Start after this key (or common prefix); empty = from the start.
    pub after: String,
    /// Keys plus common prefixes to return (1..=MAX_LIST_KEYS).
    pub max: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListEntry {
    pub key: String,
    pub size: u64,
    pub etag: String,
    pub mtime_ms: u64,
    /// For uploads: the upload id (`etag` and `size` are then empty).
    #[serde(default)]
    pub upload_id: String,
    #[serde(default)]
    pub owner: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListPage {
    pub entries: Vec<ListEntry>,
    pub prefixes: Vec<String>,
    /// More keys follow; the next page starts after `last`.
    pub truncated: bool,
    /// The last key or common prefix this page covered.
    pub last: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum QueryReply {
    User(Option<User>),
    /// [`ObjectQuery::Users`]: their `secret_key`s are empty.
    Users(Vec<User>),
    /// [`ObjectQuery::Unnamed`]: the paths nothing names.
    Unnamed(Vec<String>),
    Buckets(Vec<BucketInfo>),
    Bucket(BucketInfo),
    Object(ObjectMeta),
    List(ListPage),
    Parts {
        upload: Upload,
        parts: Vec<Part>,
        truncated: bool,
    },
    Uploads(Vec<Upload>),
    Packs(Vec<PackCandidate>),
    Trash(Vec<String>),
    Volume(Volume),
    Volumes(Vec<Volume>),
    /// [`ObjectQuery::Layout`].
    Layout(Vec<u32>),
    Gateways {
        gateways: Vec<Gateway>,
        buckets: u64,
        objects: u64,
        uploads: u64,
        /// Files freed into the trash, deleted once their grace has passed.
        #[serde(default)]
        trash: u64,
    },
}

pub type QueryResult = Result<QueryReply, ObjectError>;

/// What a conditional PUT asks of the object it replaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PutCondition {
    /// `If-Match`: the current version has this ETag (`*`: any version exists). A missing
    /// object is NoSuchKey, as S3 answers.
    IfMatch(String),
    /// `If-None-Match`: no version exists with this ETag (`*`: no version exists at all).
    IfNoneMatch(String),
}

/// Why the object index refused a request. Each maps to the S3 error of the same name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ObjectError {
    #[error("no such bucket")]
    NoSuchBucket,
    #[error("the bucket exists and is yours")]
    BucketAlreadyOwnedByYou,
    #[error("the bucket name is taken")]
    BucketAlreadyExists,
    #[error("the bucket is not empty")]
    BucketNotEmpty,
    #[error("no such key")]
    NoSuchKey,
    #[error("no such upload")]
    NoSuchUpload,
    #[error("part {0}: missing, or its ETag differs")]
    InvalidPart(u32),
    #[error("parts must be listed in ascending order")]
    InvalidPartOrder,
    #[error("part {0} is smaller than 5 MiB and not the last")]
    EntityTooSmall(u32),
    #[error("access denied")]
    AccessDenied,
    #[error("a user or access key by that name exists")]
    UserExists,
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("no such volume")]
    NoSuchVolume,
    #[error("a volume by that name exists")]
    VolumeExists,
    #[error("no such snapshot")]
    NoSuchSnapshot,
    #[error("a snapshot by that name exists")]
    SnapshotExists,
    /// Something depends on what was to be deleted (snapshots of a volume, clones of a
    /// snapshot).
    #[error("in use: {0}")]
    InUse(String),
    /// A conditional PUT's condition does not hold.
    #[error("at least one of the preconditions you specified did not hold")]
    PreconditionFailed,
    /// The bucket's objects are kept in other partitions than the data named was written
    /// for (its layout changed since the gateway asked): the gateway asks again and retries.
    #[error("the bucket's layout changed: {0}")]
    Moved(String),
    /// The pack named by a shared extent was retired by compaction (its lease had lapsed and
    /// no object named it) before this object named it: the gateway drops the pack and the
    /// client's retry writes the data to a new one.
    #[error("pack {0} was retired before this write was committed")]
    PackRetired(String),
}

/// Encodes for a `bytes` field.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("object index types serialize")
}

/// Decodes from a `bytes` field.
///
/// # Errors
/// The bytes are not JSON of `T`.
pub fn decode<T: for<'a> Deserialize<'a>>(bytes: &[u8]) -> Result<T, crate::MetaError> {
    serde_json::from_slice(bytes)
        .map_err(|e| crate::MetaError::invalid(format!("object index message: {e}")))
}

/// S3's bucket naming rules (the general-purpose bucket rules): 3–63 characters of lowercase
/// letters, digits, `.` and `-`, starting and ending with a letter or digit, no `..`, not an
/// IP address, none of the reserved prefixes and suffixes.
pub fn valid_bucket_name(name: &str) -> bool {
    let b = name.as_bytes();
    if !(3..=63).contains(&b.len()) {
        return false;
    }
    let ok_char = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-';
    let edge = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !b.iter().all(|&c| ok_char(c)) || !edge(b[0]) || !edge(b[b.len() - 1]) {
        return false;
    }
    if name.contains("..") || name.contains(".-") || name.contains("-.") {
        return false;
    }
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        return false;
    }
    const PREFIXES: [&str; 3] = ["xn--", "sthree-", "amzn-s3-demo-"];
    const SUFFIXES: [&str; 3] = ["-s3alias", "--ol-s3", "--x-s3"];
    !PREFIXES.iter().any(|p| name.starts_with(p)) && !SUFFIXES.iter().any(|s| name.ends_with(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names() {
        for ok in ["abc", "my-bucket", "a.b.c", "0bucket9", &"a".repeat(63)] {
            assert!(valid_bucket_name(ok), "{ok}");
        }
        for bad in [
            "ab",
            &"a".repeat(64),
            "Abc",
            "a_b",
            "-ab",
            "ab-",
            "a..b",
            "a.-b",
            "192.168.1.1",
            "xn--abc",
            "abc-s3alias",
            "bücket",
        ] {
            assert!(!valid_bucket_name(bad), "{bad}");
        }
    }

    #[test]
    fn user_debug_hides_the_secret() {
        let u = User {
            name: "n".into(),
            access_key: "AK".into(),
            secret_key: "very-secret".into(),
            created_ms: 0,
            admin: false,
            certs: vec![],
        };
        assert!(!format!("{u:?}").contains("very-secret"));
    }

    #[test]
    fn ops_round_trip() {
        let op = ObjectOp::DeleteObject {
            user: "u".into(),
            bucket: "b".into(),
            key: "k/é".into(),
        };
        assert_eq!(decode::<ObjectOp>(&encode(&op)).unwrap(), op);
        assert!(decode::<ObjectOp>(b"{").is_err());
    }
}
