//! Compressed blocks (docs/formats/compressed-block.md): a 16-byte header and the stored
//! bytes. A block whose LZ4 form is not smaller than its input is stored raw; every block
//! records its original length and the CRC32C of its original bytes, checked on decode, so the
//! user's bytes are verified end to end whatever the codec did.
//!
//! ```text
//! offset size field
//!      0    1 kind: 1 = raw, 2 = LZ4 block (lz4_flex's block format, no size prefix)
//!      1    3 zero
//!      4    4 original length (u32 LE), at most MAX_BLOCK
//!      8    4 stored length (u32 LE): raw: = original; LZ4: < original
//!     12    4 CRC32C of the original bytes (u32 LE)
//!     16    … stored bytes
//! ```

/// Header bytes before each block's stored bytes.
pub const HEADER: usize = 16;
/// The largest original block: a bound on what a decoder allocates for one header.
pub const MAX_BLOCK: usize = 4 << 20;

const KIND_RAW: u8 = 1;
const KIND_LZ4: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Raw,
    Lz4,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub original_len: u32,
    pub stored_len: u32,
    pub crc: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("block header truncated: {0} bytes")]
    Truncated(usize),
    #[error("unknown block kind {0}")]
    Kind(u8),
    #[error("non-zero reserved bytes in a block header")]
    Reserved,
    #[error("block of {0} bytes is over the {MAX_BLOCK}-byte limit")]
    TooLarge(u32),
    #[error("stored length {stored} does not fit a {kind:?} block of {original} bytes")]
    Lengths {
        kind: Kind,
        original: u32,
        stored: u32,
    },
    #[error("block body truncated: {have} of {want} bytes")]
    Body { have: usize, want: usize },
    #[error("LZ4 data does not decompress to {0} bytes")]
    Decompress(u32),
    #[error("block CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Crc { stored: u32, computed: u32 },
}

pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

impl Header {
    pub fn decode(buf: &[u8]) -> Result<Self, BlockError> {
        let Some(h) = buf.get(..HEADER) else {
            return Err(BlockError::Truncated(buf.len()));
        };
        let kind = match h[0] {
            KIND_RAW => Kind::Raw,
            KIND_LZ4 => Kind::Lz4,
            k => return Err(BlockError::Kind(k)),
        };
        if h[1..4] != [0, 0, 0] {
            return Err(BlockError::Reserved);
        }
        let word = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
        let (original_len, stored_len, crc) = (word(4), word(8), word(12));
        if original_len as usize > MAX_BLOCK {
            return Err(BlockError::TooLarge(original_len));
        }
        let fits = match kind {
            Kind::Raw => stored_len == original_len,
            Kind::Lz4 => stored_len < original_len,
        };
        if !fits {
            return Err(BlockError::Lengths {
                kind,
                original: original_len,
                stored: stored_len,
            });
        }
        Ok(Self {
            kind,
            original_len,
            stored_len,
            crc,
        })
    }

    pub fn encode(&self) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        h[0] = match self.kind {
            Kind::Raw => KIND_RAW,
            Kind::Lz4 => KIND_LZ4,
        };
        h[4..8].copy_from_slice(&self.original_len.to_le_bytes());
        h[8..12].copy_from_slice(&self.stored_len.to_le_bytes());
        h[12..16].copy_from_slice(&self.crc.to_le_bytes());
        h
    }

    /// Header plus stored bytes.
    pub fn block_len(&self) -> usize {
        HEADER + self.stored_len as usize
    }
}

/// Appends the block of `data` (at most [`MAX_BLOCK`] bytes) to `out`: LZ4 if that is
/// smaller, raw otherwise. Returns its header.
pub fn encode(data: &[u8], out: &mut Vec<u8>) -> Header {
    assert!(data.len() <= MAX_BLOCK, "block of {} bytes", data.len());
    let crc = crc32c(data);
    let start = out.len();
    out.resize(
        start + HEADER + lz4_flex::block::get_maximum_output_size(data.len()),
        0,
    );
    let compressed = lz4_flex::block::compress_into(data, &mut out[start + HEADER..])
        .ok()
        .filter(|&n| n < data.len());
    let h = match compressed {
        Some(n) => Header {
            kind: Kind::Lz4,
            original_len: data.len() as u32,
            stored_len: n as u32,
            crc,
        },
        None => {
            out[start + HEADER..start + HEADER + data.len()].copy_from_slice(data);
            Header {
                kind: Kind::Raw,
                original_len: data.len() as u32,
                stored_len: data.len() as u32,
                crc,
            }
        }
    };
    out.truncate(start + h.block_len());
    out[start..start + HEADER].copy_from_slice(&h.encode());
    h
}

/// Decodes the block at the start of `buf` into `out` (appended); returns the bytes it took
/// from `buf`. Nothing is appended unless the block is whole and its CRC matches.
pub fn decode(buf: &[u8], out: &mut Vec<u8>) -> Result<usize, BlockError> {
    let h = Header::decode(buf)?;
    let Some(stored) = buf.get(HEADER..h.block_len()) else {
        return Err(BlockError::Body {
            have: buf.len().saturating_sub(HEADER),
            want: h.stored_len as usize,
        });
    };
    let start = out.len();
    match h.kind {
        Kind::Raw => out.extend_from_slice(stored),
        Kind::Lz4 => {
            out.resize(start + h.original_len as usize, 0);
            match lz4_flex::block::decompress_into(stored, &mut out[start..]) {
                Ok(n) if n == h.original_len as usize => {}
                _ => {
                    out.truncate(start);
                    return Err(BlockError::Decompress(h.original_len));
                }
            }
        }
    }
    let computed = crc32c(&out[start..]);
    if computed != h.crc {
        out.truncate(start);
        return Err(BlockError::Crc {
            stored: h.crc,
            computed,
        });
    }
    Ok(h.block_len())
}

/// Bytes of a block index's trailer.
pub const INDEX_TRAILER: usize = 24;
const INDEX_MAGIC: &[u8; 8] = b"CAIRNBX1";

/// Errors of a block index (docs/formats/compressed-block.md, "Compressed chunk groups").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("block index of {have} bytes, {want} expected")]
    Length { have: usize, want: usize },
    #[error("bad block index magic")]
    Magic,
    #[error("block index for {got} blocks of {got_block} bytes, expected {want} of {want_block}")]
    Shape {
        got: u32,
        got_block: u32,
        want: u32,
        want_block: u32,
    },
    #[error("block index CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Crc { stored: u32, computed: u32 },
    #[error("block {0}'s offset is out of order or past the blocks")]
    Offset(usize),
}

/// Bytes of the index of `blocks` blocks: an offset each and the trailer.
pub fn index_len(blocks: usize) -> usize {
    blocks * 8 + INDEX_TRAILER
}

/// Appends the index of a stream of blocks to `out`: `offsets[i]` is where block `i` starts
/// in the stream (the first at 0), each holding `block` user bytes (the last may hold fewer).
pub fn encode_index(offsets: &[u64], block: u32, out: &mut Vec<u8>) {
    let start = out.len();
    for o in offsets {
        out.extend_from_slice(&o.to_le_bytes());
    }
    let crc = crc32c(&out[start..]);
    out.extend_from_slice(INDEX_MAGIC);
    out.extend_from_slice(&(offsets.len() as u32).to_le_bytes());
    out.extend_from_slice(&block.to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
}

/// Decodes the index at the end of a stream whose blocks take the first `blocks_end` bytes:
/// `buf` is the [`index_len`]`(blocks)` bytes after them. Returns every block's start and,
/// last, `blocks_end`, so block `i` is `[offsets[i], offsets[i + 1])`.
pub fn decode_index(
    buf: &[u8],
    blocks: u32,
    block: u32,
    blocks_end: u64,
) -> Result<Vec<u64>, IndexError> {
    let want = index_len(blocks as usize);
    if buf.len() != want {
        return Err(IndexError::Length {
            have: buf.len(),
            want,
        });
    }
    let (entries, t) = buf.split_at(want - INDEX_TRAILER);
    if &t[..8] != INDEX_MAGIC || t[20..24] != [0; 4] {
        return Err(IndexError::Magic);
    }
    let word = |i: usize| u32::from_le_bytes(t[i..i + 4].try_into().unwrap());
    if (word(8), word(12)) != (blocks, block) {
        return Err(IndexError::Shape {
            got: word(8),
            got_block: word(12),
            want: blocks,
            want_block: block,
        });
    }
    let computed = crc32c(entries);
    if computed != word(16) {
        return Err(IndexError::Crc {
            stored: word(16),
            computed,
        });
    }
    let mut offsets: Vec<u64> = entries
        .chunks_exact(8)
        .map(|e| u64::from_le_bytes(e.try_into().unwrap()))
        .collect();
    offsets.push(blocks_end);
    // A block is at least its header and at most a header and MAX_BLOCK bytes.
    for i in 0..blocks as usize {
        let first_ok = i > 0 || offsets[0] == 0;
        let size = offsets[i + 1].checked_sub(offsets[i]);
        if !first_ok || size.is_none_or(|n| n < HEADER as u64 || n > (HEADER + MAX_BLOCK) as u64) {
            return Err(IndexError::Offset(i));
        }
    }
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_compresses_and_noise_stays_raw() {
        let text: Vec<u8> = (0..20_000)
            .flat_map(|i| format!("GET /api/v1/items/{} 200 {}ms\n", i % 97, i % 13).into_bytes())
            .take(64 << 10)
            .collect();
        let mut out = Vec::new();
        let h = encode(&text, &mut out);
        assert_eq!(h.kind, Kind::Lz4);
        assert!(
            out.len() < text.len() / 3,
            "{} of {}",
            out.len(),
            text.len()
        );
        let mut noise = vec![0u8; 4096];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for b in &mut noise {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let h2 = encode(&noise, &mut out);
        assert_eq!(h2.kind, Kind::Raw);
        let mut back = Vec::new();
        let n = decode(&out, &mut back).unwrap();
        let m = decode(&out[n..], &mut back).unwrap();
        assert_eq!(n + m, out.len());
        assert_eq!(back, [text, noise].concat());
    }

    #[test]
    fn damage_is_a_typed_error_and_appends_nothing() {
        let data = b"hello hello hello hello hello hello hello hello".repeat(20);
        let mut blk = Vec::new();
        encode(&data, &mut blk);
        let mut out = vec![7u8];
        for i in 0..blk.len() {
            let mut bad = blk.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad, &mut out).is_err(), "flip at {i} accepted");
            assert_eq!(out, [7u8]);
        }
        assert_eq!(
            decode(&blk[..blk.len() - 1], &mut out),
            Err(BlockError::Body {
                have: blk.len() - 1 - HEADER,
                want: blk.len() - HEADER
            })
        );
        assert_eq!(decode(&blk[..3], &mut out), Err(BlockError::Truncated(3)));
    }

    #[test]
    fn empty_block_round_trips() {
        let mut blk = Vec::new();
        let h = encode(&[], &mut blk);
        assert_eq!((h.kind, blk.len()), (Kind::Raw, HEADER));
        let mut out = Vec::new();
        assert_eq!(decode(&blk, &mut out), Ok(HEADER));
        assert!(out.is_empty());
    }
}

#[cfg(test)]
mod index_tests {
    use super::{decode_index, encode, encode_index, index_len};

    #[test]
    fn an_index_round_trips_and_damage_is_refused() {
        let mut stream = Vec::new();
        let mut offsets = Vec::new();
        for i in 0..5u8 {
            offsets.push(stream.len() as u64);
            encode(&vec![i; 1000 + usize::from(i)], &mut stream);
        }
        let end = stream.len() as u64;
        let mut index = Vec::new();
        encode_index(&offsets, 1 << 16, &mut index);
        assert_eq!(index.len(), index_len(5));
        let got = decode_index(&index, 5, 1 << 16, end).unwrap();
        assert_eq!(&got[..5], &offsets[..]);
        assert_eq!(got[5], end);
        for bit in 0..index.len() * 8 {
            let mut bad = index.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_index(&bad, 5, 1 << 16, end).is_err(), "bit {bit}");
        }
        assert!(decode_index(&index, 4, 1 << 16, end).is_err());
        assert!(decode_index(&index, 5, 1 << 15, end).is_err());
        assert!(decode_index(&index, 5, 1 << 16, end - 20).is_err());
    }
}

#[cfg(test)]
mod doc_example {
    /// docs/formats/compressed-block.md's worked example.
    #[test]
    fn four_kib_of_a() {
        let data = vec![b'a'; 4096];
        let mut blk = Vec::new();
        let h = super::encode(&data, &mut blk);

        assert_eq!(h.kind, super::Kind::Lz4);
        assert_eq!(&blk[..8], &[2, 0, 0, 0, 0, 0x10, 0, 0]);
        assert_eq!(h.stored_len as usize, blk.len() - super::HEADER);
        assert_eq!(h.stored_len, DOC_STORED_LEN);
        assert_eq!(h.crc, 0x26c7_4ca2);
    }
    const DOC_STORED_LEN: u32 = 27;
}
