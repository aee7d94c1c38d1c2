//! Pack compaction: the space of deleted and overwritten small objects comes back.
//!
//! Every gateway runs a compactor. It asks the masters for closed packs (no writer holds them)
//! whose live bytes are a small share of their length, walks each one record by record, and
//! for every record the index still names, appends a copy to the gateway's own open pack and
//! moves the object to it — a conditional change that applies only if the object is still the
//! same version and still names the old record, so a concurrent overwrite or delete simply
//! wins. Once no object names the pack, the masters delete it. Reading and rewriting are
//! capped at `bytes_per_sec`, so foreground requests keep the disks.
//!
//! Two gateways compacting the same pack at once are safe: the second one's moves find the
//! records already moved and are refused; its copies are dead bytes of its own pack.

use crate::data::DataStore;
use crate::pack;
use crate::{change, now_ms, query};
use bytes::{Buf, BytesMut};
use cairn_rpc::object::{Extent, ObjectOp, ObjectQuery, PackCandidate, QueryReply};
use s3s::S3ErrorCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Compactor settings.
#[derive(Debug, Clone)]
pub struct CompactOptions {
    /// A pack is compacted when its live bytes are under this percentage of its length.
    pub live_pct: u8,
    /// How often the compactor looks for work.
    pub every: Duration,
    /// Bytes read plus bytes rewritten per second, at most.
    pub bytes_per_sec: u64,
    /// A freed file (a replaced large object, a dropped pack) is deleted this long after this
    /// gateway first saw it in the trash (and never while one of its GETs reads it), so that
    /// GETs of other gateways that had already found it get to start reading.
    pub free_grace: Duration,
    /// How often the trash is looked at.
    pub trash_every: Duration,
    /// A file of the blob directory that nothing names and nobody has written to for this
    /// long (an upload that failed, a gateway that died mid-PUT) is deleted; also how often
    /// the directory is swept.
    pub sweep_after: Duration,
}

impl Default for CompactOptions {
    fn default() -> Self {
        Self {
            live_pct: 50,
            every: Duration::from_secs(60),
            bytes_per_sec: 32 << 20,
            free_grace: Duration::from_secs(5),
            trash_every: Duration::from_secs(1),
            sweep_after: Duration::from_secs(60),
        }
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    pub packs_dropped: u64,
    pub records_moved: u64,
    pub bytes_moved: u64,
}

/// Empties the trash every `trash_every` and runs a compaction pass every `every`, forever.
///
/// Freed space comes back within seconds (a deleted or replaced object's file, a dropped
/// pack): a full cluster is not kept full by what its users deleted.
pub async fn run(data: Arc<DataStore>, opts: CompactOptions) {
    let mut trash = Trash::default();
    let mut last_pass = Instant::now();
    let mut last_sweep = Instant::now();
    loop {
        tokio::time::sleep(opts.trash_every.min(opts.every)).await;
        if last_sweep.elapsed() >= opts.sweep_after {
            last_sweep = Instant::now();
            match sweep(&data, opts.sweep_after).await {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(files = n, "swept files no object names");
                    metrics::counter!("cairn_s3_swept_files_total").increment(n);
                }
                Err(e) => tracing::warn!(error = %e, "sweeping the blob directory failed"),
            }
        }
        match trash.empty(&data, opts.free_grace).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(files = n, "emptied the trash");
                metrics::counter!("cairn_s3_trash_deleted_total").increment(n);
            }
            Err(e) => tracing::warn!(error = %e, "emptying the trash failed"),
        }
        if last_pass.elapsed() < opts.every {
            continue;
        }
        last_pass = Instant::now();
        match pass(&data, &opts).await {
            Ok(p) if p != Pass::default() => {
                tracing::info!(?p, "compacted packs");
                metrics::counter!("cairn_s3_compaction_packs_dropped_total")
                    .increment(p.packs_dropped);
                metrics::counter!("cairn_s3_compaction_bytes_moved_total").increment(p.bytes_moved);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "compaction pass failed"),
        }
    }
}

/// One pass over the current candidates.
///
/// # Errors
/// The masters could not be asked for candidates.
pub async fn pass(data: &DataStore, opts: &CompactOptions) -> Result<Pass, String> {
    let mut candidates = Vec::new();
    // Each data directory's packs (the root's and every bucket shard's).
    for dir in data.places.all().await.map_err(|e| e.to_string())? {
        let q = ObjectQuery::CompactionCandidates {
            dir: format!("{dir}/packs"),
            now_ms: now_ms(),
            live_pct: opts.live_pct,
            max: 16,
        };
        match query(&data.client, &q).await {
            Ok(QueryReply::Packs(p)) => candidates.extend(p),
            Ok(_) => return Err("candidates answered with something else".into()),
            Err(e) => return Err(e.to_string()),
        }
    }
    let mut total = Pass::default();
    let mut throttle = Throttle::new(opts.bytes_per_sec);
    for c in candidates {
        match compact(data, &c, &mut throttle).await {
            Ok(p) => {
                total.packs_dropped += p.packs_dropped;
                total.records_moved += p.records_moved;
                total.bytes_moved += p.bytes_moved;
            }
            Err(e) => tracing::warn!(pack = %c.path, error = %e, "pack not compacted"),
        }
    }
    Ok(total)
}

/// Moves the live records out of one pack, then drops it.
async fn compact(
    data: &DataStore,
    c: &PackCandidate,
    throttle: &mut Throttle,
) -> Result<Pass, String> {
    let mut done = Pass::default();
    if c.live_objects > 0 {
        let mut buf = BytesMut::new();
        // File offset of buf[0], and of the next byte to read.
        let (mut base, mut next) = (0u64, 0u64);
        while base < c.length {
            let rec = match pack::decode(&buf) {
                Ok(r) if (buf.len() as u64) >= r.data_offset as u64 + r.data_len => r,
                Ok(_) | Err(pack::RecordError::Truncated(_)) => {
                    if next >= c.length {
                        return Err(format!("a record runs past the end at {base}"));
                    }
                    let n = (c.length - next).min(crate::data::READ_PIECE);
                    throttle.take(n).await;
                    let bytes = data
                        .client
                        .read(&c.path, next, n as usize)
                        .await
                        .map_err(|e| e.to_string())?;
                    buf.extend_from_slice(&bytes);
                    next += n;
                    continue;
                }
                Err(e) => return Err(format!("record at {base}: {e}")),
            };
            let from = Extent {
                path: c.path.clone(),
                offset: base + rec.data_offset as u64,
                len: rec.data_len,
                shared: true,
            };
            buf.advance(rec.data_offset);
            let body = buf.split_to(rec.data_len as usize).freeze();
            if crc32c::crc32c(&body) != rec.data_crc {
                return Err(format!("record at {base}: data checksum mismatch"));
            }
            base = from.offset + from.len;
            if move_if_live(data, &rec.bucket, &rec.key, from, body, throttle).await? {
                done.records_moved += 1;
                done.bytes_moved += rec.data_len;
            }
        }
    }
    let op = ObjectOp::DropPack {
        path: c.path.clone(),
        now_ms: now_ms(),
    };
    change(&data.client, &op).await.map_err(|e| e.to_string())?;
    done.packs_dropped += 1;
    Ok(done)
}

/// Copies a record the index still names into this gateway's pack and moves the object there.
async fn move_if_live(
    data: &DataStore,
    bucket: &str,
    key: &str,
    from: Extent,
    body: bytes::Bytes,
    throttle: &mut Throttle,
) -> Result<bool, String> {
    let q = ObjectQuery::Locate {
        bucket: bucket.to_owned(),
        key: key.to_owned(),
    };
    let o = match query(&data.client, &q).await {
        Ok(QueryReply::Object(o)) => o,
        Ok(_) => return Err("Locate answered with something else".into()),
        Err(e) if matches!(e.code(), S3ErrorCode::NoSuchKey | S3ErrorCode::NoSuchBucket) => {
            return Ok(false);
        }
        Err(e) => return Err(e.to_string()),
    };
    if !o.extents.contains(&from) {
        return Ok(false); // dead: overwritten or deleted since
    }
    throttle.take(from.len).await;
    let to = data
        .places
        .of(bucket, key)
        .await
        .map_err(|e| e.to_string())?
        .packs
        .put(bucket, key, body)
        .await
        .map_err(|e| e.to_string())?;
    let op = ObjectOp::MoveExtent {
        bucket: bucket.to_owned(),
        key: key.to_owned(),
        put_id: o.put_id,
        from,
        to,
    };
    match data.commit(&op).await {
        Ok(_) => Ok(true),
        // Overwritten or deleted meanwhile: the copy is dead, the writer won.
        Err(e) if e.code() == &S3ErrorCode::NoSuchKey => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

/// Deletes the files of the blob directory that no object or upload names and that nobody
/// wrote to for `idle` (a writer's lease renewals and every chunk it allocates touch the
/// file's mtime): the leftovers of a PUT that failed without cleaning up (its gateway died).
/// Returns how many.
///
/// # Errors
/// The masters could not be asked.
pub async fn sweep(data: &DataStore, idle: Duration) -> Result<u64, String> {
    let mut swept = 0;
    for dir in data.places.all().await.map_err(|e| e.to_string())? {
        swept += sweep_dir(data, &format!("{dir}/blobs"), idle).await?;
    }
    Ok(swept)
}

/// [`sweep`] of one blob directory.
async fn sweep_dir(data: &DataStore, blob_dir: &str, idle: Duration) -> Result<u64, String> {
    let entries = match data.client.list(blob_dir).await {
        Ok(e) => e,
        Err(cairn_client::Error::Meta(e)) if e.kind == cairn_rpc::ErrorKind::NotFound => {
            return Ok(0);
        }
        Err(e) => return Err(e.to_string()),
    };
    let before = now_ms().saturating_sub(idle.as_millis() as u64);
    let idle: Vec<String> = entries
        .iter()
        .filter(|e| !e.is_dir && e.mtime_ms < before)
        .map(|e| format!("{blob_dir}/{}", e.name))
        .collect();
    let mut swept = 0;
    for paths in idle.chunks(1000) {
        let q = ObjectQuery::Unnamed {
            paths: paths.to_vec(),
        };
        let unnamed = match query(&data.client, &q).await {
            Ok(QueryReply::Unnamed(u)) => u,
            Ok(_) => return Err("the sweep's query answered with something else".into()),
            Err(e) => return Err(e.to_string()),
        };
        for p in unnamed {
            match data.client.delete(&p).await {
                Ok(()) => swept += 1,
                Err(e) => tracing::warn!(path = %p, error = %e, "sweeping a file failed"),
            }
        }
    }
    Ok(swept)
}

/// Files this gateway saw in the trash, and when it first did.
#[derive(Default)]
pub struct Trash {
    seen: std::collections::HashMap<String, Instant>,
}

impl Trash {
    /// Deletes what was in the trash `grace` ago and still is, except what this gateway's
    /// GETs are reading now; returns how many.
    ///
    /// # Errors
    /// The masters could not be asked.
    pub async fn empty(&mut self, data: &DataStore, grace: Duration) -> Result<u64, String> {
        let now = Instant::now();
        let listed = match query(&data.client, &ObjectQuery::Trash { max: 1000 }).await {
            Ok(QueryReply::Trash(t)) => t,
            Ok(_) => return Err("the trash answered with something else".into()),
            Err(e) => return Err(e.to_string()),
        };
        self.seen.retain(|p, _| listed.contains(p));
        let due: Vec<String> = listed
            .into_iter()
            .filter(|p| now.duration_since(*self.seen.entry(p.clone()).or_insert(now)) >= grace)
            .filter(|p| !data.reading.contains(p))
            .collect();
        if due.is_empty() {
            return Ok(0);
        }
        let n = due.len() as u64;
        // One change per partition: each empties its own trash.
        let mut by_place: std::collections::BTreeMap<Option<u32>, Vec<String>> =
            std::collections::BTreeMap::new();
        for p in due {
            by_place
                .entry(cairn_rpc::object::data_dir_shard(&p))
                .or_default()
                .push(p);
        }
        for paths in by_place.into_values() {
            change(&data.client, &ObjectOp::EmptyTrash { paths })
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(n)
    }
}

/// A token bucket of bytes per second (one second of burst).
struct Throttle {
    rate: u64,
    tokens: f64,
    at: Instant,
}

impl Throttle {
    fn new(rate: u64) -> Self {
        Self {
            rate: rate.max(1),
            tokens: rate.max(1) as f64,
            at: Instant::now(),
        }
    }

    async fn take(&mut self, n: u64) {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate as f64)
            .min(self.rate as f64);
        self.at = now;
        self.tokens -= n as f64;
        if self.tokens < 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(-self.tokens / self.rate as f64)).await;
        }
    }
}
