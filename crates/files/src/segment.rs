//! Segments: the FlatLogFiles a mount appends file data to (docs/formats/fs-segment.md).
//!
//! A mount writes the dirty ranges of its files as *records* — a 32-byte header naming the
//! inode and file offset, then the bytes — into its open segment, one append for every range
//! a flush carries, and then commits the ranges as extents of their files
//! ([`cairn_rpc::files::FileOp::Write`]). Many small files share a segment, as S3's small
//! objects share packs, so a 4 KiB file costs 4 KiB and a header, not a chunk of its own.
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `CFSG` |
//! | 4 | version (1) |
//! | 5..8 | reserved (0) |
//! | 8..16 | inode (u64 LE) |
//! | 16..24 | file offset of the data (u64 LE) |
//! | 24..28 | data length (u32 LE) |
//! | 28..32 | CRC32C of bytes 0..28 |
//!
//! The data's integrity is the chunk store's (a CRC32C per 4 KiB unit) and the data plane's
//! (a CRC32C per frame); the header's CRC lets a reader walking a segment (garbage collection,
//! a person with no index) tell a record from anything else.

use bytes::{BufMut, BytesMut};
use cairn_client::{Client, CreateOptions, FlatLogFile};
use cairn_rpc::files::{Extent, segment_path};

pub const MAGIC: [u8; 4] = *b"CFSG";
pub const VERSION: u8 = 1;
pub const HEADER_BYTES: usize = 32;
/// Most data bytes one record holds (a longer range is several records).
pub const MAX_RECORD: usize = 4 << 20;
/// A segment takes no more appends past this many bytes: the next goes to a new one.
pub const SEGMENT_BYTES: u64 = 256 << 20;
/// How long sealing a segment the mount leaves (full, or its writer failed) may hold up the
/// flush that leaves it; one not sealed by then stays open, as a killed mount's does.
const SEAL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A record's header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub ino: u64,
    pub offset: u64,
    pub len: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("record truncated: {0} bytes")]
    Truncated(usize),
    #[error("bad magic")]
    Magic,
    #[error("unknown record version {0}")]
    Version(u8),
    #[error("header checksum mismatch")]
    HeaderCrc,
    #[error("reserved header bytes are not zero")]
    Reserved,
}

/// Appends a record of `data` (at most [`MAX_RECORD`] bytes) for inode `ino`'s bytes at
/// `offset` to `out`; returns where the data starts inside `out`.
pub fn encode(out: &mut BytesMut, ino: u64, offset: u64, data: &[u8]) -> usize {
    assert!(
        data.len() <= MAX_RECORD,
        "a record holds at most {MAX_RECORD} bytes"
    );
    let mut h = [0u8; HEADER_BYTES];
    h[0..4].copy_from_slice(&MAGIC);
    h[4] = VERSION;
    h[8..16].copy_from_slice(&ino.to_le_bytes());
    h[16..24].copy_from_slice(&offset.to_le_bytes());
    h[24..28].copy_from_slice(&(data.len() as u32).to_le_bytes());
    let crc = crc32c::crc32c(&h[..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    out.put_slice(&h);
    let at = out.len();
    out.put_slice(data);
    at
}

/// Decodes the header at the start of `buf`.
///
/// # Errors
/// Too short, wrong magic or version, a checksum mismatch, or reserved bytes set.
pub fn decode(buf: &[u8]) -> Result<Header, RecordError> {
    let h: &[u8; HEADER_BYTES] = buf
        .get(..HEADER_BYTES)
        .and_then(|b| b.try_into().ok())
        .ok_or(RecordError::Truncated(buf.len()))?;
    if h[0..4] != MAGIC {
        return Err(RecordError::Magic);
    }
    if h[4] != VERSION {
        return Err(RecordError::Version(h[4]));
    }
    let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[i..i + 8]);
        u64::from_le_bytes(b)
    };
    if crc32c::crc32c(&h[..28]) != u32_at(28) {
        return Err(RecordError::HeaderCrc);
    }
    // Version 1 has no use for them: a later version that does is a new version.
    if h[5..8] != [0, 0, 0] {
        return Err(RecordError::Reserved);
    }
    Ok(Header {
        ino: u64_at(8),
        offset: u64_at(16),
        len: u32_at(24),
    })
}

/// One range to write: inode `ino`'s bytes at `offset`.
pub struct Piece<'a> {
    pub ino: u64,
    pub offset: u64,
    pub data: &'a [u8],
}

/// The mount's open segment of one policy.
pub struct Segments {
    client: Client,
    /// The segments' redundancy policy; `None`: `/.fs/seg`'s (the default).
    policy: Option<cairn_ec::Policy>,
    open: Option<(u64, FlatLogFile)>,
}

impl Segments {
    pub fn new(client: Client, policy: Option<cairn_ec::Policy>) -> Self {
        Self {
            client,
            policy,
            open: None,
        }
    }

    /// A new segment with a number no other has (a random one, made exclusively).
    async fn start(&mut self) -> Result<(), cairn_client::Error> {
        loop {
            let seg = rand::random::<u64>() | 1;
            let opts = CreateOptions {
                parents: true,
                policy: self.policy,
                ..CreateOptions::default()
            };
            match self.client.create(&segment_path(seg), opts).await {
                Ok(f) => {
                    self.open = Some((seg, f));
                    return Ok(());
                }
                Err(cairn_client::Error::Meta(e))
                    if e.kind == cairn_rpc::ErrorKind::AlreadyExists =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Appends `pieces` as records, durably, in one append; the extents that name their
    /// bytes, in the pieces' order (a piece longer than [`MAX_RECORD`] is several).
    ///
    /// # Errors
    /// The append failed on the open segment and on a new one.
    pub async fn write(
        &mut self,
        pieces: &[Piece<'_>],
    ) -> Result<Vec<Extent>, cairn_client::Error> {
        let mut buf = BytesMut::new();
        let mut at = Vec::new();
        for p in pieces {
            for (i, chunk) in p.data.chunks(MAX_RECORD).enumerate() {
                let offset = p.offset + (i * MAX_RECORD) as u64;
                let start = encode(&mut buf, p.ino, offset, chunk);
                at.push((offset, chunk.len() as u64, start as u64));
            }
        }
        let buf = buf.freeze();
        let mut tries = 0;
        loop {
            if self
                .open
                .as_ref()
                .is_none_or(|(_, f)| f.len() >= SEGMENT_BYTES)
            {
                if let Some((_, full)) = self.open.take() {
                    // Sealed off the write's path failing or not: its records are durable.
                    match tokio::time::timeout(SEAL_WAIT, full.close()).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => tracing::warn!(error = %e, "closing a full segment"),
                        Err(_) => tracing::warn!("closing a full segment timed out"),
                    }
                }
                crate::warn_if_slow("a new segment", 0, self.start()).await?;
            }
            let (seg, f) = self.open.as_mut().expect("started");
            let seg = *seg;
            match crate::warn_if_slow("an append to segment", seg, f.append_bytes(buf.clone()))
                .await
            {
                Ok(base) => {
                    return Ok(at
                        .into_iter()
                        .map(|(offset, len, start)| Extent {
                            offset,
                            len,
                            seg,
                            seg_offset: base + start,
                        })
                        .collect());
                }
                Err(e) if tries == 0 => {
                    // A writer that failed is unusable: sealed at what it acknowledged (so
                    // that readers find the committed extents in it without recovering it),
                    // then a new segment, once.
                    tracing::warn!(seg, error = %e, "segment append failed; starting a new segment");
                    if let Some((_, failed)) = self.open.take() {
                        match tokio::time::timeout(SEAL_WAIT, failed.close()).await {
                            Ok(Ok(_)) => {}
                            Ok(Err(e)) => {
                                tracing::warn!(seg, error = %e, "sealing a failed segment");
                            }
                            Err(_) => tracing::warn!(seg, "sealing a failed segment timed out"),
                        }
                    }
                    tries += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Leaves segment `seg` if it is the open one (the masters refuse extents in it: it is
    /// being collected); the next write starts another. It is not sealed: it is deleted.
    pub fn abandon(&mut self, seg: u64) {
        if self.open.as_ref().is_some_and(|(s, _)| *s == seg) {
            self.open = None;
        }
    }

    /// Closes the open segment (its bytes are durable already; this seals it).
    pub async fn close(&mut self) {
        if let Some((seg, f)) = self.open.take()
            && let Err(e) = f.close().await
        {
            tracing::warn!(seg, error = %e, "closing the open segment");
        }
    }
}

/// Why a group append failed: the append's own error, shared by every flush in the group;
/// `None` when the append was dropped before it answered.
pub type GroupError = Option<std::sync::Arc<cairn_client::Error>>;

/// One flush's ranges, owned, waiting for the next group append.
struct Job {
    pieces: Vec<(u64, u64, Vec<u8>)>,
    done: tokio::sync::oneshot::Sender<Result<Vec<Extent>, GroupError>>,
}

/// The open segment of one policy and the flushes waiting for it.
struct Lane {
    segments: tokio::sync::Mutex<Segments>,
    pending: parking_lot::Mutex<Vec<Job>>,
}

/// Bytes one flush of a file carries that give the file segments of its own: a file written
/// as a stream (a write flushes at [`crate::DIRTY_FILE_MAX`] dirty bytes) rather than closed
/// small (docs/files.md "Large files").
pub const OWN_SEGMENT_FLUSH: usize = 4 << 20;

/// Which open segment a flush goes to: its policy, and the file whose own it is (0: shared).
type LaneKey = (String, u64);

/// Group commit of the mount's flushes: the ranges of every flush that arrives while an
/// append is in flight go out together in the next one, one durable append for all of them
/// (concurrent closes of many small files otherwise queue one replicated append each). Files
/// of each policy (their directory's: docs/files.md "Policies") have segments of their own,
/// and so does each large file while it is open.
pub struct GroupWriter {
    client: Client,
    lanes: parking_lot::Mutex<std::collections::HashMap<LaneKey, std::sync::Arc<Lane>>>,
}

impl GroupWriter {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            lanes: Default::default(),
        }
    }

    fn lane(&self, policy: &str, own: u64) -> std::sync::Arc<Lane> {
        self.lanes
            .lock()
            .entry((policy.to_owned(), own))
            .or_insert_with(|| {
                // The masters' text of a policy: one that does not parse (a newer master's)
                // gets the default rather than no segment at all.
                let parsed = (!policy.is_empty())
                    .then(|| policy.parse::<cairn_ec::Policy>())
                    .and_then(|r| {
                        r.inspect_err(|e| tracing::warn!(policy, error = %e, "a file's policy"))
                            .ok()
                    });
                std::sync::Arc::new(Lane {
                    segments: tokio::sync::Mutex::new(Segments::new(self.client.clone(), parsed)),
                    pending: parking_lot::Mutex::new(Vec::new()),
                })
            })
            .clone()
    }

    fn all(&self) -> Vec<std::sync::Arc<Lane>> {
        self.lanes.lock().values().cloned().collect()
    }

    /// Whether file `ino` has a segment of its own open.
    pub fn has_own(&self, ino: u64) -> bool {
        self.lanes.lock().keys().any(|(_, o)| *o == ino)
    }

    /// Appends `pieces` (inode, file offset, bytes) durably to a segment of `policy` (empty:
    /// the default) — file `own`'s own one, or with `own` 0 the shared one, with whatever
    /// other flushes of it are waiting; their extents in order, as [`Segments::write`] gives
    /// them.
    ///
    /// # Errors
    /// The group's append failed.
    pub async fn write(
        &self,
        policy: &str,
        own: u64,
        pieces: Vec<(u64, u64, Vec<u8>)>,
    ) -> Result<Vec<Extent>, GroupError> {
        let lane = self.lane(policy, own);
        let (done, rx) = tokio::sync::oneshot::channel();
        lane.pending.lock().push(Job { pieces, done });
        {
            // Whoever holds the segment appends everything queued by then; a job already
            // taken by the holder before finds the queue without it and just waits.
            let mut seg = crate::warn_if_slow("the segment lock", 0, lane.segments.lock()).await;
            let jobs = std::mem::take(&mut *lane.pending.lock());
            if !jobs.is_empty() {
                let all: Vec<Piece<'_>> = jobs
                    .iter()
                    .flat_map(|j| {
                        j.pieces.iter().map(|(ino, offset, data)| Piece {
                            ino: *ino,
                            offset: *offset,
                            data,
                        })
                    })
                    .collect();
                match seg.write(&all).await {
                    Ok(extents) => {
                        let mut it = extents.into_iter();
                        for j in jobs {
                            let n: usize = j
                                .pieces
                                .iter()
                                .map(|p| p.2.len().div_ceil(MAX_RECORD))
                                .sum();
                            let _ = j.done.send(Ok(it.by_ref().take(n).collect()));
                        }
                    }
                    Err(e) => {
                        let e = std::sync::Arc::new(e);
                        for j in jobs {
                            let _ = j.done.send(Err(Some(e.clone())));
                        }
                    }
                }
            }
        }
        rx.await.unwrap_or(Err(None))
    }

    /// Leaves segment `seg` if it is an open one (see [`Segments::abandon`]).
    pub async fn abandon(&self, seg: u64) {
        for lane in self.all() {
            lane.segments.lock().await.abandon(seg);
        }
    }

    /// Closes the open segments (see [`Segments::close`]).
    pub async fn close(&self) {
        for lane in self.all() {
            lane.segments.lock().await.close().await;
        }
    }

    /// File `ino`'s last close: its own segment, if any, is sealed and left.
    pub async fn release(&self, ino: u64) {
        if ino == 0 {
            return;
        }
        let own: Vec<std::sync::Arc<Lane>> = {
            let mut lanes = self.lanes.lock();
            let keys: Vec<LaneKey> = lanes.keys().filter(|k| k.1 == ino).cloned().collect();
            keys.iter().filter_map(|k| lanes.remove(k)).collect()
        };
        for lane in own {
            lane.segments.lock().await.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_refused() {
        let mut buf = BytesMut::new();
        let at = encode(&mut buf, 0xabc, 1 << 40, b"hello");
        assert_eq!(at, HEADER_BYTES);
        assert_eq!(&buf[at..], b"hello");
        let h = decode(&buf).unwrap();
        assert_eq!(
            h,
            Header {
                ino: 0xabc,
                offset: 1 << 40,
                len: 5
            }
        );
        assert_eq!(decode(&buf[..10]), Err(RecordError::Truncated(10)));
        for (i, want) in [
            (0, RecordError::Magic),
            (4, RecordError::Version(0xfe)),
            (9, RecordError::HeaderCrc),
        ] {
            let mut bad = buf.to_vec();
            bad[i] ^= if i == 4 { 0xff } else { 1 };
            assert_eq!(decode(&bad), Err(want), "byte {i}");
        }
        // A reserved byte set, under a checksum that matches it (found by fuzzing).
        let mut odd = buf.to_vec();
        odd[5] = 95;
        let crc = crc32c::crc32c(&odd[..28]);
        odd[28..32].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode(&odd), Err(RecordError::Reserved));
    }
}
