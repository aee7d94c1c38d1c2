//! The capabilities a client holds, by chunk (docs/security.md).
//!
//! The masters sign one into every chunk they describe (`ChunkMeta.cap`); the client keeps
//! them here, and its data-plane connections attach one to every request on that chunk. Each
//! chunk has two places: a writer's capability (one that may append or seal, signed with the
//! writer's epoch into the replies to its open and commits) and a reader's. A reader's never
//! takes a writer's place, whatever happens to the writer's: a writer in the same process as
//! readers of its file (a gateway, a volume) keeps appending and sealing with its own. A
//! request that needs to append, create or seal carries the writer's; a read or stat carries
//! the reader's, else the writer's. A refused reader's capability is forgotten (the next
//! lookup brings a fresh one); a refused writer's stays until the writer's next commit brings
//! a fresh one, since the refusal may be one server's alone (docs/security.md, "Refusals").
//!
//! The table is bounded: past [`MAX_CAPS`] chunks, expired capabilities go first, then the
//! oldest-expiring half.

use cairn_proto::cap::{APPEND, CAP_BYTES, CREATE, Capability, SEAL};
use parking_lot::RwLock;
use std::collections::HashMap;

/// Chunks held at most (~200 bytes each).
pub const MAX_CAPS: usize = 1 << 18;

/// A chunk's two places.
#[derive(Debug, Default, Clone)]
struct Held {
    writer: Option<Capability>,
    reader: Option<Capability>,
}

impl Held {
    fn expires(&self) -> u32 {
        let e = |c: &Option<Capability>| c.as_ref().map_or(0, |c| c.claims.expires_secs);
        e(&self.writer).max(e(&self.reader))
    }
}

/// Whether a capability with these rights goes to the writer's place, and a request that
/// needs them takes the writer's.
fn writes(rights: u8) -> bool {
    rights & (APPEND | SEAL | CREATE) != 0
}

/// Whether `new` should take the place `old` holds.
fn replaces(old: &Capability, new: &Capability) -> bool {
    if u64::from(old.claims.expires_secs) <= now_secs() {
        return true;
    }
    let (o, n) = (&old.claims, &new.claims);
    // A newer version or writer epoch; else a right the old one lacks, or the same rights
    // for at least as long.
    (n.chunk_version, n.epoch) > (o.chunk_version, o.epoch)
        || (n.chunk_version, n.epoch) == (o.chunk_version, o.epoch)
            && (n.rights & !o.rights != 0
                || n.rights == o.rights && n.expires_secs >= o.expires_secs)
}

/// Capabilities by chunk id.
#[derive(Debug, Default)]
pub struct Caps {
    by_chunk: RwLock<HashMap<u64, Held>>,
}

impl Caps {
    /// Keeps the capability in `bytes` (as the masters sent it) in its chunk's place for its
    /// rights. Empty bytes (masters that sign none) and undecodable ones are ignored: the
    /// chunkserver will answer UNAUTHORIZED with the reason.
    pub fn remember(&self, bytes: &[u8]) {
        let Ok(cap) = Capability::decode(bytes) else {
            return;
        };
        let mut m = self.by_chunk.write();
        let held = m.entry(cap.claims.chunk_id).or_default();
        let place = match writes(cap.claims.rights) {
            true => &mut held.writer,
            false => &mut held.reader,
        };
        if place.as_ref().is_none_or(|old| replaces(old, &cap)) {
            *place = Some(cap);
        }
        if m.len() > MAX_CAPS {
            shrink(&mut m);
        }
    }

    /// The capability to send with a request on `chunk_id` that needs `rights`, encoded: the
    /// writer's for a request that appends, creates or seals; the reader's, else the
    /// writer's, for one that reads.
    pub fn get(&self, chunk_id: u64, rights: u8) -> Option<[u8; CAP_BYTES]> {
        let m = self.by_chunk.read();
        let held = m.get(&chunk_id)?;
        let cap = match writes(rights) {
            true => held.writer.as_ref(),
            false => held.reader.as_ref().or(held.writer.as_ref()),
        };
        cap.map(Capability::encode)
    }

    /// Forgets a chunk's capabilities.
    pub fn forget(&self, chunk_id: u64) {
        self.by_chunk.write().remove(&chunk_id);
    }

    /// A chunkserver refused `sent`: forgets it if it is the reader's capability the chunk
    /// still holds (not a fresher one that arrived meanwhile), so that the next lookup's
    /// takes its place. A writer's is kept: its next commit brings a fresh one.
    pub fn refused(&self, chunk_id: u64, sent: &[u8; CAP_BYTES]) {
        let mut m = self.by_chunk.write();
        let Some(held) = m.get_mut(&chunk_id) else {
            return;
        };
        if held.reader.as_ref().is_some_and(|c| c.encode() == *sent) {
            held.reader = None;
            if held.writer.is_none() {
                m.remove(&chunk_id);
            }
        }
    }

    /// Chunks with a capability held.
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

fn shrink(m: &mut HashMap<u64, Held>) {
    let now = now_secs();
    m.retain(|_, h| u64::from(h.expires()) > now);
    if m.len() > MAX_CAPS / 2 {
        let mut exp: Vec<u32> = m.values().map(Held::expires).collect();
        let mid = exp.len() / 2;
        let (_, cut, _) = exp.select_nth_unstable(mid);
        let cut = *cut;
        m.retain(|_, h| h.expires() > cut);
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
        assert_eq!(c.get(7, APPEND), Some(cap(WRITE, 1, 2, far)));
        assert_eq!(c.get(7, SEAL), Some(cap(WRITE, 1, 2, far)));
        assert_eq!(c.get(7, READ), Some(cap(READ, 1, 0, far + 100)));
        // A fresher writer capability replaces it; so does a newer version.
        c.remember(&cap(WRITE, 1, 2, far + 200));
        assert_eq!(c.get(7, APPEND), Some(cap(WRITE, 1, 2, far + 200)));
        c.remember(&cap(WRITE, 2, 1, far));
        assert_eq!(c.get(7, APPEND), Some(cap(WRITE, 2, 1, far)));
        // An older writer's does not.
        c.remember(&cap(WRITE, 2, 0, far + 300));
        assert_eq!(c.get(7, APPEND), Some(cap(WRITE, 2, 1, far)));
        // An expired one is replaced by anything.
        c.forget(7);
        c.remember(&cap(WRITE, 9, 9, 1));
        c.remember(&cap(WRITE, 1, 0, far));
        assert_eq!(c.get(7, APPEND), Some(cap(WRITE, 1, 0, far)));
        c.remember(b"garbage");
        assert_eq!(c.len(), 1);
        // Reads take the writer's when no reader's is held.
        assert_eq!(c.get(7, READ), Some(cap(WRITE, 1, 0, far)));
        assert_eq!(c.get(8, READ), None);
    }

    /// The loss the nemesis found under CPU starvation (RELIABILITY.md, 2026-11-28): a
    /// writer's capability refused by one restarted server was forgotten, a reader in the
    /// same process brought a read-only one into its place, and the writer's appends and
    /// seals at the healthy replicas were refused until the chunk was sealed short.
    #[test]
    fn a_refusal_forgets_only_a_reader_capability() {
        let c = Caps::default();
        let far = (now_secs() + 1000) as u32;
        let w = cap(WRITE, 1, 2, far);
        c.remember(&w);
        c.refused(7, &w);
        c.remember(&cap(READ, 1, 0, far + 100));
        assert_eq!(c.get(7, APPEND), Some(w));
        assert_eq!(c.get(7, READ), Some(cap(READ, 1, 0, far + 100)));
        // A refused reader's goes; one that arrived since stays.
        c.refused(7, &cap(READ, 1, 0, far + 1));
        assert_eq!(c.get(7, READ), Some(cap(READ, 1, 0, far + 100)));
        c.refused(7, &cap(READ, 1, 0, far + 100));
        assert_eq!(c.get(7, READ), Some(w));
        assert_eq!(c.len(), 1);
        c.forget(7);
        c.remember(&cap(READ, 1, 0, far));
        c.refused(7, &cap(READ, 1, 0, far));
        assert!(c.is_empty());
    }
}
