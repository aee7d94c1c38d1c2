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

use crate::buf::AlignedBuf;
use crate::checksum;
use crate::layout::Geometry;
use parking_lot::Mutex;

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
}

impl Prepared {
    pub fn new(geo: &Geometry, pool: &BufPool, offset: u64, data: &[u8]) -> Self {
        let mut p = Prepared {
            offset,
            len: data.len(),
            buf: AlignedBuf::zeroed(0),
            first_unit: 0,
            unit_crcs: Vec::new(),
            crc: 0,
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
        p
    }

    /// Units this append touches.
    pub fn units(&self) -> usize {
        self.unit_crcs.len()
    }
}

/// Write buffers shared by callers and the device thread, reused because fresh zeroed
/// memory costs a page fault per 4 KiB on first touch.
#[derive(Default)]
pub(crate) struct BufPool {
    bufs: Mutex<Vec<AlignedBuf>>,
}

/// Buffers kept, at most.
const POOL_BUFFERS: usize = 64;

impl BufPool {
    /// A buffer of at least `len` bytes (contents arbitrary): a pooled one that fits, or a
    /// new one.
    pub fn take(&self, len: usize) -> AlignedBuf {
        let mut bufs = self.bufs.lock();
        // Of the smallest that fit, the most recently returned: it is likeliest in cache.
        let best = bufs
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => bufs.remove(i),
            None => {
                drop(bufs);
                AlignedBuf::zeroed(len.next_power_of_two())
            }
        }
    }

    /// Returns a buffer for reuse; when the pool is full the smallest buffer goes.
    pub fn give(&self, buf: AlignedBuf) {
        if buf.is_empty() {
            return;
        }
        let mut bufs = self.bufs.lock();
        if bufs.len() < POOL_BUFFERS {
            bufs.push(buf);
            return;
        }
        if let Some((i, small)) = bufs.iter().enumerate().min_by_key(|(_, b)| b.len())
            && small.len() < buf.len()
        {
            bufs[i] = buf;
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
