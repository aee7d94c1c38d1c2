//! Sector-unit footers (docs/formats/chunk-store.md §3).
//!
//! A unit of `S` bytes holds `S - 2 * FOOTER_BYTES` bytes of chunk data followed by two footer
//! slots. The slots alternate so that rewriting a partly filled unit never disturbs the footer
//! that describes its acknowledged bytes.

use super::{DecodeError, Reader};
use crate::checksum;

/// Bytes of one footer slot.
pub const FOOTER_BYTES: usize = 40;
/// Footer slots per unit.
pub const SLOTS: usize = 2;
/// Bytes of footer area per unit.
pub const FOOTER_AREA_BYTES: usize = FOOTER_BYTES * SLOTS;

const MAGIC: u16 = 0x5543; // "CU" in little-endian byte order
const VERSION: u8 = 1;

/// Flag: an append ends exactly at `valid_len`.
pub const FLAG_APPEND_END: u8 = 0x01;
const KNOWN_FLAGS: u8 = FLAG_APPEND_END;

/// The decoded contents of a footer slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footer {
    pub flags: u8,
    pub chunk_id: u64,
    pub epoch: u64,
    pub unit_index: u32,
    pub mount_gen: u32,
    pub valid_len: u16,
    pub data_crc: u32,
}

impl Footer {
    pub fn append_end(&self) -> bool {
        self.flags & FLAG_APPEND_END != 0
    }

    /// Encodes into exactly [`FOOTER_BYTES`] bytes with the salted footer CRC.
    pub fn encode(&self, salt: u32, out: &mut [u8]) {
        assert_eq!(out.len(), FOOTER_BYTES);
        // Written in place (this runs once per unit on the append path: no allocation).
        out[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        out[2] = VERSION;
        out[3] = self.flags;
        out[4..12].copy_from_slice(&self.chunk_id.to_le_bytes());
        out[12..20].copy_from_slice(&self.epoch.to_le_bytes());
        out[20..24].copy_from_slice(&self.unit_index.to_le_bytes());
        out[24..28].copy_from_slice(&self.mount_gen.to_le_bytes());
        out[28..30].copy_from_slice(&self.valid_len.to_le_bytes());
        out[30..32].fill(0);
        out[32..36].copy_from_slice(&self.data_crc.to_le_bytes());
        let crc = checksum::salted(salt, &out[..36]);
        out[36..40].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes a footer slot, checking magic, version, reserved bits and the footer CRC.
    /// It does not check the data CRC (see [`unit_slot_valid`]).
    pub fn decode(salt: u32, bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let body = r.take(FOOTER_BYTES - 4)?;
        let crc = r.u32()?;
        let mut r = Reader::new(body);
        if r.u16()? != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = r.u8()?;
        if version != VERSION {
            return Err(DecodeError::Version(version as u32));
        }
        if checksum::salted(salt, body) != crc {
            return Err(DecodeError::Checksum);
        }
        let flags = r.u8()?;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(DecodeError::Invalid {
                field: "flags",
                value: flags as u64,
            });
        }
        let chunk_id = r.u64()?;
        let epoch = r.u64()?;
        let unit_index = r.u32()?;
        let mount_gen = r.u32()?;
        let valid_len = r.u16()?;
        let reserved = r.u16()?;
        if reserved != 0 {
            return Err(DecodeError::Invalid {
                field: "reserved",
                value: reserved as u64,
            });
        }
        if valid_len == 0 {
            return Err(DecodeError::Invalid {
                field: "valid_len",
                value: 0,
            });
        }
        let data_crc = r.u32()?;
        Ok(Self {
            flags,
            chunk_id,
            epoch,
            unit_index,
            mount_gen,
            valid_len,
            data_crc,
        })
    }
}

/// Byte offset of footer slot `slot` inside a unit of `unit_bytes`.
pub const fn slot_offset(unit_bytes: usize, slot: usize) -> usize {
    unit_bytes - FOOTER_AREA_BYTES + slot * FOOTER_BYTES
}

/// Data bytes a unit of `unit_bytes` can hold.
pub const fn data_bytes(unit_bytes: usize) -> usize {
    unit_bytes - FOOTER_AREA_BYTES
}

/// Decodes slot `slot` of `unit` and returns it if it is valid for `(chunk_id, epoch,
/// unit_index)`, including the CRC of its data bytes.
pub fn unit_slot_valid(
    salt: u32,
    unit: &[u8],
    slot: usize,
    chunk_id: u64,
    epoch: u64,
    unit_index: u32,
) -> Option<Footer> {
    let unit_bytes = unit.len();
    let off = slot_offset(unit_bytes, slot);
    let f = Footer::decode(salt, &unit[off..off + FOOTER_BYTES]).ok()?;
    if f.chunk_id != chunk_id || f.epoch != epoch || f.unit_index != unit_index {
        return None;
    }
    if f.valid_len as usize > data_bytes(unit_bytes) {
        return None;
    }
    if checksum::crc32c(&unit[..f.valid_len as usize]) != f.data_crc {
        return None;
    }
    Some(f)
}

/// The state of one unit as read back: its best valid slot and, if valid too, the other one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitState {
    /// The current state: the valid slot with the largest `(mount_gen, valid_len)`.
    pub best: Footer,
    pub best_slot: usize,
    /// The other slot, when it is valid as well.
    pub other: Option<Footer>,
}

/// Evaluates both slots of `unit` for `(chunk_id, epoch, unit_index)`. `min_gen` rejects slots
/// written by an earlier mount than the unit before them in the chunk.
pub fn unit_state(
    salt: u32,
    unit: &[u8],
    chunk_id: u64,
    epoch: u64,
    unit_index: u32,
    min_gen: u32,
) -> Option<UnitState> {
    let mut valid = [None, None];
    for (slot, v) in valid.iter_mut().enumerate() {
        *v = unit_slot_valid(salt, unit, slot, chunk_id, epoch, unit_index)
            .filter(|f| f.mount_gen >= min_gen);
    }
    match valid {
        [None, None] => None,
        [Some(a), None] => Some(UnitState {
            best: a,
            best_slot: 0,
            other: None,
        }),
        [None, Some(b)] => Some(UnitState {
            best: b,
            best_slot: 1,
            other: None,
        }),
        [Some(a), Some(b)] => {
            if (b.mount_gen, b.valid_len) > (a.mount_gen, a.valid_len) {
                Some(UnitState {
                    best: b,
                    best_slot: 1,
                    other: Some(a),
                })
            } else {
                Some(UnitState {
                    best: a,
                    best_slot: 0,
                    other: Some(b),
                })
            }
        }
    }
}

const _: () = assert!(FOOTER_BYTES == 40);
const _: () = assert!(data_bytes(4096) == 4016);

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Footer {
        Footer {
            flags: FLAG_APPEND_END,
            chunk_id: 7,
            epoch: 3,
            unit_index: 1,
            mount_gen: 5,
            valid_len: 984,
            data_crc: 0xdead_beef,
        }
    }

    #[test]
    fn roundtrip() {
        let mut b = [0u8; FOOTER_BYTES];
        sample().encode(11, &mut b);
        assert_eq!(Footer::decode(11, &b), Ok(sample()));
        // A different salt (another format of the device) does not validate.
        assert_eq!(Footer::decode(12, &b), Err(DecodeError::Checksum));
    }

    #[test]
    fn every_single_bit_flip_is_rejected() {
        let mut b = [0u8; FOOTER_BYTES];
        sample().encode(11, &mut b);
        for bit in 0..FOOTER_BYTES * 8 {
            let mut c = b;
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(Footer::decode(11, &c).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn zeros_are_not_a_footer() {
        assert!(Footer::decode(0, &[0u8; FOOTER_BYTES]).is_err());
    }
}
