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
    /// Segment `seg` is being appended to and every batch in it before byte `off` is in
    /// the index: a reopening server seals it and replays its batches from `off` on. Not a
    /// change to the map; each record (and checkpoint) names every such segment.
    Cover { seg: u64, off: u64 },
}

const KIND_MAP: u8 = 1;
const KIND_TRIM: u8 = 2;
const KIND_COVER: u8 = 3;

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
            Change::Cover { .. } => {}
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
            Change::Cover { seg, off } => (KIND_COVER, 0, 0, seg, off),
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
            KIND_COVER if lba == 0 && blocks == 0 => Ok(Change::Cover { seg, off }),
            KIND_COVER => Err(JournalError::Invalid("a cover with blocks")),
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

/// A checkpoint: the whole index as of journal record `seq` (records up to it are in it),
/// and the segments being appended to then (`covers`: segment, bytes whose batches are in
/// the map), for a reopening server that finds no record after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub seq: u64,
    pub block_size: u32,
    pub map: ExtentMap,
    pub covers: Vec<(u64, u64)>,
}

/// Checkpoint flag: a section of covers follows the runs.
const CKPT_COVERS: u32 = 1;

impl Checkpoint {
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(32 + ENTRY * (self.map.len() + self.covers.len()));
        let flags = if self.covers.is_empty() {
            0
        } else {
            CKPT_COVERS
        };
        body.extend_from_slice(&self.seq.to_le_bytes());
        body.extend_from_slice(&self.block_size.to_le_bytes());
        body.extend_from_slice(&flags.to_le_bytes());
        body.extend_from_slice(&(self.map.len() as u64).to_le_bytes());
        for (lba, r) in self.map.iter() {
            body.extend_from_slice(&lba.to_le_bytes());
            body.extend_from_slice(&r.blocks.to_le_bytes());
            body.extend_from_slice(&r.seg.to_le_bytes());
            body.extend_from_slice(&r.off.to_le_bytes());
        }
        if flags & CKPT_COVERS != 0 {
            body.extend_from_slice(&(self.covers.len() as u64).to_le_bytes());
            for &(seg, off) in &self.covers {
                Change::Cover { seg, off }.encode(&mut body);
            }
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
        let flags = u32::from_le_bytes(body[12..16].try_into().expect("4"));
        if flags & !CKPT_COVERS != 0 {
            return Err(JournalError::Invalid("unknown checkpoint flags"));
        }
        let n = u64_at(body, 16);
        let runs_end = n
            .checked_mul(ENTRY as u64)
            .and_then(|b| b.checked_add(24))
            .filter(|&e| e <= body.len() as u64)
            .ok_or(JournalError::Invalid("run count and length disagree"))?
            as usize;
        let mut covers = Vec::new();
        if flags & CKPT_COVERS != 0 {
            let m = body
                .get(runs_end..runs_end + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8")))
                .ok_or(JournalError::Invalid("checkpoint covers cut short"))?;
            if (body.len() - runs_end - 8) as u64 != m.saturating_mul(ENTRY as u64) || m == 0 {
                return Err(JournalError::Invalid("cover count and length disagree"));
            }
            for c in body[runs_end + 8..].chunks_exact(ENTRY) {
                match Change::decode(c.try_into().expect("ENTRY"))? {
                    Change::Cover { seg, off } => covers.push((seg, off)),
                    _ => return Err(JournalError::Invalid("a checkpoint cover of another kind")),
                }
            }
        } else if runs_end != body.len() {
            return Err(JournalError::Invalid("run count and length disagree"));
        }
        let mut map = ExtentMap::new(block_size);
        let mut next = 0u64;
        for c in body[24..runs_end].chunks_exact(ENTRY) {
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
            covers,
        })
    }
}

/// "CBB1": a batch of blocks appended to a segment.
pub const BATCH_MAGIC: u32 = u32::from_le_bytes(*b"CBB1");
/// Bytes of a batch header before its extents.
pub const BATCH_HEADER: usize = 32;
/// Bytes of one extent in a batch header.
pub const BATCH_EXTENT: usize = 16;
/// The most data one batch carries (a reader refuses more).
pub const MAX_BATCH_DATA: usize = 64 << 20;

/// What a batch's data is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchKind {
    /// Client writes: its extents, in order, are where its data belongs.
    Writes = 1,
    /// Blocks the collector copied: mapped by the journal, not by the batch (no extents).
    Copies = 2,
}

/// The header of one append to a segment: a reopening server maps the writes of batches a
/// journal record does not cover from these, in `seq` order (docs/block.md, "Segments").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Orders batches of all of a server's segments: a write that overlaps one still in
    /// flight waits for it, so for any block the later write has the larger number.
    pub seq: u64,
    pub kind: BatchKind,
    /// (first block, blocks) of each write, in the order their data follows the header.
    pub extents: Vec<(u64, u32)>,
}

impl Batch {
    /// Bytes of the header (the data starts there).
    pub fn header_len(&self) -> usize {
        BATCH_HEADER + BATCH_EXTENT * self.extents.len()
    }

    /// The header for `data`; its CRC covers the header after it and the data.
    pub fn encode(&self, data: &[u8]) -> Vec<u8> {
        self.encode_parts(&[data])
    }

    /// The header for data in parts, one after another.
    pub fn encode_parts(&self, data: &[&[u8]]) -> Vec<u8> {
        let len: usize = data.iter().map(|d| d.len()).sum();
        let mut h = Vec::with_capacity(self.header_len());
        h.extend_from_slice(&BATCH_MAGIC.to_le_bytes());
        h.extend_from_slice(&[0; 4]);
        h.extend_from_slice(&self.seq.to_le_bytes());
        h.extend_from_slice(&(len as u32).to_le_bytes());
        h.extend_from_slice(&(self.extents.len() as u32).to_le_bytes());
        h.push(self.kind as u8);
        h.extend_from_slice(&[0; 7]);
        for &(lba, blocks) in &self.extents {
            h.extend_from_slice(&lba.to_le_bytes());
            h.extend_from_slice(&blocks.to_le_bytes());
            h.extend_from_slice(&[0; 4]);
        }
        let mut crc = crc32c::crc32c(&h[8..]);
        for d in data {
            crc = crc32c::crc32c_append(crc, d);
        }
        h[4..8].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// The batch at the start of `b` (whole, data included) and the bytes it takes with its
    /// data; writes must fill their data exactly in blocks of `block_size`.
    ///
    /// # Errors
    /// As [`JournalError`]: a torn tail ([`JournalError::Short`]), anything else.
    pub fn decode(b: &[u8], block_size: u32) -> Result<(Self, usize), JournalError> {
        if b.len() < BATCH_HEADER {
            return Err(JournalError::Short);
        }
        if u32::from_le_bytes(b[0..4].try_into().expect("4")) != BATCH_MAGIC {
            return Err(JournalError::Magic);
        }
        let crc = u32::from_le_bytes(b[4..8].try_into().expect("4"));
        let seq = u64_at(b, 8);
        let len = u32::from_le_bytes(b[16..20].try_into().expect("4")) as usize;
        let n = u32::from_le_bytes(b[20..24].try_into().expect("4")) as usize;
        if b[25..32] != [0; 7] {
            return Err(JournalError::Invalid(
                "reserved bytes of a batch are not zero",
            ));
        }
        let kind = match b[24] {
            1 => BatchKind::Writes,
            2 if n == 0 => BatchKind::Copies,
            2 => return Err(JournalError::Invalid("copies with extents")),
            _ => return Err(JournalError::Invalid("unknown batch kind")),
        };
        if len > MAX_BATCH_DATA || n > MAX_BATCH_DATA / 512 {
            return Err(JournalError::Invalid("batch longer than any written"));
        }
        let head = BATCH_HEADER + BATCH_EXTENT * n;
        let total = head + len;
        let whole = b.get(..total).ok_or(JournalError::Short)?;
        if crc32c::crc32c_append(crc32c::crc32c(&whole[8..head]), &whole[head..]) != crc {
            return Err(JournalError::Crc);
        }
        let mut extents = Vec::with_capacity(n);
        let mut blocks_total = 0u64;
        for e in whole[BATCH_HEADER..head].chunks_exact(BATCH_EXTENT) {
            let lba = u64_at(e, 0);
            let blocks = u32::from_le_bytes(e[8..12].try_into().expect("4"));
            if e[12..16] != [0; 4] {
                return Err(JournalError::Invalid(
                    "reserved bytes of an extent are not zero",
                ));
            }
            if blocks == 0 || lba.checked_add(u64::from(blocks)).is_none() {
                return Err(JournalError::Invalid("an extent past the last block"));
            }
            blocks_total += u64::from(blocks);
            extents.push((lba, blocks));
        }
        if kind == BatchKind::Writes && blocks_total * u64::from(block_size) != len as u64 {
            return Err(JournalError::Invalid("extents and data length disagree"));
        }
        Ok((Self { seq, kind, extents }, total))
    }
}

/// Every whole batch at the start of `b`, each with the offset in `b` its data starts at,
/// and where the valid prefix ends: a batch cut short at the end of `b` is not in it (read
/// on from there), anything else invalid ends the segment.
pub fn scan_batches(b: &[u8], block_size: u32) -> (Vec<(Batch, usize)>, usize, bool) {
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        match Batch::decode(&b[at..], block_size) {
            Ok((batch, used)) => {
                let data = at + batch.header_len();
                out.push((batch, data));
                at += used;
            }
            Err(JournalError::Short) => return (out, at, false),
            Err(_) => return (out, at, true),
        }
    }
    (out, at, false)
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
        let mut c = Checkpoint {
            seq: 42,
            block_size: 4096,
            map,
            covers: Vec::new(),
        };
        let b = c.encode();
        assert_eq!(Checkpoint::decode(&b).unwrap(), c);
        assert!(Checkpoint::decode(&b[..b.len() - 1]).is_err());
        // With the segments being appended to.
        c.covers = vec![(3, 8192), (4, 0)];
        let b = c.encode();
        assert_eq!(Checkpoint::decode(&b).unwrap(), c);
        assert!(Checkpoint::decode(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn covers_round_trip_in_records_and_change_nothing() {
        let r = Record {
            seq: 3,
            changes: vec![Change::Cover { seg: 7, off: 12345 }],
        };
        let (got, _) = Record::decode(&r.encode()).unwrap();
        assert_eq!(got, r);
        let mut map = ExtentMap::new(4096);
        got.changes[0].apply(&mut map);
        assert_eq!(map.len(), 0);
    }

    fn batch() -> impl Strategy<Value = (Batch, Vec<u8>)> {
        (
            any::<u64>(),
            prop::collection::vec((0u64..1 << 40, 1u32..4), 0..6),
            any::<bool>(),
            any::<u8>(),
        )
            .prop_map(|(seq, extents, copies, fill)| {
                let blocks: u64 = extents.iter().map(|e| u64::from(e.1)).sum();
                if copies {
                    let data = vec![fill; (blocks * 512) as usize];
                    (
                        Batch {
                            seq,
                            kind: BatchKind::Copies,
                            extents: Vec::new(),
                        },
                        data,
                    )
                } else {
                    let data = vec![fill; (blocks * 512) as usize];
                    (
                        Batch {
                            seq,
                            kind: BatchKind::Writes,
                            extents,
                        },
                        data,
                    )
                }
            })
    }

    proptest! {
        #[test]
        fn batches_scan_back_whole_and_stop_at_a_torn_or_damaged_one(
            batches in prop::collection::vec(batch(), 1..6),
            cut in any::<prop::sample::Index>(),
            bit in any::<prop::sample::Index>(),
        ) {
            let mut seg = Vec::new();
            let mut ends = Vec::new();
            let mut starts = Vec::new();
            for (b, data) in &batches {
                let h = b.encode_parts(&[&data[..data.len() / 2], &data[data.len() / 2..]]);
                prop_assert_eq!(&h, &b.encode(data));
                seg.extend_from_slice(&h);
                starts.push(seg.len());
                seg.extend_from_slice(data);
                ends.push(seg.len());
            }
            let (got, used, bad) = scan_batches(&seg, 512);
            prop_assert!(!bad);
            prop_assert_eq!(used, seg.len());
            prop_assert_eq!(got.len(), batches.len());
            for (i, (b, at)) in got.iter().enumerate() {
                prop_assert_eq!(b, &batches[i].0);
                prop_assert_eq!(*at, starts[i]);
                prop_assert_eq!(&seg[*at..ends[i]], &batches[i].1[..]);
            }
            // Cut anywhere: the batches wholly before the cut, and the cut one is "short".
            let at = cut.index(seg.len());
            let (got, used, bad) = scan_batches(&seg[..at], 512);
            let whole = ends.iter().filter(|&&e| e <= at).count();
            prop_assert!(!bad);
            prop_assert_eq!(got.len(), whole);
            prop_assert_eq!(used, if whole == 0 { 0 } else { ends[whole - 1] });
            // A flipped bit: never a batch that was not written.
            let i = bit.index(seg.len() * 8);
            seg[i / 8] ^= 1 << (i % 8);
            let (got, _, _) = scan_batches(&seg, 512);
            for (j, (b, _)) in got.iter().enumerate() {
                prop_assert_eq!(b, &batches[j].0);
                prop_assert!(ends[j] <= i / 8);
            }
        }
    }
}
