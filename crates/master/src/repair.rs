//! Re-replication (docs/masters.md, "Repair"): the leader finds sealed chunks with fewer good
//! copies than their policy asks and has a chunkserver copy them from a good one, under a
//! cluster-wide bandwidth cap.
//!
//! A scan every second counts the chunks short of copies. A chunk short for longer than
//! `repair_after` (reports lag a heartbeat) gets one repair task at a time: a target chosen like
//! a new chunk's (up, not already a location, another rack than the good copies), handed out
//! with the target's next heartbeat reply. The target pulls the bytes over the data plane,
//! seals its copy and reports the result in a later heartbeat; the leader then records the new
//! location and drops the bad ones (down, draining, stale) through Raft. Tasks live in the
//! leader's memory only: a new leader adopts the repairs targets say they are running and
//! schedules the rest again.

use crate::registry::{Registry, RepairResult, ServerState};
use crate::state::{ChunkId, Command, MemberMove, ServerId};
use crate::view::StateView;
use cairn_rpc::pb;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

/// Repairs one target runs at once.
const PER_TARGET: usize = 4;
/// Repairs running in the whole cluster at once.
const TOTAL: usize = 256;
/// A task the target neither runs nor reported this long after it was handed out is lost.
const LOST_AFTER: Duration = Duration::from_secs(10);
/// Window of the repair rate.
const RATE_WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
struct Task {
    target: ServerId,
    /// Bytes the target writes: the chunk's length, or a group member's.
    length: u64,
    /// The chunk's length at the masters (user bytes).
    chunk_length: u64,
    /// The group member being rebuilt.
    member: Option<MemberMove>,
    /// A conversion: the replicated chunk being encoded (the task's id is the group's).
    convert: Option<ChunkId>,
    handed_out: Instant,
    /// The result came back and its Raft command is being written.
    committing: bool,
}

/// Counters and running tasks of the repair service.
#[derive(Default)]
pub struct Repairs {
    running: HashMap<ChunkId, Task>,
    outbox: HashMap<ServerId, Vec<pb::RepairTask>>,
    /// Chunks short of copies, and since when.
    short_since: HashMap<ChunkId, Instant>,
    /// Short chunks no server can take a copy of (logged once until that changes).
    stuck: HashSet<ChunkId>,
    /// Chunks counted lost (logged once while they stay so).
    lost_logged: HashSet<ChunkId>,
    completions: VecDeque<(Instant, u64)>,
    pub done: u64,
    pub failed: u64,
    pub bytes: u64,
    /// The scan under way (it walks the inodes a slice per tick).
    scan: Pass,
    /// From the last whole scan.
    pub under_replicated: u64,
    pub under_replicated_bytes: u64,
    pub lost: u64,
    /// Conversions finished and failed since this master became leader, their user bytes,
    /// and the chunks waiting for one (from the last conversion scan).
    pub conversions_done: u64,
    pub conversions_failed: u64,
    pub converted_bytes: u64,
    pub conversions_waiting: u64,
    /// The conversion scan's place in its pass, and the chunks waiting it counted so far.
    pub(crate) conversion_cursor: Option<crate::view::Cursor>,
    pub(crate) conversions_counting: u64,
}

/// Inodes the repair and conversion scans look at per tick (per second): a state of up to
/// this many is scanned whole every tick; a larger one in slices, one whole pass per
/// `inodes / SCAN_BUDGET` seconds.
pub const SCAN_BUDGET: usize = 20_000;

/// What a repair scan found so far in its pass over the inodes.
#[derive(Default)]
struct Pass {
    /// The last inode looked at (`None`: the pass starts at the first).
    cursor: Option<crate::view::Cursor>,
    short: HashMap<ChunkId, Instant>,
    under: u64,
    under_bytes: u64,
    lost: u64,
}

/// The chunks of `inodes` that are files', with their file's policy.
pub fn chunks_of(
    inodes: &[std::sync::Arc<crate::state::Inode>],
) -> impl Iterator<Item = (crate::state::Policy, crate::state::Chunk)> + '_ {
    inodes.iter().flat_map(|ino| match ino.file() {
        Some(f) => f.chunks.iter().map(|c| (f.policy, c.clone())).collect(),
        None => Vec::new(),
    })
}

/// A task whose target reported success: its command is written next.
#[derive(Debug, Clone, Copy)]
pub struct Finished {
    pub chunk: ChunkId,
    /// The chunk's length at the masters.
    pub chunk_length: u64,
    pub member: Option<MemberMove>,
    pub convert: bool,
    /// A compressing conversion's LZ4 stream length (0 if none).
    pub stream: u64,
}

impl Repairs {
    /// Whether `server` is the target of a running repair of `chunk`.
    pub fn targets(&self, chunk: ChunkId, server: ServerId) -> bool {
        self.running.get(&chunk).is_some_and(|t| t.target == server)
    }

    pub fn running(&self) -> usize {
        self.running
            .values()
            .filter(|t| t.convert.is_none())
            .count()
    }

    /// Conversions running now.
    pub fn conversions_running(&self) -> usize {
        self.running
            .values()
            .filter(|t| t.convert.is_some())
            .count()
    }

    /// Whether a task (repair or conversion) of `id` runs.
    pub fn is_running(&self, id: ChunkId) -> bool {
        self.running.contains_key(&id)
    }

    /// The worker of every running conversion.
    pub fn converters(&self) -> impl Iterator<Item = ServerId> + '_ {
        self.running
            .values()
            .filter(|t| t.convert.is_some())
            .map(|t| t.target)
    }

    /// Hands conversion `task` (to group `group`) out to `worker`.
    #[allow(clippy::too_many_arguments)]
    pub fn hand_out_conversion(
        &mut self,
        group: ChunkId,
        chunk: ChunkId,
        worker: ServerId,
        member_length: u64,
        chunk_length: u64,
        now: Instant,
        task: pb::RepairTask,
    ) {
        self.running.insert(
            group,
            Task {
                target: worker,
                length: member_length,
                chunk_length,
                member: None,
                convert: Some(chunk),
                handed_out: now,
                committing: false,
            },
        );
        self.outbox.entry(worker).or_default().push(task);
    }

    /// Bytes/s repaired over the last window.
    pub fn rate(&self, now: Instant) -> u64 {
        let bytes: u64 = self
            .completions
            .iter()
            .filter(|(t, _)| now.duration_since(*t) <= RATE_WINDOW)
            .map(|(_, b)| b)
            .sum();
        bytes / RATE_WINDOW.as_secs()
    }

    /// One target's share of the cluster's cap: the cap split over the targets at work.
    pub fn share(&self, cap: u64) -> u64 {
        let mut targets: Vec<ServerId> = self.running.values().map(|t| t.target).collect();
        targets.sort_unstable();
        targets.dedup();
        cap / targets.len().max(1) as u64
    }

    /// The tasks waiting for `server`'s heartbeat.
    pub fn take_tasks(&mut self, server: ServerId) -> Vec<pb::RepairTask> {
        self.outbox.remove(&server).unwrap_or_default()
    }

    /// Repairs a server says it runs that this leader does not know (it was elected since):
    /// adopted, so the copy is not taken for an orphan and not scheduled twice.
    pub fn adopt(
        &mut self,
        server: ServerId,
        repairing: &[ChunkId],
        state: &impl StateView,
        now: Instant,
    ) {
        for &c in repairing {
            // A group's rebuild is not adopted: which member it rebuilds is not reported, so
            // it is scheduled again (the unrecorded copy becomes an orphan).
            if let Some((_, chunk)) = state.chunk(c)
                && chunk.sealed
                && chunk.ec.is_none()
            {
                self.running.entry(c).or_insert(Task {
                    target: server,
                    length: chunk.length,
                    chunk_length: chunk.length,
                    member: None,
                    convert: None,
                    handed_out: now,
                    committing: false,
                });
            }
        }
    }

    /// Takes a target's results; returns the successful ones, whose tasks now wait for their
    /// command (`Repaired`, `ConvertEnd`) to be written.
    pub fn results(&mut self, server: ServerId, results: &[RepairResult]) -> Vec<Finished> {
        let mut out = Vec::new();
        for r in results {
            let Some(t) = self.running.get_mut(&r.chunk_id) else {
                continue;
            };
            if t.target != server || t.committing {
                continue;
            }
            // A compressing conversion's members are as long as its stream makes them,
            // which only the worker knows (0 here).
            if r.ok && (r.length == t.length || t.convert.is_some() && t.length == 0) {
                t.committing = true;
                out.push(Finished {
                    chunk: r.chunk_id,
                    chunk_length: t.chunk_length,
                    member: t.member,
                    convert: t.convert.is_some(),
                    stream: r.stream_length,
                });
            } else {
                tracing::warn!(chunk = r.chunk_id, server, error = %r.error, "repair or conversion failed");
                if self
                    .running
                    .remove(&r.chunk_id)
                    .is_some_and(|t| t.convert.is_some())
                {
                    self.conversions_failed += 1;
                } else {
                    self.failed += 1;
                }
            }
        }
        out
    }

    /// The `Repaired` command of `chunk` was written (or failed to be): the task is over.
    pub fn committed(&mut self, chunk: ChunkId, ok: bool, now: Instant) {
        if let Some(t) = self.running.remove(&chunk) {
            if t.convert.is_some() {
                tracing::info!(group = chunk, worker = t.target, ok, "conversion recorded");
                match ok {
                    true => {
                        self.conversions_done += 1;
                        self.converted_bytes += t.chunk_length;
                    }
                    false => self.conversions_failed += 1,
                }
                return;
            }
            tracing::info!(chunk, target = t.target, ok, "repair recorded");
            if ok {
                self.done += 1;
                self.bytes += t.length;
                self.completions.push_back((now, t.length));
            } else {
                self.failed += 1;
            }
        }
        while self
            .completions
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW)
        {
            self.completions.pop_front();
        }
    }
}

impl Registry {
    /// Good copies of a chunk among its locations.
    pub fn good_copies(
        &self,
        state: &impl StateView,
        chunk: ChunkId,
        length: u64,
        servers: &[ServerId],
        now: Instant,
    ) -> Vec<ServerId> {
        servers
            .iter()
            .copied()
            .filter(|s| self.holds(state.servers().get(s), chunk, length, now))
            .collect()
    }

    /// The command recording a repair of `chunk` onto `server`: the new copy becomes a
    /// location, the locations that are not good copies stop being ones; a rebuilt group
    /// member takes its position.
    pub fn repaired(
        &self,
        state: &impl StateView,
        chunk_id: ChunkId,
        length: u64,
        server: ServerId,
        member: Option<MemberMove>,
        now: Instant,
    ) -> Command {
        if member.is_some() {
            return Command::Repaired {
                chunk_id,
                length,
                server,
                remove: Vec::new(),
                member,
            };
        }
        let servers = state
            .chunk(chunk_id)
            .map(|(_, c)| c.servers.clone())
            .unwrap_or_default();
        let good = self.good_copies(state, chunk_id, length, &servers, now);
        Command::Repaired {
            chunk_id,
            length,
            server,
            remove: servers.into_iter().filter(|s| !good.contains(s)).collect(),
            member: None,
        }
    }

    /// The scan: counts what is short of copies and hands out new tasks.
    pub fn scan_repairs(&mut self, state: &impl StateView, now: Instant) {
        // Tasks whose target went down, or that the target never started.
        let lost: Vec<ChunkId> = self
            .repairs
            .running
            .iter()
            .filter(|(c, t)| {
                !t.committing && {
                    let live = self.live.get(&t.target);
                    let gone = state.servers().get(&t.target).is_none_or(|r| {
                        self.state_of(r, now) == crate::registry::ServerState::Down
                    });
                    let forgotten = now.duration_since(t.handed_out) > LOST_AFTER
                        && live.is_none_or(|l| !l.repairing.contains(c));
                    gone || forgotten
                }
            })
            .map(|(c, _)| *c)
            .collect();
        for c in lost {
            let t = self.repairs.running.remove(&c).expect("listed");
            tracing::warn!(
                chunk = c,
                target = t.target,
                "repair lost; scheduling it again"
            );
            self.repairs.failed += 1;
            if let Some(q) = self.repairs.outbox.get_mut(&t.target) {
                q.retain(|x| x.chunk_id != c);
            }
        }
        let mut pass = std::mem::take(&mut self.repairs.scan);
        let (inodes, next) = state.inodes_after(pass.cursor, SCAN_BUDGET);
        let mut wanted = Vec::new();
        let mut wanted_groups = Vec::new();
        for (policy, c) in chunks_of(&inodes) {
            if !c.sealed || c.length == 0 {
                continue;
            }
            // A group member is not a copy of another member: a group short of members is
            // rebuilt by decoding, one member per task.
            let (is_short, good_count) = match c.ec {
                Some(g) => {
                    let member_length = c.stored_length();
                    let good = c
                        .servers
                        .iter()
                        .filter(|s| self.holds(state.servers().get(s), c.id, member_length, now))
                        .count();
                    let width = usize::from(g.k) + usize::from(g.m);
                    (good < width, good.saturating_sub(usize::from(g.k) - 1))
                }
                None => {
                    let good = self.good_copies(state, c.id, c.length, &c.servers, now);
                    (good.len() < usize::from(policy.replicas), good.len())
                }
            };
            if !is_short {
                continue;
            }
            let since = *pass
                .short
                .get(&c.id)
                .or_else(|| self.repairs.short_since.get(&c.id))
                .unwrap_or(&now);
            pass.short.insert(c.id, since);
            if now.duration_since(since) < self.opts.repair_after {
                continue;
            }
            pass.under += 1;
            pass.under_bytes += c.length;
            // `good_count` is 0 when nothing can be read back: no copy, or fewer than K
            // members.
            if good_count == 0 {
                pass.lost += 1;
                if self.repairs.lost_logged.insert(c.id) {
                    self.log_lost(state, &c, now);
                }
                continue;
            }
            if self.repairs.running.contains_key(&c.id) {
                continue;
            }
            match c.ec {
                Some(g) => wanted_groups.push((
                    c.id,
                    c.version,
                    c.length,
                    c.stored_length(),
                    g,
                    c.servers.clone(),
                )),
                None => {
                    let good = self.good_copies(state, c.id, c.length, &c.servers, now);
                    wanted.push((c.id, c.version, c.length, c.servers.clone(), good));
                }
            }
        }
        pass.cursor = next;
        if next.is_none() {
            // A whole pass: what it found is the state of things.
            let short = std::mem::take(&mut pass.short);
            self.repairs.stuck.retain(|c| short.contains_key(c));
            self.repairs.lost_logged.retain(|c| short.contains_key(c));
            self.repairs.short_since = short;
            self.repairs.under_replicated = pass.under;
            self.repairs.under_replicated_bytes = pass.under_bytes;
            self.repairs.lost = pass.lost;
            pass = Pass::default();
        }
        self.repairs.scan = pass;

        let mut per_target: HashMap<ServerId, usize> = HashMap::new();
        for t in self.repairs.running.values() {
            *per_target.entry(t.target).or_default() += 1;
        }
        for (chunk_id, version, length, servers, mut good) in wanted {
            if self.repairs.running.len() >= TOTAL {
                break;
            }
            // No other server can take a copy: one of the chunk's own servers whose copy is
            // not good (its scrubber found it bad) and that is up replaces it in place.
            let in_place = || {
                servers.iter().copied().find(|s| {
                    !good.contains(s)
                        && self
                            .live
                            .get(s)
                            .is_some_and(|l| l.corrupt.contains(&chunk_id))
                        && self.is_up(state, *s, now)
                })
            };
            let Some(target) = self
                .place_copy(state.servers(), &servers, &good, now)
                .or_else(in_place)
            else {
                self.note_stuck(chunk_id, &servers);
                continue;
            };
            self.repairs.stuck.remove(&chunk_id);
            let n = per_target.entry(target).or_default();
            if *n >= PER_TARGET {
                continue;
            }
            *n += 1;
            // Up sources first, then the least loaded.
            good.sort_by_key(|s| {
                let l = self.live.get(s);
                (!self.is_up(state, *s, now), l.map_or(u32::MAX, |l| l.load))
            });
            let sources = good.iter().filter_map(|s| self.addr(state, *s)).collect();
            tracing::info!(chunk = chunk_id, target, ?good, "repair handed out");
            self.hand_out(
                chunk_id,
                target,
                length,
                length,
                None,
                now,
                pb::RepairTask {
                    chunk_id,
                    version,
                    length,
                    sources,
                    ..Default::default()
                },
            );
        }
        for (chunk_id, version, length, member_length, g, servers) in wanted_groups {
            if self.repairs.running.len() >= TOTAL {
                break;
            }
            let good: Vec<bool> = servers
                .iter()
                .map(|s| self.holds(state.servers().get(s), chunk_id, member_length, now))
                .collect();
            let Some(index) = good.iter().position(|g| !g) else {
                continue;
            };
            let from = servers[index];
            // Another server than every member's; else the member's own server in place
            // when it is up (its copy is bad, or it lost it).
            let target = self
                .place_copy(state.servers(), &servers, &[], now)
                .or_else(|| self.is_up(state, from, now).then_some(from));
            let Some(target) = target else {
                self.note_stuck(chunk_id, &servers);
                continue;
            };
            self.repairs.stuck.remove(&chunk_id);
            let n = per_target.entry(target).or_default();
            if *n >= PER_TARGET {
                continue;
            }
            *n += 1;
            let members = servers
                .iter()
                .zip(&good)
                .map(|(s, ok)| match ok {
                    true => self.addr(state, *s).unwrap_or_default(),
                    false => pb::ServerAddr::default(),
                })
                .collect();
            tracing::info!(
                chunk = chunk_id,
                target,
                member = index,
                from,
                "member rebuild handed out"
            );
            let member = MemberMove {
                index: index as u8,
                from,
            };
            self.hand_out(
                chunk_id,
                target,
                member_length,
                length,
                Some(member),
                now,
                pb::RepairTask {
                    chunk_id,
                    version,
                    length: member_length,
                    sources: Vec::new(),
                    ec_data: u32::from(g.k),
                    ec_parity: u32::from(g.m),
                    ec_cell: g.cell,
                    member: index as u32,
                    members,
                    convert_from: 0,
                    compress_block: 0,
                    caps: Vec::new(),
                },
            );
        }
    }

    fn is_up(&self, state: &impl StateView, server: ServerId, now: Instant) -> bool {
        state
            .servers()
            .get(&server)
            .is_some_and(|r| self.state_of(r, now) == ServerState::Up)
    }

    fn addr(&self, state: &impl StateView, server: ServerId) -> Option<pb::ServerAddr> {
        state.servers().get(&server).map(|r| pb::ServerAddr {
            id: server,
            addr: r.addr.clone(),
        })
    }

    /// Says, once, which chunk nothing can be read back of and what each of its locations
    /// last reported of it: an operator's only lead to the copies.
    fn log_lost(&self, state: &impl StateView, c: &crate::state::Chunk, now: Instant) {
        let copies: Vec<String> = c
            .servers
            .iter()
            .map(|s| {
                let Some(rec) = state.servers().get(s) else {
                    return format!("{s}: not registered");
                };
                let seen = self.live.get(s).and_then(|l| l.reported.as_ref()).map_or(
                    "no report".to_owned(),
                    |r| match r.get(&c.id) {
                        Some(rc) => format!("reports {} bytes", rc.length),
                        None => "does not report it".to_owned(),
                    },
                );
                format!("{s} ({:?}): {seen}", self.state_of(rec, now))
            })
            .collect();
        tracing::error!(
            chunk = c.id,
            length = c.length,
            version = c.version,
            ?copies,
            "chunk lost: no location holds a readable copy"
        );
    }

    fn note_stuck(&mut self, chunk_id: ChunkId, servers: &[ServerId]) {
        if self.repairs.stuck.insert(chunk_id) {
            tracing::warn!(
                chunk = chunk_id,
                ?servers,
                "chunk short of copies and no server can take one"
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn hand_out(
        &mut self,
        chunk_id: ChunkId,
        target: ServerId,
        length: u64,
        chunk_length: u64,
        member: Option<MemberMove>,
        now: Instant,
        task: pb::RepairTask,
    ) {
        self.repairs.running.insert(
            chunk_id,
            Task {
                target,
                length,
                chunk_length,
                member,
                convert: None,
                handed_out: now,
                committing: false,
            },
        );
        self.repairs.outbox.entry(target).or_default().push(task);
    }
}
