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
    /// Large appends (docs/formats/chunk-store.md §3.2) as `(logical offset, length)`, in
    /// offset order: 12 B each, at most one per 512 KiB of data.
    pub large: Vec<(u64, u32)>,
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
            large: Vec::new(),
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
            large: c.large.clone(),
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
            large: self.large.clone(),
        }
    }
}

/// The chunk table.
#[derive(Debug, Default)]
pub struct Index {
    pub chunks: HashMap<ChunkId, ChunkEntry>,
}

/// Free-extent bitmap that keeps each chunk's extents physically contiguous where it can.
///
/// A chunk that grows takes the extent right after its last one when that is free, so an
/// append that crosses an extent boundary is still one device write and a sequential read
/// of the chunk one device read. To leave that room, a chunk's first extent is taken at the
/// start of a free run of `stride` extents (the extents a chunk of the maximum size needs)
/// when one exists; otherwise, and when the next extent is taken, allocation takes the lowest
/// free extent at or after a cursor (next fit).
#[derive(Debug, Clone)]
pub struct Allocator {
    words: Vec<u64>,
    count: u32,
    free: u32,
    cursor: u32,
    stride: u32,
}

/// Free runs probed for a chunk's first extent before falling back to next fit.
const MAX_RUN_PROBES: u32 = 4096;

impl Allocator {
    /// All `count` extents free; a chunk of the maximum size spans `stride` extents.
    pub fn new(count: u32, stride: u32) -> Self {
        let mut words = vec![!0u64; (count as usize).div_ceil(64)];
        if !count.is_multiple_of(64) {
            *words.last_mut().expect("non-empty") = (1u64 << (count % 64)) - 1;
        }
        Self {
            words,
            count,
            free: count,
            cursor: 0,
            stride: stride.max(1),
        }
    }

    fn is_free(&self, e: u32) -> bool {
        e < self.count && self.words[(e / 64) as usize] & (1 << (e % 64)) != 0
    }

    /// Allocates one extent for a chunk whose last extent is `prev` (`None`: its first).
    pub fn allocate(&mut self, prev: Option<u32>) -> Option<u32> {
        if self.free == 0 {
            return None;
        }
        let e = match prev {
            Some(p) if self.is_free(p + 1) => Some(p + 1),
            Some(_) => None,
            None => self.free_run(),
        };
        match e {
            Some(e) => {
                let taken = self.take(e);
                debug_assert!(taken);
                Some(e)
            }
            None => self.next_fit(),
        }
    }

    /// The first extent of a free, stride-aligned run of `stride` extents at or after the
    /// cursor (wrapping), probing at most MAX_RUN_PROBES runs.
    fn free_run(&mut self) -> Option<u32> {
        let runs = self.count / self.stride;
        if runs == 0 {
            return None;
        }
        let first = self.cursor.div_ceil(self.stride) % runs;
        for i in 0..runs.min(MAX_RUN_PROBES) {
            let start = (first + i) % runs * self.stride;
            if (start..start + self.stride).all(|e| self.is_free(e)) {
                self.cursor = (start + self.stride) % self.count;
                return Some(start);
            }
        }
        None
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

    /// The lowest free extent at or after the cursor (wrapping).
    fn next_fit(&mut self) -> Option<u32> {
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
        let mut a = Allocator::new(130, 8);
        let mut got: Vec<u32> = (0..130)
            .map(|i| a.allocate((i % 3 == 0).then_some(i)).unwrap())
            .collect();
        assert_eq!(a.allocate(None), None);
        got.sort();
        assert_eq!(got, (0..130).collect::<Vec<_>>());
        a.release(77);
        assert_eq!(a.allocate(None), Some(77));
    }

    #[test]
    fn chunks_grow_contiguously_in_their_own_runs() {
        let mut a = Allocator::new(64, 8);
        // Three chunks start in separate runs and grow interleaved, each into its own run.
        let mut last: Vec<u32> = (0..3).map(|_| a.allocate(None).unwrap()).collect();
        assert_eq!(last, vec![0, 8, 16]);
        for _ in 0..7 {
            for l in &mut last {
                let e = a.allocate(Some(*l)).unwrap();
                assert_eq!(e, *l + 1);
                *l = e;
            }
        }
        // A chunk past its run continues with the next free extent.
        assert_eq!(a.allocate(Some(7)), Some(24));
    }

    #[test]
    fn first_extent_falls_back_to_next_fit_without_a_free_run() {
        let mut a = Allocator::new(16, 8);
        assert!(a.take(3));
        assert!(a.take(12));
        // No run of 8 is free: next fit from the cursor.
        assert_eq!(a.allocate(None), Some(0));
        assert_eq!(a.allocate(None), Some(1));
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_panics() {
        let mut a = Allocator::new(10, 1);
        a.release(3);
    }
}
