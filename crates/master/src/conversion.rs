//! Replica→EC conversion (docs/erasure-coding.md §5): the leader picks sealed replicated
//! chunks of `replicas:N,then:ec:K+M` files whose file was last changed longer ago than the
//! conversion age, and has a chunkserver that holds a good copy encode it into a chunk group on
//! K+M servers.
//!
//! The steps, each a crash point that leaves one complete layout:
//! 1. `ConvertBegin` (Raft) allocates the group's id and records the conversion: the members
//!    being written are not orphans. The file still lists the replicas.
//! 2. The worker (a chunkserver, as a repair task) reads its copy, encodes whole stripes
//!    (the last padded with zeros), appends the K+M members, seals them and checks each
//!    member's length and CRC against what it encoded; it reports the result with a heartbeat.
//! 3. `ConvertEnd { switch }` (Raft) replaces the file's chunk by the group in one step; the
//!    replicas stop being locations and are deleted as orphans. A failed or lost worker, or a
//!    conversion a new leader finds without a task, ends without the switch: the members
//!    become orphans instead.

use crate::registry::{Registry, ServerState};
use crate::repair::SCAN_BUDGET;
use crate::state::{ChunkId, Command, ServerId};
use crate::view::StateView;
use cairn_rpc::pb;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// Conversions running in the cluster at once.
const TOTAL: usize = 16;
/// Conversions one worker runs at once.
const PER_WORKER: usize = 2;

/// A conversion the leader wants to start: written as `ConvertBegin`, then handed out.
#[derive(Debug, Clone)]
pub struct Begin {
    pub chunk_id: ChunkId,
    pub version: u64,
    pub length: u64,
    pub worker: ServerId,
    pub servers: Vec<ServerId>,
    pub k: u8,
    pub m: u8,
    /// The file's policy compresses: the worker writes LZ4 blocks.
    pub lz4: bool,
}

/// What one conversion scan wants written.
#[derive(Debug, Default)]
pub struct Plan {
    /// Conversions in the state that no task of this leader runs: ended without a switch.
    pub abandon: Vec<ChunkId>,
    pub begin: Vec<Begin>,
}

impl Registry {
    /// The conversion scan: what to abandon and what to start.
    pub fn plan_conversions(&mut self, state: &impl StateView, now: Instant, now_ms: u64) -> Plan {
        let mut plan = Plan::default();
        for (group, _) in state.conversions() {
            if !self.repairs.is_running(group) {
                plan.abandon.push(group);
            }
        }
        let age = Duration::from_secs(state.config().convert_after_secs);
        let converting: BTreeSet<ChunkId> = state.conversions().map(|(_, c)| c.chunk).collect();
        let mut per_worker: HashMap<ServerId, usize> = HashMap::new();
        let mut running = 0;
        for w in self.repairs.converters() {
            *per_worker.entry(w).or_default() += 1;
            running += 1;
        }
        let (inodes, next) = state.inodes_after(self.repairs.conversion_cursor, SCAN_BUDGET);
        for ino in &inodes {
            let Some(f) = ino.file() else {
                continue;
            };
            let Some(ec) = f.policy.ec.filter(|e| e.then) else {
                continue;
            };
            if Duration::from_millis(now_ms.saturating_sub(ino.mtime_ms)) < age {
                continue;
            }
            for c in &f.chunks {
                if !c.sealed || c.ec.is_some() || c.length == 0 || converting.contains(&c.id) {
                    continue;
                }
                self.repairs.conversions_counting += 1;
                if running + plan.begin.len() >= TOTAL {
                    continue;
                }
                // Only a chunk at full redundancy is converted (repair comes first), by a
                // server that holds a good copy and is up.
                let good = self.good_copies(state, c.id, c.length, &c.servers, now);
                if good.len() < usize::from(f.policy.replicas) {
                    continue;
                }
                let Some(&worker) = good
                    .iter()
                    .filter(|s| {
                        state
                            .servers()
                            .get(s)
                            .is_some_and(|r| self.state_of(r, now) == ServerState::Up)
                    })
                    .filter(|s| per_worker.get(s).copied().unwrap_or(0) < PER_WORKER)
                    .min_by_key(|s| per_worker.get(s).copied().unwrap_or(0))
                else {
                    continue;
                };
                let width = usize::from(ec.k) + usize::from(ec.m);
                let Ok(mut placed) =
                    self.place(state.servers(), width, width, 1, &BTreeSet::new(), now)
                else {
                    continue; // fewer than K+M servers up: later
                };
                *per_worker.entry(worker).or_default() += 1;
                plan.begin.push(Begin {
                    chunk_id: c.id,
                    version: c.version,
                    length: c.length,
                    worker,
                    servers: placed.remove(0),
                    k: ec.k,
                    m: ec.m,
                    lz4: f.policy.compression,
                });
            }
        }
        self.repairs.conversion_cursor = next;
        if next.is_none() {
            // A whole pass over the inodes.
            self.repairs.conversions_waiting =
                std::mem::take(&mut self.repairs.conversions_counting);
        }
        plan
    }

    /// `ConvertBegin` of `b` committed as group `group`: its task goes to the worker.
    pub fn conversion_started(
        &mut self,
        group: ChunkId,
        b: &Begin,
        state: &impl StateView,
        now: Instant,
    ) {
        let cell = crate::state::DEFAULT_CELL;
        let stripe = u64::from(b.k) * u64::from(cell);
        // A compressed group's members are as long as the stream makes them: unknown yet.
        let member_length = match b.lz4 {
            true => 0,
            false => b.length.div_ceil(stripe) * u64::from(cell),
        };
        let members = b
            .servers
            .iter()
            .map(|s| pb::ServerAddr {
                id: *s,
                addr: state
                    .servers()
                    .get(s)
                    .map(|r| r.addr.clone())
                    .unwrap_or_default(),
            })
            .collect();
        tracing::info!(chunk = b.chunk_id, group, worker = b.worker, servers = ?b.servers, "conversion handed out");
        self.repairs.hand_out_conversion(
            group,
            b.chunk_id,
            b.worker,
            member_length,
            b.length,
            now,
            pb::RepairTask {
                chunk_id: group,
                version: b.version,
                length: b.length,
                sources: Vec::new(),
                ec_data: u32::from(b.k),
                ec_parity: u32::from(b.m),
                ec_cell: cell,
                member: 0,
                members,
                convert_from: b.chunk_id,
                compress_block: if b.lz4 { crate::state::LZ4_BLOCK } else { 0 },
                caps: Vec::new(),
            },
        );
    }
}

/// The command that ends a conversion (`stream`: the LZ4 stream's length, 0 if none).
pub fn end(group_id: ChunkId, switch: bool, stream: u64) -> Command {
    Command::ConvertEnd {
        group_id,
        switch,
        stream,
    }
}
