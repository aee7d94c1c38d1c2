//! The read path: map logical bytes to units, read them with O_DIRECT, verify, copy out.
//!
//! Readers do not go through the device thread. They copy the chunk's extent list under the
//! index's read lock, then read without any lock. A tail unit may be rewritten while it is
//! read; that is safe for the same reason it is crash-safe: the acknowledged bytes and the
//! footer describing them are rewritten with identical contents.

use crate::buf::AlignedBuf;
use crate::checksum;
use crate::error::{ChunkId, CorruptionKind, Error, Result};
use crate::format::footer;
use crate::format::segment::{self, SegHeader};
use crate::layout::LargePlan;
use crate::store::Shared;
use std::cell::RefCell;

thread_local! {
    static READ_BUF: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

pub(crate) fn read_into(
    shared: &Shared,
    chunk_id: ChunkId,
    offset: u64,
    out: &mut [u8],
) -> Result<()> {
    let geo = &shared.geo;
    let len = out.len() as u64;
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
            return Ok(());
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
    let span = (hi - lo + 1) as usize;
    let total = (span + headers.len()) * s;
    if (hi / upe) as usize >= extents.len() {
        // Only a chunk recovery found damaged can lack extents for its length.
        return Err(corrupt(geo.unit_of(offset) as u64 * d));
    }
    let mut buf = take_buf(total);
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
    let slot = |t: u32| -> &[u8] {
        if t >= lo {
            &buf[(t - lo) as usize * s..][..s]
        } else {
            let i = headers.iter().position(|&h| h == t).expect("header read");
            &buf[(span + i) * s..][..s]
        }
    };
    let mut written = 0usize;
    let mut checked: Vec<(u32, SegHeader)> = Vec::new();
    for (part, from, to) in parts {
        let n = (to - from) as usize;
        match part {
            Part::Unit(u) => {
                let unit = slot(u);
                let ustart = u as u64 * d;
                let (a, b) = ((from - ustart) as usize, (to - ustart) as usize);
                let st = footer::unit_state(geo.salt, unit, chunk_id, epoch, u, 0);
                let ok = st.is_some_and(|st| {
                    st.best.valid_len as usize >= b
                        || st.other.is_some_and(|o| o.valid_len as usize >= b)
                });
                if !ok {
                    put_buf(buf);
                    return Err(missing_or_corrupt(shared, chunk_id, epoch, ustart));
                }
                out[written..written + n].copy_from_slice(&unit[a..b]);
            }
            Part::Large { plan, at } => {
                let (append, p) = &plans[plan];
                let o = append.0;
                let mut a = at;
                let stop = at + n as u64;
                while a < stop {
                    let (seg, t) = p.locate(s, a).expect("located above");
                    let h = match checked.iter().find(|(x, _)| *x == seg.slot) {
                        Some((_, h)) => h,
                        None => {
                            let h = segment::header_at(
                                geo.salt,
                                slot(seg.slot),
                                chunk_id,
                                epoch,
                                seg.slot,
                                0,
                            )
                            .filter(|h| h.is_seg_of(*append, seg, s));
                            let Some(h) = h else {
                                put_buf(buf);
                                return Err(missing_or_corrupt(shared, chunk_id, epoch, o + a));
                            };
                            checked.push((seg.slot, h));
                            &checked.last().expect("pushed").1
                        }
                    };
                    let j = (t - seg.slot - 1) as usize;
                    let sstart = seg.data_off as u64 + j as u64 * s as u64;
                    let slen = (seg.data_off as u64 + seg.data_len as u64 - sstart).min(s as u64);
                    let bytes = &slot(t)[..slen as usize];
                    if checksum::crc32c(bytes) != h.slot_crcs[j] {
                        put_buf(buf);
                        return Err(missing_or_corrupt(shared, chunk_id, epoch, o + sstart));
                    }
                    let b = stop.min(sstart + slen);
                    let k = (b - a) as usize;
                    let w = written + (a - at) as usize;
                    out[w..w + k].copy_from_slice(&bytes[(a - sstart) as usize..][..k]);
                    a = b;
                }
            }
        }
        written += n;
    }
    put_buf(buf);
    debug_assert_eq!(written, out.len());
    Ok(())
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

/// This thread's read buffer if it holds `len` bytes, else a new one.
fn take_buf(len: usize) -> AlignedBuf {
    READ_BUF
        .with(|cell| cell.borrow_mut().take())
        .filter(|b| b.len() >= len)
        .unwrap_or_else(|| AlignedBuf::zeroed(len.next_power_of_two()))
}

/// Keeps `buf` for this thread's next read.
fn put_buf(buf: AlignedBuf) {
    READ_BUF.with(|cell| *cell.borrow_mut() = Some(buf));
}
