//! CRC32C, the one checksum of the chunk store: `crc-fast` (CLMUL folding fused with the
//! `crc32` instruction, ~2.2× the `crc32c` crate on 4 KiB units here; see BENCHMARKS.md), with
//! the `crc32c` crate kept as the reference it is tested against and for building combine
//! tables.
//!
//! Structures on the device use a *salted* CRC: the CRC computation starts from the store's
//! salt instead of zero, so that bytes left on a device by an earlier format never validate.

/// CRC32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// CRC32C of `bytes` appended to a stream whose CRC so far is `crc`.
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    // The digest's state is the CRC before its final inversion.
    let mut d =
        crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(bytes);
    d.finalize() as u32
}

/// CRC32C of the concatenation `a ‖ b`, from `crc32c(a)`, `crc32c(b)` and `b`'s length.
///
/// One table shift per set bit of `len_b` (tables for every power of two up to 4 GiB, built
/// once per process); the `crc32c` crate's combine squares bit matrices on every call and
/// costs microseconds, which the append path cannot spend.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    static POW2: std::sync::OnceLock<Vec<CrcShift>> = std::sync::OnceLock::new();
    if len_b == 0 {
        return crc_a; // `b` is empty (its CRC is 0).
    }
    if len_b >> POW2_TABLES != 0 {
        return crc32c::crc32c_combine(crc_a, crc_b, len_b);
    }
    let tables = POW2.get_or_init(|| {
        let mut v = vec![CrcShift::new(1)];
        for k in 1..POW2_TABLES {
            let prev = &v[k - 1];
            let basis = std::array::from_fn(|i| prev.apply(prev.apply(1 << i)));
            v.push(CrcShift::from_basis(1 << k, &basis));
        }
        v
    });
    let mut crc = crc_a;
    let mut len = len_b;
    let mut k = 0;
    while len != 0 {
        if len & 1 != 0 {
            crc = tables[k].apply(crc);
        }
        len >>= 1;
        k += 1;
    }
    crc ^ crc_b
}

/// Powers of two with a shift table: lengths below 2^32 bytes combine by tables.
const POW2_TABLES: usize = 32;

/// [`crc32c_combine`] for one fixed length, in four table lookups: the CRC of `a ‖ b` for
/// every `b` of `len` bytes. Combining a CRC with `len` zero bytes is linear over GF(2), so
/// it is a 32×32 bit matrix; the tables hold its products with every byte of the CRC.
#[derive(Clone)]
pub struct CrcShift {
    len: usize,
    table: Box<[[u32; 256]; 4]>,
}

impl CrcShift {
    pub fn new(len: usize) -> Self {
        let basis: [u32; 32] = std::array::from_fn(|i| crc32c::crc32c_combine(1 << i, 0, len));
        Self::from_basis(len, &basis)
    }

    /// From the shifts of the 32 one-bit CRCs.
    fn from_basis(len: usize, basis: &[u32; 32]) -> Self {
        let mut table = Box::new([[0u32; 256]; 4]);
        for (b, t) in table.iter_mut().enumerate() {
            for (v, e) in t.iter_mut().enumerate() {
                *e = (0..8)
                    .filter(|j| v & (1 << j) != 0)
                    .fold(0, |acc, j| acc ^ basis[8 * b + j]);
            }
        }
        Self { len, table }
    }

    /// The length this shift is for.
    pub fn shift_len(&self) -> usize {
        self.len
    }

    /// CRC32C of `a ‖ b` from `crc32c(a)` and `crc32c(b)`, where `b` is `self.len()` bytes.
    pub fn combine(&self, crc_a: u32, crc_b: u32) -> u32 {
        self.apply(crc_a) ^ crc_b
    }

    fn apply(&self, crc: u32) -> u32 {
        let t = &self.table;
        t[0][(crc & 0xff) as usize]
            ^ t[1][((crc >> 8) & 0xff) as usize]
            ^ t[2][((crc >> 16) & 0xff) as usize]
            ^ t[3][(crc >> 24) as usize]
    }
}

impl std::fmt::Debug for CrcShift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrcShift").field("len", &self.len).finish()
    }
}

/// The salt of a store: the CRC of its 16-byte id.
pub fn salt_of(store_id: &[u8; 16]) -> u32 {
    crc32c(store_id)
}

/// Salted CRC of `bytes`.
pub fn salted(salt: u32, bytes: &[u8]) -> u32 {
    crc32c_append(salt, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // The standard CRC32C check value.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    /// The on-disk formats were defined with the `crc32c` crate: every length class of the
    /// SIMD paths (tails, 4 KiB units, large buffers), from any starting CRC (the salts),
    /// must give its exact values.
    #[test]
    fn equals_the_reference_crate() {
        let data: Vec<u8> = (0..(1u32 << 20) + 77)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut crc = 0x1234_5678u32;
        let lens = (0..300).chain([1023, 1024, 4016, 4095, 4096, 65_536, 1 << 20, data.len()]);
        for len in lens {
            for start in [0, 1, 7] {
                let b = &data[start..(start + len).min(data.len())];
                assert_eq!(crc32c(b), crc32c::crc32c(b), "len {len} start {start}");
                assert_eq!(
                    crc32c_append(crc, b),
                    crc32c::crc32c_append(crc, b),
                    "append, len {len} start {start}"
                );
                crc = crc.rotate_left(5) ^ len as u32;
            }
        }
    }

    #[test]
    fn append_equals_whole() {
        let a = b"hello ";
        let b = b"world";
        assert_eq!(crc32c_append(crc32c(a), b), crc32c(b"hello world"));
    }

    #[test]
    fn combine_equals_whole() {
        let a = vec![3u8; 5000];
        let b: Vec<u8> = (0..70_000u32).map(|i| i as u8).collect();
        let whole = crc32c_append(crc32c(&a), &b);
        assert_eq!(crc32c_combine(crc32c(&a), crc32c(&b), b.len()), whole);
    }

    #[test]
    fn table_combine_equals_crate_combine() {
        let mut x = 0x1234_5678u32;
        for len in [
            0usize,
            1,
            2,
            3,
            7,
            100,
            4016,
            4096,
            65_536,
            1 << 20,
            (1 << 26) + 5,
            usize::MAX >> 20,
        ] {
            x = x.wrapping_mul(2_654_435_761).wrapping_add(len as u32);
            let y = x.rotate_left(7);
            assert_eq!(
                crc32c_combine(x, y, len),
                crc32c::crc32c_combine(x, y, len),
                "len {len}"
            );
        }
    }

    #[test]
    fn shift_equals_combine() {
        let shift = CrcShift::new(4016);
        let b: Vec<u8> = (0..4016u32).map(|i| (i * 7) as u8).collect();
        for a in [&b"x"[..], b"hello world", &[0xff; 9000]] {
            let whole = crc32c_append(crc32c(a), &b);
            assert_eq!(shift.combine(crc32c(a), crc32c(&b)), whole);
        }
    }

    #[test]
    fn salt_changes_crc() {
        let s1 = salt_of(&[1; 16]);
        let s2 = salt_of(&[2; 16]);
        assert_ne!(salted(s1, b"x"), salted(s2, b"x"));
    }
}
