//! Segment headers of large appends (docs/formats/chunk-store.md §3.2).
//!
//! A large append keeps the caller's bytes contiguous on the device: they fill whole slots
//! after a segment header, one segment per extent the append's middle touches. The header
//! carries the CRC32C of every data slot after it, so that a read of any part verifies what
//! it returns, and names the whole append so that recovery can check the segment belongs
//! where it is found.

use super::{DecodeError, Reader};
use crate::checksum;
use crate::layout::Seg;

const MAGIC: &[u8; 4] = b"CSEG";
const VERSION: u8 = 1;
/// Bytes of the fixed part of a header, before the slot CRCs.
pub const HEADER_BYTES: usize = 64;

/// Appends shorter than this always go into sector units. It bounds how many large appends a
/// store holds, which sizes the checkpoint slots.
pub const LARGE_MIN_BYTES: usize = 512 << 10;

/// Most large appends a store of `extent_count` extents of `extent_bytes` can hold.
pub const fn max_large_appends(extent_count: u32, extent_bytes: u32) -> u64 {
    extent_count as u64 * extent_bytes as u64 / LARGE_MIN_BYTES as u64
}

/// A decoded segment header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegHeader {
    pub chunk_id: u64,
    pub epoch: u64,
    /// The chunk's slot (unit index) holding this header.
    pub unit_index: u32,
    pub mount_gen: u32,
    /// Logical offset of the append's first byte.
    pub append_offset: u64,
    /// Bytes of the whole append.
    pub append_len: u32,
    /// Offset inside the append of this segment's first data byte.
    pub data_off: u32,
    /// Data bytes in this segment (0 for a filler header).
    pub data_len: u32,
    /// CRC32C of each data slot's bytes (the last slot's first `data_len mod S` bytes).
    pub slot_crcs: Vec<u32>,
}

/// Most slot CRCs a header of `unit_bytes` can carry.
pub const fn max_slots(unit_bytes: usize) -> usize {
    (unit_bytes - HEADER_BYTES) / 4
}

impl SegHeader {
    /// Encodes into `out` (one whole slot): the fixed part, the slot CRCs, zeros after them.
    ///
    /// # Panics
    /// If the CRCs do not fit the slot.
    pub fn encode(&self, salt: u32, out: &mut [u8]) {
        let n = self.slot_crcs.len();
        assert!(
            n <= max_slots(out.len()),
            "segment header overflows its slot"
        );
        out[0..4].copy_from_slice(MAGIC);
        out[4] = VERSION;
        out[5] = 0;
        out[6..8].copy_from_slice(&(n as u16).to_le_bytes());
        out[8..16].copy_from_slice(&self.chunk_id.to_le_bytes());
        out[16..24].copy_from_slice(&self.epoch.to_le_bytes());
        out[24..28].copy_from_slice(&self.unit_index.to_le_bytes());
        out[28..32].copy_from_slice(&self.mount_gen.to_le_bytes());
        out[32..40].copy_from_slice(&self.append_offset.to_le_bytes());
        out[40..44].copy_from_slice(&self.append_len.to_le_bytes());
        out[44..48].copy_from_slice(&self.data_off.to_le_bytes());
        out[48..52].copy_from_slice(&self.data_len.to_le_bytes());
        out[52..60].fill(0);
        for (i, c) in self.slot_crcs.iter().enumerate() {
            out[HEADER_BYTES + 4 * i..][..4].copy_from_slice(&c.to_le_bytes());
        }
        out[HEADER_BYTES + 4 * n..].fill(0);
        let crc = header_crc(salt, &out[..60], &out[HEADER_BYTES..HEADER_BYTES + 4 * n]);
        out[60..64].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes a header slot, checking magic, version, reserved bytes, the salted CRC and
    /// the internal consistency of the lengths. It does not check the data.
    pub fn decode(salt: u32, bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.take(4)? != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = r.u8()?;
        if version != VERSION {
            return Err(DecodeError::Version(version as u32));
        }
        let flags = r.u8()?;
        let n = r.u16()? as usize;
        let chunk_id = r.u64()?;
        let epoch = r.u64()?;
        let unit_index = r.u32()?;
        let mount_gen = r.u32()?;
        let append_offset = r.u64()?;
        let append_len = r.u32()?;
        let data_off = r.u32()?;
        let data_len = r.u32()?;
        let reserved = r.u64()?;
        let crc = r.u32()?;
        let crcs = r.take(4 * n)?;
        if header_crc(salt, &bytes[..60], crcs) != crc {
            return Err(DecodeError::Checksum);
        }
        if flags != 0 || reserved != 0 {
            return Err(DecodeError::Invalid {
                field: "reserved",
                value: flags as u64 | reserved,
            });
        }
        if data_off as u64 + data_len as u64 > append_len as u64 {
            return Err(DecodeError::Invalid {
                field: "data_len",
                value: data_len as u64,
            });
        }
        if (n == 0) != (data_len == 0) {
            return Err(DecodeError::Invalid {
                field: "slot_count",
                value: n as u64,
            });
        }
        if append_offset.checked_add(append_len as u64).is_none() {
            return Err(DecodeError::Invalid {
                field: "append_offset",
                value: append_offset,
            });
        }
        let slot_crcs = crcs
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        Ok(Self {
            chunk_id,
            epoch,
            unit_index,
            mount_gen,
            append_offset,
            append_len,
            data_off,
            data_len,
            slot_crcs,
        })
    }
}

impl SegHeader {
    /// Whether it is the header the layout puts at `seg` of the append `(offset, len)`.
    pub(crate) fn is_seg_of(&self, append: (u64, u32), seg: &Seg, unit_bytes: usize) -> bool {
        (self.append_offset, self.append_len) == append
            && self.data_off == seg.data_off
            && self.data_len == seg.data_len
            && self.slot_crcs.len() == seg.data_slots(unit_bytes) as usize
    }
}

/// Decodes `bytes` as a header valid for slot `unit_index` of `(chunk_id, epoch)` written
/// by mount generation `min_gen` or later.
pub fn header_at(
    salt: u32,
    bytes: &[u8],
    chunk_id: u64,
    epoch: u64,
    unit_index: u32,
    min_gen: u32,
) -> Option<SegHeader> {
    SegHeader::decode(salt, bytes).ok().filter(|h| {
        h.chunk_id == chunk_id
            && h.epoch == epoch
            && h.unit_index == unit_index
            && h.mount_gen >= min_gen
    })
}

fn header_crc(salt: u32, fixed: &[u8], crcs: &[u8]) -> u32 {
    checksum::crc32c_append(checksum::salted(salt, fixed), crcs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SegHeader {
        SegHeader {
            chunk_id: 7,
            epoch: 3,
            unit_index: 262,
            mount_gen: 5,
            append_offset: 1_048_000,
            append_len: 1 << 20,
            data_off: 4096 * 200,
            data_len: (1 << 20) - 4096 * 200,
            slot_crcs: (0..56).map(|i| i * 0x0101_0101).collect(),
        }
    }

    #[test]
    fn roundtrip() {
        let mut b = vec![0xEEu8; 4096];
        sample().encode(11, &mut b);
        assert_eq!(SegHeader::decode(11, &b), Ok(sample()));
        assert_eq!(SegHeader::decode(12, &b), Err(DecodeError::Checksum));
        let mut filler = sample();
        filler.data_off = 1 << 20;
        filler.data_len = 0;
        filler.slot_crcs.clear();
        filler.encode(11, &mut b);
        assert_eq!(SegHeader::decode(11, &b), Ok(filler));
    }

    #[test]
    fn every_single_bit_flip_in_the_used_bytes_is_rejected() {
        let mut b = vec![0u8; 4096];
        sample().encode(11, &mut b);
        let used = HEADER_BYTES + 4 * 56;
        for bit in 0..used * 8 {
            let mut c = b.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(SegHeader::decode(11, &c).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn zeros_and_units_are_not_headers() {
        assert!(SegHeader::decode(0, &[0u8; 4096]).is_err());
        assert!(SegHeader::decode(0, &[]).is_err());
    }

    #[test]
    fn capacity() {
        assert_eq!(max_slots(4096), 1008);
    }
}
