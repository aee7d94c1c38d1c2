//! Partitions at the service (docs/partitions.md): starting the groups the root's map says
//! this master hosts, keeping each partition's leader with the root's, creating partitions
//! and reporting them.

use super::{Inner, MetaService, Rpc};
use crate::groups::Hosted;
use crate::state::Command;
use crate::state::partitions::{PartitionId, ROOT_PARTITION};
use cairn_rpc::{MetaError, pb};
use openraft::BasicNode;
use openraft::async_runtime::WatchReceiver;
use std::collections::BTreeMap;
use tonic::Request;

impl Inner {
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
        let map = self.sm.lock().state.partitions().partitions.clone();
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
        let res: Result<(), MetaError> = async {
            who.require_admin("creating a partition")?;
            self.inner.leader_check()?;
            let voters: Vec<u64> = {
                let m = self.inner.raft.metrics().borrow_watched().clone();
                m.membership_config.membership().voter_ids().collect()
            };
            let mut members = if r.members.is_empty() {
                voters.clone()
            } else {
                r.members.clone()
            };
            members.sort_unstable();
            members.dedup();
            if let Some(m) = members.iter().find(|m| !voters.contains(m)) {
                return Err(MetaError::invalid(format!(
                    "master {m} is not a voter of the root group (voters: {voters:?})"
                )));
            }
            self.inner
                .write(Command::AddPartition {
                    members,
                    now_ms: super::now_ms(),
                })
                .await?;
            Ok(())
        }
        .await;
        self.inner.audited(&call, target, res)?;
        // Start hosting it now rather than at the next tick.
        self.inner.host_partitions().await;
        self.status_reply().await
    }

    pub(crate) async fn host_partitions(&self) {
        self.inner.host_partitions().await;
    }
}
