//! Checkpoints of the chunk index (docs/formats/chunk-store.md §5).

use super::{DecodeError, FORMAT_VERSION, Reader, Writer};
use crate::checksum;

const MAGIC: &[u8; 8] = b"CAIRNCKP";
/// Bytes of the checkpoint header.
pub const HEADER_BYTES: usize = 64;
/// Bytes of a chunk record without its extent and large-append lists.
pub const RECORD_BYTES: usize = 48;
/// Bytes of one large-append entry.
pub const LARGE_BYTES: usize = 12;
const FLAG_SEALED: u8 = 1;

/// One chunk as recorded in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkRecord {
    pub chunk_id: u64,
    pub epoch: u64,
    pub version: u64,
    pub length: u64,
    pub crc: u32,
    pub sealed: bool,
    pub extents: Vec<u32>,
    /// Large appends as `(logical offset, length)`, in offset order.
    pub large: Vec<(u64, u32)>,
}

/// A whole checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub seq: u64,
    /// The first log block not reflected here.
    pub lsn: u64,
    pub next_epoch: u64,
    pub mount_gen: u32,
    pub chunks: Vec<ChunkRecord>,
}

/// Largest encoded checkpoint for a store of this size holding at most `max_large` large
/// appends.
pub const fn slot_bytes_needed(max_chunks: u32, extent_count: u32, max_large: u64) -> u64 {
    HEADER_BYTES as u64
        + RECORD_BYTES as u64 * max_chunks as u64
        + 4 * extent_count as u64
        + LARGE_BYTES as u64 * max_large
}

impl Checkpoint {
    /// Encodes the checkpoint; the result's length is a multiple of `align`.
    pub fn encode(&self, salt: u32, align: usize) -> Vec<u8> {
        let mut p = Writer::default();
        for c in &self.chunks {
            p.u64(c.chunk_id);
            p.u64(c.epoch);
            p.u64(c.version);
            p.u64(c.length);
            p.u32(c.crc);
            p.u8(if c.sealed { FLAG_SEALED } else { 0 });
            p.raw(&[0; 3]);
            p.u32(c.extents.len() as u32);
            for &e in &c.extents {
                p.u32(e);
            }
            p.u32(c.large.len() as u32);
            for &(o, n) in &c.large {
                p.u64(o);
                p.u32(n);
            }
        }
        let mut w = Writer::default();
        w.raw(MAGIC);
        w.u32(FORMAT_VERSION);
        w.u32(0);
        w.u64(self.seq);
        w.u64(self.lsn);
        w.u64(self.next_epoch);
        w.u32(self.mount_gen);
        w.u32(self.chunks.len() as u32);
        w.u64(p.bytes.len() as u64);
        w.u32(checksum::salted(salt, &p.bytes));
        let hcrc = checksum::salted(salt, &w.bytes);
        w.u32(hcrc);
        debug_assert_eq!(w.bytes.len(), HEADER_BYTES);
        w.raw(&p.bytes);
        let len = w.bytes.len().div_ceil(align) * align;
        w.bytes.resize(len, 0);
        w.bytes
    }

    /// Decodes the header only and returns `(seq, total encoded bytes)`, so that a reader can
    /// fetch the rest of the slot.
    pub fn decode_header(salt: u32, bytes: &[u8]) -> Result<(u64, u64), DecodeError> {
        let h = Header::decode(salt, bytes)?;
        Ok((h.seq, HEADER_BYTES as u64 + h.payload_len))
    }

    /// Decodes a whole checkpoint. `extent_count` bounds every extent number.
    pub fn decode(salt: u32, bytes: &[u8], extent_count: u32) -> Result<Self, DecodeError> {
        let h = Header::decode(salt, bytes)?;
        let end = (HEADER_BYTES as u64)
            .checked_add(h.payload_len)
            .filter(|&e| e <= bytes.len() as u64);
        let Some(end) = end else {
            return Err(DecodeError::Truncated {
                need: usize::MAX,
                have: bytes.len(),
            });
        };
        let payload = &bytes[HEADER_BYTES..end as usize];
        if checksum::salted(salt, payload) != h.payload_crc {
            return Err(DecodeError::Checksum);
        }
        let mut r = Reader::new(payload);
        let mut chunks =
            Vec::with_capacity((h.chunk_count as usize).min(payload.len() / RECORD_BYTES));
        for _ in 0..h.chunk_count {
            let chunk_id = r.u64()?;
            let epoch = r.u64()?;
            let version = r.u64()?;
            let length = r.u64()?;
            let crc = r.u32()?;
            let flags = r.u8()?;
            let reserved = r.take(3)?;
            if flags & !FLAG_SEALED != 0 || reserved != [0, 0, 0] {
                return Err(DecodeError::Invalid {
                    field: "chunk_flags",
                    value: flags as u64,
                });
            }
            let n = r.u32()?;
            if n > extent_count {
                return Err(DecodeError::Invalid {
                    field: "extent_count",
                    value: n as u64,
                });
            }
            let mut extents = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let e = r.u32()?;
                if e >= extent_count {
                    return Err(DecodeError::Invalid {
                        field: "extent",
                        value: e as u64,
                    });
                }
                extents.push(e);
            }
            let n = r.u32()? as usize;
            let mut large = Vec::with_capacity(n.min(r.remaining() / LARGE_BYTES));
            for _ in 0..n {
                let (o, len) = (r.u64()?, r.u32()?);
                if large
                    .last()
                    .is_some_and(|&(po, pl): &(u64, u32)| po + pl as u64 > o)
                    || o >= length
                    || o.checked_add(len as u64).is_none()
                {
                    return Err(DecodeError::Invalid {
                        field: "large_append",
                        value: o,
                    });
                }
                large.push((o, len));
            }
            chunks.push(ChunkRecord {
                chunk_id,
                epoch,
                version,
                length,
                crc,
                sealed: flags & FLAG_SEALED != 0,
                extents,
                large,
            });
        }
        if r.pos() != payload.len() {
            return Err(DecodeError::Invalid {
                field: "payload_len",
                value: h.payload_len,
            });
        }
        Ok(Self {
            seq: h.seq,
            lsn: h.lsn,
            next_epoch: h.next_epoch,
            mount_gen: h.mount_gen,
            chunks,
        })
    }
}

struct Header {
    seq: u64,
    lsn: u64,
    next_epoch: u64,
    mount_gen: u32,
    chunk_count: u32,
    payload_len: u64,
    payload_crc: u32,
}

impl Header {
    fn decode(salt: u32, bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.take(8)? != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = r.u32()?;
        if version != FORMAT_VERSION {
            return Err(DecodeError::Version(version));
        }
        let reserved = r.u32()?;
        let h = Header {
            seq: r.u64()?,
            lsn: r.u64()?,
            next_epoch: r.u64()?,
            mount_gen: r.u32()?,
            chunk_count: r.u32()?,
            payload_len: r.u64()?,
            payload_crc: r.u32()?,
        };
        let hcrc = r.u32()?;
        if checksum::salted(salt, &bytes[..HEADER_BYTES - 4]) != hcrc {
            return Err(DecodeError::Checksum);
        }
        if reserved != 0 {
            return Err(DecodeError::Invalid {
                field: "reserved",
                value: reserved as u64,
            });
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            seq: 4,
            lsn: 99,
            next_epoch: 12,
            mount_gen: 3,
            chunks: vec![
                ChunkRecord {
                    chunk_id: 1,
                    epoch: 2,
                    version: 1,
                    length: 5100,
                    crc: 7,
                    sealed: true,
                    extents: vec![3],
                    large: vec![],
                },
                ChunkRecord {
                    chunk_id: 9,
                    epoch: 11,
                    version: 1,
                    length: 2_000_000,
                    crc: 0,
                    sealed: false,
                    extents: vec![5, 6],
                    large: vec![(10, 600_000), (600_010, 700_000)],
                },
            ],
        }
    }

    #[test]
    fn roundtrip() {
        let c = sample();
        let b = c.encode(5, 512);
        assert_eq!(b.len() % 512, 0);
        assert_eq!(Checkpoint::decode_header(5, &b).map(|h| h.0), Ok(4));
        assert_eq!(Checkpoint::decode(5, &b, 10), Ok(c));
        assert!(Checkpoint::decode(5, &b, 3).is_err(), "extent out of range");
        assert!(Checkpoint::decode(6, &b, 10).is_err(), "wrong salt");
    }

    #[test]
    fn size_bound_holds() {
        let c = sample();
        let b = c.encode(5, 1);
        assert!(b.len() as u64 <= slot_bytes_needed(2, 3, 2));
    }
}
