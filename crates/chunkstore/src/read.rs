//! The read path: map logical bytes to units, read them with O_DIRECT, verify, and hand the
//! verified bytes out where they landed ([`ReadBuf`]), with their CRC32C.
//!
//! Readers do not go through the device thread. They copy the chunk's extent list under the
//! index's read lock, then read without any lock. A tail unit may be rewritten while it is
//! read; that is safe for the same reason it is crash-safe: the acknowledged bytes and the
//! footer describing them are rewritten with identical contents.

use crate::buf::{AlignedBuf, BufPool};
use crate::checksum;
use crate::error::{ChunkId, CorruptionKind, Error, Result};
use crate::format::footer;
use crate::format::segment::{self, SegHeader};
use crate::layout::LargePlan;
use crate::store::Shared;
use parking_lot::Mutex;
use std::num::NonZeroUsize;
use std::sync::Arc;

/// Verified segment headers of acknowledged large appends, by `(chunk, epoch, slot)`.
///
/// A header inside an acknowledged append never changes while its chunk incarnation lives
/// (appends never rewrite a slot they do not own, and `(chunk, epoch)` names one
/// incarnation), so an entry needs no invalidation: after a delete it is never asked for
/// again, and a read that finds a cached header still checks the data slots against it.
pub(crate) struct HeaderCache(Option<Mutex<lru::LruCache<HeaderKey, Arc<SegHeader>>>>);

/// `(chunk, epoch, slot)` of a segment header.
type HeaderKey = (ChunkId, u64, u32);

impl HeaderCache {
    pub(crate) fn new(entries: usize) -> Self {
        Self(NonZeroUsize::new(entries).map(|n| Mutex::new(lru::LruCache::new(n))))
    }

    fn get(&self, key: HeaderKey) -> Option<Arc<SegHeader>> {
        self.0.as_ref()?.lock().get(&key).cloned()
    }

    fn put(&self, key: HeaderKey, h: Arc<SegHeader>) {
        if let Some(c) = &self.0 {
            c.lock().put(key, h);
        }
    }
}

/// Bytes read from a chunk, verified, still in the aligned buffer the device read them into:
/// the pieces of the units' and large appends' data slots that make up the range, in order.
/// A chunkserver writes them to its socket as they are; nothing copies them.
///
/// Dropping it returns the buffer to the store's pool.
pub struct ReadBuf {
    buf: Option<AlignedBuf>,
    /// Byte ranges of `buf`, in logical order.
    pieces: Vec<(usize, usize)>,
    len: usize,
    crc: u32,
    pool: Arc<BufPool>,
}

impl ReadBuf {
    /// Bytes in the range read.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// CRC32C of the bytes, combined from the CRCs they were verified against (and computed
    /// over at most the two partly read slots at the range's edges): an end-to-end check
    /// from the device to whoever receives them, without another pass over the bytes.
    pub fn crc32c(&self) -> u32 {
        self.crc
    }

    /// The bytes, in order, as slices of the read buffer.
    pub fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        let buf = self.buf.as_deref().unwrap_or(&[]);
        self.pieces.iter().map(move |&(a, b)| &buf[a..b])
    }

    /// Copies the bytes into `out`.
    ///
    /// # Panics
    /// If `out` is not exactly [`ReadBuf::len`] bytes.
    pub fn copy_to(&self, out: &mut [u8]) {
        assert_eq!(
            out.len(),
            self.len,
            "copy_to needs a buffer of the read's length"
        );
        let mut at = 0;
        for p in self.pieces() {
            out[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
    }

    /// The bytes as one vector (a copy).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for p in self.pieces() {
            v.extend_from_slice(p);
        }
        v
    }
}

impl std::fmt::Debug for ReadBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadBuf")
            .field("len", &self.len)
            .field("pieces", &self.pieces.len())
            .field("crc32c", &self.crc)
            .finish()
    }
}

impl Drop for ReadBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.give(b);
        }
    }
}

/// Reads `len` bytes at `offset` of a chunk, verified.
pub(crate) fn read_buf(
    shared: &Shared,
    chunk_id: ChunkId,
    offset: u64,
    len: usize,
) -> Result<ReadBuf> {
    let geo = &shared.geo;
    let len = len as u64;
    let end = offset.saturating_add(len);
    let (epoch, extents, large) = {
        let index = shared.index.read();
        let c = index
            .chunks
            .get(&chunk_id)
            .ok_or(Error::NotFound { chunk_id })?;
        if offset.checked_add(len).is_none_or(|e| e > c.length) {
            return Err(Error::OutOfRange {
                chunk_id,
                offset,
                len,
                length: c.length,
            });
        }
        if len == 0 {
            return Ok(ReadBuf {
                buf: None,
                pieces: Vec::new(),
                len: 0,
                crc: 0,
                pool: shared.read_pool.clone(),
            });
        }
        // Large appends whose middle the range reaches (their first and last units are
        // ordinary units).
        let first = c.large.partition_point(|&(o, n)| o + n as u64 <= offset);
        let large: Vec<(u64, u32)> = c.large[first..]
            .iter()
            .take_while(|&&(o, _)| o < end)
            .copied()
            .collect();
        (c.epoch, c.extents.clone(), large)
    };
    let corrupt = |at: u64| Error::Corruption {
        chunk_id,
        offset: at,
        kind: CorruptionKind::NoValidFooter,
    };
    let (s, d, upe) = (geo.unit, geo.data as u64, geo.units_per_extent);

    // What the range is made of, in order: bytes of units, and bytes of large appends'
    // middles (served from their data slots).
    enum Part {
        Unit(u32),
        Large { plan: usize, at: u64 },
    }
    // Each with its layout, which is a function of `(offset, length)`.
    let mut plans: Vec<((u64, u32), LargePlan)> = Vec::with_capacity(large.len());
    for &(o, n) in &large {
        let plan = geo.plan_large(o, n as usize).ok_or_else(|| corrupt(o))?;
        plans.push(((o, n), plan));
    }
    let mut parts: Vec<(Part, u64, u64)> = Vec::new();
    let (mut lo, mut hi) = (u32::MAX, 0u32);
    let mut headers: Vec<u32> = Vec::new();
    let mut pos = offset;
    let mut li = 0;
    while pos < end {
        while li < plans.len() && (plans[li].1.u1 as u64) * d <= pos {
            li += 1;
        }
        let u = geo.unit_of(pos);
        match plans.get(li) {
            Some(((o, _), p)) if p.u0 < u && u < p.u1 => {
                let to = end.min(p.u1 as u64 * d);
                let (a, b) = (pos - o, to - 1 - o);
                let (sa, ta) = p.locate(s, a).ok_or_else(|| corrupt(pos))?;
                let (sb, tb) = p.locate(s, b).ok_or_else(|| corrupt(pos))?;
                lo = lo.min(ta);
                hi = hi.max(tb);
                headers.extend(
                    p.segs
                        .iter()
                        .filter(|g| g.slot >= sa.slot && g.slot <= sb.slot)
                        .map(|g| g.slot),
                );
                parts.push((Part::Large { plan: li, at: a }, pos, to));
                pos = to;
            }
            _ => {
                let to = end.min((u as u64 + 1) * d);
                lo = lo.min(u);
                hi = hi.max(u);
                parts.push((Part::Unit(u), pos, to));
                pos = to;
            }
        }
    }
    // Every slot from `lo` to `hi` in one read per physically contiguous run, and the
    // headers below `lo` on their own, all in flight together.
    headers.retain(|&h| h < lo);
    headers.sort_unstable();
    headers.dedup();
    // Headers an earlier read verified need no device read.
    let mut checked: Vec<(u32, Arc<SegHeader>)> = Vec::new();
    headers.retain(|&h| match shared.headers.get((chunk_id, epoch, h)) {
        Some(hdr) => {
            shared
                .stats
                .header_cache_hits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            checked.push((h, hdr));
            false
        }
        None => true,
    });
    let span = (hi - lo + 1) as usize;
    let total = (span + headers.len()) * s;
    if (hi / upe) as usize >= extents.len() {
        // Only a chunk recovery found damaged can lack extents for its length.
        return Err(corrupt(geo.unit_of(offset) as u64 * d));
    }
    let mut buf = shared.read_pool.take(total);
    let mut reads: Vec<(u64, &mut [u8])> = Vec::with_capacity(4);
    let (mut rest, hdr_bufs) = buf[..total].split_at_mut(span * s);
    let mut ua = lo;
    while ua <= hi {
        let ub = hi.min(crate::writer::contiguous_end(&extents, ua, upe));
        let (run, tail) = rest.split_at_mut((ub - ua + 1) as usize * s);
        reads.push((geo.unit_offset(extents[(ua / upe) as usize], ua), run));
        rest = tail;
        ua = ub + 1;
    }
    for (&h, b) in headers.iter().zip(hdr_bufs.chunks_exact_mut(s)) {
        reads.push((geo.unit_offset(extents[(h / upe) as usize], h), b));
    }
    if let Some(e) = shared
        .disk
        .read_batch(&mut reads)
        .into_iter()
        .find_map(|r| r.err())
    {
        // The device may still complete a failed batch into the buffer: never reuse it.
        std::mem::forget(buf);
        return Err(Error::io("chunk read", e));
    }
    drop(reads);
    let slot_at = |t: u32| -> usize {
        if t >= lo {
            (t - lo) as usize * s
        } else {
            let i = headers.iter().position(|&h| h == t).expect("header read");
            (span + i) * s
        }
    };
    let slot = |t: u32| -> &[u8] { &buf[slot_at(t)..][..s] };
    // The range's bytes as pieces of `buf`, and their CRC, built up as they verify.
    let mut pieces: Vec<(usize, usize)> = Vec::new();
    let mut crc = 0u32;
    let mut push = |at: usize, n: usize, piece_crc: u32| {
        crc = checksum::crc32c_combine(crc, piece_crc, n);
        match pieces.last_mut() {
            Some(last) if last.1 == at => last.1 += n,
            _ => pieces.push((at, at + n)),
        }
    };
    for (part, from, to) in parts {
        let n = (to - from) as usize;
        match part {
            Part::Unit(u) => {
                let unit = slot(u);
                let ustart = u as u64 * d;
                let (a, b) = ((from - ustart) as usize, (to - ustart) as usize);
                let st = footer::unit_state(geo.salt, unit, chunk_id, epoch, u, 0);
                let covering = st.and_then(|st| {
                    [Some(st.best), st.other]
                        .into_iter()
                        .flatten()
                        .find(|f| f.valid_len as usize >= b)
                });
                let Some(f) = covering else {
                    shared.read_pool.give(buf);
                    return Err(missing_or_corrupt(shared, chunk_id, epoch, ustart));
                };
                // The footer's CRC covers the unit's first `valid_len` bytes.
                let piece_crc = if a == 0 && b == f.valid_len as usize {
                    f.data_crc
                } else {
                    checksum::crc32c(&unit[a..b])
                };
                push(slot_at(u) + a, b - a, piece_crc);
            }
            Part::Large { plan, at } => {
                let (append, p) = &plans[plan];
                let o = append.0;
                let mut a = at;
                let stop = at + n as u64;
                while a < stop {
                    let (seg, t) = p.locate(s, a).expect("located above");
                    let h = match checked.iter().position(|(x, _)| *x == seg.slot) {
                        // (A cached header is checked again: it guards the index below.)
                        Some(i) if checked[i].1.is_seg_of(*append, seg, s) => &checked[i].1,
                        Some(_) => {
                            shared.read_pool.give(buf);
                            return Err(missing_or_corrupt(shared, chunk_id, epoch, o + a));
                        }
                        None => {
                            // A header inside the range read: verify it and keep it for
                            // the reads after this one.
                            let h = segment::header_at(
                                geo.salt,
                                slot(seg.slot),
                                chunk_id,
                                epoch,
                                seg.slot,
                                0,
                            )
                            .filter(|h| h.is_seg_of(*append, seg, s));
                            let Some(h) = h.map(Arc::new) else {
                                shared.read_pool.give(buf);
                                return Err(missing_or_corrupt(shared, chunk_id, epoch, o + a));
                            };
                            shared.headers.put((chunk_id, epoch, seg.slot), h.clone());
                            checked.push((seg.slot, h));
                            &checked.last().expect("pushed").1
                        }
                    };
                    let j = (t - seg.slot - 1) as usize;
                    let sstart = seg.data_off as u64 + j as u64 * s as u64;
                    let slen = (seg.data_off as u64 + seg.data_len as u64 - sstart).min(s as u64);
                    let bytes = &slot(t)[..slen as usize];
                    if checksum::crc32c(bytes) != h.slot_crcs[j] {
                        shared.read_pool.give(buf);
                        return Err(missing_or_corrupt(shared, chunk_id, epoch, o + sstart));
                    }
                    let b = stop.min(sstart + slen);
                    let (ka, kb) = ((a - sstart) as usize, (b - sstart) as usize);
                    let piece_crc = if ka == 0 && kb == bytes.len() {
                        h.slot_crcs[j]
                    } else {
                        checksum::crc32c(&bytes[ka..kb])
                    };
                    push(slot_at(t) + ka, kb - ka, piece_crc);
                    a = b;
                }
            }
        }
    }
    debug_assert_eq!(pieces.iter().map(|(a, b)| b - a).sum::<usize>() as u64, len);
    Ok(ReadBuf {
        buf: Some(buf),
        pieces,
        len: len as usize,
        crc,
        pool: shared.read_pool.clone(),
    })
}

/// A unit did not verify: either the chunk was deleted (and its extent reused) while we read,
/// or the device returned bad bytes.
fn missing_or_corrupt(shared: &Shared, chunk_id: ChunkId, epoch: u64, offset: u64) -> Error {
    match shared.index.read().chunks.get(&chunk_id) {
        Some(c) if c.epoch == epoch => Error::Corruption {
            chunk_id,
            offset,
            kind: CorruptionKind::NoValidFooter,
        },
        _ => Error::NotFound { chunk_id },
    }
}
