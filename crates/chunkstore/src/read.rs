//! The read path: map logical bytes to units, read them with O_DIRECT, verify, copy out.
//!
//! Readers do not go through the device thread. They copy the chunk's extent list under the
//! index's read lock, then read without any lock. A tail unit may be rewritten while it is
//! read; that is safe for the same reason it is crash-safe: the acknowledged bytes and the
//! footer describing them are rewritten with identical contents.

use crate::buf::AlignedBuf;
use crate::error::{ChunkId, CorruptionKind, Error, Result};
use crate::format::footer;
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
    let (epoch, extents) = {
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
        let first = (geo.unit_of(offset) / geo.units_per_extent) as usize;
        let last = (geo.unit_of(offset + len - 1) / geo.units_per_extent) as usize;
        match c.extents.get(first..=last) {
            Some(e) => (c.epoch, e.to_vec()),
            // Only a chunk recovery found damaged can lack extents for its length.
            None => {
                let offset = geo.unit_of(offset) as u64 * geo.data as u64;
                return Err(Error::Corruption {
                    chunk_id,
                    offset,
                    kind: CorruptionKind::NoValidFooter,
                });
            }
        }
    };
    let (s, d, upe) = (geo.unit, geo.data as u64, geo.units_per_extent);
    let (u0, u1) = (geo.unit_of(offset), geo.unit_of(offset + len - 1));
    let first_extent = u0 / upe;
    let total = (u1 - u0 + 1) as usize * s;
    let mut buf = take_buf(total);
    // One read per physically contiguous run of extents the range touches, all in flight
    // together.
    let mut reads: Vec<(u64, &mut [u8])> = Vec::with_capacity(extents.len());
    let mut rest = &mut buf[..total];
    let mut ua = u0;
    while ua <= u1 {
        let rel = ua - first_extent * upe;
        let ub = u1.min(crate::writer::contiguous_end(&extents, rel, upe) + first_extent * upe);
        let (run, tail) = rest.split_at_mut((ub - ua + 1) as usize * s);
        let extent = extents[(ua / upe - first_extent) as usize];
        reads.push((geo.unit_offset(extent, ua), run));
        rest = tail;
        ua = ub + 1;
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
    let mut written = 0usize;
    for u in u0..=u1 {
        let unit = &buf[(u - u0) as usize * s..][..s];
        let ustart = u as u64 * d;
        let from = (offset.max(ustart) - ustart) as usize;
        let to = ((offset + len).min(ustart + d) - ustart) as usize;
        let st = footer::unit_state(geo.salt, unit, chunk_id, epoch, u, 0);
        let ok = st.and_then(|st| {
            if st.best.valid_len as usize >= to {
                Some(())
            } else {
                st.other.filter(|o| o.valid_len as usize >= to).map(|_| ())
            }
        });
        if ok.is_none() {
            put_buf(buf);
            return Err(missing_or_corrupt(shared, chunk_id, epoch, ustart));
        }
        out[written..written + (to - from)].copy_from_slice(&unit[from..to]);
        written += to - from;
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
