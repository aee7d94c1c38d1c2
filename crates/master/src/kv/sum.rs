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
    s.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(super) fn sum_from(b: &[u8]) -> Option<Sum> {
    if b.len() != SUM_WIDTH * 8 {
        return None;
    }
    let mut s = [0u64; SUM_WIDTH];
    for (i, c) in b.chunks_exact(8).enumerate() {
        s[i] = u64::from_le_bytes(c.try_into().ok()?);
    }
    Some(s)
}
