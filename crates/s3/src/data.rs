//! Object bytes on Cairn: a body becomes extents of FlatLogFiles (a pack record for a small
//! object, a file of its own for a large one or a multipart part), and extents become a byte
//! stream again for a GET.

use crate::pack::Packs;
use bytes::{Bytes, BytesMut};
use cairn_client::{Client, CreateOptions, FlatLogFile};
use cairn_rpc::object::Extent;
use futures::{Stream, StreamExt};
use s3s::checksum::ChecksumHasher;
use s3s::crypto::{Checksum as _, Md5};
use s3s::{S3Error, S3ErrorCode, s3_error};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// Bytes read from the cluster per piece of a GET's stream.
pub const READ_PIECE: u64 = 4 << 20;
/// Bytes gathered before an append to a large object's own file.
const WRITE_PIECE: usize = 4 << 20;

/// An object's bytes on their way to a client: a task reads pieces from the cluster, at most
/// two ahead of the one being sent.
pub struct BodyStream(mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl Stream for BodyStream {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// What a body was stored as, with its digests.
pub struct Stored {
    pub extents: Vec<Extent>,
    pub size: u64,
    pub md5_hex: String,
    pub checksums: s3s::dto::Checksum,
}

/// The S3 error for a request body that could not be read whole: a body unlike the SHA-256
/// its signature covers is BadDigest (s3s's checking stream is private to it, so its error is
/// known by its text), anything else IncompleteBody.
fn body_error(e: impl std::fmt::Display) -> S3Error {
    let text = e.to_string();
    let code = if text.contains("Sha256Mismatch") {
        S3ErrorCode::BadDigest
    } else {
        S3ErrorCode::IncompleteBody
    };
    S3Error::with_message(code, format!("reading the body: {text}"))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn internal(e: impl std::fmt::Display) -> S3Error {
    S3Error::with_message(S3ErrorCode::InternalError, e.to_string())
}

/// An SDK error as S3 answers it: what may pass (no leader, too few servers, a full
/// cluster) is 503 ServiceUnavailable, which S3 clients retry; the rest is 500.
pub fn client_err(e: &cairn_client::Error) -> S3Error {
    match e {
        cairn_client::Error::Meta(m) => crate::meta_err(m.clone()),
        e => internal(e),
    }
}

pub struct DataStore {
    pub client: Client,
    /// Where each bucket's data files go (the root's data directory, or a bucket shard's).
    pub places: Places,
    /// Bodies up to this size go into a pack.
    pub pack_max: usize,
    /// Files this gateway's GETs are reading now, with how many read each: the trash is
    /// not emptied of them (compact.rs).
    pub reading: Reading,
}

/// A data directory (`/.s3`, or `/.s3/p/N` of a bucket shard: docs/partitions.md
/// "Buckets"): its packs, written by this gateway's lanes, and its own files' directory. An
/// object's data files are in the directory of the partition that holds its index entry.
pub struct Place {
    pub packs: Packs,
    /// Large objects' and parts' own files.
    pub blob_dir: String,
}

/// How long a bucket's layout (the partitions its keys hash over) is trusted. A layout
/// changes only while the bucket is empty (placed) or when it is deleted and made again; a
/// PUT whose data went to the old place is refused (ServiceUnavailable: the client's retry
/// finds the new one).
const LAYOUT_TTL: std::time::Duration = std::time::Duration::from_secs(2);

/// The data directories this gateway writes to, opened as they are first needed.
pub struct Places {
    client: Client,
    /// Pack writers of each place are made with these (the directory set per place).
    packs: crate::pack::PackOptions,
    open: parking_lot::Mutex<std::collections::HashMap<String, Arc<Place>>>,
    layouts: parking_lot::Mutex<std::collections::HashMap<String, (Vec<u32>, std::time::Instant)>>,
}

impl Places {
    pub fn new(client: Client, packs: crate::pack::PackOptions) -> Self {
        Self {
            client,
            packs,
            open: Default::default(),
            layouts: Default::default(),
        }
    }

    /// Tells the pack writers that the index refused `pack` as retired (compaction dropped
    /// it): the one writing it starts a new pack.
    pub fn retire_pack(&self, pack: &str) {
        for place in self.open.lock().values() {
            place.packs.retire(pack);
        }
    }

    /// The place of `key` in `bucket`.
    ///
    /// # Errors
    /// The masters could not be asked the bucket's layout, or the place's directories made.
    pub async fn of(&self, bucket: &str, key: &str) -> Result<Arc<Place>, S3Error> {
        let cached = self
            .layouts
            .lock()
            .get(bucket)
            .filter(|(_, at)| at.elapsed() < LAYOUT_TTL)
            .map(|(s, _)| s.clone());
        let shards = match cached {
            Some(s) => s,
            None => {
                let q = cairn_rpc::object::ObjectQuery::Layout {
                    bucket: bucket.to_owned(),
                };
                match crate::query(&self.client, &q).await {
                    Ok(cairn_rpc::object::QueryReply::Layout(s)) => {
                        let mut layouts = self.layouts.lock();
                        // Bounded by the buckets written to within the TTL.
                        if layouts.len() >= 1024 {
                            layouts.retain(|_, (_, at)| at.elapsed() < LAYOUT_TTL);
                        }
                        layouts.insert(bucket.to_owned(), (s.clone(), std::time::Instant::now()));
                        s
                    }
                    Ok(_) => return Err(internal("the layout answered with something else")),
                    // Not kept: the index change that follows answers NoSuchBucket.
                    Err(e) if e.code() == &S3ErrorCode::NoSuchBucket => Vec::new(),
                    Err(e) => return Err(e),
                }
            }
        };
        let dir = cairn_rpc::object::data_dir(cairn_rpc::object::shard_of(key, &shards));
        self.dir(&dir).await
    }

    /// The place at data directory `dir`, its directories made when first opened here.
    ///
    /// # Errors
    /// The directories could not be made.
    pub async fn dir(&self, dir: &str) -> Result<Arc<Place>, S3Error> {
        if let Some(p) = self.open.lock().get(dir) {
            return Ok(p.clone());
        }
        for sub in ["packs", "blobs"] {
            self.client
                .mkdir(&format!("{dir}/{sub}"), true)
                .await
                .map_err(|e| client_err(&e))?;
        }
        let place = Arc::new(Place {
            packs: Packs::start(
                self.client.clone(),
                crate::pack::PackOptions {
                    dir: format!("{dir}/packs"),
                    ..self.packs.clone()
                },
            ),
            blob_dir: format!("{dir}/blobs"),
        });
        // Two first uses at once: one place wins, the other's idle lanes end with it.
        Ok(self
            .open
            .lock()
            .entry(dir.to_owned())
            .or_insert(place)
            .clone())
    }

    /// Every data directory in the cluster: the root's and each bucket shard's.
    ///
    /// # Errors
    /// The shards' parent could not be listed.
    pub async fn all(&self) -> Result<Vec<String>, cairn_client::Error> {
        let mut dirs = vec![cairn_rpc::object::data_dir(None)];
        let parent = cairn_rpc::object::shards_dir();
        match self.client.list(&parent).await {
            Ok(entries) => dirs.extend(
                entries
                    .iter()
                    .filter(|e| e.is_dir)
                    .filter_map(|e| e.name.parse::<u32>().ok())
                    .map(|n| cairn_rpc::object::data_dir(Some(n))),
            ),
            Err(cairn_client::Error::Meta(e)) if e.kind == cairn_rpc::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(dirs)
    }
}

/// Files being read, counted; see [`DataStore::reading`].
#[derive(Default, Clone)]
pub struct Reading(Arc<parking_lot::Mutex<std::collections::HashMap<String, u32>>>);

impl Reading {
    /// Counts `paths` as read until the guard is dropped.
    fn hold(&self, paths: Vec<String>) -> ReadingGuard {
        let mut m = self.0.lock();
        for p in &paths {
            *m.entry(p.clone()).or_insert(0) += 1;
        }
        ReadingGuard {
            reading: self.clone(),
            paths,
        }
    }

    /// Whether a GET of this gateway reads `path` now.
    pub fn contains(&self, path: &str) -> bool {
        self.0.lock().contains_key(path)
    }
}

/// Releases its paths from [`Reading`] when dropped (the read ended, however it ended).
struct ReadingGuard {
    reading: Reading,
    paths: Vec<String>,
}

impl Drop for ReadingGuard {
    fn drop(&mut self) {
        let mut m = self.reading.0.lock();
        for p in &self.paths {
            if let Some(n) = m.get_mut(p) {
                *n -= 1;
                if *n == 0 {
                    m.remove(p);
                }
            }
        }
    }
}

impl DataStore {
    /// Applies an index change that names data this gateway wrote (a PUT, a part, a
    /// compaction move). A refusal because the data's pack was retired also retires the
    /// pack here, so the client's retry (503) goes to a new pack.
    ///
    /// # Errors
    /// As [`crate::change`].
    pub async fn commit(
        &self,
        op: &cairn_rpc::object::ObjectOp,
    ) -> Result<cairn_rpc::object::OpReply, S3Error> {
        match self.client.masters().object_op(op).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => {
                if let cairn_rpc::object::ObjectError::PackRetired(pack) = &e {
                    tracing::warn!(%pack, "the index refused a write to a retired pack");
                    self.places.retire_pack(pack);
                }
                Err(crate::convert::s3_err(e))
            }
            Err(e) => Err(crate::meta_err(e)),
        }
    }

    /// Stores a body: up to `pack_max` bytes as a pack record, more in a file of its own
    /// (`own_name` under the blob directory). Digests are computed on the way.
    ///
    /// # Errors
    /// The body stream failed (IncompleteBody), or the cluster refused the data.
    pub async fn store<E: std::fmt::Display>(
        &self,
        bucket: &str,
        key: &str,
        own_name: &str,
        mut body: impl Stream<Item = Result<Bytes, E>> + Unpin,
        mut hasher: ChecksumHasher,
        force_own_file: bool,
    ) -> Result<Stored, S3Error> {
        let mut md5 = Md5::new();
        let mut head = BytesMut::new();
        let mut size = 0u64;
        let mut overflow: Option<Bytes> = None;
        while let Some(piece) = body.next().await {
            let piece = piece.map_err(body_error)?;
            md5.update(&piece);
            hasher.update(&piece);
            size += piece.len() as u64;
            if force_own_file || head.len() + piece.len() > self.pack_max {
                overflow = Some(piece);
                break;
            }
            head.extend_from_slice(&piece);
        }
        let place = self.places.of(bucket, key).await?;
        let extents = match overflow {
            None => {
                let data = head.freeze();
                let e = place
                    .packs
                    .put(bucket, key, data)
                    .await
                    .map_err(|e| e.to_s3())?;
                vec![e]
            }
            Some(first) => {
                let path = format!("{}/{own_name}", place.blob_dir);
                let mut pending = head;
                pending.extend_from_slice(&first);
                let written = self
                    .own_file(&path, pending, &mut body, &mut md5, &mut hasher, &mut size)
                    .await;
                let len = match written {
                    Ok(len) => len,
                    Err(e) => {
                        // A failed upload's bytes go at once, not at the next sweep: a full
                        // cluster must not stay full because of what it could not store.
                        if let Err(d) = self.client.delete(&path).await {
                            tracing::warn!(%path, error = %d, "removing a failed upload's file failed; the sweeper will");
                        }
                        return Err(e);
                    }
                };
                vec![Extent {
                    path,
                    offset: 0,
                    len,
                    shared: false,
                }]
            }
        };
        Ok(Stored {
            extents,
            size,
            md5_hex: hex(md5.finalize().as_ref()),
            checksums: hasher.finalize(),
        })
    }

    /// Writes a body that outgrew a pack into its own file at `path`: `pending` first, then
    /// the rest of `body`, each piece received while the one before is appended. Returns the
    /// closed file's length. On an error the file is left for the caller to delete.
    async fn own_file<E: std::fmt::Display>(
        &self,
        path: &str,
        mut pending: BytesMut,
        body: &mut (impl Stream<Item = Result<Bytes, E>> + Unpin),
        md5: &mut Md5,
        hasher: &mut ChecksumHasher,
        size: &mut u64,
    ) -> Result<u64, S3Error> {
        type Appending = tokio::task::JoinHandle<Result<FlatLogFile, cairn_client::Error>>;
        let file = self
            .client
            .create(path, CreateOptions::default())
            .await
            .map_err(|e| client_err(&e))?;
        let mut file = Some(file);
        let mut appending: Option<Appending> = None;
        let joined = |r: Result<
            Result<FlatLogFile, cairn_client::Error>,
            tokio::task::JoinError,
        >| { r.map_err(internal)?.map_err(|e| client_err(&e)) };
        let mut ended = false;
        loop {
            while !ended && pending.len() < WRITE_PIECE {
                match body.next().await {
                    Some(Ok(piece)) => {
                        md5.update(&piece);
                        hasher.update(&piece);
                        *size += piece.len() as u64;
                        pending.extend_from_slice(&piece);
                    }
                    Some(Err(e)) => {
                        if let Some(a) = appending.take() {
                            let _ = a.await;
                        }
                        return Err(body_error(e));
                    }
                    None => ended = true,
                }
            }
            if let Some(a) = appending.take() {
                file = Some(joined(a.await)?);
            }
            if !pending.is_empty() {
                let data = std::mem::take(&mut pending).freeze();
                let mut f = file.take().expect("no append in flight");
                appending = Some(tokio::spawn(async move {
                    f.append_bytes(data).await.map(|_| f)
                }));
            }
            if ended {
                if let Some(a) = appending.take() {
                    file = Some(joined(a.await)?);
                }
                break;
            }
        }
        let file = file.expect("no append in flight");
        let len = file.close().await.map_err(|e| client_err(&e))?;
        if len != *size {
            return Err(internal(format!(
                "{path}: closed at {len} bytes after appending {size}"
            )));
        }
        Ok(len)
    }

    /// The bytes `range` (relative to the object) of an object made of `extents`, as a stream
    /// read piece by piece.
    pub fn read(&self, extents: &[Extent], range: std::ops::Range<u64>) -> BodyStream {
        let mut pieces = Vec::new();
        let mut start = 0u64;
        for e in extents {
            let (lo, hi) = (range.start.max(start), range.end.min(start + e.len));
            let mut at = lo;
            while at < hi {
                let n = (hi - at).min(READ_PIECE);
                pieces.push((e.path.clone(), e.offset + (at - start), n as usize));
                at += n;
            }
            start += e.len;
        }
        let client = self.client.clone();
        let (tx, rx) = mpsc::channel(2);
        let mut paths: Vec<String> = pieces.iter().map(|p| p.0.clone()).collect();
        paths.dedup();
        let held = self.reading.hold(paths);
        tokio::spawn(async move {
            let _held = held;
            let mut reads = futures::stream::iter(pieces)
                .map(|(path, offset, len)| {
                    let client = client.clone();
                    async move {
                        client
                            .read(&path, offset, len)
                            .await
                            .map(Bytes::from)
                            .map_err(|e| {
                                // The response has begun: the client sees a cut body.
                                tracing::error!(%path, offset, len, error = %e, "an object's read failed mid-GET");
                                std::io::Error::other(e)
                            })
                    }
                })
                .buffered(2);
            while let Some(piece) = reads.next().await {
                let failed = piece.is_err();
                // The client went away: stop reading.
                if tx.send(piece).await.is_err() || failed {
                    break;
                }
            }
        });
        BodyStream(rx)
    }

    /// Reads a whole range into memory (copies; small ranges only).
    pub async fn read_all(
        &self,
        extents: &[Extent],
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, S3Error> {
        let mut out = BytesMut::with_capacity((range.end - range.start) as usize);
        let mut s = self.read(extents, range);
        while let Some(p) = s.next().await {
            out.extend_from_slice(&p.map_err(|e| internal(e.to_string()))?);
        }
        Ok(out.freeze())
    }
}

/// Checks a stored body's digests against what the request declared (Content-MD5 and
/// `x-amz-checksum-*`, from headers or trailers).
///
/// # Errors
/// BadDigest on a mismatch, InvalidDigest on a malformed Content-MD5.
pub fn verify(
    stored: &Stored,
    content_md5: Option<&str>,
    declared: &s3s::dto::Checksum,
) -> Result<(), S3Error> {
    if let Some(m) = content_md5 {
        let want = base64_decode(m)
            .ok_or_else(|| s3_error!(InvalidDigest, "Content-MD5 is not base64"))?;
        if want.len() != 16 {
            return Err(s3_error!(InvalidDigest, "Content-MD5 is not 16 bytes"));
        }
        if hex(&want) != stored.md5_hex {
            return Err(s3_error!(
                BadDigest,
                "the Content-MD5 you specified did not match what we received"
            ));
        }
    }
    let pairs = [
        (
            "CRC32",
            &declared.checksum_crc32,
            &stored.checksums.checksum_crc32,
        ),
        (
            "CRC32C",
            &declared.checksum_crc32c,
            &stored.checksums.checksum_crc32c,
        ),
        (
            "SHA1",
            &declared.checksum_sha1,
            &stored.checksums.checksum_sha1,
        ),
        (
            "SHA256",
            &declared.checksum_sha256,
            &stored.checksums.checksum_sha256,
        ),
        (
            "CRC64NVME",
            &declared.checksum_crc64nvme,
            &stored.checksums.checksum_crc64nvme,
        ),
    ];
    for (name, want, got) in pairs {
        if let Some(w) = want
            && Some(w) != got.as_ref()
        {
            return Err(S3Error::with_message(
                S3ErrorCode::BadDigest,
                format!(
                    "the x-amz-checksum-{} you specified did not match what we received",
                    name.to_lowercase()
                ),
            ));
        }
    }
    Ok(())
}

/// Standard base64 (with padding) to bytes; `None` if malformed.
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    base64_simd::STANDARD.decode_to_vec(s.trim()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_md5s() {
        // MD5("") = d41d8cd98f00b204e9800998ecf8427e
        assert_eq!(
            hex(&base64_decode("1B2M2Y8AsgTpgAmY7PhCfg==").unwrap()),
            "d41d8cd98f00b204e9800998ecf8427e"
        );
        assert_eq!(base64_decode("Zm9v").unwrap(), b"foo");
        assert_eq!(base64_decode("Zm8=").unwrap(), b"fo");
        assert!(base64_decode("Zm8").is_none());
        assert!(base64_decode("Zm!v").is_none());
    }
}
