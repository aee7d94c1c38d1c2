//! The partition map (docs/partitions.md): which partitions exist and which masters host
//! them. It lives in the root partition's state, changed only by root commands, so every
//! master has it (in its root replica) with every change in log order.

use super::{Reply, Response, State};
use cairn_rpc::MetaError;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// A partition's number; 0 is the root.
pub type PartitionId = u32;

/// The root partition: the group every cluster had before partitions.
pub const ROOT_PARTITION: PartitionId = 0;

/// At most this many partitions besides the root (ids carry the partition in 16 bits).
pub const MAX_PARTITIONS: usize = 4096;

/// A partition in the map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRecord {
    /// The masters that host it (its Raft group's members).
    pub members: BTreeSet<u64>,
    pub created_ms: u64,
}

/// The partitions besides the root, by number.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionMap {
    pub partitions: BTreeMap<PartitionId, PartitionRecord>,
}

impl State {
    pub fn partitions(&self) -> &PartitionMap {
        &self.partitions
    }

    /// Adds a partition hosted by `members`; its number is the lowest unused one.
    pub(super) fn add_partition(&mut self, members: &[u64], now_ms: u64) -> Response {
        if members.is_empty() || members.contains(&0) {
            return Err(MetaError::invalid(
                "a partition needs masters to host it (ids ≥ 1)",
            ));
        }
        if self.partitions.partitions.len() >= MAX_PARTITIONS {
            return Err(MetaError::invalid(format!(
                "there are {MAX_PARTITIONS} partitions already"
            )));
        }
        let id = (1..)
            .find(|i| !self.partitions.partitions.contains_key(i))
            .expect("fewer than MAX_PARTITIONS are taken");
        self.partitions.partitions.insert(
            id,
            PartitionRecord {
                members: members.iter().copied().collect(),
                created_ms: now_ms,
            },
        );
        Ok(Reply {
            partition: Some(id),
            ..Reply::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;

    #[test]
    fn partitions_take_the_lowest_free_number() {
        let mut st = State::default();
        let add = |st: &mut State, members: Vec<u64>| {
            st.apply(&Command::AddPartition { members, now_ms: 7 })
        };
        assert_eq!(add(&mut st, vec![1, 2, 3]).unwrap().partition, Some(1));
        assert_eq!(add(&mut st, vec![2]).unwrap().partition, Some(2));
        let p = &st.partitions().partitions;
        assert_eq!(p[&1].members, BTreeSet::from([1, 2, 3]));
        assert_eq!(p[&2].created_ms, 7);
        assert!(add(&mut st, vec![]).is_err());
        assert!(add(&mut st, vec![0, 1]).is_err());
        assert_eq!(st.partitions().partitions.len(), 2);
    }
}
