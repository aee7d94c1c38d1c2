//! Operation-log blocks (docs/formats/chunk-store.md §4).
//!
//! The log records the operations that are not appends: create, seal, delete. A group commit writes at most one block, so a block that did not
//! become durable is always the last one of the log.

use super::{DecodeError, FORMAT_VERSION, Reader, Writer};
use crate::checksum;

const MAGIC: &[u8; 4] = b"CLOG";
/// Bytes of the block header.
pub const HEADER_BYTES: usize = 24;

/// One logged operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogEntry {
    Create {
        chunk_id: u64,
        epoch: u64,
        version: u64,
    },
    Seal {
        chunk_id: u64,
        epoch: u64,
        length: u64,
        crc: u32,
    },
    Delete {
        chunk_id: u64,
        epoch: u64,
    },
}

impl LogEntry {
    /// Encoded size in bytes, tag included.
    pub const fn encoded_len(&self) -> usize {
        match self {
            LogEntry::Create { .. } => 25,
            LogEntry::Seal { .. } => 29,
            LogEntry::Delete { .. } => 17,
        }
    }

    fn encode(&self, w: &mut Writer) {
        match *self {
            LogEntry::Create {
                chunk_id,
                epoch,
                version,
            } => {
                w.u8(2);
                w.u64(chunk_id);
                w.u64(epoch);
                w.u64(version);
            }
            LogEntry::Seal {
                chunk_id,
                epoch,
                length,
                crc,
            } => {
                w.u8(3);
                w.u64(chunk_id);
                w.u64(epoch);
                w.u64(length);
                w.u32(crc);
            }
            LogEntry::Delete { chunk_id, epoch } => {
                w.u8(4);
                w.u64(chunk_id);
                w.u64(epoch);
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(match r.u8()? {
            2 => LogEntry::Create {
                chunk_id: r.u64()?,
                epoch: r.u64()?,
                version: r.u64()?,
            },
            3 => LogEntry::Seal {
                chunk_id: r.u64()?,
                epoch: r.u64()?,
                length: r.u64()?,
                crc: r.u32()?,
            },
            4 => LogEntry::Delete {
                chunk_id: r.u64()?,
                epoch: r.u64()?,
            },
            tag => {
                return Err(DecodeError::Invalid {
                    field: "log_entry_tag",
                    value: tag as u64,
                });
            }
        })
    }
}

/// Payload bytes available in a block of `block_bytes`.
pub const fn capacity(block_bytes: usize) -> usize {
    block_bytes - HEADER_BYTES
}

/// Encodes a log block of exactly `block_bytes` bytes.
///
/// # Panics
/// If the entries do not fit; callers check with [`capacity`].
pub fn encode_block(salt: u32, lsn: u64, entries: &[LogEntry], block_bytes: usize) -> Vec<u8> {
    let mut payload = Writer::default();
    for e in entries {
        e.encode(&mut payload);
    }
    assert!(
        payload.bytes.len() <= capacity(block_bytes),
        "log block overflow"
    );
    let mut w = Writer::default();
    w.raw(MAGIC);
    w.u8(FORMAT_VERSION as u8);
    w.u8(0);
    w.u16(u16::try_from(entries.len()).expect("entry count"));
    w.u64(lsn);
    w.u32(payload.bytes.len() as u32);
    let crc = checksum::crc32c_append(checksum::salted(salt, &w.bytes), &payload.bytes);
    w.u32(crc);
    w.raw(&payload.bytes);
    w.bytes.resize(block_bytes, 0);
    w.bytes
}

/// Decodes the block and checks that it is block `expect_lsn` of this store.
pub fn decode_block(
    salt: u32,
    expect_lsn: u64,
    bytes: &[u8],
) -> Result<Vec<LogEntry>, DecodeError> {
    let mut r = Reader::new(bytes);
    if r.take(4)? != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let version = r.u8()?;
    if version as u32 != FORMAT_VERSION {
        return Err(DecodeError::Version(version as u32));
    }
    let reserved = r.u8()?;
    let count = r.u16()?;
    let lsn = r.u64()?;
    let payload_len = r.u32()? as usize;
    let crc = r.u32()?;
    if payload_len > bytes.len().saturating_sub(HEADER_BYTES) {
        return Err(DecodeError::Truncated {
            need: HEADER_BYTES + payload_len,
            have: bytes.len(),
        });
    }
    let payload = &bytes[HEADER_BYTES..HEADER_BYTES + payload_len];
    if checksum::crc32c_append(checksum::salted(salt, &bytes[..20]), payload) != crc {
        return Err(DecodeError::Checksum);
    }
    if reserved != 0 {
        return Err(DecodeError::Invalid {
            field: "reserved",
            value: reserved as u64,
        });
    }
    if lsn != expect_lsn {
        return Err(DecodeError::Invalid {
            field: "lsn",
            value: lsn,
        });
    }
    let mut p = Reader::new(payload);
    let mut entries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        entries.push(LogEntry::decode(&mut p)?);
    }
    if p.pos() != payload_len {
        return Err(DecodeError::Invalid {
            field: "payload_len",
            value: payload_len as u64,
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let entries = vec![
            LogEntry::Create {
                chunk_id: 1,
                epoch: 2,
                version: 3,
            },
            LogEntry::Seal {
                chunk_id: 1,
                epoch: 2,
                length: 5100,
                crc: 9,
            },
            LogEntry::Delete {
                chunk_id: 1,
                epoch: 2,
            },
        ];
        let b = encode_block(5, 42, &entries, 4096);
        assert_eq!(b.len(), 4096);
        assert_eq!(decode_block(5, 42, &b), Ok(entries.clone()));
        assert!(
            decode_block(5, 43, &b).is_err(),
            "a block from another lap of the ring"
        );
        assert!(
            decode_block(6, 42, &b).is_err(),
            "a block from another format"
        );
        let sizes: usize = entries.iter().map(|e| e.encoded_len()).sum();
        let mut w = Writer::default();
        for e in &entries {
            e.encode(&mut w);
        }
        assert_eq!(w.bytes.len(), sizes);
    }

    #[test]
    fn torn_block_rejected() {
        let entries = vec![LogEntry::Create {
            chunk_id: 1,
            epoch: 2,
            version: 3,
        }];
        let b = encode_block(5, 0, &entries, 4096);
        for cut in 0..(HEADER_BYTES + 25) {
            // Torn at `cut`: the rest of the block holds whatever was there before (here, the
            // complement, so that every torn byte really differs).
            let mut t = b.clone();
            t[cut..].iter_mut().for_each(|x| *x = !*x);
            assert!(decode_block(5, 0, &t).is_err(), "cut at {cut}");
        }
    }
}
