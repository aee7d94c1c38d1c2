//! The caller's half of an append: lay the bytes out as sector units and checksum them.
//!
//! The caller knows the offset it appends at, so it knows where every byte lands inside its
//! sector units (a unit holds `D` data bytes; logical byte `o` is byte `o % D` of unit
//! `o / D`). It copies the data into an aligned buffer in that layout and computes the CRC32C
//! of each unit's new bytes and of the whole append — on its own thread, in parallel with
//! other callers. The device thread is left with the per-append work that needs the chunk's
//! state: the bytes of a partly filled first unit, the footers, and the write itself. If the
//! offset turns out to be wrong, the device thread refuses the append without touching the
//! buffer.

use crate::buf::{AlignedBuf, BufPool};
use crate::checksum;
use crate::layout::{Geometry, LargePlan};
use std::sync::Arc;
use std::time::Instant;

/// Appends touching more units than this get their CRC by combining the units' CRCs.
const COMBINE_FROM_UNITS: usize = 16;

/// An append laid out in sector units.
pub(crate) struct Prepared {
    /// Logical offset the caller appends at.
    pub offset: u64,
    /// Bytes appended.
    pub len: usize,
    /// Units `first_unit ..` of the chunk: new bytes in place, footer slots and the bytes
    /// after the data zero; the bytes before the data in the first unit are filled in by
    /// the device thread. Empty when the offset is past any chunk's maximum length (such an
    /// append is refused with the chunk's length before anything reads the buffer).
    pub buf: AlignedBuf,
    pub first_unit: u32,
    /// CRC32C of the new bytes in each unit.
    pub unit_crcs: Vec<u32>,
    /// CRC32C of all the new bytes.
    pub crc: u32,
    /// A large append: `buf` then holds just its first and last units (`unit_crcs` their
    /// new bytes' CRCs) and the rest of its bytes are written from the caller's buffer.
    pub large: Option<Large>,
    /// When it was ready to queue (its CRCs done), for [`crate::Stats::append_queue_ns`].
    pub ready: Instant,
}

/// The part of a large append (docs/formats/chunk-store.md §3.2) beyond its two units.
pub(crate) struct Large {
    /// The caller's bytes, `[0, len)`, slot-aligned; written in place.
    pub data: Arc<AlignedBuf>,
    /// The buffer came from the pool (a copy made by `append(&[u8])`): it goes back.
    pub pooled: bool,
    pub plan: LargePlan,
    /// CRC32C of each S-byte slot of the data (the last one's bytes only).
    pub slot_crcs: Vec<u32>,
    /// One slot per segment header; the device thread encodes them.
    pub headers: AlignedBuf,
}

impl Prepared {
    pub fn new(geo: &Geometry, pool: &BufPool, offset: u64, data: &[u8]) -> Self {
        let plan = (offset <= geo.sb.max_chunk_bytes)
            .then(|| geo.plan_large(offset, data.len()))
            .flatten();
        let Some(plan) = plan else {
            return Self::new_units(geo, pool, offset, data);
        };
        // One copy into an aligned buffer (the caller's bytes may be anywhere), then the large
        // layout: the same bytes on the device as `new_aligned` writes.
        let mut buf = pool.take(data.len().next_multiple_of(geo.unit));
        buf[..data.len()].copy_from_slice(data);
        Self::new_large(geo, pool, offset, Arc::new(buf), data.len(), true, plan)
    }

    /// An append of `data[..len]` that is written from `data` itself when it is laid out as a
    /// large append; otherwise it is copied into units like any other.
    pub fn new_aligned(
        geo: &Geometry,
        pool: &BufPool,
        offset: u64,
        data: Arc<AlignedBuf>,
        len: usize,
        pooled: bool,
    ) -> Self {
        let s = geo.unit;
        let plan = (offset <= geo.sb.max_chunk_bytes
            && data.len() >= len.next_multiple_of(s)
            && (data.as_ptr() as usize).is_multiple_of(crate::buf::BUF_ALIGN))
        .then(|| geo.plan_large(offset, len))
        .flatten();
        let Some(plan) = plan else {
            let p = Self::new_units(geo, pool, offset, &data[..len]);
            if pooled && let Ok(b) = Arc::try_unwrap(data) {
                pool.give(b);
            }
            return p;
        };
        Self::new_large(geo, pool, offset, data, len, pooled, plan)
    }

    /// `data[..len]` laid out by `plan`: slot CRCs, the first and last units.
    fn new_large(
        geo: &Geometry,
        pool: &BufPool,
        offset: u64,
        data: Arc<AlignedBuf>,
        len: usize,
        pooled: bool,
        plan: LargePlan,
    ) -> Self {
        let s = geo.unit;
        let d = geo.data as u64;
        let bytes = &data[..len];
        let slot_crcs: Vec<u32> = bytes.chunks(s).map(checksum::crc32c).collect();
        let crc = slot_crcs
            .iter()
            .zip(bytes.chunks(s))
            .skip(1)
            .fold(slot_crcs[0], |c, (&x, piece)| {
                checksum::crc32c_combine(c, x, piece.len())
            });
        // The first unit gets the bytes up to its end, the last unit the bytes from its start.
        let mut buf = pool.take(2 * s);
        let from0 = (offset - plan.u0 as u64 * d) as usize;
        let head = geo.data - from0;
        let tail_at = (plan.u1 as u64 * d - offset) as usize;
        buf[..from0].fill(0);
        buf[from0..geo.data].copy_from_slice(&bytes[..head]);
        buf[geo.data..s].fill(0);
        buf[s..s + len - tail_at].copy_from_slice(&bytes[tail_at..]);
        buf[s + len - tail_at..2 * s].fill(0);
        let unit_crcs = vec![
            checksum::crc32c(&bytes[..head]),
            checksum::crc32c(&bytes[tail_at..]),
        ];
        let headers = pool.take(plan.segs.len() * s);
        Prepared {
            offset,
            len,
            buf,
            first_unit: plan.u0,
            unit_crcs,
            crc,
            large: Some(Large {
                data,
                pooled,
                plan,
                slot_crcs,
                headers,
            }),
            ready: Instant::now(),
        }
    }

    fn new_units(geo: &Geometry, pool: &BufPool, offset: u64, data: &[u8]) -> Self {
        let mut p = Prepared {
            offset,
            len: data.len(),
            buf: AlignedBuf::zeroed(0),
            first_unit: 0,
            unit_crcs: Vec::new(),
            crc: 0,
            large: None,
            ready: Instant::now(),
        };
        if data.is_empty() || offset > geo.sb.max_chunk_bytes {
            return p;
        }
        let (s, d) = (geo.unit, geo.data as u64);
        let end = offset + data.len() as u64;
        let (u0, u1) = (geo.unit_of(offset), geo.unit_of(end - 1));
        let n = (u1 - u0 + 1) as usize;
        p.buf = pool.take(n * s);
        p.first_unit = u0;
        p.unit_crcs.reserve_exact(n);
        let mut rest = data;
        for (i, unit) in p.buf[..n * s].chunks_exact_mut(s).enumerate() {
            let ustart = (u0 as u64 + i as u64) * d;
            let from = (offset.max(ustart) - ustart) as usize;
            let to = (end.min(ustart + d) - ustart) as usize;
            let (piece, tail) = rest.split_at(to - from);
            unit[from..to].copy_from_slice(piece);
            unit[to..].fill(0);
            p.unit_crcs.push(checksum::crc32c(piece));
            rest = tail;
        }
        // The whole append's CRC: a second pass over small appends; for large ones, the unit
        // CRCs combined (four table lookups per full unit, one general combine at the end).
        p.crc = if n <= COMBINE_FROM_UNITS {
            checksum::crc32c(data)
        } else {
            let shift = &geo.data_shift;
            let last = n - 1;
            let mut crc = p.unit_crcs[..last]
                .iter()
                .skip(1)
                .fold(p.unit_crcs[0], |c, &u| shift.combine(c, u));
            let last_len = (end - (u0 as u64 + last as u64) * d) as usize;
            crc = if last_len == shift.shift_len() {
                shift.combine(crc, p.unit_crcs[last])
            } else {
                checksum::crc32c_combine(crc, p.unit_crcs[last], last_len)
            };
            crc
        };
        p.ready = Instant::now();
        p
    }

    /// Units this append touches (a large append: its first and last unit only).
    pub fn units(&self) -> usize {
        self.unit_crcs.len()
    }

    /// Returns the buffers to the pool once the device is done with them.
    pub fn release(&mut self, pool: &BufPool) {
        pool.give(std::mem::replace(&mut self.buf, AlignedBuf::zeroed(0)));
        if let Some(l) = self.large.take() {
            pool.give(l.headers);
            if l.pooled
                && let Ok(b) = Arc::try_unwrap(l.data)
            {
                pool.give(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{FormatOptions, plan};

    fn geo() -> Geometry {
        Geometry::new(plan(&FormatOptions::default(), 1 << 30, 4096, [7; 16], 0).unwrap())
    }

    #[test]
    fn layout_and_crcs() {
        let g = geo();
        let pool = BufPool::default();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 31) as u8).collect();
        let offset = g.data as u64 - 100;
        let p = Prepared::new(&g, &pool, offset, &data);
        assert_eq!(p.first_unit, 0);
        assert_eq!(p.units(), 4); // 100 + 4016 + 4016 + 1868
        assert_eq!(&p.buf[g.data - 100..g.data], &data[..100]);
        assert_eq!(&p.buf[g.unit..g.unit + g.data], &data[100..100 + g.data]);
        assert_eq!(p.unit_crcs[0], checksum::crc32c(&data[..100]));
        assert_eq!(p.crc, checksum::crc32c(&data));
        for (offset, len) in [
            (0, 100_000),
            (5, 1 << 20),
            (g.data as u64, 17 * g.data),
            (7, 3 << 20),
        ] {
            let data: Vec<u8> = (0..len as u32).map(|i| (i * 13 + 1) as u8).collect();
            let p = Prepared::new(&g, &pool, offset, &data);
            assert_eq!(p.crc, checksum::crc32c(&data), "offset {offset} len {len}");
        }
        let last = &p.buf[3 * g.unit..4 * g.unit];
        assert!(last[10_000 - 100 - 2 * g.data..].iter().all(|&b| b == 0));
    }

    #[test]
    fn wild_offset_lays_out_nothing() {
        let g = geo();
        let p = Prepared::new(&g, &BufPool::default(), u64::MAX - 3, b"abcdef");
        assert_eq!(p.units(), 0);
        assert_eq!(p.len, 6);
    }

    #[test]
    fn pool_best_fit() {
        let pool = BufPool::default();
        pool.give(AlignedBuf::zeroed(1 << 20));
        pool.give(AlignedBuf::zeroed(8192));
        assert_eq!(pool.take(4096).len(), 8192);
        assert_eq!(pool.take(4096).len(), 1 << 20);
        assert_eq!(pool.take(5000).len(), 8192);
    }
}
