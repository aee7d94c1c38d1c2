//! Where the bytes of an erasure-coded chunk group live (docs/erasure-coding.md §2).
//!
//! A chunk group is K+M chunks on K+M servers. Its user bytes are cut into stripes of K cells
//! of `cell` bytes; stripe `s`'s data cell `i` is bytes `[s·cell, (s+1)·cell)` of data chunk
//! `i`, and its parity cell `j` the same range of parity chunk `j`. Every chunk of the group
//! therefore has the same length, `stripes · cell`, and a stripe is complete or absent.

use crate::codec::CELL_ALIGN;
use serde::{Deserialize, Serialize};
use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeLayout {
    pub k: u32,
    pub m: u32,
    /// Bytes per cell: a non-zero multiple of [`CELL_ALIGN`].
    pub cell: u32,
}

/// One contiguous piece of a user range, inside one data cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The data chunk (0..K) holding it.
    pub chunk: u32,
    /// Offset in that chunk.
    pub chunk_offset: u64,
    pub len: u64,
    /// Offset in the user range asked for (0 for the first piece).
    pub at: u64,
}

impl StripeLayout {
    pub fn new(k: u32, m: u32, cell: u32) -> Option<Self> {
        (k > 0 && m > 0 && cell > 0 && (cell as usize).is_multiple_of(CELL_ALIGN)).then_some(Self {
            k,
            m,
            cell,
        })
    }

    /// User bytes per stripe (K · cell).
    pub fn stripe_bytes(&self) -> u64 {
        u64::from(self.k) * u64::from(self.cell)
    }

    /// The stripes touched by the user range `[off, off + len)`.
    pub fn stripes(&self, off: u64, len: u64) -> Range<u64> {
        if len == 0 {
            return off / self.stripe_bytes()..off / self.stripe_bytes();
        }
        off / self.stripe_bytes()..(off + len).div_ceil(self.stripe_bytes())
    }

    /// The data-cell pieces of the user range `[off, off + len)`, in user order.
    pub fn pieces(&self, off: u64, len: u64) -> impl Iterator<Item = Piece> + '_ {
        let cell = u64::from(self.cell);
        let mut pos = off;
        let end = off + len;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let stripe = pos / self.stripe_bytes();
            let in_stripe = pos % self.stripe_bytes();
            let chunk = (in_stripe / cell) as u32;
            let in_cell = in_stripe % cell;
            let n = (cell - in_cell).min(end - pos);
            let p = Piece {
                chunk,
                chunk_offset: stripe * cell + in_cell,
                len: n,
                at: pos - off,
            };
            pos += n;
            Some(p)
        })
    }

    /// Each chunk's length once `stripes` stripes are written.
    pub fn chunk_len(&self, stripes: u64) -> u64 {
        stripes * u64::from(self.cell)
    }

    /// Bytes on devices (all K+M chunks) for `user` user bytes, the last stripe padded.
    pub fn stored_bytes(&self, user: u64) -> u64 {
        user.div_ceil(self.stripe_bytes()) * u64::from(self.k + self.m) * u64::from(self.cell)
    }

    /// Splits the user bytes of whole stripes into the cells of each stripe: cell `i` of
    /// stripe `s` is `stripe_data[s·K·cell + i·cell ..][..cell]`.
    pub fn cells<'a>(&self, stripe_data: &'a [u8]) -> Vec<&'a [u8]> {
        stripe_data.chunks(self.cell as usize).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_range_in_order() {
        let l = StripeLayout::new(4, 2, 64).unwrap();
        let p: Vec<Piece> = l.pieces(60, 200).collect();
        assert_eq!(
            p,
            vec![
                Piece {
                    chunk: 0,
                    chunk_offset: 60,
                    len: 4,
                    at: 0
                },
                Piece {
                    chunk: 1,
                    chunk_offset: 0,
                    len: 64,
                    at: 4
                },
                Piece {
                    chunk: 2,
                    chunk_offset: 0,
                    len: 64,
                    at: 68
                },
                Piece {
                    chunk: 3,
                    chunk_offset: 0,
                    len: 64,
                    at: 132
                },
                Piece {
                    chunk: 0,
                    chunk_offset: 64,
                    len: 4,
                    at: 196
                },
            ]
        );
        assert_eq!(l.stripes(60, 200), 0..2);
        assert_eq!(l.stripes(256, 256), 1..2);
        assert_eq!(l.stored_bytes(1), 6 * 64);
        assert_eq!(l.stored_bytes(256), 6 * 64);
        assert_eq!(l.stored_bytes(257), 12 * 64);
        assert!(StripeLayout::new(4, 2, 100).is_none());
    }
}
