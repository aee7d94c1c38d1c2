//! A file's extents (docs/files.md "How a file's bytes are kept"): laying new ones over
//! them and cutting ranges out, touching only the extents a range covers.

use super::Extent;
use std::ops::Range;

/// The extents of `extents` (sorted, not overlapping) that bytes `[from, to)` touch, as an
/// index range found by binary search, and what is left of them outside those bytes: the
/// first one's part before `from`, the last one's part from `to`. Only they change when
/// the range is cut out or overwritten: a file of many extents costs a search, not a walk
/// (each extent of a 4 KiB random write rebuilt the whole list before).
fn covered(
    extents: &[Extent],
    from: u64,
    to: u64,
) -> (Range<usize>, Option<Extent>, Option<Extent>) {
    let lo = extents.partition_point(|e| e.end() <= from);
    let hi = lo + extents[lo..].partition_point(|e| e.offset < to);
    let (mut left, mut right) = (None, None);
    if lo < hi {
        let first = extents[lo];
        if first.offset < from {
            left = Some(Extent {
                len: from - first.offset,
                ..first
            });
        }
        let last = extents[hi - 1];
        if last.end() > to {
            let skip = to - last.offset;
            right = Some(Extent {
                offset: to,
                len: last.len - skip,
                seg: last.seg,
                seg_offset: last.seg_offset + skip,
            });
        }
    }
    (lo..hi, left, right)
}

/// The bytes of `extents` (sorted, not overlapping) after cutting out `[from, to)`.
pub fn cut(extents: &mut Vec<Extent>, from: u64, to: u64) {
    let (range, left, right) = covered(extents, from, to);
    extents.splice(range, left.into_iter().chain(right));
}

/// Puts `new` into `extents` (sorted, not overlapping), replacing what it covers and joining
/// it to a neighbour that continues it in the same segment.
pub fn overlay(extents: &mut Vec<Extent>, new: Extent) {
    if new.len == 0 {
        return;
    }
    // The covered extents give way to what is left of them and `new`, in one splice (the
    // tail moves only when their number changes).
    let (range, left, right) = covered(extents, new.offset, new.end());
    let at = range.start + usize::from(left.is_some());
    extents.splice(range, left.into_iter().chain(Some(new)).chain(right));
    join_around(extents, at);
}

/// Joins extent `at` with the one before and after it when the bytes continue in the same
/// segment.
fn join_around(extents: &mut Vec<Extent>, at: usize) {
    let joins = |a: &Extent, b: &Extent| {
        a.end() == b.offset && a.seg == b.seg && a.seg_offset + a.len == b.seg_offset
    };
    if at + 1 < extents.len() && joins(&extents[at], &extents[at + 1]) {
        extents[at].len += extents[at + 1].len;
        extents.remove(at + 1);
    }
    if at > 0 && joins(&extents[at - 1], &extents[at]) {
        extents[at - 1].len += extents[at].len;
        extents.remove(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(offset: u64, len: u64, seg: u64, seg_offset: u64) -> Extent {
        Extent {
            offset,
            len,
            seg,
            seg_offset,
        }
    }

    /// `cut` as it was: a walk over every extent into a new list (the reference).
    fn cut_walk(extents: &mut Vec<Extent>, from: u64, to: u64) {
        let mut out = Vec::new();
        for e in extents.drain(..) {
            if e.end() <= from || e.offset >= to {
                out.push(e);
                continue;
            }
            if e.offset < from {
                out.push(Extent {
                    len: from - e.offset,
                    ..e
                });
            }
            if e.end() > to {
                let skip = to - e.offset;
                out.push(Extent {
                    offset: to,
                    len: e.len - skip,
                    seg: e.seg,
                    seg_offset: e.seg_offset + skip,
                });
            }
        }
        *extents = out;
    }

    /// `overlay` as it was, on [`cut_walk`] and a search after it.
    fn overlay_walk(extents: &mut Vec<Extent>, new: Extent) {
        if new.len == 0 {
            return;
        }
        cut_walk(extents, new.offset, new.end());
        let at = extents.partition_point(|e| e.offset < new.offset);
        extents.insert(at, new);
        // (The joins did not change.)
        join_around(extents, at);
    }

    /// The searched `cut` and `overlay` give the very lists the walks gave (the masters'
    /// state must not change shape under them), over random writes, rewrites, sequential
    /// runs that join, punches and truncates of a small file, so that they overlap a lot.
    #[test]
    fn searched_cut_and_overlay_give_the_walks_lists() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..200 {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let mut seg_end = 0u64;
            for _ in 0..300 {
                match next(10) {
                    0 => {
                        let from = next(70_000);
                        let to = if next(4) == 0 {
                            u64::MAX
                        } else {
                            from + next(9_000)
                        };
                        cut(&mut a, from, to);
                        cut_walk(&mut b, from, to);
                    }
                    k => {
                        // A run that continues the last write in its segment (joins), or
                        // one anywhere in one of three segments.
                        let len = 1 + next(if k < 4 { 4_096 } else { 20_000 });
                        let (offset, seg, seg_offset) = if k == 9 && !a.is_empty() {
                            let last: &Extent = &a[next(a.len() as u64) as usize];
                            (last.end(), last.seg, last.seg_offset + last.len)
                        } else {
                            seg_end += len;
                            (next(64_000), 1 + next(3), seg_end)
                        };
                        let e = ext(offset, len, seg, seg_offset);
                        overlay(&mut a, e);
                        overlay_walk(&mut b, e);
                    }
                }
                assert_eq!(a, b, "round {round}");
                assert!(
                    a.windows(2)
                        .all(|w| w[0].end() <= w[1].offset && w[0].len > 0),
                    "sorted, apart, none empty: {a:?}"
                );
            }
        }
    }
}
