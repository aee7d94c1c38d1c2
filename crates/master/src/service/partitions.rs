//! Partitions at the service (docs/partitions.md): starting the groups the root's map says
//! this master hosts, keeping each partition's leader with the root's, creating partitions
//! and reporting them.

use super::{Inner, MetaService, Rpc};
use crate::groups::Hosted;
use crate::state::partitions::{PartitionId, ROOT_PARTITION};
use crate::state::{ChunkId, Command, Reply};
use crate::store::Applied;
use crate::view::View;
use cairn_rpc::{MetaError, pb};
use openraft::BasicNode;
use openraft::async_runtime::WatchReceiver;
use std::collections::{BTreeMap, BTreeSet};
use tonic::Request;

impl Inner {
    /// Adds a partition hosted by `members` (the root's voters when empty); its number.
    pub(super) async fn add_partition(&self, members: &[u64]) -> Result<PartitionId, MetaError> {
        self.leader_check()?;
        let voters: Vec<u64> = {
            let m = self.raft.metrics().borrow_watched().clone();
            m.membership_config.membership().voter_ids().collect()
        };
        let mut members = if members.is_empty() {
            voters.clone()
        } else {
            members.to_vec()
        };
        members.sort_unstable();
        members.dedup();
        if let Some(m) = members.iter().find(|m| !voters.contains(m)) {
            return Err(MetaError::invalid(format!(
                "master {m} is not a voter of the root group (voters: {voters:?})"
            )));
        }
        let reply = self
            .write(Command::AddPartition {
                members,
                now_ms: super::now_ms(),
            })
            .await?;
        reply
            .partition
            .ok_or_else(|| MetaError::internal("adding a partition named none"))
    }

    /// `f` on the root's applied state and the view (crate::view) of the root and every
    /// partition this master leads whose state is settled (holds everything committed
    /// before its leader's term): what heartbeats, repair, conversion and status read.
    pub(crate) fn with_view<T>(&self, f: impl FnOnce(&Applied, &View<'_>) -> T) -> T {
        self.with_view_of(None, f)
    }

    /// The partitions this master leads, each confirmed by a read barrier (its lease holds:
    /// no other master can lead it now).
    pub(crate) async fn confirmed_partitions(&self) -> BTreeSet<PartitionId> {
        let mut out = BTreeSet::new();
        for h in self.groups.all() {
            if h.id != ROOT_PARTITION && h.leader_check().is_ok() && h.read_barrier().await.is_ok()
            {
                out.insert(h.id);
            }
        }
        out
    }

    /// [`Inner::with_view`] of the partitions in `only` (all it leads when `None`).
    pub(crate) fn with_view_of<T>(
        &self,
        only: Option<&BTreeSet<PartitionId>>,
        f: impl FnOnce(&Applied, &View<'_>) -> T,
    ) -> T {
        let root = self.sm.lock();
        let led: Vec<(std::sync::Arc<Hosted>, u64)> = self
            .groups
            .all()
            .into_iter()
            .filter(|h| h.id != ROOT_PARTITION && only.is_none_or(|o| o.contains(&h.id)))
            .filter_map(|h| {
                let term = h.leader_check().ok()?;
                Some((h, term))
            })
            .collect();
        // Root first, then by partition: the order every holder of several takes them in.
        let guards: Vec<_> = led.iter().map(|(h, t)| (h.id, *t, h.sm.lock())).collect();
        let parts = guards
            .iter()
            .filter(|(_, term, g)| {
                g.last_applied
                    .is_some_and(|l| l.committed_leader_id().term == *term)
            })
            .map(|(p, _, g)| (*p, &g.state))
            .collect();
        f(
            &root,
            &View {
                root: &root.state,
                parts,
            },
        )
    }

    /// Applies `cmd`, about chunk `id`, in the partition that allocated the chunk.
    pub(crate) async fn write_for_chunk(
        &self,
        id: ChunkId,
        cmd: Command,
    ) -> Result<Reply, MetaError> {
        let h = self.led_soon(self.chunk_home(id)).await?;
        self.write_to(&h, cmd).await
    }

    /// The partition holding chunk `id`'s file: the one that allocated it, unless that one
    /// (hosted here) forwards it (state/moves.rs, state/txn.rs).
    pub(crate) fn chunk_home(&self, id: ChunkId) -> PartitionId {
        let alloc = crate::state::partitions::partition_of(id);
        if alloc == ROOT_PARTITION {
            return self.sm.lock().state.chunk_partition(id);
        }
        self.groups
            .get(alloc)
            .map_or(alloc, |h| h.sm.lock().state.chunk_partition(id))
    }

    /// Starts the Raft node of every partition in the root's map that names this master and
    /// has none here yet; the lowest-numbered member initializes a new group with the
    /// members' addresses from the root's membership. Then hands each partition this master
    /// leads, but whose root it does not, to the root's leader (leader affinity).
    pub(super) async fn host_partitions(&self) {
        let _one = self.hosting.lock().await;
        let wanted: Vec<(PartitionId, Vec<u64>)> = {
            let a = self.sm.lock();
            a.state
                .partitions()
                .partitions
                .iter()
                .filter(|(id, p)| p.members.contains(&self.id) && self.groups.get(**id).is_none())
                .map(|(id, p)| (*id, p.members.iter().copied().collect()))
                .collect()
        };
        for (id, members) in wanted {
            match Hosted::open(&self.opts, id, self.tls.clone()).await {
                Ok(h) => {
                    tracing::info!(partition = id, ?members, "hosting a partition");
                    self.groups.insert(h.clone());
                    if members.first() == Some(&self.id) {
                        initialize(&h, &members, &self.master_addrs()).await;
                    }
                }
                Err(e) => tracing::error!(partition = id, error = %e,
                    "cannot open a partition"),
            }
        }
        self.follow_root_leader();
    }

    /// The root group's masters (voters and learners) and their addresses.
    pub(super) fn master_addrs(&self) -> BTreeMap<u64, String> {
        let m = self.raft.metrics().borrow_watched().clone();
        m.membership_config
            .membership()
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect()
    }

    /// Asks each partition this master leads to transfer its leadership to the root's
    /// leader, when that is another master and a member.
    fn follow_root_leader(&self) {
        let root_leader = self.raft.metrics().borrow_watched().current_leader;
        let Some(root_leader) = root_leader.filter(|l| *l != self.id) else {
            return;
        };
        for g in self.groups.all() {
            if g.id == ROOT_PARTITION {
                continue;
            }
            let (leads, member) = {
                let m = g.raft.metrics().borrow_watched().clone();
                let member = m
                    .membership_config
                    .membership()
                    .voter_ids()
                    .any(|v| v == root_leader);
                (m.current_leader == Some(self.id), member)
            };
            if leads && member {
                let raft = g.raft.clone();
                tokio::spawn(async move {
                    if let Err(e) = raft.trigger().transfer_leader(root_leader).await {
                        tracing::warn!(error = %e, "partition leadership transfer failed");
                    }
                });
            }
        }
    }

    /// What `cairn status` shows of each partition, the root first.
    pub(super) fn partition_status(&self) -> Vec<pb::PartitionStatus> {
        let (map, subtrees) = {
            let a = self.sm.lock();
            // A hashed directory's shards hold it too (state/hashed.rs).
            let subtrees: BTreeMap<PartitionId, String> = a
                .state
                .subtrees()
                .iter()
                .map(|(t, p)| (*p, t.clone()))
                .chain(
                    a.state
                        .hashed()
                        .iter()
                        .flat_map(|(t, s)| s.iter().map(|p| (*p, t.clone()))),
                )
                .collect();
            (a.state.partitions().partitions.clone(), subtrees)
        };
        let root_members = {
            let m = self.raft.metrics().borrow_watched().clone();
            m.membership_config.membership().voter_ids().collect()
        };
        std::iter::once((ROOT_PARTITION, root_members))
            .chain(
                map.into_iter()
                    .map(|(id, p)| (id, p.members.into_iter().collect())),
            )
            .map(|(id, members)| {
                let mut s = pb::PartitionStatus {
                    id,
                    members,
                    subtree: match id {
                        ROOT_PARTITION => "/".to_owned(),
                        _ => subtrees.get(&id).cloned().unwrap_or_default(),
                    },
                    ..Default::default()
                };
                if let Some(g) = self.groups.get(id) {
                    let m = g.raft.metrics().borrow_watched().clone();
                    s.hosted = true;
                    s.leader_id = m.current_leader.unwrap_or(0);
                    s.term = m.current_term;
                    s.last_applied = m.last_applied.as_ref().map_or(0, |l| l.index);
                    let a = g.sm.lock();
                    let (files, dirs, _, _) = a.state.totals();
                    s.files = files;
                    s.dirs = dirs;
                    s.objects = a.state.objects().object_count();
                }
                s
            })
            .collect()
    }
}

/// Initializes partition `h`'s new group with `members` at the root's addresses for them.
async fn initialize(h: &Hosted, members: &[u64], addrs: &BTreeMap<u64, String>) {
    match h.raft.is_initialized().await {
        Ok(false) => {}
        Ok(true) => return,
        Err(e) => {
            tracing::error!(partition = h.id, error = %e, "partition's Raft node failed");
            return;
        }
    }
    let nodes: BTreeMap<u64, BasicNode> = members
        .iter()
        .filter_map(|m| addrs.get(m).map(|a| (*m, BasicNode { addr: a.clone() })))
        .collect();
    if nodes.len() != members.len() {
        tracing::error!(partition = h.id, ?members, known = ?addrs.keys(),
            "a partition names masters that are not in the root group");
        return;
    }
    if let Err(e) = h.raft.initialize(nodes).await {
        tracing::error!(partition = h.id, error = %e, "cannot initialize a partition");
    }
}

impl MetaService {
    /// `CreatePartition`: adds a partition hosted by the masters named (the root's voters
    /// when none are); answers with the status, the new partition in it.
    pub(super) async fn create_partition(
        &self,
        req: Request<pb::PartitionRequest>,
    ) -> Rpc<pb::StatusReply> {
        let (who, call) = self.inner.call(&req, "CreatePartition")?;
        let r = req.into_inner();
        let target = serde_json::json!({ "members": r.members });
        let res: Result<PartitionId, MetaError> = async {
            who.require_admin("creating a partition")?;
            self.inner.add_partition(&r.members).await
        }
        .await;
        self.inner.audited(&call, target, res)?;
        // Start hosting it now rather than at the next tick.
        self.inner.host_partitions().await;
        self.status_reply().await
    }

    /// `SplitPartition`: sends the subtree at a path in the root partition to a partition, a
    /// new one unless named. The partition takes the subtree first (`InitPartition`: its top
    /// directory's owner, mode and default policy, ids of its range). A missing or empty
    /// directory is then sent there by the root's map (`AssignSubtree`, which checks the
    /// directory is still empty and unchanged); a split that stops between the two leaves a
    /// partition that holds a subtree nothing routes to, which the same split run again
    /// completes. A populated one is moved (`BeginMove`, then [`Inner::drive_move`]: its
    /// rows copied while writes to it wait).
    pub(super) async fn split_partition(
        &self,
        req: Request<pb::SplitRequest>,
    ) -> Rpc<pb::StatusReply> {
        let (who, call) = self.inner.call(&req, "SplitPartition")?;
        let r = req.into_inner();
        let target = serde_json::json!({
            "path": r.path, "to": r.to, "members": r.members, "bucket": r.bucket, "shards": r.shards,
        });
        let res: Result<(), MetaError> = async {
            who.require_admin("splitting a partition")?;
            if r.bucket.is_empty() && r.shards > 1 {
                if r.to != 0 {
                    return Err(MetaError::invalid(
                        "a directory is hashed over new partitions (--shards), not --to one",
                    ));
                }
                let path = crate::convert::path(&r.path)?;
                self.inner
                    .hash_directory(&path, r.shards, &r.members)
                    .await
                    .map(|_| ())
            } else if r.bucket.is_empty() {
                let path = crate::convert::path(&r.path)?;
                self.inner
                    .split_subtree(&path, r.to, &r.members)
                    .await
                    .map(|_| ())
            } else {
                self.inner
                    .split_bucket(&r.bucket, r.shards, &r.members)
                    .await
            }
        }
        .await;
        self.inner.audited(&call, target, res)?;
        self.status_reply().await
    }

    pub(crate) async fn host_partitions(&self) {
        self.inner.host_partitions().await;
    }

    /// Finishes or undoes placed buckets' deletions whose driver stopped
    /// (service/buckets.rs).
    pub(crate) async fn resume_bucket_deletes(&self) {
        self.inner.resume_bucket_deletes().await;
    }

    /// `CheckMetadata`: the consistency check (state/check.rs) of the root and of every
    /// partition in its map, each at a read barrier, and of the map against what each
    /// partition holds. A partition not led here within the routing wait is a problem (it
    /// could not be checked).
    pub(super) async fn check_metadata(&self, req: Request<pb::Empty>) -> Rpc<pb::CheckReply> {
        let (who, call) = self.inner.call(&req, "CheckMetadata")?;
        let res: Result<pb::CheckReply, MetaError> = async {
            who.require_admin("checking the metadata")?;
            self.inner.read_barrier().await?;
            let mut chunks = ChunkHomes::default();
            let (root, map, subtrees, busy) = {
                let a = self.inner.sm.lock();
                let st = &a.state;
                let tops: BTreeMap<PartitionId, String> = st
                    .subtrees()
                    .iter()
                    .map(|(t, p)| (*p, t.clone()))
                    .chain(
                        st.hashed()
                            .iter()
                            .flat_map(|(t, s)| s.iter().map(|p| (*p, t.clone()))),
                    )
                    .collect();
                let ids: Vec<PartitionId> = st.partitions().partitions.keys().copied().collect();
                chunks.read(ROOT_PARTITION, st);
                let busy = st.moving().is_some() || !st.txns().open.is_empty();
                (st.check(), ids, tops, busy)
            };
            // Moves out of other partitions under way (their targets hold a subtree the map
            // does not send them yet, and chunks are forwarded as they go).
            let moving_into: BTreeSet<PartitionId> = self
                .inner
                .groups
                .all()
                .iter()
                .flat_map(|h| {
                    let st = &h.sm.lock().state;
                    let mut to: Vec<PartitionId> = st.moving().map(|m| m.to).into_iter().collect();
                    to.extend_from_slice(st.move_shards());
                    to
                })
                .collect();
            let busy = busy || !moving_into.is_empty();
            let mut out = vec![check_reply(ROOT_PARTITION, root)];
            for p in map {
                let r = match self.inner.led_soon(p).await {
                    Ok(h) => match h.read_barrier().await {
                        Ok(_) => {
                            let st = &h.sm.lock().state;
                            chunks.read(p, st);
                            let mut r = st.check();
                            let home = st.home();
                            match subtrees.get(&p) {
                                Some(top) if home.partition != p || home.path != *top => {
                                    r.problem(format!(
                                        "the root sends {top} here; the partition holds {:?} \
                                         of partition {}",
                                        home.path, home.partition
                                    ));
                                }
                                None if home.partition == p && !moving_into.contains(&p) => r
                                    .problem(format!(
                                        "the partition holds {}, which the root does not send here \
                                     (a split that stopped: run it again)",
                                        home.path
                                    )),
                                _ => {}
                            }
                            r
                        }
                        Err(e) => unchecked(&e),
                    },
                    Err(e) => unchecked(&e),
                };
                out.push(check_reply(p, r));
            }
            // Across partitions: a chunk held by a partition that did not allocate it is
            // forwarded there by the one that did (not while a move or rename is under way).
            if !busy {
                for (holder, what) in chunks.misplaced() {
                    if let Some(r) = out.iter_mut().find(|r| r.partition == holder) {
                        r.problems += 1;
                        if r.listed.len() < crate::state::MAX_LISTED {
                            r.listed.push(what);
                        }
                    }
                }
            }
            Ok(pb::CheckReply { partitions: out })
        }
        .await;
        self.inner.audited(&call, serde_json::json!({}), res)
    }
}

impl MetaService {
    /// `StateDigest`: this master's digest of each partition it hosts, at the entry it has
    /// applied (no barrier, no leader: each master answers for its own copy).
    pub(super) async fn state_digest(&self, req: Request<pb::Empty>) -> Rpc<pb::DigestReply> {
        let (who, call) = self.inner.call(&req, "StateDigest")?;
        let res: Result<pb::DigestReply, MetaError> = async {
            who.require_admin("reading state digests")?;
            let mut groups = Vec::new();
            for h in self.inner.groups.all() {
                let machine = h.machine.clone();
                let d = tokio::task::spawn_blocking(move || machine.digest())
                    .await
                    .map_err(|e| MetaError::internal(e.to_string()))?
                    .map_err(|e| MetaError::internal(format!("partition {}: {e}", h.id)))?;
                groups.push(pb::GroupDigest {
                    partition: h.id,
                    term: d.at.map_or(0, |l| l.leader_id.term),
                    index: d.at.map_or(0, |l| l.index),
                    rows: d.rows,
                    crc: d.crc,
                    tables: d
                        .tables
                        .into_iter()
                        .map(|(name, rows, crc)| pb::TableDigest {
                            name: name.to_owned(),
                            rows,
                            crc,
                        })
                        .collect(),
                });
            }
            Ok(pb::DigestReply {
                master: self.inner.id,
                groups,
            })
        }
        .await;
        self.inner.audited(&call, serde_json::json!({}), res)
    }
}

/// What the cross-partition check reads of each partition: the chunks its files hold that
/// another partition allocated, and its forwards.
#[derive(Default)]
struct ChunkHomes {
    foreign: Vec<(PartitionId, ChunkId)>,
    forwards: BTreeMap<ChunkId, PartitionId>,
    read: BTreeSet<PartitionId>,
}

impl ChunkHomes {
    fn read(&mut self, p: PartitionId, st: &crate::state::State) {
        self.read.insert(p);
        for c in st.chunks() {
            if crate::state::partitions::partition_of(c.id) != p {
                self.foreign.push((p, c.id));
            }
        }
        self.forwards.extend(st.forwards());
    }

    /// (holder, problem) for each foreign chunk whose allocating partition (when read)
    /// does not forward it to its holder.
    fn misplaced(&self) -> Vec<(PartitionId, String)> {
        self.foreign
            .iter()
            .filter(|(_, c)| {
                self.read
                    .contains(&crate::state::partitions::partition_of(*c))
            })
            .filter(|(holder, c)| self.forwards.get(c) != Some(holder))
            .map(|(holder, c)| {
                (
                    *holder,
                    format!(
                        "chunk {c} is held here but its partition {} forwards it to {:?}",
                        crate::state::partitions::partition_of(*c),
                        self.forwards.get(c)
                    ),
                )
            })
            .collect()
    }
}

/// A partition that could not be checked.
fn unchecked(e: &MetaError) -> crate::state::CheckReport {
    let mut r = crate::state::CheckReport::default();
    r.problem(format!("not checked: {}", e.message));
    r
}

fn check_reply(partition: PartitionId, r: crate::state::CheckReport) -> pb::PartitionCheck {
    pb::PartitionCheck {
        partition,
        inodes: r.inodes,
        chunks: r.chunks,
        objects: r.objects,
        problems: r.problems,
        listed: r.listed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, State};

    /// Canary for the cross-partition check: a chunk held by a partition that did not
    /// allocate it, and not forwarded there, is a problem; forwarded, it is not.
    #[test]
    fn a_chunk_held_without_its_forward_is_misplaced() {
        let mut root = State::default();
        root.apply(&Command::AddPartition {
            members: vec![1],
            now_ms: 1,
        })
        .unwrap();
        let ino = crate::state::tests::create_file(&mut root, "/f", 1);
        let chunk = ino.file().unwrap().chunks[0].id;
        let mut p1 = crate::state::tests::partition_state(1, "/p");
        let mut moved = ino.clone();
        moved.parent = crate::state::ROOT;
        p1.apply(&Command::LoadRows {
            top: "/p".into(),
            inodes: vec![moved],
            policies: vec![],
        })
        .unwrap();
        let homes = |root: &State, p1: &State| {
            let mut h = ChunkHomes::default();
            h.read(ROOT_PARTITION, root);
            h.read(1, p1);
            h.misplaced()
        };
        let m = homes(&root, &p1);
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!(m[0].0, 1);
        root.apply(&Command::TxForward {
            chunks: vec![chunk],
            to: 1,
        })
        .unwrap();
        assert!(homes(&root, &p1).is_empty());
    }
}
