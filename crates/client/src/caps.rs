//! The capabilities a client holds, by chunk (docs/security.md).
//!
//! The masters sign one into every chunk they describe (`ChunkMeta.cap`); the client keeps
//! the newest per chunk here, and its data-plane connections attach it to every request on
//! that chunk. A writer's capability (append, seal) is never replaced by a reader's one for the
//! same chunk that expires no later. The table is bounded: past [`MAX_CAPS`] entries, expired
//! ones go first, then the oldest-expiring half.

use cairn_proto::cap::{CAP_BYTES, Capability};
use parking_lot::RwLock;
use std::collections::HashMap;

/// Entries kept at most (~100 bytes each).
pub const MAX_CAPS: usize = 1 << 18;

/// Capabilities by chunk id.
#[derive(Debug, Default)]
pub struct Caps {
    by_chunk: RwLock<HashMap<u64, Capability>>,
}

impl Caps {
    /// Keeps the capability in `bytes` (as the masters sent it) for its chunk. Empty bytes
    /// (masters that sign none) and undecodable ones are ignored: the chunkserver will answer
    /// UNAUTHORIZED with the reason.
    pub fn remember(&self, bytes: &[u8]) {
        let Ok(cap) = Capability::decode(bytes) else {
            return;
        };
        let mut m = self.by_chunk.write();
        let keep = match m.get(&cap.claims.chunk_id) {
            Some(old) if u64::from(old.claims.expires_secs) <= now_secs() => true,
            Some(old) => {
                let (o, n) = (&old.claims, &cap.claims);
                // A newer version or writer epoch; else a right the old one lacks, or the
                // same rights for at least as long.
                (n.chunk_version, n.epoch) > (o.chunk_version, o.epoch)
                    || (n.chunk_version, n.epoch) == (o.chunk_version, o.epoch)
                        && (n.rights & !o.rights != 0
                            || n.rights == o.rights && n.expires_secs >= o.expires_secs)
            }
            None => true,
        };
        if keep {
            m.insert(cap.claims.chunk_id, cap);
        }
        if m.len() > MAX_CAPS {
            shrink(&mut m);
        }
    }

    /// The capability to send with a request on `chunk_id`, encoded.
    pub fn get(&self, chunk_id: u64) -> Option<[u8; CAP_BYTES]> {
        self.by_chunk.read().get(&chunk_id).map(Capability::encode)
    }

    /// Forgets the capability of a chunk (refused by a chunkserver: the next lookup brings
    /// a fresh one).
    pub fn forget(&self, chunk_id: u64) {
        self.by_chunk.write().remove(&chunk_id);
    }

    /// [`Caps::forget`] if the capability held is still `sent` (not a fresher one that
    /// arrived meanwhile).
    pub fn forget_if(&self, chunk_id: u64, sent: &[u8; CAP_BYTES]) {
        let mut m = self.by_chunk.write();
        if m.get(&chunk_id).is_some_and(|c| c.encode() == *sent) {
            m.remove(&chunk_id);
        }
    }

    pub fn len(&self) -> usize {
        self.by_chunk.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn shrink(m: &mut HashMap<u64, Capability>) {
    let now = now_secs();
    m.retain(|_, c| u64::from(c.claims.expires_secs) > now);
    if m.len() > MAX_CAPS / 2 {
        let mut exp: Vec<u32> = m.values().map(|c| c.claims.expires_secs).collect();
        let mid = exp.len() / 2;
        let (_, cut, _) = exp.select_nth_unstable(mid);
        let cut = *cut;
        m.retain(|_, c| c.claims.expires_secs > cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::cap::{CapKey, Claims, READ, WRITE};

    fn cap(rights: u8, version: u64, epoch: u32, exp: u32) -> [u8; CAP_BYTES] {
        let k = CapKey {
            id: 1,
            secret: [1; 32],
        };
        Capability::sign(
            &k,
            Claims {
                rights,
                chunk_id: 7,
                chunk_version: version,
                epoch,
                expires_secs: exp,
                generation: 0,
                holder: 0,
            },
        )
        .encode()
    }

    #[test]
    fn a_writer_capability_is_not_replaced_by_a_reader_one() {
        let c = Caps::default();
        let far = (now_secs() + 1000) as u32;
        c.remember(&cap(WRITE, 1, 2, far));
        c.remember(&cap(READ, 1, 0, far + 100));
        assert_eq!(c.get(7), Some(cap(WRITE, 1, 2, far)));
        // A fresher writer capability replaces it; so does a newer version.
        c.remember(&cap(WRITE, 1, 2, far + 200));
        assert_eq!(c.get(7), Some(cap(WRITE, 1, 2, far + 200)));
        c.remember(&cap(READ, 2, 0, far));
        assert_eq!(c.get(7), Some(cap(READ, 2, 0, far)));
        // An expired one is replaced by anything.
        c.forget(7);
        c.remember(&cap(WRITE, 9, 9, 1));
        c.remember(&cap(READ, 1, 0, far));
        assert_eq!(c.get(7), Some(cap(READ, 1, 0, far)));
        c.remember(b"garbage");
        assert_eq!(c.len(), 1);
        // Forgetting what was refused leaves a fresher one alone.
        c.forget_if(7, &cap(READ, 1, 0, far + 1));
        assert_eq!(c.len(), 1);
        c.forget_if(7, &cap(READ, 1, 0, far));
        assert!(c.is_empty());
        c.remember(&cap(READ, 1, 0, far));
        c.forget(7);
        assert!(c.is_empty());
    }
}
