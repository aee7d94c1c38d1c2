//! Small objects share append-only log files ("packs"), as Pangu's OSS packs them: a 4 KiB
//! PUT costs one append to an open pack, not a master file create. Each gateway writes its own
//! packs; one writer task per pack takes every object queued while its last append was in
//! flight and appends them all at once (group commit), so concurrent PUTs share appends.
//!
//! A record is a 32-byte header, the bucket and key names, then the data (docs/object.md §3):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `CSPK` |
//! | 4 | version (1) |
//! | 5 | reserved (0) |
//! | 6..8 | bucket name length (u16 LE) |
//! | 8..10 | key length (u16 LE) |
//! | 10..12 | reserved (0) |
//! | 12..20 | data length (u64 LE) |
//! | 20..24 | CRC32C of the data |
//! | 24..28 | reserved (0) |
//! | 28..32 | CRC32C of bytes 0..28, the bucket and the key |
//!
//! The index names the data's range; the header lets compaction walk a pack and ask the index
//! which records are still live, and lets a person read a pack with no index at all.

use bytes::{BufMut, Bytes, BytesMut};
use cairn_client::{Client, CreateOptions, FlatLogFile};
use cairn_rpc::object::Extent;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{mpsc, oneshot};

pub const MAGIC: [u8; 4] = *b"CSPK";
pub const VERSION: u8 = 1;
pub const HEADER_BYTES: usize = 32;

/// A record's header, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub bucket: String,
    pub key: String,
    pub data_len: u64,
    pub data_crc: u32,
    /// Bytes of header and names: the data starts this far into the record.
    pub data_offset: usize,
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
    #[error("names are not UTF-8")]
    Names,
}

/// Appends one record for `data` to `out`; returns the data's offset inside `out`.
pub fn encode(out: &mut BytesMut, bucket: &str, key: &str, data: &[u8]) -> usize {
    let start = out.len();
    let mut h = [0u8; HEADER_BYTES];
    h[0..4].copy_from_slice(&MAGIC);
    h[4] = VERSION;
    h[6..8].copy_from_slice(&(bucket.len() as u16).to_le_bytes());
    h[8..10].copy_from_slice(&(key.len() as u16).to_le_bytes());
    h[12..20].copy_from_slice(&(data.len() as u64).to_le_bytes());
    h[20..24].copy_from_slice(&crc32c::crc32c(data).to_le_bytes());
    let mut crc = crc32c::crc32c(&h[..28]);
    crc = crc32c::crc32c_append(crc, bucket.as_bytes());
    crc = crc32c::crc32c_append(crc, key.as_bytes());
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    out.put_slice(&h);
    out.put_slice(bucket.as_bytes());
    out.put_slice(key.as_bytes());
    out.put_slice(data);
    start + HEADER_BYTES + bucket.len() + key.len()
}

/// Decodes the header and names at the start of `buf` (the data need not be there).
///
/// # Errors
/// Too short, wrong magic or version, or a checksum mismatch.
pub fn decode(buf: &[u8]) -> Result<Record, RecordError> {
    if buf.len() < HEADER_BYTES {
        return Err(RecordError::Truncated(buf.len()));
    }
    let h = &buf[..HEADER_BYTES];
    if h[0..4] != MAGIC {
        return Err(RecordError::Magic);
    }
    if h[4] != VERSION {
        return Err(RecordError::Version(h[4]));
    }
    let u16_at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]) as usize;
    let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
    let (blen, klen) = (u16_at(6), u16_at(8));
    let data_offset = HEADER_BYTES + blen + klen;
    if buf.len() < data_offset {
        return Err(RecordError::Truncated(buf.len()));
    }
    let names = &buf[HEADER_BYTES..data_offset];
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[..28]), names);
    if crc != u32_at(28) {
        return Err(RecordError::HeaderCrc);
    }
    let bucket = std::str::from_utf8(&names[..blen]).map_err(|_| RecordError::Names)?;
    let key = std::str::from_utf8(&names[blen..]).map_err(|_| RecordError::Names)?;
    Ok(Record {
        bucket: bucket.to_owned(),
        key: key.to_owned(),
        data_len: u64::from_le_bytes(h[12..20].try_into().expect("8 bytes")),
        data_crc: u32_at(20),
        data_offset,
    })
}

struct Put {
    bucket: String,
    key: String,
    data: Bytes,
    done: oneshot::Sender<Result<Extent, PackError>>,
}

/// Bytes one group append carries at most (more waits for the next append).
const MAX_GROUP_BYTES: usize = 8 << 20;

/// The gateway's pack writers.
#[derive(Clone)]
pub struct Packs {
    lanes: Vec<mpsc::Sender<Put>>,
    next: Arc<AtomicU64>,
    /// Packs the index refused as retired ([`Packs::retire`]): a lane leaves its open pack
    /// before the next append when it is one of them.
    retired: Retired,
    /// How this gateway's packs' paths start (`DIR/WRITER-`).
    mine: String,
}

type Retired = Arc<parking_lot::Mutex<std::collections::HashSet<String>>>;

/// Settings of the pack writers.
#[derive(Debug, Clone)]
pub struct PackOptions {
    /// Directory of the packs (`/.s3/packs`).
    pub dir: String,
    /// Names this gateway's packs apart from other gateways'.
    pub writer_id: String,
    /// Writer tasks (packs open at once).
    pub lanes: usize,
    /// A pack is closed and a new one begun past this length.
    pub pack_bytes: u64,
}

impl Packs {
    pub fn start(client: Client, opts: PackOptions) -> Self {
        let seq = Arc::new(AtomicU64::new(0));
        let retired = Retired::default();
        let lanes = (0..opts.lanes.max(1))
            .map(|_| {
                let (tx, rx) = mpsc::channel(1024);
                tokio::spawn(lane(
                    client.clone(),
                    opts.clone(),
                    seq.clone(),
                    retired.clone(),
                    rx,
                ));
                tx
            })
            .collect();
        Self {
            lanes,
            next: Arc::new(AtomicU64::new(0)),
            retired,
            mine: format!("{}/{}-", opts.dir, opts.writer_id),
        }
    }

    /// The index refused an extent in `path` because compaction retired the pack (its lease
    /// lapsed while no object named it, e.g. while this gateway was stalled): the lane
    /// writing it starts a new pack before its next append. A path not one of this gateway's
    /// packs is ignored.
    pub fn retire(&self, path: &str) {
        if !path.starts_with(&self.mine) {
            return; // another gateway's (a copy's source)
        }
        let mut r = self.retired.lock();
        if r.len() >= 1024 {
            // Paths no lane had open (rotated already) are never taken out: bounded here.
            r.clear();
        }
        r.insert(path.to_owned());
    }

    /// Appends `data` as a record of `bucket`/`key`; the extent is durable (MinCopy replicas)
    /// when this returns.
    ///
    /// # Errors
    /// The append failed even on a fresh pack.
    pub async fn put(&self, bucket: &str, key: &str, data: Bytes) -> Result<Extent, PackError> {
        let lane = self.next.fetch_add(1, Ordering::Relaxed) as usize % self.lanes.len();
        let (tx, rx) = oneshot::channel();
        let put = Put {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            data,
            done: tx,
        };
        self.lanes[lane]
            .send(put)
            .await
            .map_err(|_| PackError::stopped())?;
        rx.await.map_err(|_| PackError::stopped())?
    }
}

struct Open {
    path: String,
    file: FlatLogFile,
}

/// Why a pack write failed: what the SDK said, and its kind when the masters refused (a
/// full cluster is retried by S3 clients; see [`crate::data::client_err`]).
#[derive(Debug, Clone)]
pub struct PackError {
    kind: Option<cairn_rpc::ErrorKind>,
    message: String,
}

impl PackError {
    fn stopped() -> Self {
        Self {
            kind: None,
            message: "the pack writer stopped".into(),
        }
    }

    fn of(e: &cairn_client::Error, what: String) -> Self {
        Self {
            kind: match e {
                cairn_client::Error::Meta(m) => Some(m.kind),
                _ => None,
            },
            message: format!("{what}: {e}"),
        }
    }

    /// As S3 answers it.
    pub fn to_s3(&self) -> s3s::S3Error {
        match self.kind {
            Some(kind) => crate::meta_err(cairn_rpc::MetaError::new(kind, self.message.clone())),
            None => crate::data::internal(&self.message),
        }
    }
}

impl std::fmt::Display for PackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

async fn lane(
    client: Client,
    opts: PackOptions,
    seq: Arc<AtomicU64>,
    retired: Retired,
    mut rx: mpsc::Receiver<Put>,
) {
    let mut open: Option<Open> = None;
    while let Some(first) = rx.recv().await {
        if let Some(o) = open.take_if(|o| retired.lock().remove(&o.path)) {
            // In the trash already: nothing more goes to it, and it is not sealed (the
            // trash deletes it).
            tracing::warn!(pack = %o.path, "pack retired by compaction while open; starting a new pack");
            drop(o.file);
        }
        let mut group = vec![first];
        let mut bytes = group[0].data.len();
        while bytes < MAX_GROUP_BYTES {
            match rx.try_recv() {
                Ok(p) => {
                    bytes += p.data.len();
                    group.push(p);
                }
                Err(_) => break,
            }
        }
        let mut buf = BytesMut::with_capacity(bytes + group.len() * (HEADER_BYTES + 128));
        let offsets: Vec<(usize, usize)> = group
            .iter()
            .map(|p| (encode(&mut buf, &p.bucket, &p.key, &p.data), p.data.len()))
            .collect();
        let buf = buf.freeze();
        // One retry on a fresh pack: a writer that failed (lost lease, no chunk could take the
        // data) is unusable.
        let mut result = Err(PackError::stopped());
        for _ in 0..2 {
            result = append(&client, &opts, &seq, &mut open, buf.clone()).await;
            if result.is_ok() {
                break;
            }
            if let Some(o) = open.take() {
                tracing::warn!(pack = %o.path, error = ?result.as_ref().err(), "pack append failed; starting a new pack");
                // A pack that never took a record names no object: removed at once (a full
                // cluster is not kept full by empty packs).
                if o.file.is_empty() {
                    let client = client.clone();
                    tokio::spawn(async move {
                        drop(o.file);
                        let _ = client.delete(&o.path).await;
                    });
                }
            }
        }
        match result {
            Ok((path, base)) => {
                for (p, (off, len)) in group.into_iter().zip(offsets) {
                    let _ = p.done.send(Ok(Extent {
                        path: path.clone(),
                        offset: base + off as u64,
                        len: len as u64,
                        shared: true,
                    }));
                }
            }
            Err(e) => {
                for p in group {
                    let _ = p.done.send(Err(e.clone()));
                }
            }
        }
        // Rotate a full pack after the append, off the PUTs' path.
        if open
            .as_ref()
            .is_some_and(|o| o.file.len() >= opts.pack_bytes)
            && let Some(o) = open.take()
            && let Err(e) = o.file.close().await
        {
            tracing::warn!(pack = %o.path, error = %e, "closing a full pack failed");
        }
    }
    if let Some(o) = open.take() {
        let _ = o.file.close().await;
    }
}

/// Appends `buf` to the open pack (opening one first if none is); the pack's path and the
/// offset `buf` landed at.
async fn append(
    client: &Client,
    opts: &PackOptions,
    seq: &AtomicU64,
    open: &mut Option<Open>,
    buf: Bytes,
) -> Result<(String, u64), PackError> {
    if open.is_none() {
        let n = seq.fetch_add(1, Ordering::Relaxed);
        let path = format!("{}/{}-{n:06}", opts.dir, opts.writer_id);
        let file = client
            .create(&path, CreateOptions::default())
            .await
            .map_err(|e| PackError::of(&e, format!("creating pack {path}")))?;
        *open = Some(Open { path, file });
    }
    let o = open.as_mut().expect("opened");
    let at = o
        .file
        .append_bytes(buf)
        .await
        .map_err(|e| PackError::of(&e, format!("appending to pack {}", o.path)))?;
    Ok((o.path.clone(), at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let mut buf = BytesMut::new();
        let a = encode(&mut buf, "bucket", "key/é", b"hello");
        let b = encode(&mut buf, "b2", "", b"");
        let r = decode(&buf).unwrap();
        assert_eq!(
            (r.bucket.as_str(), r.key.as_str(), r.data_len),
            ("bucket", "key/é", 5)
        );
        assert_eq!(r.data_offset, a);
        assert_eq!(&buf[a..a + 5], b"hello");
        assert_eq!(r.data_crc, crc32c::crc32c(b"hello"));
        let r2 = decode(&buf[a + 5..]).unwrap();
        assert_eq!(
            (r2.bucket.as_str(), r2.key.as_str(), r2.data_len),
            ("b2", "", 0)
        );
        assert_eq!(a + 5 + r2.data_offset, b);
    }

    #[test]
    fn any_flipped_header_or_name_byte_is_refused() {
        let mut buf = BytesMut::new();
        let at = encode(&mut buf, "bucket", "key", b"data");
        for i in 0..at {
            for bit in 0..8 {
                let mut bad = buf.to_vec();
                bad[i] ^= 1 << bit;
                assert!(decode(&bad).is_err(), "byte {i} bit {bit}");
            }
        }
        assert_eq!(decode(&buf[..10]), Err(RecordError::Truncated(10)));
    }
}
