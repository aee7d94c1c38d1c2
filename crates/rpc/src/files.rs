//! The file service's API: what a mount (`cairn mount`) asks of the masters (docs/files.md).
//!
//! A mount's files and directories are the namespace's inodes (one namespace for `cairn fs`,
//! S3's internal files and every mount), with POSIX attributes ([`Attr`]) beside the
//! namespace's owner and permission bits. A regular file's bytes are [`Extent`]s: byte ranges
//! of *segments*, FlatLogFiles below [`SEGMENTS_DIR`] that mounts append records to
//! (docs/formats/fs-segment.md). A mount writes the data first, durably, then commits the
//! extents ([`FileOp::Write`]), so a file never names bytes that are not there.
//!
//! Calls name an inode by its path, as the mount last saw it, and most by its inode number too
//! (0: any): a call whose path now names another inode is refused (`not-found`), so a mount
//! never changes a file another mount put at the same path.
//!
//! Changes ([`FileOp`]) travel in `Batch` calls (concurrent calls share one Raft entry);
//! reads ([`FileQuery`]) in `FileRead`. Both are JSON in protobuf `bytes`.

use serde::{Deserialize, Serialize};

/// Where segments live.
pub const SEGMENTS_DIR: &str = "/.fs/seg";
/// Longest name of a directory entry, in bytes (POSIX's `NAME_MAX` on Linux).
pub const NAME_MAX: usize = 255;
/// Most extents one [`FileOp::Write`] may commit.
pub const MAX_WRITE_EXTENTS: usize = 4096;
/// Most entries one [`FileQuery::Readdir`] answers.
pub const READDIR_MAX: u32 = 1000;
/// Longest symbolic link target, in bytes (Linux's `PATH_MAX`).
pub const SYMLINK_MAX: usize = 4095;
/// Most names (hard links) one node may have: `link(2)` past it is `EMLINK` (ext4 allows
/// 65 000; the names are listed in the node's record, so fewer here).
pub const LINK_MAX: u32 = 4096;

/// The most a file may hold, in bytes (2^63 - 1, as `off_t` allows).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// Longest extended attribute name, in bytes, namespace prefix included (Linux's
/// `XATTR_NAME_MAX`).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest extended attribute value, in bytes (Linux's `XATTR_SIZE_MAX`).
pub const XATTR_SIZE_MAX: usize = 65536;
/// Most bytes one node's extended attributes hold, names and values together (they live in
/// the inode's record, read with every lookup); past it a set answers `ENOSPC`, as ext4
/// does when its attribute block is full.
pub const XATTRS_MAX: usize = 128 << 10;
/// The extended attribute namespaces a node may hold (`system.` is POSIX ACLs: not kept).
pub const XATTR_NAMESPACES: [&str; 3] = ["user.", "trusted.", "security."];

/// How long a new file stays held for its creating mount (`FileOp::Make::hold`) when no
/// write commits: the bound on another mount's wait for a close that answered before its
/// commit (the mount that made it died, or its flush failed).
pub const HOLD_MS: u64 = 5_000;
/// How long a directory a mount made is held for it (`FileOp::Make::hold` of a directory):
/// other mounts' lookups of names not in it, listings of it and new names in it wait until
/// then, while the mount's creates in it answer before they reach the masters
/// (docs/files.md "A create that does not wait"). Renewed only while such a create is
/// slow to commit.
pub const DIR_HOLD_MS: u64 = 3_000;
/// Most inode numbers one `FileOp::Make::reserve` hands out.
pub const RESERVE_MAX: u32 = 1_024;

/// The directory a normalized path is in (`/` for `/a`, and for `/` itself).
pub fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// The path of segment `seg`.
pub fn segment_path(seg: u64) -> String {
    format!("{SEGMENTS_DIR}/{seg:016x}")
}

/// A file type, as `stat`'s `st_mode` high bits say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeType {
    Regular,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// A time: seconds and nanoseconds since the Unix epoch (before it: negative seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Time {
    pub secs: i64,
    pub nanos: u32,
}

impl Time {
    /// A time `ms` milliseconds after the epoch.
    pub fn from_ms(ms: u64) -> Self {
        Self {
            secs: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
            nanos: u32::try_from(ms % 1000).unwrap_or(0) * 1_000_000,
        }
    }

    /// Milliseconds after the epoch (0 before it).
    pub fn as_ms(&self) -> u64 {
        u64::try_from(self.secs)
            .unwrap_or(0)
            .saturating_mul(1000)
            .saturating_add(u64::from(self.nanos / 1_000_000))
    }
}

/// What `stat` shows of a file, directory or other node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub ino: u64,
    pub kind: NodeType,
    /// Permission bits (and setuid, setgid, sticky): `st_mode & 07777`.
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    /// Bytes: a regular file's length, a symlink's target's length; 0 for the rest.
    pub size: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    /// A device node's number.
    pub rdev: u32,
    /// The Cairn user who owns it (the namespace's owner; empty: the cluster).
    pub owner: String,
    /// A regular file's redundancy policy in its text form (`replicas:3,then:ec:4+2,lz4`:
    /// the directory's when the file was made), which the segments a mount writes its bytes
    /// to have; empty: the default, `/.fs/seg`'s (docs/files.md "Policies").
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub policy: String,
}

/// A byte range of a file held in a segment: file bytes `[offset, offset + len)` are segment
/// `seg`'s bytes `[seg_offset, seg_offset + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub seg: u64,
    pub seg_offset: u64,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// Where a file's bytes are: its extents in order (no two overlap; gaps read as zeros), or
/// the file's own FlatLogFile (a file `cairn fs` wrote: its bytes are the log's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Data {
    Extents(Vec<Extent>),
    /// Read the file itself, `[0, size)`.
    Own,
}

/// A new node's type and what it needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NewNode {
    Regular,
    Directory,
    Symlink { target: String },
    Fifo,
    Socket,
    CharDevice { rdev: u32 },
    BlockDevice { rdev: u32 },
}

/// `rename(2)`'s flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameFlags {
    /// `RENAME_NOREPLACE`: refuse when the destination exists.
    pub noreplace: bool,
    /// `RENAME_EXCHANGE`: swap the two, which both exist.
    pub exchange: bool,
}

/// Attributes a `setattr` changes (`None`: unchanged).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    pub mode: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Truncate or extend (with zeros) to this many bytes.
    pub size: Option<u64>,
    pub atime: Option<Time>,
    pub mtime: Option<Time>,
}

/// `setxattr(2)`'s flags: whether the attribute may, must or must not exist already.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum XattrSet {
    /// Create it or replace it.
    #[default]
    Any,
    /// `XATTR_CREATE`: it must not exist (`already-exists`).
    Create,
    /// `XATTR_REPLACE`: it must exist (answered [`FileReply::NoXattr`] when it does not).
    Replace,
}

/// A change, applied by the partition that holds its path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileOp {
    /// `mkdir`, `mknod`, `create`, `symlink`: a new node at `path` (its parent exists; the
    /// path does not).
    Make {
        path: String,
        node: NewNode,
        mode: u16,
        uid: u32,
        gid: u32,
        now: Time,
        /// A regular file's creating mount (its id, `Client::client_id`), whose close
        /// answers before its bytes commit: other mounts' lookups and maps of the file wait
        /// until its first [`FileOp::Write`] commits, or [`HOLD_MS`] pass (docs/files.md "A
        /// close that does not wait"). Empty: no hold.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        hold: String,
        /// The asking mount (empty: not a mount). A directory it makes with a `reserve` is
        /// held for it for [`DIR_HOLD_MS`]: its creates there may answer before they reach
        /// the masters (docs/files.md "A create that does not wait"); a name in a directory
        /// another mount holds is not made until the hold ends.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        mount: String,
        /// The new node's inode number, from a reservation of this partition's ([`reserve`]
        /// of an earlier make): a mount's create answered before it reached the masters.
        /// 0: the masters number it.
        ///
        /// [`reserve`]: FileOp::Make::reserve
        #[serde(default, skip_serializing_if = "is_zero")]
        ino: u64,
        /// Inode numbers to reserve for the mount's later makes in this directory's
        /// partition (at most [`RESERVE_MAX`]); the answer is then [`FileReply::Made`].
        #[serde(default, skip_serializing_if = "is_zero_u32")]
        reserve: u32,
    },
    /// `unlink` (`dir` false) or `rmdir` (`dir` true) of `path`, inode `ino`.
    Remove {
        path: String,
        ino: u64,
        dir: bool,
        now: Time,
        /// The asking mount (empty: not a mount): a directory another mount holds is not
        /// removed until the hold ends ([`DIR_HOLD_MS`]).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        mount: String,
    },
    /// `rename(2)` of `from` (inode `ino`) to `to`, replacing what is there (a file by a
    /// file, an empty directory by a directory) unless `flags` say otherwise.
    Rename {
        from: String,
        ino: u64,
        to: String,
        flags: RenameFlags,
        now: Time,
        /// The asking mount, as for [`FileOp::Remove`]: nothing is renamed into, or out of
        /// the place of, a directory another mount holds until the hold ends.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        mount: String,
    },
    /// `link(2)`: `to` (absent; its directory exists) becomes another name of the node at
    /// `from` (inode `ino`), which is not a directory; both in one partition (else
    /// `cross-device`). Answers the node's attributes (its link count one more).
    Link {
        from: String,
        ino: u64,
        to: String,
        now: Time,
        /// The asking mount, as for [`FileOp::Remove`].
        #[serde(default, skip_serializing_if = "String::is_empty")]
        mount: String,
    },
    /// `chmod`, `chown`, `truncate`, `utimens`.
    SetAttr {
        path: String,
        ino: u64,
        attr: SetAttr,
        now: Time,
    },
    /// Makes written bytes the file's: each extent replaces the file's bytes it covers, and
    /// the file's size becomes at least `size` (writes past the end). Then `then`, when
    /// some, applies as a [`FileOp::SetAttr`] would (no size): the `chmod`, `chown` and
    /// `utimens` a mount took while the new file's bytes were not yet committed, in the
    /// same change (docs/files.md "Attributes of a new file"). Ends the file's hold
    /// ([`FileOp::Make`]): with no extents and `size` not past the file's, it changes no
    /// bytes and no times and only ends the hold (and applies `then`). Answers the node's
    /// attributes.
    Write {
        path: String,
        ino: u64,
        extents: Vec<Extent>,
        size: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        then: Option<SetAttr>,
        now: Time,
    },
    /// Mount `holder` still commits the new file it holds ([`FileOp::Make::hold`]): the
    /// hold lasts [`HOLD_MS`] from `now` (a flush slower than the hold renews it). Nothing
    /// when the file is not held by `holder` any more. Answers [`FileReply::Done`].
    Hold {
        path: String,
        ino: u64,
        holder: String,
        now: Time,
    },
    /// `fallocate(FALLOC_FL_PUNCH_HOLE)`: the file's bytes `[offset, offset + len)` read as
    /// zeros from now on (their extents are cut out); the size is unchanged.
    Punch {
        path: String,
        ino: u64,
        offset: u64,
        len: u64,
        now: Time,
    },
    /// `setxattr(2)` (`value` some) or `removexattr(2)` (none) of extended attribute `name`;
    /// the node's ctime becomes `now`. Answers the node's attributes, or
    /// [`FileReply::NoXattr`] when a removal or an [`XattrSet::Replace`] finds no such
    /// attribute.
    SetXattr {
        path: String,
        ino: u64,
        name: String,
        value: Option<Vec<u8>>,
        flags: XattrSet,
        now: Time,
    },
}

impl FileOp {
    /// The change's name, for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            FileOp::Make { .. } => "make",
            FileOp::Remove { .. } => "remove",
            FileOp::Rename { .. } => "rename",
            FileOp::Link { .. } => "link",
            FileOp::SetAttr { .. } => "setattr",
            FileOp::Write { .. } => "write",
            FileOp::Punch { .. } => "punch",
            FileOp::Hold { .. } => "hold",
            FileOp::SetXattr { .. } => "setxattr",
        }
    }

    /// The mount that asks for the change (empty: not a mount, or a change a directory's
    /// hold does not stop).
    pub fn mount(&self) -> &str {
        match self {
            FileOp::Make { mount, .. }
            | FileOp::Remove { mount, .. }
            | FileOp::Rename { mount, .. }
            | FileOp::Link { mount, .. } => mount,
            _ => "",
        }
    }

    /// The path whose partition applies the change.
    pub fn path(&self) -> &str {
        match self {
            FileOp::Make { path, .. }
            | FileOp::Remove { path, .. }
            | FileOp::SetAttr { path, .. }
            | FileOp::Write { path, .. }
            | FileOp::Punch { path, .. }
            | FileOp::Hold { path, .. }
            | FileOp::SetXattr { path, .. } => path,
            FileOp::Rename { from, .. } | FileOp::Link { from, .. } => from,
        }
    }
}

/// A read, answered by the partition that holds its path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileQuery {
    /// The node at `path`. `mount` is the asker (`Client::client_id`): a file another mount
    /// holds (`FileOp::Make::hold`) answers `LeaseHeld` until its bytes commit.
    Lookup {
        path: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        mount: String,
    },
    /// Up to `limit` entries of directory `path` (inode `ino`) after the name `after`.
    Readdir {
        path: String,
        ino: u64,
        after: String,
        limit: u32,
        /// The asker, as for `Lookup`: a directory another mount holds answers
        /// `LeaseHeld` until the hold ends.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        mount: String,
    },
    /// A file's attributes and where its bytes are (`mount` as for `Lookup`).
    Map {
        path: String,
        ino: u64,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        mount: String,
    },
    /// The file system's size and free space.
    Statfs,
    /// Every extended attribute of `path` (inode `ino`).
    Xattrs { path: String, ino: u64 },
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    pub attr: Attr,
}

/// What a [`FileQuery`] or [`FileOp`] answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileReply {
    /// Make, SetAttr, Write, Lookup.
    Attr(Attr),
    /// A make that reserved inode numbers ([`FileOp::Make::reserve`]): the node's
    /// attributes, `count` numbers from `first` on for the mount's later makes, and the
    /// policy a regular file made in the new node (a directory) has, as [`Attr::policy`].
    Made {
        attr: Attr,
        first: u64,
        count: u32,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        policy: String,
    },
    /// Remove, Rename.
    Done,
    Readdir {
        entries: Vec<Entry>,
        more: bool,
    },
    Map {
        attr: Attr,
        data: Data,
        /// A symlink's target.
        target: Option<String>,
    },
    Statfs {
        /// Bytes the chunkservers hold and have free, divided by the default copies.
        total: u64,
        free: u64,
        files: u64,
    },
    /// A node's extended attributes, by name.
    Xattrs(std::collections::BTreeMap<String, Vec<u8>>),
    /// SetXattr: no attribute of that name to remove or replace (`ENODATA`).
    NoXattr,
}

mod extents;
pub use extents::{cut, overlay};

/// Encodes for a `bytes` field.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("file service types serialize")
}

/// Decodes from a `bytes` field.
///
/// # Errors
/// The bytes are not JSON of `T`.
pub fn decode<T: for<'a> Deserialize<'a>>(bytes: &[u8]) -> Result<T, crate::MetaError> {
    serde_json::from_slice(bytes)
        .map_err(|e| crate::MetaError::invalid(format!("file service message: {e}")))
}

/// The first of the 256 code points, U+10FF00 to U+10FFFF (the end of plane 16's private
/// use area), that stand for one raw byte each in a name or a symbolic link's target that is
/// not UTF-8 (docs/files.md "Names").
const RAW_BYTE: u32 = 0x10_FF00;

fn raw_byte(b: u8) -> char {
    char::from_u32(RAW_BYTE + u32::from(b)).expect("in plane 16")
}

/// The namespace's string for a name (or a symbolic link's target) of any bytes: UTF-8 as it
/// is; each byte of a sequence that is not UTF-8 — and of a character in U+10FF00..U+10FFFF,
/// so that the mapping is one to one — as the code point U+10FF00 + the byte.
pub fn name_from_bytes(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            if u32::from(c) >= RAW_BYTE {
                let mut buf = [0u8; 4];
                out.extend(c.encode_utf8(&mut buf).bytes().map(raw_byte));
            } else {
                out.push(c);
            }
        }
        out.extend(chunk.invalid().iter().copied().map(raw_byte));
    }
    out
}

/// The bytes a namespace string names: [`name_from_bytes`] undone.
pub fn name_bytes(s: &str) -> std::borrow::Cow<'_, [u8]> {
    if !s.chars().any(|c| u32::from(c) >= RAW_BYTE) {
        return std::borrow::Cow::Borrowed(s.as_bytes());
    }
    let mut out = Vec::with_capacity(s.len());
    for c in s.chars() {
        match u32::from(c).checked_sub(RAW_BYTE) {
            Some(b) => out.push(b as u8),
            None => out.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes()),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Checks a new entry's name (a [`name_from_bytes`] string).
///
/// # Errors
/// `invalid-argument` naming what is wrong: empty, `.` or `..`, a `/` or NUL, longer than
/// [`NAME_MAX`] bytes, or not the string [`name_from_bytes`] makes of its bytes (two strings
/// for one name).
pub fn check_name(name: &str) -> Result<(), crate::MetaError> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(crate::MetaError::invalid(format!("{name:?}: not a name")));
    }
    let bytes = name_bytes(name);
    if bytes.len() > NAME_MAX {
        return Err(crate::MetaError::invalid(format!(
            "a name of {} bytes: at most {NAME_MAX}",
            bytes.len()
        )));
    }
    if bytes.contains(&b'/') || bytes.contains(&0) {
        return Err(crate::MetaError::invalid(format!(
            "{name:?}: a name holds no / or NUL"
        )));
    }
    if matches!(bytes, std::borrow::Cow::Owned(_)) && name_from_bytes(&bytes) != name {
        return Err(crate::MetaError::invalid(format!(
            "{name:?}: raw bytes (U+10FF00 and above) stand only for bytes that are not UTF-8"
        )));
    }
    Ok(())
}

/// Checks an extended attribute's name and value (`None`: a removal).
///
/// # Errors
/// `invalid-argument` naming what is wrong: no known namespace prefix or nothing after it, a
/// NUL, a name longer than [`XATTR_NAME_MAX`] bytes, a value longer than [`XATTR_SIZE_MAX`].
pub fn check_xattr(name: &str, value: Option<&[u8]>) -> Result<(), crate::MetaError> {
    let known = XATTR_NAMESPACES
        .iter()
        .any(|ns| name.len() > ns.len() && name.starts_with(ns));
    if !known {
        return Err(crate::MetaError::invalid(format!(
            "extended attribute {name:?}: the name starts with one of {} and goes on",
            XATTR_NAMESPACES.join(", ")
        )));
    }
    if name.len() > XATTR_NAME_MAX || name.contains('\0') {
        return Err(crate::MetaError::invalid(format!(
            "extended attribute name of {} bytes: at most {XATTR_NAME_MAX}, no NUL",
            name.len()
        )));
    }
    if let Some(v) = value
        && v.len() > XATTR_SIZE_MAX
    {
        return Err(crate::MetaError::invalid(format!(
            "extended attribute value of {} bytes: at most {XATTR_SIZE_MAX}",
            v.len()
        )));
    }
    Ok(())
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any bytes but `/` and NUL make a name, one string each, and back; the lengths
    /// checked are the bytes'.
    #[test]
    fn names_of_any_bytes_map_one_to_one() {
        let cases: [&[u8]; 7] = [
            b"plain",
            "caf\u{e9}".as_bytes(),
            b"\xff\xfe latin-1 \xe9",
            b"half \xe2\x82",
            "\u{10ff41}literal".as_bytes(),
            b"\xf4\x8f\xbc\x80",
            &[0x80; 255],
        ];
        for b in cases {
            let s = name_from_bytes(b);
            assert_eq!(&*name_bytes(&s), b, "{s:?}");
            check_name(&s).unwrap();
        }
        assert_eq!(name_from_bytes(b"plain"), "plain");
        assert!(
            check_name(&name_from_bytes(&[0x80; 256])).is_err(),
            "256 bytes"
        );
        // An escape for a byte that is UTF-8 on its own, or for / or NUL: refused.
        assert!(check_name(&format!("a{}", raw_byte(b'b'))).is_err());
        assert!(check_name(&format!("a{}", raw_byte(b'/'))).is_err());
        assert!(check_name(&format!("a{}", raw_byte(0))).is_err());
    }

    #[test]
    fn times_convert_to_and_from_milliseconds() {
        let t = Time::from_ms(1_234_567);
        assert_eq!(
            t,
            Time {
                secs: 1234,
                nanos: 567_000_000
            }
        );
        assert_eq!(t.as_ms(), 1_234_567);
        assert_eq!(Time { secs: -5, nanos: 0 }.as_ms(), 0);
    }

    fn ext(offset: u64, len: u64, seg: u64, seg_offset: u64) -> Extent {
        Extent {
            offset,
            len,
            seg,
            seg_offset,
        }
    }

    #[test]
    fn overlay_replaces_the_bytes_it_covers_and_joins_neighbours() {
        let mut x = vec![ext(0, 100, 1, 0)];
        overlay(&mut x, ext(10, 10, 2, 0));
        assert_eq!(
            x,
            vec![ext(0, 10, 1, 0), ext(10, 10, 2, 0), ext(20, 80, 1, 20)]
        );
        // Continuing segment 2 where it left off joins the extent before.
        overlay(&mut x, ext(20, 5, 2, 10));
        assert_eq!(
            x,
            vec![ext(0, 10, 1, 0), ext(10, 15, 2, 0), ext(25, 75, 1, 25)]
        );
        // Covering everything leaves one.
        overlay(&mut x, ext(0, 200, 3, 7));
        assert_eq!(x, vec![ext(0, 200, 3, 7)]);
        // Past the end: a hole between.
        overlay(&mut x, ext(300, 1, 3, 500));
        assert_eq!(x, vec![ext(0, 200, 3, 7), ext(300, 1, 3, 500)]);
        cut(&mut x, 100, u64::MAX);
        assert_eq!(x, vec![ext(0, 100, 3, 7)]);
    }

    #[test]
    fn xattr_names_and_values_are_checked() {
        assert!(check_xattr("user.a", Some(b"v")).is_ok());
        assert!(check_xattr("trusted.x", None).is_ok());
        assert!(check_xattr("security.selinux", Some(&[0; XATTR_SIZE_MAX])).is_ok());
        for bad in [
            "user.",
            "user",
            "system.posix_acl_access",
            "other.a",
            "",
            "user.a\0",
        ] {
            assert!(check_xattr(bad, Some(b"v")).is_err(), "{bad:?}");
        }
        let long = format!("user.{}", "x".repeat(XATTR_NAME_MAX - 4));
        assert!(check_xattr(&long, None).is_err());
        assert!(check_xattr(&long[..XATTR_NAME_MAX], None).is_ok());
        assert!(check_xattr("user.a", Some(&[0; XATTR_SIZE_MAX + 1])).is_err());
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("a").is_ok());
        assert!(check_name(&"x".repeat(NAME_MAX)).is_ok());
        assert!(check_name(&"x".repeat(NAME_MAX + 1)).is_err());
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ops_round_trip_as_json() {
        let op = FileOp::Write {
            path: "/a".into(),
            ino: 7,
            extents: vec![Extent {
                offset: 0,
                len: 4096,
                seg: 1,
                seg_offset: 32,
            }],
            size: 4096,
            then: Some(SetAttr {
                mode: Some(0o644),
                ..SetAttr::default()
            }),
            now: Time::from_ms(5),
        };
        let back: FileOp = decode(&encode(&op)).unwrap();
        assert_eq!(back, op);
        assert!(decode::<FileOp>(b"{").is_err());
        // A write without attributes is the bytes older masters logged.
        let older =
            br#"{"Write":{"path":"/a","ino":7,"extents":[],"size":1,"now":{"secs":0,"nanos":0}}}"#;
        let FileOp::Write { then, .. } = decode::<FileOp>(older).unwrap() else {
            panic!("a write");
        };
        assert_eq!(then, None);
        let plain = FileOp::Write {
            path: "/a".into(),
            ino: 7,
            extents: Vec::new(),
            size: 1,
            then: None,
            now: Time { secs: 0, nanos: 0 },
        };
        assert_eq!(encode(&plain), older.to_vec());
    }
}
