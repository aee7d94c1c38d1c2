//! The chunkserver's side of capabilities (docs/security.md): the keys it checks them with
//! (from the masters' heartbeat replies) and the newest writer epoch it has seen per chunk.
//!
//! A frame's capability is checked in two steps. [`Checker::check_frame`] runs as soon as the
//! header and capability are read, before anything is allocated for the payload: signature,
//! expiry, chunk id and rights. [`Checker::check_chunk`] runs once the chunk is looked up:
//! its version (a deleted and recreated chunk id has another) and the writer epoch. A writer's
//! capability with a newer epoch raises the chunk's fence, so a writer whose lease was taken
//! over is refused from the new writer's first request on. The fence is kept in memory: after
//! a restart the seal the new writer puts on the chunk is what stops the old one.
//!
//! The first step also refuses a revoked capability: the masters' heartbeat replies name the
//! revocations a `chmod`, a `chown` or a user's deletion made ([`Revoked`]); the server holds
//! them in memory, sends back the number of the last one it has, and after a restart learns
//! them all again in its first heartbeat.

use cairn_proto::cap::{
    CapError, CapKey, Capability, REVOCATION_KEEP, Revocation, Revoked, needed,
};
use cairn_proto::frame::Header;
use cairn_rpc::pb;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Chunks whose writer epoch is remembered at most; past it the table starts over.
const MAX_FENCES: usize = 1 << 20;

#[derive(Default)]
pub(crate) struct Checker {
    keys: RwLock<Vec<CapKey>>,
    epochs: Mutex<HashMap<u64, u32>>,
    revoked: RwLock<Revoked>,
    /// The number of the last revocation held (`HeartbeatRequest.revocations_seen`).
    revocations_seen: AtomicU64,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn refused(e: &CapError) {
    let reason = match e {
        CapError::Missing => "missing",
        CapError::Length(_) | CapError::Version(_) | CapError::Malformed => "malformed",
        CapError::UnknownKey(_) => "unknown_key",
        CapError::BadSignature => "bad_signature",
        CapError::Expired { .. } => "expired",
        CapError::WrongChunk { .. } => "wrong_chunk",
        CapError::WrongVersion { .. } => "wrong_version",
        CapError::Rights { .. } => "rights",
        CapError::StaleEpoch { .. } => "stale_epoch",
        CapError::Revoked { .. } => "revoked",
        _ => "other",
    };
    metrics::counter!("cairn_chunkserver_capabilities_refused_total", "reason" => reason)
        .increment(1);
}

impl Checker {
    pub(crate) fn set_keys(&self, keys: Vec<CapKey>) {
        if keys.is_empty() {
            return;
        }
        let mut k = self.keys.write();
        if *k != keys {
            tracing::info!(
                keys = ?keys.iter().map(|k| k.id).collect::<Vec<_>>(),
                "capability keys changed"
            );
            *k = keys;
        }
    }

    /// Whether the keys have come (the first heartbeat reply since the start): before, every
    /// capability is refused `NOT_READY` (retry), not `UNAUTHORIZED` (refresh or give up).
    pub(crate) fn ready(&self) -> bool {
        !self.keys.read().is_empty()
    }

    /// The number of the last revocation held, for the next heartbeat.
    pub(crate) fn revocations_seen(&self) -> u64 {
        self.revocations_seen.load(Ordering::Relaxed)
    }

    /// Takes a heartbeat reply's revocations (those after the number sent) and the number
    /// of the last one; drops those every capability they revoke has outlived.
    pub(crate) fn add_revocations(&self, list: &[pb::Revocation], upto: u64) {
        use pb::revocation::Kind;
        let now = Instant::now();
        let mut r = self.revoked.write();
        for x in list {
            let Ok(kind) = Kind::try_from(x.kind) else {
                tracing::warn!(kind = x.kind, "a revocation of an unknown kind: ignored");
                continue;
            };
            let one = match kind {
                Kind::Chunk => Revocation::Chunk {
                    chunk_id: x.chunk_id,
                    generation: x.generation,
                    except: x.except,
                },
                Kind::Holder => Revocation::Holder {
                    holder: x.holder,
                    generation: x.generation,
                },
                Kind::All => Revocation::All {
                    generation: x.generation,
                },
            };
            r.add(one, now);
        }
        r.prune(now, REVOCATION_KEEP);
        metrics::gauge!("cairn_chunkserver_revocations").set(r.len() as f64);
        if !list.is_empty() {
            tracing::info!(
                new = list.len(),
                held = r.len(),
                upto,
                "capability revocations learned"
            );
        }
        drop(r);
        if upto != 0 {
            self.revocations_seen.store(upto, Ordering::Relaxed);
        }
    }

    /// The first step: `Ok(Some(cap))` for a request whose capability holds so far,
    /// `Ok(None)` for one that needs none (PING, FAULT, an unknown opcode) or when checks are
    /// off (`require` false).
    pub(crate) fn check_frame(
        &self,
        h: &Header,
        cap: Option<&[u8; cairn_proto::cap::CAP_BYTES]>,
        require: bool,
    ) -> Result<Option<Capability>, CapError> {
        if !require {
            return Ok(None);
        }
        let Some(rights) = h.op().and_then(needed) else {
            return Ok(None);
        };
        let r = (|| {
            let cap = Capability::decode(cap.ok_or(CapError::Missing)?)?;
            cap.verify(&self.keys.read(), h.chunk_id, rights, now_secs())?;
            self.revoked.read().check(&cap.claims)?;
            Ok(cap)
        })();
        match r {
            Ok(cap) => Ok(Some(cap)),
            Err(e) => {
                refused(&e);
                Err(e)
            }
        }
    }

    /// The second step, against the chunk's stored version.
    pub(crate) fn check_chunk(&self, cap: &Capability, version: u64) -> Result<(), CapError> {
        let epoch = cap.claims.epoch;
        let mut fences = self.epochs.lock();
        let current = fences.get(&cap.claims.chunk_id).copied().unwrap_or(0);
        if let Err(e) = cap.check_chunk(version, current) {
            refused(&e);
            return Err(e);
        }
        if epoch > current {
            if fences.len() >= MAX_FENCES {
                fences.clear();
            }
            fences.insert(cap.claims.chunk_id, epoch);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::cap::{APPEND, Claims, READ};
    use cairn_proto::frame::Opcode;

    fn key() -> CapKey {
        CapKey {
            id: 3,
            secret: [5; 32],
        }
    }

    fn cap(rights: u8, epoch: u32) -> [u8; cairn_proto::cap::CAP_BYTES] {
        Capability::sign(
            &key(),
            Claims {
                rights,
                chunk_id: 9,
                chunk_version: 1,
                epoch,
                expires_secs: (now_secs() + 60) as u32,
                generation: 3,
                holder: 11,
            },
        )
        .encode()
    }

    #[test]
    fn frames_are_checked_before_their_payload() {
        let c = Checker::default();
        let h = Header::request(Opcode::Append, 1, 9);
        // No keys yet: nothing verifies.
        assert!(!c.ready());
        assert_eq!(
            c.check_frame(&h, Some(&cap(APPEND, 1)), true),
            Err(CapError::UnknownKey(3))
        );
        c.set_keys(vec![key()]);
        assert!(c.ready());
        assert!(c.check_frame(&h, Some(&cap(APPEND, 1)), true).is_ok());
        assert_eq!(c.check_frame(&h, None, true), Err(CapError::Missing));
        assert!(matches!(
            c.check_frame(&h, Some(&cap(READ, 0)), true),
            Err(CapError::Rights { .. })
        ));
        // Revoked: refused; a revocation of an older generation changes nothing.
        c.add_revocations(
            &[pb::Revocation {
                kind: pb::revocation::Kind::Holder.into(),
                generation: 3,
                holder: 11,
                ..Default::default()
            }],
            4,
        );
        assert!(c.check_frame(&h, Some(&cap(APPEND, 1)), true).is_ok());
        assert_eq!(c.revocations_seen(), 4);
        c.add_revocations(
            &[pb::Revocation {
                kind: pb::revocation::Kind::Chunk.into(),
                generation: 4,
                chunk_id: 9,
                ..Default::default()
            }],
            5,
        );
        assert_eq!(
            c.check_frame(&h, Some(&cap(APPEND, 1)), true),
            Err(CapError::Revoked { cap: 3, revoked: 4 })
        );
        // Checks off: nothing is asked.
        assert_eq!(c.check_frame(&h, None, false), Ok(None));
        // A ping needs none.
        assert_eq!(
            c.check_frame(&Header::request(Opcode::Ping, 1, 0), None, true),
            Ok(None)
        );
    }

    #[test]
    fn a_newer_writer_fences_the_older_one() {
        let c = Checker::default();
        c.set_keys(vec![key()]);
        let h = Header::request(Opcode::Append, 1, 9);
        let old = c
            .check_frame(&h, Some(&cap(APPEND, 1)), true)
            .unwrap()
            .unwrap();
        let new = c
            .check_frame(&h, Some(&cap(APPEND, 2)), true)
            .unwrap()
            .unwrap();
        assert_eq!(c.check_chunk(&old, 1), Ok(()));
        assert_eq!(c.check_chunk(&new, 1), Ok(()));
        assert_eq!(
            c.check_chunk(&old, 1),
            Err(CapError::StaleEpoch { cap: 1, current: 2 })
        );
        assert_eq!(
            c.check_chunk(&new, 2),
            Err(CapError::WrongVersion { cap: 1, stored: 2 })
        );
    }
}
