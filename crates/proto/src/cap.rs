//! Capabilities: what a chunkserver checks on every frame before it touches a disk
//! (seeds/002 §2.5; docs/security.md, docs/formats/wire.md).
//!
//! The masters sign a capability when they hand out a chunk's locations: which chunk, which
//! rights, the chunk's version (a deleted and recreated chunk id has another), the writer's
//! lease epoch (a superseded writer's capabilities carry an older one), an expiry, and the id
//! of the key that signed it. The signature is HMAC-SHA256 under a key that masters and
//! chunkservers share; a chunkserver checks it with nothing but its key ring and its clock,
//! asking no one. A capability is a bearer token: whoever holds it may use it until it
//! expires or is revoked, so the masters hand it only to callers they authenticated. It names
//! the masters' permission generation when it was signed (a count of the `chmod`s, `chown`s
//! and user deletions applied) and whom it was issued to (a hash of the user's name, 0 for
//! servers), so that the masters can revoke what such a change took away: chunkservers learn
//! revocations in heartbeat replies and keep them in a [`Revoked`] table.
//!
//! The format is fixed-size, 80 bytes, little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | version (2) |
//! | 1 | 1 | rights (bits: [`READ`], [`APPEND`], [`SEAL`], [`DELETE`], [`CREATE`]) |
//! | 2 | 2 | reserved, 0 |
//! | 4 | 4 | key id |
//! | 8 | 8 | chunk id |
//! | 16 | 8 | chunk version |
//! | 24 | 4 | writer epoch (0: not a writer's) |
//! | 28 | 4 | expiry, seconds since the Unix epoch |
//! | 32 | 8 | permission generation of the masters' state it was signed from |
//! | 40 | 8 | holder: [`holder_of`] the user it was issued to; 0 for servers |
//! | 48 | 32 | HMAC-SHA256 of bytes 0..48 under the key |

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Bytes of an encoded capability.
pub const CAP_BYTES: usize = 80;
/// The only capability version this code speaks.
pub const CAP_VERSION: u8 = 2;
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

const SIGNED_BYTES: usize = 48;
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
    /// The masters' permission generation it was signed from (see [`Revoked`]).
    pub generation: u64,
    /// Who it was issued to: [`holder_of`] a user's name; 0 for servers (never revoked).
    pub holder: u64,
}

/// The holder a user's capabilities name: the first 8 bytes of SHA-256 of the name,
/// little-endian, never 0 (0 is a server's).
pub fn holder_of(user: &str) -> u64 {
    use sha2::Digest;
    let d = Sha256::digest(user.as_bytes());
    u64::from_le_bytes(d[..8].try_into().expect("8 bytes")).max(1)
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
    #[error(
        "capability of permission generation {cap} was revoked at generation {revoked} (a chmod, chown or user deletion)"
    )]
    Revoked { cap: u64, revoked: u64 },
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
                generation: u64_at(32),
                holder: u64_at(40),
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

/// How long the masters make a capability valid. Writers get fresh ones with every commit;
/// readers with every lookup (a refused read looks its chunk up again).
pub const CAP_LIFETIME_SECS: u64 = 3600;

/// How long a chunkserver keeps a revocation after it learned it: by then every capability
/// it revokes has expired (a capability lives [`CAP_LIFETIME_SECS`] from its signing, which
/// came before the revocation), with ten minutes for clocks that disagree.
pub const REVOCATION_KEEP: std::time::Duration =
    std::time::Duration::from_secs(CAP_LIFETIME_SECS + 600);

/// One revocation, as the masters send it in heartbeat replies: capabilities of a permission
/// generation below `generation` stop working.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revocation {
    /// On one chunk (a file's `chmod` or `chown` revokes each of its chunks), except for
    /// the holder `except` (the file's owner after the change; 0: no one is excepted).
    Chunk {
        chunk_id: u64,
        generation: u64,
        except: u64,
    },
    /// One user's, everywhere (the user was deleted).
    Holder { holder: u64, generation: u64 },
    /// Every user's, everywhere (the masters had too many revocations to list).
    All { generation: u64 },
}

/// A chunk's or a holder's revocations, merged: capabilities below `floor` are revoked for
/// everyone, those below `generation` for everyone but `except` (the newest revocation's).
#[derive(Debug, Clone, Copy)]
struct Entry {
    generation: u64,
    except: u64,
    floor: u64,
    learned: std::time::Instant,
}

impl Entry {
    /// This entry and a revocation below `generation` except `except`. Exact but for one
    /// case, on the safe side: a holder excepted by an older revocation but not the newest
    /// loses the older exception below its generation (the newest revokes them anyway).
    fn merge(old: Option<&Entry>, generation: u64, except: u64, now: std::time::Instant) -> Self {
        let fresh = Entry {
            generation,
            except,
            floor: 0,
            learned: now,
        };
        let Some(o) = old else { return fresh };
        // The newer of the two keeps its exception; the other's counts for everyone (or,
        // excepting the same holder, only its own floor does).
        let (newer, older) = if generation >= o.generation {
            (fresh, *o)
        } else {
            (*o, fresh)
        };
        let floor = if older.except == newer.except {
            older.floor
        } else {
            older.floor.max(older.generation)
        };
        Entry {
            floor: floor.max(newer.floor),
            learned: now,
            ..newer
        }
    }

    fn revokes(&self, c: &Claims) -> Option<u64> {
        if c.generation < self.floor {
            return Some(self.floor);
        }
        (c.generation < self.generation && c.holder != self.except).then_some(self.generation)
    }
}

/// The revocations a chunkserver holds (docs/security.md, "Revocation"). Servers'
/// capabilities (holder 0) are never revoked: they repair and convert whatever the users'
/// rights. Each entry is kept [`REVOCATION_KEEP`] after it was last added to
/// ([`Revoked::prune`]), except the one for every user, a single number.
#[derive(Debug, Default)]
pub struct Revoked {
    all: u64,
    holders: std::collections::HashMap<u64, Entry>,
    chunks: std::collections::HashMap<u64, Entry>,
}

impl Revoked {
    /// Adds `r`, learned at `now`.
    pub fn add(&mut self, r: Revocation, now: std::time::Instant) {
        match r {
            Revocation::Chunk {
                chunk_id,
                generation,
                except,
            } => {
                let e = Entry::merge(self.chunks.get(&chunk_id), generation, except, now);
                self.chunks.insert(chunk_id, e);
            }
            Revocation::Holder { holder, generation } => {
                let e = Entry::merge(self.holders.get(&holder), generation, 0, now);
                self.holders.insert(holder, e);
            }
            Revocation::All { generation } => self.all = self.all.max(generation),
        }
    }

    /// Whether `c` was revoked.
    pub fn check(&self, c: &Claims) -> Result<(), CapError> {
        if c.holder == 0 {
            return Ok(());
        }
        let revoked = |revoked: u64| {
            Err(CapError::Revoked {
                cap: c.generation,
                revoked,
            })
        };
        if c.generation < self.all {
            return revoked(self.all);
        }
        if let Some(g) = self.holders.get(&c.holder).and_then(|e| e.revokes(c)) {
            return revoked(g);
        }
        if let Some(g) = self.chunks.get(&c.chunk_id).and_then(|e| e.revokes(c)) {
            return revoked(g);
        }
        Ok(())
    }

    /// Drops the entries learned more than `keep` before `now`.
    pub fn prune(&mut self, now: std::time::Instant, keep: std::time::Duration) {
        let live = |e: &mut Entry| now.duration_since(e.learned) <= keep;
        self.chunks.retain(|_, e| live(e));
        self.holders.retain(|_, e| live(e));
    }

    /// Entries held (chunks and holders).
    pub fn len(&self) -> usize {
        self.chunks.len() + self.holders.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0 && self.all == 0
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
    b[32..40].copy_from_slice(&c.generation.to_le_bytes());
    b[40..48].copy_from_slice(&c.holder.to_le_bytes());
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
        (
            1u8..=ALL,
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            1u32..,
            any::<u64>(),
            any::<u64>(),
        )
            .prop_map(
                |(rights, chunk_id, chunk_version, epoch, expires_secs, generation, holder)| {
                    Claims {
                        rights,
                        chunk_id,
                        chunk_version,
                        epoch,
                        expires_secs,
                        generation,
                        holder,
                    }
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

        /// Merged revocations of a chunk never accept a capability one of them revokes, and
        /// refuse one none revokes only when the same holder was excepted before and not
        /// after (documented as on the safe side).
        #[test]
        fn merged_revocations_are_safe(
            revs in proptest::collection::vec((1u64..8, 0u64..3), 1..6),
            generation in 0u64..9,
            holder in 1u64..3,
        ) {
            let now = std::time::Instant::now();
            let mut r = Revoked::default();
            for &(g, except) in &revs {
                r.add(Revocation::Chunk { chunk_id: 1, generation: g, except }, now);
            }
            let c = Claims {
                rights: READ,
                chunk_id: 1,
                chunk_version: 1,
                epoch: 0,
                expires_secs: 1,
                generation,
                holder,
            };
            let exact = revs.iter().any(|&(g, e)| generation < g && holder != e);
            if exact {
                prop_assert!(r.check(&c).is_err(), "{revs:?} {c:?}");
            } else if r.check(&c).is_err() {
                // Only a holder that some revocation excepted is refused beyond the exact
                // answer.
                prop_assert!(revs.iter().any(|&(_, e)| e == holder), "{revs:?} {c:?}");
            }
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
            generation: 1,
            holder: 0,
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
            generation: 1,
            holder: 0,
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
    fn revocations_stop_older_generations_but_never_a_servers() {
        let now = std::time::Instant::now();
        let (alice, bob) = (holder_of("alice"), holder_of("bob"));
        assert_ne!(alice, bob);
        let claims = |holder, generation, chunk_id| Claims {
            rights: READ,
            chunk_id,
            chunk_version: 1,
            epoch: 0,
            expires_secs: 100,
            generation,
            holder,
        };
        let mut r = Revoked::default();
        r.add(
            Revocation::Chunk {
                chunk_id: 7,
                generation: 5,
                except: alice,
            },
            now,
        );
        // Bob's older capability on chunk 7 is revoked; his newer one, alice's (the owner)
        // and a server's are not; nor is bob's on another chunk.
        assert_eq!(
            r.check(&claims(bob, 4, 7)),
            Err(CapError::Revoked { cap: 4, revoked: 5 })
        );
        assert_eq!(r.check(&claims(bob, 5, 7)), Ok(()));
        assert_eq!(r.check(&claims(alice, 4, 7)), Ok(()));
        assert_eq!(r.check(&claims(0, 0, 7)), Ok(()));
        assert_eq!(r.check(&claims(bob, 4, 8)), Ok(()));
        // A second revocation excepting another holder (a chown to bob): alice's newer
        // capability goes, bob's stays unless the first revocation had taken it.
        r.add(
            Revocation::Chunk {
                chunk_id: 7,
                generation: 6,
                except: bob,
            },
            now,
        );
        assert!(r.check(&claims(alice, 5, 7)).is_err());
        assert_eq!(r.check(&claims(bob, 5, 7)), Ok(()));
        assert_eq!(
            r.check(&claims(bob, 4, 7)),
            Err(CapError::Revoked { cap: 4, revoked: 5 })
        );
        // Out of order (a lower generation after a higher one) gives the same answers.
        let mut o = Revoked::default();
        for (generation, except) in [(6, bob), (5, alice)] {
            o.add(
                Revocation::Chunk {
                    chunk_id: 7,
                    generation,
                    except,
                },
                now,
            );
        }
        for c in [claims(alice, 5, 7), claims(bob, 5, 7), claims(bob, 4, 7)] {
            assert_eq!(o.check(&c).is_ok(), r.check(&c).is_ok(), "{c:?}");
        }
        // A deleted user, everywhere.
        r.add(
            Revocation::Holder {
                holder: bob,
                generation: 9,
            },
            now,
        );
        assert!(r.check(&claims(bob, 8, 100)).is_err());
        assert_eq!(r.check(&claims(alice, 8, 100)), Ok(()));
        // Every user.
        r.add(Revocation::All { generation: 10 }, now);
        assert!(r.check(&claims(alice, 9, 100)).is_err());
        assert_eq!(r.check(&claims(alice, 10, 100)), Ok(()));
        assert_eq!(r.check(&claims(0, 0, 100)), Ok(()));
        // Pruned once every capability they revoke has expired.
        assert_eq!(r.len(), 2);
        r.prune(
            now + REVOCATION_KEEP + std::time::Duration::from_secs(1),
            REVOCATION_KEEP,
        );
        assert_eq!(r.len(), 0);
        assert_eq!(
            r.check(&claims(bob, 8, 100)),
            Err(CapError::Revoked {
                cap: 8,
                revoked: 10
            })
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
            generation: 0x07,
            holder: 0x08,
        };
        let b = Capability::sign(&key(9, 0), c).encode();
        assert_eq!(&b[..4], &[2, 5, 0, 0]);
        assert_eq!(&b[4..8], &9u32.to_le_bytes());
        assert_eq!(&b[8..16], &0x0102u64.to_le_bytes());
        assert_eq!(&b[16..24], &0x0304u64.to_le_bytes());
        assert_eq!(&b[24..28], &5u32.to_le_bytes());
        assert_eq!(&b[28..32], &6u32.to_le_bytes());
        assert_eq!(&b[32..40], &7u64.to_le_bytes());
        assert_eq!(&b[40..48], &8u64.to_le_bytes());
        // RFC 4231-style check that the MAC is HMAC-SHA256 over the first 48 bytes.
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&[0u8; 32]).unwrap();
        m.update(&b[..48]);
        assert_eq!(&b[48..], &m.finalize().into_bytes()[..]);
    }
}
