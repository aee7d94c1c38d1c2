//! The in-memory index: chunk table and free-extent bitmap.
//!
//! RAM per chunk: a `ChunkEntry` (≈ 64 B) in a hash map (≈ 16 B + load factor) plus 4 B per
//! extent; ≈ 0.4 KiB for a full 64 MiB chunk. The allocator keeps one bit per extent
//! (128 KiB per TiB at 1 MiB extents).

use crate::error::ChunkId;
use crate::format::checkpoint::ChunkRecord;
use std::collections::HashMap;

/// What readers and the writer agree on about a chunk: only durable state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkEntry {
    pub epoch: u64,
    pub version: u64,
    /// Durable length: every byte below it is acknowledged.
    pub length: u64,
    /// CRC32C of bytes `[0, length)`.
    pub crc: u32,
    pub sealed: bool,
    /// Extents in chunk order.
    pub extents: Vec<u32>,
}

impl ChunkEntry {
    /// A chunk just created: empty, open, no extents.
    pub fn empty(epoch: u64, version: u64) -> Self {
        Self {
            epoch,
            version,
            length: 0,
            crc: 0,
            sealed: false,
            extents: Vec::new(),
        }
    }

    /// From its checkpoint record.
    pub fn from_record(c: &ChunkRecord) -> Self {
        Self {
            epoch: c.epoch,
            version: c.version,
            length: c.length,
            crc: c.crc,
            sealed: c.sealed,
            extents: c.extents.clone(),
        }
    }

    /// Its checkpoint record.
    pub fn record(&self, chunk_id: ChunkId) -> ChunkRecord {
        ChunkRecord {
            chunk_id,
            epoch: self.epoch,
            version: self.version,
            length: self.length,
            crc: self.crc,
            sealed: self.sealed,
            extents: self.extents.clone(),
        }
    }
}

/// The chunk table.
#[derive(Debug, Default)]
pub struct Index {
    pub chunks: HashMap<ChunkId, ChunkEntry>,
}

/// Free-extent bitmap. Allocation takes the lowest free extent at or after a cursor, so
/// chunks written together land near each other.
#[derive(Debug, Clone)]
pub struct Allocator {
    words: Vec<u64>,
    count: u32,
    free: u32,
    cursor: u32,
}

impl Allocator {
    /// All `count` extents free.
    pub fn new(count: u32) -> Self {
        let mut words = vec![!0u64; (count as usize).div_ceil(64)];
        if !count.is_multiple_of(64) {
            *words.last_mut().expect("non-empty") = (1u64 << (count % 64)) - 1;
        }
        Self {
            words,
            count,
            free: count,
            cursor: 0,
        }
    }

    pub fn free_count(&self) -> u32 {
        self.free
    }

    /// Marks `e` used. Returns false if it was already used.
    pub fn take(&mut self, e: u32) -> bool {
        let (w, b) = ((e / 64) as usize, e % 64);
        if self.words[w] & (1 << b) == 0 {
            return false;
        }
        self.words[w] &= !(1 << b);
        self.free -= 1;
        true
    }

    /// Allocates one extent.
    pub fn allocate(&mut self) -> Option<u32> {
        if self.free == 0 {
            return None;
        }
        let n = self.words.len();
        let start = (self.cursor / 64) as usize;
        for i in 0..=n {
            let w = (start + i) % n;
            let mut bits = self.words[w];
            if i == 0 {
                // Only bits at or after the cursor on the first word.
                bits &= !0u64 << (self.cursor % 64);
            }
            if bits != 0 {
                let e = (w * 64) as u32 + bits.trailing_zeros();
                let taken = self.take(e);
                debug_assert!(taken);
                self.cursor = (e + 1) % self.count;
                return Some(e);
            }
        }
        None
    }

    /// Returns `e` to the free set.
    ///
    /// # Panics
    /// If `e` is already free: a double free means the index is wrong.
    pub fn release(&mut self, e: u32) {
        let (w, b) = ((e / 64) as usize, e % 64);
        assert!(self.words[w] & (1 << b) == 0, "double free of extent {e}");
        self.words[w] |= 1 << b;
        self.free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_all_then_none() {
        let mut a = Allocator::new(130);
        let mut got: Vec<u32> = (0..130).map(|_| a.allocate().unwrap()).collect();
        assert_eq!(a.allocate(), None);
        got.sort();
        assert_eq!(got, (0..130).collect::<Vec<_>>());
        a.release(77);
        assert_eq!(a.allocate(), Some(77));
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_panics() {
        let mut a = Allocator::new(10);
        a.release(3);
    }
}
