//! Signing capabilities (docs/security.md): the leader signs one into every chunk it
//! describes, for the rights of the call that asked, and hands the keys to chunkservers in
//! their heartbeat replies.
//!
//! Keys live in the replicated state ([`crate::state::KeyRecord`]); the leader creates the
//! first one when it finds none, and `cairn admin rotate-key` adds another. A new key signs
//! only once [`KEY_ACTIVATION_MS`] have passed since it was made (every chunkserver has had a
//! heartbeat reply naming it by then); until then the one before it signs. The key before
//! the newest stays valid, so capabilities signed with it work until they expire.

use crate::state::{Inode, KeyRecord, State};
use cairn_proto::cap::{CapKey, Capability, Claims};
use cairn_rpc::auth::Principal;
use cairn_rpc::pb;

pub use cairn_proto::cap::CAP_LIFETIME_SECS;

/// How long a new key waits before it signs: several heartbeats, so every chunkserver up
/// holds it first.
pub const KEY_ACTIVATION_MS: u64 = 5_000;

/// The key that signs now, with the expiry and permission generation it gives, for one
/// holder.
pub struct Signer {
    key: CapKey,
    expires_secs: u32,
    generation: u64,
    holder: u64,
}

/// The holder a principal's capabilities name: a user's [`cairn_proto::cap::holder_of`]
/// name; 0 for servers, services and open clusters (never revoked).
pub fn holder(who: &Principal) -> u64 {
    match who {
        Principal::User { name, .. } => cairn_proto::cap::holder_of(name),
        // A service's rights come from its namespace, which no chmod changes: like servers',
        // its capabilities are never revoked.
        Principal::Server(_) | Principal::Service(_) | Principal::Open => 0,
    }
}

fn cap_key(k: &KeyRecord) -> CapKey {
    CapKey {
        id: k.id,
        secret: k.secret,
    }
}

impl Signer {
    /// The newest key older than [`KEY_ACTIVATION_MS`], else the oldest one (a lone new key
    /// signs at once: there is no other), signing for `who` at the state's permission
    /// generation; `None` while the state has no key. Take it under the same lock as the
    /// permission check its capabilities follow from: a change applied after that check
    /// revokes them.
    pub fn of(state: &State, now_ms: u64, who: &Principal) -> Option<Self> {
        let keys = state.cap_keys();
        let k = keys
            .iter()
            .rev()
            .find(|k| k.created_ms + KEY_ACTIVATION_MS <= now_ms)
            .or(keys.first())?;
        let expires = now_ms / 1000 + CAP_LIFETIME_SECS;
        Some(Self {
            key: cap_key(k),
            expires_secs: u32::try_from(expires).unwrap_or(u32::MAX),
            generation: state.revocations().generation(),
            holder: holder(who),
        })
    }

    /// A capability for `chunk_id` at `version` with `rights`; `epoch` is the writer's
    /// (0 for readers and servers).
    pub fn sign(&self, chunk_id: u64, version: u64, rights: u8, epoch: u32) -> Vec<u8> {
        Capability::sign(
            &self.key,
            Claims {
                rights,
                chunk_id,
                chunk_version: version,
                epoch,
                expires_secs: self.expires_secs,
                generation: self.generation,
                holder: self.holder,
            },
        )
        .encode()
        .to_vec()
    }

    /// Signs every chunk of `f`.
    pub fn sign_file(&self, f: &mut pb::FileMeta, rights: u8, epoch: u32) {
        for c in &mut f.chunks {
            c.cap = self.sign(c.id, c.version, rights, epoch);
        }
    }
}

/// The keys for a heartbeat reply: every key held, the signing one among them.
pub fn keys_pb(state: &State) -> Vec<pb::CapKey> {
    state
        .cap_keys()
        .iter()
        .map(|k| pb::CapKey {
            id: k.id,
            secret: k.secret.to_vec(),
        })
        .collect()
}

/// A fresh key's 32 random bytes (drawn by the leader; the command carries them so every
/// master applies the same key).
pub fn new_secret() -> [u8; cairn_proto::cap::KEY_BYTES] {
    let mut s = [0u8; cairn_proto::cap::KEY_BYTES];
    rand::fill(&mut s);
    s
}

/// Revocations bounded per heartbeat reply, in chunks named: a server far behind catches up
/// over several heartbeats.
pub const MAX_REVOKED_CHUNKS_PER_REPLY: usize = 50_000;

/// The revocations after `seen` for a heartbeat reply, each file's expanded into its chunks
/// (whole records only, at least one, at most [`MAX_REVOKED_CHUNKS_PER_REPLY`] chunks
/// beyond the first), and the number of the last one included (the last one the state has
/// when none is new).
pub fn revocations_pb(state: &State, seen: u64) -> (Vec<pb::Revocation>, u64) {
    use crate::state::revoke::Record;
    use pb::revocation::Kind;
    let mut out = Vec::new();
    let mut upto = state.revocations().last_seq();
    for (seq, r) in state.revocations().after(seen) {
        let before = out.len();
        match *r {
            Record::File {
                inode,
                generation,
                except,
            } => {
                let ino = state.inode(inode);
                let chunks = ino.as_deref().and_then(Inode::file);
                for c in chunks.into_iter().flat_map(|f| &f.chunks) {
                    out.push(pb::Revocation {
                        kind: Kind::Chunk.into(),
                        generation,
                        chunk_id: c.id,
                        holder: 0,
                        except,
                    });
                }
            }
            Record::Holder { holder, generation } => out.push(pb::Revocation {
                kind: Kind::Holder.into(),
                generation,
                holder,
                ..Default::default()
            }),
            Record::All { generation } => out.push(pb::Revocation {
                kind: Kind::All.into(),
                generation,
                ..Default::default()
            }),
        }
        if before > 0 && out.len() > MAX_REVOKED_CHUNKS_PER_REPLY {
            out.truncate(before);
            break;
        }
        upto = seq;
    }
    (out, upto)
}
