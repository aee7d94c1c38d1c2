//! CRC32C, the one checksum of the chunk store (hardware instruction via the `crc32c` crate).
//!
//! Structures on the device use a *salted* CRC: the CRC computation starts from the store's
//! salt instead of zero, so that bytes left on a device by an earlier format never validate.

/// CRC32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// CRC32C of `bytes` appended to a stream whose CRC so far is `crc`.
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
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

    #[test]
    fn append_equals_whole() {
        let a = b"hello ";
        let b = b"world";
        assert_eq!(crc32c_append(crc32c(a), b), crc32c(b"hello world"));
    }

    #[test]
    fn salt_changes_crc() {
        let s1 = salt_of(&[1; 16]);
        let s2 = salt_of(&[2; 16]);
        assert_ne!(salted(s1, b"x"), salted(s2, b"x"));
    }
}
