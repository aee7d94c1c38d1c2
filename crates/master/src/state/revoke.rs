//! Revoking capabilities when rights are taken away (docs/security.md, "Revocation").
//!
//! The state counts the permission changes that can take rights away — a `chmod` that
//! clears bits, a `chown`, a user's deletion — as its permission generation, and every
//! capability carries the generation it was signed from. Each such change adds a record:
//! capabilities of an older generation stop working on the file's chunks (except its new
//! owner's), or everywhere for a deleted user. Chunkservers learn the records from heartbeat
//! replies (`caps::revocations_pb`) and check each capability against them, so what a
//! change took away stops working at the next heartbeat, not when the capability expires.
//!
//! The records are replicated (every master sends the same ones after a failover) and
//! numbered; a chunkserver sends back the number of the last one it holds. The leader
//! proposes [`super::Command::PruneRevocations`] for records older than every capability
//! they revoke ([`cairn_proto::cap::REVOCATION_KEEP`], by its own clock since it applied
//! them). Past [`MAX_RECORDS`] the records are replaced by one that revokes every user's
//! capabilities: the clients look their chunks up again, and the table stays bounded.

use super::{InodeId, State};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Instant;

/// Records held at most; past it they collapse into one for every user.
pub const MAX_RECORDS: usize = 10_000;

/// What one record revokes: capabilities of a generation below `generation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// On every chunk of a file, except those of the holder `except` (0: no one).
    File {
        inode: InodeId,
        generation: u64,
        except: u64,
    },
    /// A deleted user's, everywhere.
    Holder { holder: u64, generation: u64 },
    /// Every user's, everywhere.
    All { generation: u64 },
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Revocations {
    /// Permission changes applied: signed into every capability.
    generation: u64,
    /// Sequence number of the last record added (records are numbered from 1).
    last_seq: u64,
    records: BTreeMap<u64, Record>,
    /// When this master applied each record (its own clock; a snapshot loaded counts as
    /// now): what the leader prunes by.
    #[serde(skip)]
    applied: BTreeMap<u64, Instant>,
}

impl PartialEq for Revocations {
    fn eq(&self, o: &Self) -> bool {
        (self.generation, self.last_seq, &self.records) == (o.generation, o.last_seq, &o.records)
    }
}

impl Revocations {
    pub fn is_empty(&self) -> bool {
        self.generation == 0 && self.records.is_empty()
    }

    /// The generation capabilities are signed with now.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Starts a change: the generation its records revoke below.
    pub fn next_generation(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }

    /// Adds `r` (of the generation [`Revocations::next_generation`] gave).
    pub fn add(&mut self, r: Record) {
        if self.records.len() >= MAX_RECORDS {
            self.records.clear();
            self.applied.clear();
            // The current generation: it revokes everything `r` would.
            let generation = self.generation;
            self.push(Record::All { generation });
            return;
        }
        self.push(r);
    }

    fn push(&mut self, r: Record) {
        self.last_seq += 1;
        self.records.insert(self.last_seq, r);
        self.applied.insert(self.last_seq, Instant::now());
    }

    /// The records after `seen`, in order (all of them if `seen` is past the last: the
    /// server held another cluster's, or this one's from before a restore).
    pub fn after(&self, seen: u64) -> impl Iterator<Item = (u64, &Record)> {
        let from = if seen > self.last_seq { 0 } else { seen };
        self.records.range(from + 1..).map(|(seq, r)| (*seq, r))
    }

    /// The last record applied at least `keep` before `now`: every record up to it can go.
    pub fn prunable(&self, now: Instant, keep: std::time::Duration) -> Option<u64> {
        self.records
            .keys()
            .take_while(|seq| {
                self.applied
                    .get(seq)
                    .is_some_and(|t| now.saturating_duration_since(*t) > keep)
            })
            .last()
            .copied()
    }

    /// Drops the records up to `upto`.
    pub fn prune(&mut self, upto: u64) {
        self.records.retain(|seq, _| *seq > upto);
        self.applied.retain(|seq, _| *seq > upto);
    }

    /// After a snapshot is loaded: every record counts as applied now.
    pub fn rebuild(&mut self) {
        let now = Instant::now();
        self.applied = self.records.keys().map(|seq| (*seq, now)).collect();
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }
}

impl State {
    /// Revokes what a change to `id`'s mode or owner took away: capabilities of other
    /// holders than its owner on a file's chunks; of every holder on the files below a
    /// directory (its bits gate the way to them).
    ///
    /// Capabilities are signed and revoked by the root partition: a partition's state
    /// records nothing, and its leader has the root apply [`Command::Revoke`] with
    /// [`State::revocation_targets`] instead (docs/partitions.md).
    pub(super) fn revoke_below(&mut self, id: InodeId) {
        if self.home().partition != super::partitions::ROOT_PARTITION {
            return;
        }
        let targets = self.revocation_targets(id);
        self.revoke_files(&targets);
    }

    /// Records one generation's revocation of `files`: (inode, holder kept, 0 for none).
    pub(super) fn revoke_files(&mut self, files: &[(InodeId, u64)]) {
        let generation = self.revocations.next_generation();
        for &(inode, except) in files {
            self.revocations.add(Record::File {
                inode,
                generation,
                except,
            });
        }
    }

    /// What a change to `id`'s mode or owner revokes: (file, holder kept, 0 for none) —
    /// other holders than its owner on a file; every holder on the files below a
    /// directory.
    pub fn revocation_targets(&self, id: InodeId) -> Vec<(InodeId, u64)> {
        let Some(ino) = self.inodes.get(&id) else {
            return Vec::new();
        };
        if ino.file().is_some() {
            let except = if ino.owner.is_empty() {
                0
            } else {
                cairn_proto::cap::holder_of(&ino.owner)
            };
            return vec![(id, except)];
        }
        let mut out = Vec::new();
        let mut dirs = vec![id];
        while let Some(dir) = dirs.pop() {
            let children: Vec<InodeId> = self
                .dentries
                .range((dir, String::new())..)
                .take_while(|((p, _), _)| *p == dir)
                .map(|(_, c)| *c)
                .collect();
            for c in children {
                if self.inodes.get(&c).is_some_and(|i| i.file().is_some()) {
                    out.push((c, 0));
                } else {
                    dirs.push(c);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;
    use crate::state::tests::create;

    #[test]
    fn records_are_numbered_bounded_and_pruned_by_age() {
        let mut r = Revocations::default();
        let g = r.next_generation();
        r.add(Record::File {
            inode: 5,
            generation: g,
            except: 9,
        });
        let g = r.next_generation();
        r.add(Record::Holder {
            holder: 3,
            generation: g,
        });
        assert_eq!(r.after(0).map(|(s, _)| s).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(r.after(1).map(|(s, _)| s).collect::<Vec<_>>(), [2]);
        assert_eq!(r.after(2).count(), 0);
        // A server that holds a later number than the cluster has gets everything.
        assert_eq!(r.after(7).count(), 2);
        // Nothing is prunable before its time; all of it after.
        let keep = std::time::Duration::from_secs(60);
        assert_eq!(r.prunable(Instant::now(), keep), None);
        let later = Instant::now() + keep * 2;
        assert_eq!(r.prunable(later, keep), Some(2));
        r.prune(1);
        assert_eq!(r.after(0).map(|(s, _)| s).collect::<Vec<_>>(), [2]);
        // Past the bound, one record for every user replaces them.
        for i in 0..MAX_RECORDS as u64 + 5 {
            let generation = r.next_generation();
            r.add(Record::File {
                inode: i,
                generation,
                except: 0,
            });
        }
        assert!(r.len() <= MAX_RECORDS);
        assert!(
            r.after(0)
                .any(|(_, rec)| matches!(rec, Record::All { generation } if *generation > 10_000))
        );
    }

    /// A chmod that clears bits, a chown, a directory's chmod and a user's deletion add
    /// revocations (revoke.rs) of the generation they start; a widening chmod adds none; the
    /// records survive a snapshot and are pruned by number.
    #[test]
    fn narrowing_changes_revoke_and_widening_ones_do_not() {
        let mut s = State::default();
        s.apply(&Command::Mkdir {
            path: "/d/e".into(),
            mode: None,
            parents: true,
            now_ms: 1,
            policy: None,
        })
        .unwrap();
        create(&mut s, "/d/f", None, 1).unwrap();
        create(&mut s, "/d/e/g", None, 1).unwrap();
        let id = |s: &State, p: &str| s.lookup(p).unwrap().id;
        let set = |s: &mut State, path: &str, mode: Option<u16>, owner: Option<&str>| {
            s.apply(&Command::SetAttr {
                path: path.into(),
                mode,
                owner: owner.map(Into::into),
            })
            .unwrap();
        };
        assert_eq!(s.revocations().generation(), 0);
        set(&mut s, "/d/f", Some(0o755), None);
        set(&mut s, "/d/f", Some(0o777), None);
        assert_eq!(s.revocations().len(), 0, "nothing cleared");
        set(&mut s, "/d/f", Some(0o700), None);
        let f = id(&s, "/d/f");
        let recs = |s: &State| {
            s.revocations()
                .after(0)
                .map(|(_, r)| *r)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            recs(&s),
            [Record::File {
                inode: f,
                generation: 1,
                except: 0
            }]
        );
        set(&mut s, "/d/f", None, Some("alice"));
        assert_eq!(
            recs(&s)[1],
            Record::File {
                inode: f,
                generation: 2,
                except: cairn_proto::cap::holder_of("alice")
            }
        );
        // A directory: every file below, at any depth, no one excepted.
        set(&mut s, "/d", Some(0o700), None);
        let mut below: Vec<InodeId> = recs(&s)[2..]
            .iter()
            .map(|r| match *r {
                Record::File {
                    inode,
                    generation: 3,
                    except: 0,
                } => inode,
                other => panic!("{other:?}"),
            })
            .collect();
        below.sort_unstable();
        let mut want = vec![f, id(&s, "/d/e/g")];
        want.sort_unstable();
        assert_eq!(below, want);
        // A deleted user: one record for the holder.
        let user = cairn_rpc::object::User {
            name: "bob".into(),
            access_key: "CKBOB".into(),
            secret_key: "s".into(),
            created_ms: 1,
            admin: false,
            certs: Vec::new(),
        };
        s.apply(&Command::Object(Box::new(
            cairn_rpc::object::ObjectOp::CreateUser { user },
        )))
        .unwrap();
        s.apply(&Command::Object(Box::new(
            cairn_rpc::object::ObjectOp::DeleteUser { name: "bob".into() },
        )))
        .unwrap();
        assert_eq!(
            recs(&s).last(),
            Some(&Record::Holder {
                holder: cairn_proto::cap::holder_of("bob"),
                generation: 4
            })
        );
        // A snapshot keeps them; pruning drops them by number.
        let mut back: State = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
        back.rebuild();
        assert_eq!(back.revocations(), s.revocations());
        let last = s.revocations().last_seq();
        s.apply(&Command::PruneRevocations { upto: last - 1 })
            .unwrap();
        assert_eq!(s.revocations().len(), 1);
        assert_eq!(s.revocations().generation(), 4);
    }
}
