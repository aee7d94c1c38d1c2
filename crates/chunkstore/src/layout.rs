//! Geometry: where a chunk's logical byte lives on the device, and how `format` lays out the
//! regions (docs/formats/chunk-store.md §1, §3).

use crate::format::checkpoint::slot_bytes_needed;
use crate::format::footer;
use crate::format::segment;
use crate::format::superblock::Superblock;

/// Derived constants of a formatted store.
#[derive(Debug, Clone)]
pub struct Geometry {
    pub sb: Superblock,
    /// S: bytes per sector unit.
    pub unit: usize,
    /// D: data bytes per unit.
    pub data: usize,
    pub units_per_extent: u32,
    pub extent_bytes: u64,
    pub log_blocks: u64,
    pub salt: u32,
    /// Combines a CRC with the CRC of one unit's worth (D bytes) of data.
    pub data_shift: std::sync::Arc<crate::checksum::CrcShift>,
    /// Large appends can be laid out (a segment header holds the CRCs of a whole extent).
    pub large: bool,
}

impl Geometry {
    pub fn new(sb: Superblock) -> Self {
        let unit = sb.unit_bytes as usize;
        Self {
            unit,
            data: footer::data_bytes(unit),
            units_per_extent: sb.extent_bytes / sb.unit_bytes,
            extent_bytes: sb.extent_bytes as u64,
            log_blocks: sb.log_bytes / sb.unit_bytes as u64,
            salt: crate::checksum::salt_of(&sb.store_id),
            data_shift: std::sync::Arc::new(crate::checksum::CrcShift::new(footer::data_bytes(
                sb.unit_bytes as usize,
            ))),
            large: segment::max_slots(unit) >= (sb.extent_bytes / sb.unit_bytes) as usize,
            sb,
        }
    }

    /// Extents a chunk of the maximum size spans.
    pub fn extents_per_chunk(&self) -> u32 {
        let units = self.sb.max_chunk_bytes.div_ceil(self.data as u64);
        units
            .div_ceil(self.units_per_extent as u64)
            .min(u32::MAX as u64) as u32
    }

    /// Unit index holding logical offset `off`.
    pub fn unit_of(&self, off: u64) -> u32 {
        (off / self.data as u64) as u32
    }

    /// Device offset of unit `u` of a chunk whose extent for it is `extent`.
    pub fn unit_offset(&self, extent: u32, u: u32) -> u64 {
        self.sb.data_offset
            + extent as u64 * self.extent_bytes
            + (u % self.units_per_extent) as u64 * self.unit as u64
    }

    /// Device offset of the first byte of extent `e`.
    pub fn extent_offset(&self, e: u32) -> u64 {
        self.sb.data_offset + e as u64 * self.extent_bytes
    }

    /// Device offset of log block `lsn`.
    pub fn log_block_offset(&self, lsn: u64) -> u64 {
        self.sb.log_offset + (lsn % self.log_blocks) * self.unit as u64
    }

    /// Extents a chunk of `length` logical bytes occupies.
    pub fn extents_for(&self, length: u64) -> usize {
        let units = length.div_ceil(self.data as u64);
        units.div_ceil(self.units_per_extent as u64) as usize
    }
}

pub use crate::format::segment::LARGE_MIN_BYTES;

/// Where a large append's bytes go (docs/formats/chunk-store.md §3.2): its first and last
/// units `u0` and `u1` are ordinary sector units; every slot strictly between them holds a
/// segment header or the append's own bytes, contiguous and slot-aligned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LargePlan {
    pub u0: u32,
    pub u1: u32,
    /// In slot order, covering every slot in `u0 + 1 .. u1`.
    pub segs: Vec<Seg>,
}

/// One segment: a header slot and the data slots after it (none for a filler).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    /// The header's slot (unit index in the chunk).
    pub slot: u32,
    /// Offset of its first data byte inside the append (a multiple of S).
    pub data_off: u32,
    pub data_len: u32,
}

impl Seg {
    /// Data slots after the header.
    pub fn data_slots(&self, unit: usize) -> u32 {
        (self.data_len as usize).div_ceil(unit) as u32
    }
}

impl LargePlan {
    /// The segment holding append byte `at` and the slot it is in.
    pub fn locate(&self, unit: usize, at: u64) -> Option<(&Seg, u32)> {
        let seg = self
            .segs
            .iter()
            .find(|s| (s.data_off as u64..s.data_off as u64 + s.data_len as u64).contains(&at))?;
        Some((
            seg,
            seg.slot + 1 + ((at - seg.data_off as u64) / unit as u64) as u32,
        ))
    }
}

impl Geometry {
    /// The layout of an append of `len` bytes at logical `offset` as a large append, or `None`
    /// when it goes into sector units (too short, or its bytes and headers do not fit in the
    /// slots the units between its first and last would take).
    pub fn plan_large(&self, offset: u64, len: usize) -> Option<LargePlan> {
        if !self.large || len < LARGE_MIN_BYTES || len > u32::MAX as usize {
            return None;
        }
        let (s, upe) = (self.unit, self.units_per_extent);
        let u0 = self.unit_of(offset);
        let u1 = self.unit_of(offset + len as u64 - 1);
        let mut segs = Vec::new();
        let mut done = 0usize;
        let mut k = u0 + 1;
        while k < u1 {
            // This segment's slots: up to the end of the extent or the slot before u1.
            let last = u1.min((k / upe + 1) * upe) - 1;
            let room = (last - k) as usize * s;
            let take = room.min(len - done);
            segs.push(Seg {
                slot: k,
                data_off: done as u32,
                data_len: take as u32,
            });
            done += take;
            k += 1 + take.div_ceil(s) as u32;
        }
        (done == len).then_some(LargePlan { u0, u1, segs })
    }
}

/// Parameters of `format`.
#[derive(Debug, Clone)]
pub struct FormatOptions {
    /// Sector-unit size; a power of two, a multiple of the device alignment. Default 4096.
    pub unit_bytes: u32,
    /// Allocation granularity. Default 1 MiB.
    pub extent_bytes: u32,
    /// Largest chunk. Default 64 MiB.
    pub max_chunk_bytes: u64,
    /// Capacity of the chunk table; default two chunks per extent.
    pub max_chunks: Option<u32>,
    /// Operation-log ring size; default 64 MiB, or 1/16 of a small device.
    pub log_bytes: Option<u64>,
}

impl Default for FormatOptions {
    fn default() -> Self {
        Self {
            unit_bytes: 4096,
            extent_bytes: 1 << 20,
            max_chunk_bytes: 64 << 20,
            max_chunks: None,
            log_bytes: None,
        }
    }
}

/// Computes the superblock for a device of `device_bytes` with `alignment`.
pub fn plan(
    opts: &FormatOptions,
    device_bytes: u64,
    alignment: usize,
    store_id: [u8; 16],
    now_ms: u64,
) -> Result<Superblock, &'static str> {
    let unit = opts.unit_bytes as u64;
    let ext = opts.extent_bytes as u64;
    if !unit.is_power_of_two() || !(1024..=65536).contains(&unit) {
        return Err("unit_bytes must be a power of two in 1024..=65536");
    }
    if !unit.is_multiple_of(alignment as u64) {
        return Err("unit_bytes must be a multiple of the device's O_DIRECT alignment");
    }
    if !ext.is_multiple_of(unit) || ext < unit || ext / unit > 65536 {
        return Err("extent_bytes must be a multiple of unit_bytes, at most 65536 units");
    }
    let log_bytes = opts
        .log_bytes
        .unwrap_or_else(|| (64u64 << 20).min((device_bytes / 16) / ext * ext).max(ext));
    let log_bytes = log_bytes.div_ceil(ext) * ext;
    let total_extents = device_bytes / ext;
    // Superblock extent + log; checkpoint slots depend on the extent count, which depends on
    // them: solve by shrinking until it fits.
    let mut extent_count = total_extents.saturating_sub(1 + log_bytes / ext);
    loop {
        let max_chunks = opts
            .max_chunks
            .unwrap_or((extent_count.saturating_mul(2)).min(u32::MAX as u64) as u32)
            .max(1);
        let max_large = segment::max_large_appends(extent_count as u32, opts.extent_bytes);
        let slot =
            slot_bytes_needed(max_chunks, extent_count as u32, max_large).div_ceil(ext) * ext;
        let meta_extents = 1 + 2 * slot / ext + log_bytes / ext;
        if meta_extents + extent_count <= total_extents {
            if extent_count == 0 {
                return Err("device too small");
            }
            let sb = Superblock {
                unit_bytes: opts.unit_bytes,
                extent_bytes: opts.extent_bytes,
                device_bytes,
                max_chunk_bytes: opts.max_chunk_bytes,
                max_chunks,
                extent_count: u32::try_from(extent_count).map_err(|_| "too many extents")?,
                ckpt_offsets: [ext, ext + slot],
                ckpt_slot_bytes: slot,
                log_offset: ext + 2 * slot,
                log_bytes,
                data_offset: ext + 2 * slot + log_bytes,
                store_id,
                created_unix_ms: now_ms,
            };
            sb.validate().map_err(|_| "inconsistent geometry")?;
            return Ok(sb);
        }
        if extent_count == 0 {
            return Err("device too small");
        }
        extent_count -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_small_and_large() {
        let sb = plan(&FormatOptions::default(), 64 << 20, 512, [1; 16], 0).unwrap();
        assert!(sb.extent_count > 40, "{sb:?}");
        let sb = plan(&FormatOptions::default(), 10 << 30, 512, [1; 16], 0).unwrap();
        let g = Geometry::new(sb);
        assert_eq!(g.units_per_extent, 256);
        assert_eq!(g.data, 4016);
        assert!(g.sb.extent_count > 10_000 - 100);
        assert_eq!(g.extents_for(64 << 20), 66);
        assert!(plan(&FormatOptions::default(), 2 << 20, 512, [1; 16], 0).is_err());
    }
}
