//! Capabilities: what a chunkserver checks on every frame before it touches a disk
//! (seeds/002 §2.5; docs/security.md, docs/formats/wire.md).
//!
//! The masters sign a capability when they hand out a chunk's locations: which chunk, which
//! rights, the chunk's version (a deleted and recreated chunk id has another), the writer's
//! lease epoch (a superseded writer's capabilities carry an older one), an expiry, and the id
//! of the key that signed it. The signature is HMAC-SHA256 under a key that masters and
//! chunkservers share; a chunkserver checks it with nothing but its key ring and its clock,
//! asking no one. A capability is a bearer token: whoever holds it may use it until it
//! expires, so the masters hand it only to callers they authenticated, and it is short-lived.
//!
//! The format is fixed-size, 64 bytes, little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | version (1) |
//! | 1 | 1 | rights (bits: [`READ`], [`APPEND`], [`SEAL`], [`DELETE`], [`CREATE`]) |
//! | 2 | 2 | reserved, 0 |
//! | 4 | 4 | key id |
//! | 8 | 8 | chunk id |
//! | 16 | 8 | chunk version |
//! | 24 | 4 | writer epoch (0: not a writer's) |
//! | 28 | 4 | expiry, seconds since the Unix epoch |
//! | 32 | 32 | HMAC-SHA256 of bytes 0..32 under the key |

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Bytes of an encoded capability.
pub const CAP_BYTES: usize = 64;
/// The only capability version this code speaks.
pub const CAP_VERSION: u8 = 1;
/// Bytes of a capability key.
pub const KEY_BYTES: usize = 32;

/// Right to read the chunk and ask for its length (READ, STAT).
pub const READ: u8 = 1;
/// Right to append to it.
pub const APPEND: u8 = 2;
/// Right to seal it (SEAL, SEAL_AT).
pub const SEAL: u8 = 4;
/// Right to delete it.
pub const DELETE: u8 = 8;
/// Right to create it.
pub const CREATE: u8 = 16;
/// Every right a chunk has.
pub const ALL: u8 = READ | APPEND | SEAL | DELETE | CREATE;
/// What a writer of a chunk gets: everything but delete.
pub const WRITE: u8 = READ | APPEND | SEAL | CREATE;

const SIGNED_BYTES: usize = 32;
const _: () = assert!(SIGNED_BYTES + 32 == CAP_BYTES);

/// A key that signs capabilities. Its bytes never reach a log: `Debug` prints the id only.
#[derive(Clone, PartialEq, Eq)]
pub struct CapKey {
    pub id: u32,
    pub secret: [u8; KEY_BYTES],
}

impl std::fmt::Debug for CapKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl CapKey {
    fn mac(&self, signed: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.secret)
            .expect("HMAC takes keys of any length");
        m.update(signed);
        m
    }
}

/// The claims of a capability, before signing and after checking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claims {
    pub rights: u8,
    pub chunk_id: u64,
    pub chunk_version: u64,
    pub epoch: u32,
    pub expires_secs: u32,
}

/// A capability as carried on the wire: claims, key id and signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capability {
    pub claims: Claims,
    pub key_id: u32,
    mac: [u8; 32],
}

/// Why a capability was refused. The chunkserver answers each with `UNAUTHORIZED` and the
/// message; none of them closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CapError {
    #[error("no capability")]
    Missing,
    #[error("capability of {0} bytes; a capability has {CAP_BYTES}")]
    Length(usize),
    #[error("capability version {0}; this build speaks version {CAP_VERSION}")]
    Version(u8),
    #[error("capability with non-zero reserved bytes or unknown rights")]
    Malformed,
    #[error("capability signed with key {0}, which this server does not hold")]
    UnknownKey(u32),
    #[error("capability signature does not match")]
    BadSignature,
    #[error("capability expired at {expired_secs} (now {now_secs})")]
    Expired { expired_secs: u32, now_secs: u64 },
    #[error("capability is for chunk {cap}, not chunk {asked}")]
    WrongChunk { cap: u64, asked: u64 },
    #[error("capability is for version {cap} of the chunk; it is version {stored}")]
    WrongVersion { cap: u64, stored: u64 },
    #[error("capability grants rights {granted:#04x}; the request needs {needed:#04x}")]
    Rights { granted: u8, needed: u8 },
    #[error("capability of writer epoch {cap}; the chunk's writer is at epoch {current}")]
    StaleEpoch { cap: u32, current: u32 },
}

impl Capability {
    /// Signs `claims` with `key`.
    pub fn sign(key: &CapKey, claims: Claims) -> Self {
        let signed = signed_bytes(&claims, key.id);
        let mac = key.mac(&signed).finalize().into_bytes().into();
        Self {
            claims,
            key_id: key.id,
            mac,
        }
    }

    pub fn encode(&self) -> [u8; CAP_BYTES] {
        let mut out = [0u8; CAP_BYTES];
        out[..SIGNED_BYTES].copy_from_slice(&signed_bytes(&self.claims, self.key_id));
        out[SIGNED_BYTES..].copy_from_slice(&self.mac);
        out
    }

    /// Decodes the layout; the signature is checked by [`Capability::verify`].
    pub fn decode(b: &[u8]) -> Result<Self, CapError> {
        let b: &[u8; CAP_BYTES] = b.try_into().map_err(|_| CapError::Length(b.len()))?;
        if b[0] != CAP_VERSION {
            return Err(CapError::Version(b[0]));
        }
        if b[1] & !ALL != 0 || b[2] != 0 || b[3] != 0 {
            return Err(CapError::Malformed);
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(Self {
            claims: Claims {
                rights: b[1],
                chunk_id: u64_at(8),
                chunk_version: u64_at(16),
                epoch: u32_at(24),
                expires_secs: u32_at(28),
            },
            key_id: u32_at(4),
            mac: b[SIGNED_BYTES..].try_into().expect("32 bytes"),
        })
    }

    /// Checks the signature (in constant time) with the key of `key_id` in `keys`, then that
    /// the capability has not expired at `now_secs`, names `chunk_id` and grants every right in
    /// `needed`. Version and epoch are the caller's to check against the chunk
    /// ([`Capability::check_chunk`]), which it may have to look up first.
    pub fn verify(
        &self,
        keys: &[CapKey],
        chunk_id: u64,
        needed: u8,
        now_secs: u64,
    ) -> Result<(), CapError> {
        let key = keys
            .iter()
            .find(|k| k.id == self.key_id)
            .ok_or(CapError::UnknownKey(self.key_id))?;
        key.mac(&signed_bytes(&self.claims, self.key_id))
            .verify_slice(&self.mac)
            .map_err(|_| CapError::BadSignature)?;
        let c = &self.claims;
        if u64::from(c.expires_secs) <= now_secs {
            return Err(CapError::Expired {
                expired_secs: c.expires_secs,
                now_secs,
            });
        }
        if c.chunk_id != chunk_id {
            return Err(CapError::WrongChunk {
                cap: c.chunk_id,
                asked: chunk_id,
            });
        }
        if c.rights & needed != needed {
            return Err(CapError::Rights {
                granted: c.rights,
                needed,
            });
        }
        Ok(())
    }

    /// Checks the claims against the chunk as stored: its version, and the newest writer
    /// epoch the server has seen for it (`current_epoch`; a writer's capability older than it
    /// belongs to a writer whose lease was superseded).
    pub fn check_chunk(&self, stored_version: u64, current_epoch: u32) -> Result<(), CapError> {
        let c = &self.claims;
        if c.chunk_version != stored_version {
            return Err(CapError::WrongVersion {
                cap: c.chunk_version,
                stored: stored_version,
            });
        }
        if c.epoch != 0 && c.epoch < current_epoch {
            return Err(CapError::StaleEpoch {
                cap: c.epoch,
                current: current_epoch,
            });
        }
        Ok(())
    }
}

fn signed_bytes(c: &Claims, key_id: u32) -> [u8; SIGNED_BYTES] {
    let mut b = [0u8; SIGNED_BYTES];
    b[0] = CAP_VERSION;
    b[1] = c.rights;
    b[4..8].copy_from_slice(&key_id.to_le_bytes());
    b[8..16].copy_from_slice(&c.chunk_id.to_le_bytes());
    b[16..24].copy_from_slice(&c.chunk_version.to_le_bytes());
    b[24..28].copy_from_slice(&c.epoch.to_le_bytes());
    b[28..32].copy_from_slice(&c.expires_secs.to_le_bytes());
    b
}

/// The rights a data-plane request needs, by opcode; `None` for requests that touch no chunk
/// (PING) or are checked otherwise (FAULT: servers run with `--fault-injection` only).
pub fn needed(op: crate::Opcode) -> Option<u8> {
    use crate::Opcode::*;
    Some(match op {
        Create => CREATE | APPEND,
        Append => APPEND,
        Read | Stat => READ,
        Seal => SEAL,
        Delete => DELETE,
        Ping | Fault => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(id: u32, fill: u8) -> CapKey {
        CapKey {
            id,
            secret: [fill; KEY_BYTES],
        }
    }

    fn claims() -> impl Strategy<Value = Claims> {
        (1u8..=ALL, any::<u64>(), any::<u64>(), any::<u32>(), 1u32..).prop_map(
            |(rights, chunk_id, chunk_version, epoch, expires_secs)| Claims {
                rights,
                chunk_id,
                chunk_version,
                epoch,
                expires_secs,
            },
        )
    }

    proptest! {
        #[test]
        fn a_signed_capability_verifies_after_a_round_trip(c in claims()) {
            let k = key(7, 3);
            let cap = Capability::decode(&Capability::sign(&k, c).encode()).unwrap();
            prop_assert_eq!(cap.claims, c);
            let now = u64::from(c.expires_secs) - 1;
            prop_assert_eq!(cap.verify(&[k], c.chunk_id, c.rights, now), Ok(()));
        }

        /// Any change to any byte of a valid capability is refused.
        #[test]
        fn any_changed_byte_is_refused(c in claims(), at in 0usize..CAP_BYTES, x in 1u8..) {
            let k = key(7, 3);
            let mut b = Capability::sign(&k, c).encode();
            b[at] ^= x;
            let now = u64::from(c.expires_secs) - 1;
            let r = Capability::decode(&b).and_then(|cap| cap.verify(&[k], c.chunk_id, 0, now));
            prop_assert!(r.is_err(), "byte {at} ^ {x:#x} accepted");
        }

        /// A capability past its expiry is refused.
        #[test]
        fn expired_is_refused(c in claims(), after in 0u64..1_000_000) {
            let k = key(1, 9);
            let cap = Capability::sign(&k, c);
            let now = u64::from(c.expires_secs) + after;
            let expired = matches!(cap.verify(&[k], c.chunk_id, 0, now), Err(CapError::Expired { .. }));
            prop_assert!(expired);
        }

        /// A capability for chunk A never opens chunk B.
        #[test]
        fn another_chunk_is_refused(c in claims(), other in any::<u64>()) {
            prop_assume!(other != c.chunk_id);
            let k = key(1, 9);
            let cap = Capability::sign(&k, c);
            let r = cap.verify(&[k], other, 0, 0);
            prop_assert_eq!(r, Err(CapError::WrongChunk { cap: c.chunk_id, asked: other }));
        }

        /// Rights never widen: a request needing a right the capability lacks is refused,
        /// and re-signing wider rights needs the key.
        #[test]
        fn rights_never_widen(c in claims(), needed in 1u8..=ALL, guess in any::<[u8; KEY_BYTES]>()) {
            let k = key(1, 9);
            let cap = Capability::sign(&k, c);
            let r = cap.verify(std::slice::from_ref(&k), c.chunk_id, needed, 0);
            prop_assert_eq!(r.is_ok(), c.rights & needed == needed);
            let forged = Capability::sign(&CapKey { id: 1, secret: guess }, Claims { rights: ALL, ..c });
            prop_assume!(guess != k.secret);
            prop_assert_eq!(forged.verify(&[k], c.chunk_id, ALL, 0), Err(CapError::BadSignature));
        }
    }

    #[test]
    fn keys_by_id_and_rotation() {
        let (old, new) = (key(1, 1), key(2, 2));
        let c = Claims {
            rights: READ,
            chunk_id: 5,
            chunk_version: 1,
            epoch: 0,
            expires_secs: 100,
        };
        let cap = Capability::sign(&old, c);
        // During the overlap both keys verify; after it the old one is unknown.
        assert_eq!(cap.verify(&[old.clone(), new.clone()], 5, READ, 10), Ok(()));
        assert_eq!(
            cap.verify(&[new], 5, READ, 10),
            Err(CapError::UnknownKey(1))
        );
        assert_eq!(format!("{old:?}"), "CapKey { id: 1, .. }");
    }

    #[test]
    fn version_and_epoch_fence() {
        let c = Claims {
            rights: APPEND,
            chunk_id: 5,
            chunk_version: 3,
            epoch: 4,
            expires_secs: 100,
        };
        let cap = Capability::sign(&key(1, 1), c);
        assert_eq!(cap.check_chunk(3, 4), Ok(()));
        assert_eq!(cap.check_chunk(3, 2), Ok(()));
        assert_eq!(
            cap.check_chunk(2, 4),
            Err(CapError::WrongVersion { cap: 3, stored: 2 })
        );
        assert_eq!(
            cap.check_chunk(3, 5),
            Err(CapError::StaleEpoch { cap: 4, current: 5 })
        );
    }

    #[test]
    fn layout_is_the_documented_one() {
        let c = Claims {
            rights: READ | SEAL,
            chunk_id: 0x0102,
            chunk_version: 0x0304,
            epoch: 0x05,
            expires_secs: 0x06,
        };
        let b = Capability::sign(&key(9, 0), c).encode();
        assert_eq!(&b[..4], &[1, 5, 0, 0]);
        assert_eq!(&b[4..8], &9u32.to_le_bytes());
        assert_eq!(&b[8..16], &0x0102u64.to_le_bytes());
        assert_eq!(&b[16..24], &0x0304u64.to_le_bytes());
        assert_eq!(&b[24..28], &5u32.to_le_bytes());
        assert_eq!(&b[28..32], &6u32.to_le_bytes());
        // RFC 4231-style check that the MAC is HMAC-SHA256 over the first 32 bytes.
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&[0u8; 32]).unwrap();
        m.update(&b[..32]);
        assert_eq!(&b[32..], &m.finalize().into_bytes()[..]);
    }
}
