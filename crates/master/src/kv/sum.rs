//! The sums tables keep of their records ([`super::Table::summed`]), and their bytes in table
//! `sums` (docs/formats/master-state.md).

/// How many numbers a table's sum has.
pub const SUM_WIDTH: usize = 4;

/// What a record adds to its table's sum (e.g. an inode: files, directories, chunks, bytes).
pub type Sum = [u64; SUM_WIDTH];

pub(super) fn add(to: &mut Sum, s: Sum) {
    for (t, x) in to.iter_mut().zip(s) {
        *t = t.wrapping_add(x);
    }
}

pub(super) fn sub(from: &mut Sum, s: Sum) {
    for (t, x) in from.iter_mut().zip(s) {
        *t = t.wrapping_sub(x);
    }
}

pub(super) fn sum_bytes(s: &Sum) -> Vec<u8> {
    words_bytes(s)
}

pub(super) fn sum_from(b: &[u8]) -> Option<Sum> {
    words_from(b)
}

/// `N` u64s little-endian (sums' and tallies' stored bytes).
pub(super) fn words_bytes<const N: usize>(w: &[u64; N]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The `N` u64s of [`words_bytes`]; `None` unless exactly `N` × 8 bytes.
pub(super) fn words_from<const N: usize>(b: &[u8]) -> Option<[u64; N]> {
    if b.len() != N * 8 {
        return None;
    }
    let mut w = [0u64; N];
    for (x, c) in w.iter_mut().zip(b.chunks_exact(8)) {
        *x = u64::from_le_bytes(c.try_into().ok()?);
    }
    Some(w)
}
