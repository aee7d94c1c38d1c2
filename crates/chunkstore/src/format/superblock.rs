//! The superblock (docs/formats/chunk-store.md §2): the store's geometry, written once by format.

use super::{DecodeError, FORMAT_VERSION, Reader, Writer};
use crate::checksum;

const MAGIC: &[u8; 8] = b"CAIRN-CS";
/// Bytes the superblock occupies at offset 0 (the rest of its extent is unused).
pub const SUPERBLOCK_BYTES: usize = 4096;
const ENCODED_BYTES: usize = 124;

/// The geometry of a formatted store. Every offset is a multiple of `extent_bytes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub unit_bytes: u32,
    pub extent_bytes: u32,
    pub device_bytes: u64,
    pub max_chunk_bytes: u64,
    pub max_chunks: u32,
    pub extent_count: u32,
    pub ckpt_offsets: [u64; 2],
    pub ckpt_slot_bytes: u64,
    pub log_offset: u64,
    pub log_bytes: u64,
    pub data_offset: u64,
    pub store_id: [u8; 16],
    pub created_unix_ms: u64,
}

impl Superblock {
    /// Encodes into a zero-padded [`SUPERBLOCK_BYTES`] block.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.raw(MAGIC);
        w.u32(FORMAT_VERSION);
        w.u32(self.unit_bytes);
        w.u32(self.extent_bytes);
        w.u32(super::footer::FOOTER_BYTES as u32);
        w.u64(self.device_bytes);
        w.u64(self.max_chunk_bytes);
        w.u32(self.max_chunks);
        w.u32(self.extent_count);
        w.u64(self.ckpt_offsets[0]);
        w.u64(self.ckpt_offsets[1]);
        w.u64(self.ckpt_slot_bytes);
        w.u64(self.log_offset);
        w.u64(self.log_bytes);
        w.u64(self.data_offset);
        w.raw(&self.store_id);
        w.u64(self.created_unix_ms);
        let crc = checksum::crc32c(&w.bytes);
        w.u32(crc);
        assert_eq!(w.bytes.len(), ENCODED_BYTES);
        w.bytes.resize(SUPERBLOCK_BYTES, 0);
        w.bytes
    }

    /// Decodes and checks a superblock, including that its regions are consistent.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.take(8)? != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = r.u32()?;
        if version != FORMAT_VERSION {
            return Err(DecodeError::Version(version));
        }
        let body = bytes
            .get(..ENCODED_BYTES - 4)
            .ok_or(DecodeError::Truncated {
                need: ENCODED_BYTES,
                have: bytes.len(),
            })?;
        let mut crc_r = Reader::new(&bytes[ENCODED_BYTES - 4..]);
        if checksum::crc32c(body) != crc_r.u32()? {
            return Err(DecodeError::Checksum);
        }
        let unit_bytes = r.u32()?;
        let extent_bytes = r.u32()?;
        let footer_bytes = r.u32()?;
        let sb = Self {
            unit_bytes,
            extent_bytes,
            device_bytes: r.u64()?,
            max_chunk_bytes: r.u64()?,
            max_chunks: r.u32()?,
            extent_count: r.u32()?,
            ckpt_offsets: [r.u64()?, r.u64()?],
            ckpt_slot_bytes: r.u64()?,
            log_offset: r.u64()?,
            log_bytes: r.u64()?,
            data_offset: r.u64()?,
            store_id: r.take(16)?.try_into().expect("16 bytes"),
            created_unix_ms: r.u64()?,
        };
        if footer_bytes as usize != super::footer::FOOTER_BYTES {
            return Err(DecodeError::Invalid {
                field: "footer_bytes",
                value: footer_bytes as u64,
            });
        }
        sb.validate()?;
        Ok(sb)
    }

    /// Checks the relations between the fields (a CRC-valid superblock written by a buggy or
    /// hostile formatter must still not make the store index out of bounds).
    pub fn validate(&self) -> Result<(), DecodeError> {
        let bad = |field, value: u64| Err(DecodeError::Invalid { field, value });
        let unit = self.unit_bytes as u64;
        let ext = self.extent_bytes as u64;
        if !(1024..=65536).contains(&unit) || !unit.is_power_of_two() {
            return bad("unit_bytes", unit);
        }
        if ext < unit || !ext.is_multiple_of(unit) || ext > (1 << 30) || ext / unit > (1 << 16) {
            return bad("extent_bytes", ext);
        }
        if self.max_chunk_bytes == 0 || self.max_chunk_bytes > (1 << 40) {
            return bad("max_chunk_bytes", self.max_chunk_bytes);
        }
        if self.log_bytes < 2 * unit || !self.log_bytes.is_multiple_of(unit) {
            return bad("log_bytes", self.log_bytes);
        }
        let aligned = |v: u64| v.is_multiple_of(ext);
        if !aligned(self.ckpt_offsets[0])
            || !aligned(self.ckpt_offsets[1])
            || !aligned(self.log_offset)
            || !aligned(self.data_offset)
        {
            return bad("region_alignment", 0);
        }
        let need_ckpt = crate::format::checkpoint::slot_bytes_needed(
            self.max_chunks,
            self.extent_count,
            crate::format::segment::max_large_appends(self.extent_count, self.extent_bytes),
        );
        if self.ckpt_slot_bytes < need_ckpt {
            return bad("ckpt_slot_bytes", self.ckpt_slot_bytes);
        }
        // Regions in order, non-overlapping, inside the device.
        let ends = [
            (Some(ext), self.ckpt_offsets[0]),
            (
                self.ckpt_offsets[0].checked_add(self.ckpt_slot_bytes),
                self.ckpt_offsets[1],
            ),
            (
                self.ckpt_offsets[1].checked_add(self.ckpt_slot_bytes),
                self.log_offset,
            ),
            (
                self.log_offset.checked_add(self.log_bytes),
                self.data_offset,
            ),
        ];
        for (end, next) in ends {
            match end {
                Some(e) if e <= next => {}
                _ => return bad("region_overlap", next),
            }
        }
        let data_end = (self.extent_count as u64)
            .checked_mul(ext)
            .and_then(|d| d.checked_add(self.data_offset));
        match data_end {
            Some(e) if e <= self.device_bytes => Ok(()),
            _ => bad("extent_count", self.extent_count as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Superblock {
        let mib = 1 << 20;
        Superblock {
            unit_bytes: 4096,
            extent_bytes: mib as u32,
            device_bytes: 100 * mib,
            max_chunk_bytes: 64 * mib,
            max_chunks: 100,
            extent_count: 90,
            ckpt_offsets: [mib, 2 * mib],
            ckpt_slot_bytes: mib,
            log_offset: 3 * mib,
            log_bytes: 4 * mib,
            data_offset: 7 * mib,
            store_id: [9; 16],
            created_unix_ms: 1,
        }
    }

    #[test]
    fn roundtrip() {
        let sb = sample();
        let bytes = sb.encode();
        assert_eq!(bytes.len(), SUPERBLOCK_BYTES);
        assert_eq!(Superblock::decode(&bytes), Ok(sb));
    }

    #[test]
    fn inconsistent_geometry_rejected() {
        let mut sb = sample();
        sb.extent_count = 1000; // beyond the device
        assert!(Superblock::decode(&sb.encode()).is_err());
        let mut sb = sample();
        sb.log_offset = sb.ckpt_offsets[1]; // overlaps slot 1
        assert!(Superblock::decode(&sb.encode()).is_err());
    }

    #[test]
    fn corruption_rejected() {
        let mut bytes = sample().encode();
        bytes[30] ^= 1;
        assert_eq!(Superblock::decode(&bytes), Err(DecodeError::Checksum));
    }
}
