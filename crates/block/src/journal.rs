//! The index journal and checkpoint records, byte by byte in docs/block.md ("Formats").
//!
//! Both files are sequences of framed records: a 12-byte frame (magic, body length, CRC32C of
//! the body) and the body. A journal record is a batch of index changes appended at a FLUSH;
//! a checkpoint is one record holding the whole index. A reader stops at the first frame that
//! is short, has another magic, or fails its CRC: that is the torn tail of a crash, never
//! acknowledged (a FLUSH is answered only once its record is durable).

use crate::extent::ExtentMap;

/// "CBJ1": a journal record.
pub const JOURNAL_MAGIC: u32 = u32::from_le_bytes(*b"CBJ1");
/// "CBC1": a checkpoint.
pub const CHECKPOINT_MAGIC: u32 = u32::from_le_bytes(*b"CBC1");
/// Frame bytes before a body.
pub const FRAME: usize = 12;
/// Bytes of one change in a journal record, and of one run in a checkpoint.
pub const ENTRY: usize = 32;
/// The largest body a reader accepts (a checkpoint of 32 M runs).
pub const MAX_BODY: usize = 1 << 30;

/// One change to the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Blocks `lba..lba+blocks` are at byte `off` of segment `seg`.
    Map {
        lba: u64,
        blocks: u32,
        seg: u64,
        off: u64,
    },
    /// Blocks `lba..lba+blocks` read as zeros (TRIM, WRITE_ZEROES).
    Trim { lba: u64, blocks: u32 },
}

const KIND_MAP: u8 = 1;
const KIND_TRIM: u8 = 2;

impl Change {
    pub fn apply(&self, map: &mut ExtentMap) {
        match *self {
            Change::Map {
                lba,
                blocks,
                seg,
                off,
            } => map.insert(lba, u64::from(blocks), seg, off),
            Change::Trim { lba, blocks } => map.punch(lba, u64::from(blocks)),
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let (kind, lba, blocks, seg, off) = match *self {
            Change::Map {
                lba,
                blocks,
                seg,
                off,
            } => (KIND_MAP, lba, blocks, seg, off),
            Change::Trim { lba, blocks } => (KIND_TRIM, lba, blocks, 0, 0),
        };
        out.push(kind);
        out.extend_from_slice(&[0; 3]);
        out.extend_from_slice(&blocks.to_le_bytes());
        out.extend_from_slice(&lba.to_le_bytes());
        out.extend_from_slice(&seg.to_le_bytes());
        out.extend_from_slice(&off.to_le_bytes());
    }

    fn decode(b: &[u8; ENTRY]) -> Result<Self, JournalError> {
        let blocks = u32::from_le_bytes(b[4..8].try_into().expect("4"));
        let lba = u64_at(b, 8);
        let (seg, off) = (u64_at(b, 16), u64_at(b, 24));
        if b[1..4] != [0; 3] {
            return Err(JournalError::Invalid(
                "reserved bytes of a change are not zero",
            ));
        }
        if lba.checked_add(u64::from(blocks)).is_none() {
            return Err(JournalError::Invalid("a change past the last block"));
        }
        match b[0] {
            KIND_MAP => Ok(Change::Map {
                lba,
                blocks,
                seg,
                off,
            }),
            KIND_TRIM if seg == 0 && off == 0 => Ok(Change::Trim { lba, blocks }),
            KIND_TRIM => Err(JournalError::Invalid("a trim with a location")),
            _ => Err(JournalError::Invalid("unknown change kind")),
        }
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8"))
}

/// Why a record could not be read. Any of them ends a journal's replay at that record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    #[error("the record is cut short (a torn tail)")]
    Short,
    #[error("no record magic here")]
    Magic,
    #[error("the record's CRC does not match")]
    Crc,
    #[error("invalid record: {0}")]
    Invalid(&'static str),
}

fn frame(magic: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME + body.len());
    out.extend_from_slice(&magic.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// The body of the frame at the start of `b` and the bytes the frame takes.
fn unframe(magic: u32, b: &[u8]) -> Result<(&[u8], usize), JournalError> {
    if b.len() < FRAME {
        return Err(JournalError::Short);
    }
    if u32::from_le_bytes(b[0..4].try_into().expect("4")) != magic {
        return Err(JournalError::Magic);
    }
    let len = u32::from_le_bytes(b[4..8].try_into().expect("4")) as usize;
    if len > MAX_BODY {
        return Err(JournalError::Invalid("record longer than any written"));
    }
    let crc = u32::from_le_bytes(b[8..12].try_into().expect("4"));
    let body = b.get(FRAME..FRAME + len).ok_or(JournalError::Short)?;
    if crc32c::crc32c(body) != crc {
        return Err(JournalError::Crc);
    }
    Ok((body, FRAME + len))
}

/// A journal record: changes `seq` (one more than the record before it in the volume's life).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub changes: Vec<Change>,
}

impl Record {
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(12 + ENTRY * self.changes.len());
        body.extend_from_slice(&self.seq.to_le_bytes());
        body.extend_from_slice(&(self.changes.len() as u32).to_le_bytes());
        for c in &self.changes {
            c.encode(&mut body);
        }
        frame(JOURNAL_MAGIC, &body)
    }

    /// The record at the start of `b` and the bytes it takes.
    ///
    /// # Errors
    /// As [`JournalError`].
    pub fn decode(b: &[u8]) -> Result<(Self, usize), JournalError> {
        let (body, used) = unframe(JOURNAL_MAGIC, b)?;
        if body.len() < 12 {
            return Err(JournalError::Invalid(
                "journal record shorter than its header",
            ));
        }
        let seq = u64_at(body, 0);
        let n = u32::from_le_bytes(body[8..12].try_into().expect("4")) as usize;
        if body.len() != 12 + n * ENTRY {
            return Err(JournalError::Invalid("change count and length disagree"));
        }
        let changes = body[12..]
            .chunks_exact(ENTRY)
            .map(|c| Change::decode(c.try_into().expect("ENTRY")))
            .collect::<Result<_, _>>()?;
        Ok((Self { seq, changes }, used))
    }
}

/// Every whole record of a journal, in order, and where the valid prefix ends (the rest, if
/// any, is a torn tail).
pub fn replay(b: &[u8]) -> (Vec<Record>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        match Record::decode(&b[at..]) {
            Ok((r, used)) => {
                out.push(r);
                at += used;
            }
            Err(_) => break,
        }
    }
    (out, at)
}

/// A checkpoint: the whole index as of journal record `seq` (records up to it are in it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub seq: u64,
    pub block_size: u32,
    pub map: ExtentMap,
}

impl Checkpoint {
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(24 + ENTRY * self.map.len());
        body.extend_from_slice(&self.seq.to_le_bytes());
        body.extend_from_slice(&self.block_size.to_le_bytes());
        body.extend_from_slice(&[0; 4]);
        body.extend_from_slice(&(self.map.len() as u64).to_le_bytes());
        for (lba, r) in self.map.iter() {
            body.extend_from_slice(&lba.to_le_bytes());
            body.extend_from_slice(&r.blocks.to_le_bytes());
            body.extend_from_slice(&r.seg.to_le_bytes());
            body.extend_from_slice(&r.off.to_le_bytes());
        }
        frame(CHECKPOINT_MAGIC, &body)
    }

    /// A checkpoint file's contents (exactly one record).
    ///
    /// # Errors
    /// As [`JournalError`]; runs out of order or overlapping are invalid.
    pub fn decode(b: &[u8]) -> Result<Self, JournalError> {
        let (body, used) = unframe(CHECKPOINT_MAGIC, b)?;
        if used != b.len() {
            return Err(JournalError::Invalid("bytes after the checkpoint"));
        }
        if body.len() < 24 {
            return Err(JournalError::Invalid("checkpoint shorter than its header"));
        }
        let seq = u64_at(body, 0);
        let block_size = u32::from_le_bytes(body[8..12].try_into().expect("4"));
        if !block_size.is_power_of_two() || !(512..=65536).contains(&block_size) {
            return Err(JournalError::Invalid("checkpoint block size"));
        }
        let n = u64_at(body, 16);
        if body.len() as u64 != 24 + n.saturating_mul(ENTRY as u64) {
            return Err(JournalError::Invalid("run count and length disagree"));
        }
        let mut map = ExtentMap::new(block_size);
        let mut next = 0u64;
        for c in body[24..].chunks_exact(ENTRY) {
            let (lba, blocks) = (u64_at(c, 0), u64_at(c, 8));
            let end = lba.checked_add(blocks);
            if lba < next || blocks == 0 || end.is_none() {
                return Err(JournalError::Invalid("checkpoint runs out of order"));
            }
            next = end.expect("checked");
            map.insert(lba, blocks, u64_at(c, 16), u64_at(c, 24));
        }
        Ok(Self {
            seq,
            block_size,
            map,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            (0u64..1 << 40, 1u32..1024, 0u64..1000, 0u64..1 << 40).prop_map(
                |(lba, blocks, seg, off)| Change::Map {
                    lba,
                    blocks,
                    seg,
                    off
                }
            ),
            (0u64..1 << 40, 1u32..1024).prop_map(|(lba, blocks)| Change::Trim { lba, blocks }),
        ]
    }

    proptest! {
        #[test]
        fn records_round_trip_and_a_torn_tail_is_dropped(
            recs in prop::collection::vec(prop::collection::vec(change(), 0..20), 1..6),
            cut in any::<prop::sample::Index>(),
        ) {
            let recs: Vec<Record> = recs
                .into_iter()
                .enumerate()
                .map(|(i, changes)| Record { seq: i as u64 + 1, changes })
                .collect();
            let mut bytes = Vec::new();
            let mut ends = Vec::new();
            for r in &recs {
                bytes.extend(r.encode());
                ends.push(bytes.len());
            }
            let (got, used) = replay(&bytes);
            prop_assert_eq!(&got, &recs);
            prop_assert_eq!(used, bytes.len());
            // Cut anywhere: exactly the records wholly before the cut come back.
            let at = cut.index(bytes.len());
            let (got, used) = replay(&bytes[..at]);
            let whole = ends.iter().filter(|&&e| e <= at).count();
            prop_assert_eq!(got.len(), whole);
            prop_assert_eq!(used, if whole == 0 { 0 } else { ends[whole - 1] });
        }

        #[test]
        fn any_flipped_bit_stops_the_replay_there(
            changes in prop::collection::vec(change(), 1..20),
            bit in any::<prop::sample::Index>(),
        ) {
            let r = Record { seq: 9, changes };
            let mut b = r.encode();
            let i = bit.index(b.len() * 8);
            b[i / 8] ^= 1 << (i % 8);
            let (got, _) = replay(&b);
            prop_assert!(got.is_empty());
        }
    }

    #[test]
    fn checkpoints_round_trip() {
        let mut map = ExtentMap::new(4096);
        map.insert(0, 10, 1, 0);
        map.insert(100, 3, 2, 8192);
        let c = Checkpoint {
            seq: 42,
            block_size: 4096,
            map,
        };
        let b = c.encode();
        assert_eq!(Checkpoint::decode(&b).unwrap(), c);
        assert!(Checkpoint::decode(&b[..b.len() - 1]).is_err());
    }
}
