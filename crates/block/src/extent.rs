//! A volume's index: which blocks were written where (docs/block.md, "Index").
//!
//! Runs of blocks map to a byte offset in a segment file; a block in no run was never written
//! (or was trimmed) and reads as zeros. A write replaces whatever runs it overlaps, cutting
//! them at its edges; a run that continues the one before it in the same segment joins it,
//! so sequential writes stay one run. Offsets are computed wrapping: a run read from a
//! damaged journal may name any offset, and a read there fails rather than the server.

use std::collections::{BTreeMap, BTreeSet};

/// Where a run of blocks is: `blocks` blocks at byte `off` of segment `seg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub blocks: u64,
    pub seg: u64,
    pub off: u64,
}

/// A piece of a looked-up range: written (`Some(seg, off)`) or a hole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub lba: u64,
    pub blocks: u64,
    pub at: Option<(u64, u64)>,
}

/// Runs by first block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtentMap {
    runs: BTreeMap<u64, Run>,
    block_size: u64,
}

impl ExtentMap {
    pub fn new(block_size: u32) -> Self {
        Self {
            runs: BTreeMap::new(),
            block_size: u64::from(block_size),
        }
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Runs in the map.
    pub fn len(&self) -> usize {
        self.runs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Blocks that map somewhere.
    pub fn mapped_blocks(&self) -> u64 {
        self.runs
            .values()
            .fold(0u64, |a, r| a.saturating_add(r.blocks))
    }

    /// Every run in block order: (first block, run).
    pub fn iter(&self) -> impl Iterator<Item = (u64, Run)> + '_ {
        self.runs.iter().map(|(&l, &r)| (l, r))
    }

    /// Blocks `lba..lba+blocks` now hold what segment `seg` holds from byte `off` on.
    pub fn insert(&mut self, lba: u64, blocks: u64, seg: u64, off: u64) {
        if blocks == 0 {
            return;
        }
        self.punch(lba, blocks);
        let mut start = lba;
        let mut run = Run { blocks, seg, off };
        // Join the run that ends where this one starts, in the same segment, right before it.
        if let Some((&pl, &p)) = self.runs.range(..lba).next_back()
            && pl + p.blocks == lba
            && p.seg == seg
            && p.off.wrapping_add(p.blocks.wrapping_mul(self.block_size)) == off
        {
            start = pl;
            run = Run {
                blocks: p.blocks + blocks,
                seg,
                off: p.off,
            };
        }
        // And the one that starts where this one ends.
        let end = lba + blocks;
        if let Some(&n) = self.runs.get(&end)
            && n.seg == seg
            && off.wrapping_add(blocks.wrapping_mul(self.block_size)) == n.off
        {
            self.runs.remove(&end);
            run.blocks += n.blocks;
        }
        self.runs.insert(start, run);
    }

    /// Blocks `lba..lba+blocks` map nowhere any more (they read as zeros).
    pub fn punch(&mut self, lba: u64, blocks: u64) {
        if blocks == 0 {
            return;
        }
        let end = lba + blocks;
        let mut hit: Vec<(u64, Run)> = Vec::new();
        if let Some((&pl, &p)) = self.runs.range(..lba).next_back()
            && pl + p.blocks > lba
        {
            hit.push((pl, p));
        }
        hit.extend(self.runs.range(lba..end).map(|(&l, &r)| (l, r)));
        for (l, r) in hit {
            self.runs.remove(&l);
            if l < lba {
                self.runs.insert(
                    l,
                    Run {
                        blocks: lba - l,
                        ..r
                    },
                );
            }
            let r_end = l + r.blocks;
            if r_end > end {
                self.runs.insert(
                    end,
                    Run {
                        blocks: r_end - end,
                        seg: r.seg,
                        off: r.off.wrapping_add((end - l).wrapping_mul(self.block_size)),
                    },
                );
            }
        }
    }

    /// What `lba..lba+blocks` is made of, in order, holes included.
    pub fn lookup(&self, lba: u64, blocks: u64) -> Vec<Piece> {
        let end = lba + blocks;
        let mut out = Vec::new();
        let mut at = lba;
        let first = self
            .runs
            .range(..lba)
            .next_back()
            .filter(|(l, r)| **l + r.blocks > lba)
            .map(|(&l, &r)| (l, r));
        for (l, r) in first
            .into_iter()
            .chain(self.runs.range(lba..end).map(|(&l, &r)| (l, r)))
        {
            if l > at {
                out.push(Piece {
                    lba: at,
                    blocks: l - at,
                    at: None,
                });
                at = l;
            }
            let stop = (l + r.blocks).min(end);
            out.push(Piece {
                lba: at,
                blocks: stop - at,
                at: Some((
                    r.seg,
                    r.off.wrapping_add((at - l).wrapping_mul(self.block_size)),
                )),
            });
            at = stop;
        }
        if at < end {
            out.push(Piece {
                lba: at,
                blocks: end - at,
                at: None,
            });
        }
        out
    }

    /// Live bytes per segment (what garbage collection weighs a segment by).
    pub fn live_bytes(&self) -> BTreeMap<u64, u64> {
        let mut m = BTreeMap::new();
        for r in self.runs.values() {
            *m.entry(r.seg).or_default() += r.blocks.saturating_mul(self.block_size);
        }
        m
    }

    /// The runs in each of `segs` (one pass over the map): (first block, run), by segment.
    pub fn runs_in(&self, segs: &BTreeSet<u64>) -> BTreeMap<u64, Vec<(u64, Run)>> {
        let mut by: BTreeMap<u64, Vec<(u64, Run)>> = BTreeMap::new();
        for (l, r) in self.iter().filter(|(_, r)| segs.contains(&r.seg)) {
            by.entry(r.seg).or_default().push((l, r));
        }
        by
    }

    /// Garbage collection moved the run `lba..lba+blocks` from byte `from` of segment
    /// `from_seg` to byte `to` of `to_seg`: the blocks that still map where they were now map
    /// to the copy; blocks written or trimmed since keep what they have. Returns the pieces
    /// moved: (first block, blocks, segment, offset).
    pub fn remap(
        &mut self,
        lba: u64,
        blocks: u64,
        (from_seg, from): (u64, u64),
        (to_seg, to): (u64, u64),
    ) -> Vec<(u64, u64, u64, u64)> {
        let bs = self.block_size;
        let mut moved = Vec::new();
        for p in self.lookup(lba, blocks) {
            let skip = (p.lba - lba).wrapping_mul(bs);
            if p.at == Some((from_seg, from.wrapping_add(skip))) {
                moved.push((p.lba, p.blocks, to_seg, to.wrapping_add(skip)));
            }
        }
        for &(l, n, seg, off) in &moved {
            self.insert(l, n, seg, off);
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The naive model: one entry per block.
    fn model_apply(m: &mut [Option<(u64, u64)>], op: &(bool, u64, u64, u64), bs: u64) {
        let (write, lba, n, seg) = *op;
        for i in 0..n {
            let b = (lba + i) as usize;
            m[b] = write.then_some((seg, seg * 1_000_000 + (lba + i) * bs));
        }
    }

    proptest! {
        #[test]
        fn map_matches_a_block_by_block_model(
            ops in prop::collection::vec((any::<bool>(), 0u64..60, 1u64..12, 0u64..4), 1..80)
        ) {
            let bs = 512u64;
            let mut m = ExtentMap::new(bs as u32);
            let mut model = vec![None; 80];
            for op in &ops {
                let (write, lba, n, seg) = *op;
                if write {
                    // Offsets that make neighbouring writes of a segment contiguous.
                    m.insert(lba, n, seg, seg * 1_000_000 + lba * bs);
                } else {
                    m.punch(lba, n);
                }
                model_apply(&mut model, op, bs);
            }
            let pieces = m.lookup(0, 80);
            let mut at = 0;
            for p in &pieces {
                prop_assert_eq!(p.lba, at);
                for i in 0..p.blocks {
                    let want = model[(p.lba + i) as usize];
                    let got = p.at.map(|(s, o)| (s, o + i * bs));
                    prop_assert_eq!(got, want, "block {}", p.lba + i);
                }
                at += p.blocks;
            }
            prop_assert_eq!(at, 80);
            prop_assert_eq!(m.mapped_blocks(), model.iter().filter(|b| b.is_some()).count() as u64);
            // Runs never overlap and never touch a joinable neighbour.
            let runs: Vec<_> = m.iter().collect();
            for w in runs.windows(2) {
                prop_assert!(w[0].0 + w[0].1.blocks <= w[1].0);
            }
        }
    }

    proptest! {
        /// Moving a segment's runs elsewhere (garbage collection) while writes and trims
        /// land in between: every block reads what the model says, the moved ones from the
        /// copy, and nothing is left in the old segment.
        #[test]
        fn remapping_a_segment_keeps_what_was_written_since(
            before in prop::collection::vec((any::<bool>(), 0u64..60, 1u64..12, 0u64..3), 1..40),
            between in prop::collection::vec((any::<bool>(), 0u64..60, 1u64..12, 5u64..6), 0..20),
        ) {
            let bs = 512u64;
            let mut m = ExtentMap::new(bs as u32);
            let mut model = vec![None; 80];
            let at = |seg: u64, lba: u64| seg * 1_000_000 + lba * bs;
            for op in &before {
                let (write, lba, n, seg) = *op;
                if write { m.insert(lba, n, seg, at(seg, lba)); } else { m.punch(lba, n); }
                model_apply(&mut model, op, bs);
            }
            // The collector reads segment 1's runs, then the client writes and trims...
            let runs = m.runs_in(&BTreeSet::from([1])).remove(&1).unwrap_or_default();
            for op in &between {
                let (write, lba, n, seg) = *op;
                if write { m.insert(lba, n, seg, at(seg, lba)); } else { m.punch(lba, n); }
                model_apply(&mut model, op, bs);
            }
            // ...then the copies (in segment 9, at the model's offsets) replace what is left.
            for (lba, r) in runs {
                m.remap(lba, r.blocks, (r.seg, r.off), (9, at(9, lba)));
            }
            for b in model.iter_mut().flatten() {
                if b.0 == 1 {
                    *b = (9, b.1 - 1_000_000 + 9_000_000);
                }
            }
            prop_assert!(m.runs_in(&BTreeSet::from([1])).is_empty());
            for p in m.lookup(0, 80) {
                for i in 0..p.blocks {
                    let got = p.at.map(|(s, o)| (s, o + i * bs));
                    prop_assert_eq!(got, model[(p.lba + i) as usize], "block {}", p.lba + i);
                }
            }
        }
    }

    #[test]
    fn sequential_writes_stay_one_run() {
        let mut m = ExtentMap::new(4096);
        for i in 0..100 {
            m.insert(i, 1, 7, i * 4096);
        }
        assert_eq!(m.len(), 1);
        m.insert(50, 1, 8, 0);
        assert_eq!(m.len(), 3);
        assert_eq!(
            m.lookup(49, 3),
            vec![
                Piece {
                    lba: 49,
                    blocks: 1,
                    at: Some((7, 49 * 4096))
                },
                Piece {
                    lba: 50,
                    blocks: 1,
                    at: Some((8, 0))
                },
                Piece {
                    lba: 51,
                    blocks: 1,
                    at: Some((7, 51 * 4096))
                },
            ]
        );
    }
}
