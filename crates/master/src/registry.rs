//! The leader's live view of the chunkservers: heartbeats, loads and reported chunks.
//!
//! None of this is replicated. A new leader starts empty, asks every server for a full chunk
//! report on its first heartbeat, and counts a server as down until it has heard from it.

use crate::repair::Repairs;
use crate::state::{ChunkId, ServerId, ServerRecord};
use crate::view::StateView;
use cairn_rpc::{ErrorKind, MetaError, pb};
use rand::Rng;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

/// Timing of the registry.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// No heartbeat for this long: suspect (not given new chunks).
    pub suspect_after: Duration,
    /// No heartbeat for this long: down.
    pub down_after: Duration,
    /// A reported chunk that no file owns is deleted after this long.
    pub orphan_grace: Duration,
    /// A sealed chunk short of copies for this long is repaired (reports lag a heartbeat).
    pub repair_after: Duration,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        Self {
            suspect_after: Duration::from_secs(5),
            down_after: Duration::from_secs(15),
            orphan_grace: Duration::from_secs(60),
            repair_after: Duration::from_secs(3),
        }
    }
}

/// A chunk as a server reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    pub length: u64,
    pub sealed: bool,
}

/// A repair a server finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairResult {
    pub chunk_id: ChunkId,
    pub ok: bool,
    pub length: u64,
    /// A compressing conversion's LZ4 stream length.
    pub stream_length: u64,
    pub error: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    Up,
    Suspect,
    Down,
    Draining,
}

/// Free space a server keeps out of new placements: 64 MiB, or a sixteenth of a smaller
/// server. A server under it takes no new chunks or copies (its open chunks may still fill it).
pub fn reserve(capacity: u64) -> u64 {
    (capacity / 16).min(64 << 20)
}

impl Live {
    /// Below its reserve of free space (a server that has not said its capacity is not).
    pub fn full(&self) -> bool {
        self.capacity > 0 && self.capacity.saturating_sub(self.used) < reserve(self.capacity)
    }
}

impl ServerState {
    pub fn name(self) -> &'static str {
        match self {
            ServerState::Up => "up",
            ServerState::Suspect => "suspect",
            ServerState::Down => "down",
            ServerState::Draining => "draining",
        }
    }
}

/// A chunkserver's scrub pass, as its last heartbeat told it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScrubPass {
    /// Bytes read of `total` the pass set out to read.
    pub done: u64,
    pub total: u64,
    /// When it must end, ms since the Unix epoch.
    pub due_ms: u64,
    /// Its rate now, bytes/s.
    pub rate: u64,
    /// It needs more than the background bandwidth to end in time.
    pub behind: bool,
}

/// What the last heartbeat said.
#[derive(Debug, Clone)]
pub struct Live {
    pub last: Instant,
    pub capacity: u64,
    pub used: u64,
    pub chunk_count: u64,
    pub load: u32,
    pub healthy: bool,
    pub pid: u32,
    /// The chunks the server holds, once it sent a full report.
    pub reported: Option<HashMap<ChunkId, Reported>>,
    /// The answer to one of its heartbeats carried the capability keys: it can check the
    /// capabilities of requests, so new chunks may be placed on it (a server without keys
    /// would refuse every write to them).
    pub has_keys: bool,
    /// Repairs it said it is running, at its last heartbeat.
    pub repairing: HashSet<ChunkId>,
    /// Chunks it holds that no file owns, and since when.
    orphans: HashMap<ChunkId, Instant>,
    /// Copies its scrubber found bad: not good copies.
    pub corrupt: HashSet<ChunkId>,
    /// Its scrubber's bytes, passes and findings since it started.
    pub scrub: [u64; 3],
    pub scrub_pass: ScrubPass,
    /// Background traffic: conversion user, network, device bytes; repair network, device.
    pub traffic: [u64; 5],
}

pub struct Registry {
    pub opts: RegistryOptions,
    pub live: BTreeMap<ServerId, Live>,
    pub repairs: Repairs,
    /// Clients' blacklists (crate::reports).
    pub reports: crate::reports::Reports,
    /// The Raft term the servers' views and the repairs belong to (see [`Registry::lead`]).
    term: u64,
    /// The state holds everything committed before this leader's term (its first entry is
    /// applied): until then an orphan may be a chunk an entry not applied yet gives a
    /// location, and none is deleted.
    pub settled: bool,
    /// When a delete was last written ([`Registry::freed`]).
    freed_at: Option<Instant>,
}

/// How long after a delete a full cluster answers `Reclaiming` (retried) rather than
/// `NoSpace`: a few heartbeats of the slowest default (1 s), and the S3 trash's grace.
pub const RECLAIM_WINDOW: Duration = Duration::from_secs(10);

/// One heartbeat, already validated.
pub struct Heartbeat {
    pub server_id: ServerId,
    pub capacity: u64,
    pub used: u64,
    pub chunk_count: u64,
    pub load: u32,
    pub healthy: bool,
    pub pid: u32,
    pub full_report: bool,
    pub chunks: Vec<(ChunkId, Reported)>,
    pub deleted: Vec<ChunkId>,
    pub repaired: Vec<RepairResult>,
    pub repairing: Vec<ChunkId>,
    /// Copies its scrubber found bad.
    pub corrupt: Vec<ChunkId>,
    /// Its scrubber's bytes, passes and findings since it started.
    pub scrub: [u64; 3],
    /// Its scrubber's pass now.
    pub scrub_pass: ScrubPass,
    /// As in [`Heartbeat::traffic`].
    pub traffic: [u64; 5],
}

pub struct HeartbeatAnswer {
    pub send_full_report: bool,
    pub delete: Vec<ChunkId>,
    /// Repairs for the server to start.
    pub repairs: Vec<pb::RepairTask>,
    pub repair_bytes_per_sec: u64,
    pub background_bytes_per_sec: u64,
    /// Finished repairs to record in the replicated state.
    pub finished: Vec<crate::state::Command>,
}

impl Registry {
    pub fn new(opts: RegistryOptions) -> Self {
        Self {
            opts,
            live: BTreeMap::new(),
            repairs: Repairs::default(),
            reports: Default::default(),
            term: 0,
            settled: true,
            freed_at: None,
        }
    }

    /// Called whenever this master acts as the leader of `term`. A term it did not lead
    /// before starts from nothing, as on a new leader: what the servers reported in an
    /// earlier term of its own is stale, for since then they reported their changes to
    /// another leader (each heartbeat carries only the changes since the last one answered),
    /// and the repairs it handed out are another leader's business. Each server is asked for
    /// a full report again.
    pub fn lead(&mut self, term: u64) {
        if term != self.term {
            self.live.clear();
            self.repairs = Repairs::default();
            self.term = term;
        }
    }

    /// Whether `server` holds a good copy of a chunk of `length` bytes: it is up (or only
    /// suspect) and not draining, and its report (if it sent one) has at least those bytes.
    pub fn holds(
        &self,
        rec: Option<&ServerRecord>,
        chunk: ChunkId,
        length: u64,
        now: Instant,
    ) -> bool {
        let Some(rec) = rec else { return false };
        if !matches!(
            self.state_of(rec, now),
            ServerState::Up | ServerState::Suspect
        ) {
            return false;
        }
        if self
            .live
            .get(&rec.id)
            .is_some_and(|l| l.corrupt.contains(&chunk))
        {
            return false; // its scrubber found the copy bad
        }
        match self.live.get(&rec.id).and_then(|l| l.reported.as_ref()) {
            Some(r) => r.get(&chunk).is_some_and(|c| c.length >= length),
            None => true,
        }
    }

    pub fn state_of(&self, rec: &ServerRecord, now: Instant) -> ServerState {
        if rec.draining {
            return ServerState::Draining;
        }
        match self.live.get(&rec.id) {
            None => ServerState::Down,
            Some(l) => {
                let age = now.duration_since(l.last);
                if age >= self.opts.down_after {
                    ServerState::Down
                } else if age >= self.opts.suspect_after || !l.healthy {
                    ServerState::Suspect
                } else {
                    ServerState::Up
                }
            }
        }
    }

    /// Records a heartbeat and reconciles the server's chunks with the namespace.
    pub fn heartbeat(
        &mut self,
        hb: Heartbeat,
        state: &impl StateView,
        now: Instant,
    ) -> HeartbeatAnswer {
        let live = self.live.entry(hb.server_id).or_insert_with(|| Live {
            last: now,
            capacity: 0,
            used: 0,
            chunk_count: 0,
            load: 0,
            healthy: true,
            pid: 0,
            reported: None,
            has_keys: false,
            repairing: HashSet::new(),
            orphans: HashMap::new(),
            corrupt: HashSet::new(),
            scrub: [0; 3],
            scrub_pass: ScrubPass::default(),
            traffic: [0; 5],
        });
        live.last = now;
        // The reply to this heartbeat carries every key the state has.
        live.has_keys = !state.cap_keys().is_empty();
        live.corrupt = hb.corrupt.iter().copied().collect();
        live.scrub = hb.scrub;
        live.scrub_pass = hb.scrub_pass;
        live.traffic = hb.traffic;
        live.capacity = hb.capacity;
        live.used = hb.used;
        live.chunk_count = hb.chunk_count;
        live.load = hb.load;
        live.healthy = hb.healthy;
        live.pid = hb.pid;
        live.repairing = hb.repairing.iter().copied().collect();
        let server = hb.server_id;
        let finished: Vec<_> = self
            .repairs
            .results(server, &hb.repaired)
            .into_iter()
            .map(|f| match f.convert {
                true => crate::conversion::end(f.chunk, true, f.stream),
                false => self.repaired(state, f.chunk, f.chunk_length, server, f.member, now),
            })
            .collect();
        self.repairs.adopt(server, &hb.repairing, state, now);
        let live = self.live.get_mut(&server).expect("inserted above");
        if hb.full_report {
            live.reported = Some(hb.chunks.iter().copied().collect());
        } else if let Some(r) = &mut live.reported {
            r.extend(hb.chunks.iter().copied());
            for d in &hb.deleted {
                r.remove(d);
                live.orphans.remove(d);
            }
        } else {
            return HeartbeatAnswer {
                send_full_report: true,
                delete: Vec::new(),
                repairs: Vec::new(),
                repair_bytes_per_sec: 0,
                background_bytes_per_sec: state.config().background_bytes_per_sec,
                finished,
            };
        }
        // Reconcile: a chunk no file owns, or whose file no longer lists this server (a
        // replica a writer gave up on, a copy a repair replaced), becomes an orphan; after the
        // grace period it is deleted. The grace covers a chunk whose file is being created
        // right now. A chunk this server is being repaired onto is not an orphan.
        let repairs = &self.repairs;
        let unwanted = |c: ChunkId| {
            let listed = state
                .chunk(c)
                .is_some_and(|(_, chunk)| chunk.servers.contains(&server));
            // A chunk of a partition this view lacks is not known to be unwanted.
            state.knows(c)
                && !listed
                && !live.repairing.contains(&c)
                && !repairs.targets(c, server)
                && !state.converting_on(c, server)
        };
        let reported = live.reported.as_ref().expect("set above");
        live.orphans
            .retain(|c, _| reported.contains_key(c) && unwanted(*c));
        for &c in reported.keys() {
            if unwanted(c) {
                live.orphans.entry(c).or_insert(now);
            }
        }
        // Chunk ids are never reused: an id below the next one to be allocated that no file
        // owns was deleted or trimmed, and goes now. A higher id (allocated by a log entry this
        // master has not applied yet) waits out the grace period.
        let grace = self.opts.orphan_grace;
        let settled = self.settled;
        let delete = live
            .orphans
            .iter()
            .filter(|(c, since)| {
                settled && (**c < state.next_chunk_of(**c) || now.duration_since(**since) >= grace)
            })
            .map(|(c, _)| *c)
            .collect();
        let repairs = self.repairs.take_tasks(server);
        HeartbeatAnswer {
            send_full_report: false,
            delete,
            repairs,
            repair_bytes_per_sec: self.repairs.share(state.config().repair_bytes_per_sec),
            background_bytes_per_sec: state.config().background_bytes_per_sec,
            finished,
        }
    }

    /// Notes that space was freed at `now` (a delete was written): see [`Self::reclaiming`].
    pub fn freed(&mut self, now: Instant) {
        self.freed_at = Some(now);
    }

    /// Whether space freed lately may still be on its way back: deleted chunks become
    /// orphans at their servers' next heartbeat, are deleted at the one after, and the free
    /// space shows at the next (a few heartbeats; [`RECLAIM_WINDOW`] covers them).
    pub fn reclaiming(&self, now: Instant) -> bool {
        self.freed_at
            .is_some_and(|t| now.saturating_duration_since(t) < RECLAIM_WINDOW)
    }

    /// Chunks waiting to be deleted on some server.
    pub fn pending_deletes(&self) -> u64 {
        self.live.values().map(|l| l.orphans.len() as u64).sum()
    }

    /// Replicas the namespace places on a server that is down (or has not reported since
    /// this master led) or whose full report lacks them — the copies repair is to replace,
    /// so this is non-zero exactly while repair counts chunks under-replicated for a missing
    /// copy. Empty chunks are not counted: a spare is created by its first append, and a chunk
    /// sealed empty (a spare passed over, a chunk whose first append failed) holds nothing.
    pub fn missing_replicas(&self, state: &impl StateView, now: Instant) -> u64 {
        let mut n = 0;
        for c in state.chunks() {
            if c.length == 0 {
                continue;
            }
            for s in &c.servers {
                let missing = match self.live.get(s) {
                    None => true,
                    Some(l) if now.duration_since(l.last) >= self.opts.down_after => true,
                    Some(l) => l.reported.as_ref().is_some_and(|r| !r.contains_key(&c.id)),
                };
                n += u64::from(missing);
            }
        }
        n
    }

    /// Servers that may take a new copy, with their placement weight (free space divided by
    /// load): up, not draining, not full, not in `exclude`.
    /// Chunkservers up now (full or not).
    pub fn up_count(&self, servers: &BTreeMap<ServerId, ServerRecord>, now: Instant) -> usize {
        servers
            .values()
            .filter(|r| self.state_of(r, now) == ServerState::Up)
            .count()
    }

    fn candidates<'a>(
        &self,
        servers: &'a BTreeMap<ServerId, ServerRecord>,
        exclude: &BTreeSet<ServerId>,
        now: Instant,
    ) -> Vec<(&'a ServerRecord, f64)> {
        servers
            .values()
            .filter(|r| {
                self.state_of(r, now) == ServerState::Up
                    && !exclude.contains(&r.id)
                    && !self.live[&r.id].full()
                    && self.live[&r.id].has_keys
            })
            .map(|r| {
                let l = &self.live[&r.id];
                let free = l.capacity.saturating_sub(l.used).max(1 << 20) as f64;
                (r, free / (1.0 + f64::from(l.load)))
            })
            .collect()
    }

    /// Chooses the servers of `count` new chunks with `replicas` copies each: distinct
    /// servers, distinct racks (then hosts) while there are enough, at random weighted by free
    /// space and divided by load. Servers in `exclude` (a writer just saw them fail) are
    /// avoided while enough others are up. With fewer servers up than `replicas` but at least
    /// `min_copy`, chunks get as many copies as there are servers (repair adds the rest once
    /// the chunk is sealed and servers return).
    ///
    /// # Errors
    /// Fewer than `min_copy` servers are up (`NoServers`), or up but full (`NoSpace`).
    pub fn place(
        &self,
        servers: &BTreeMap<ServerId, ServerRecord>,
        replicas: usize,
        min_copy: usize,
        count: usize,
        exclude: &BTreeSet<ServerId>,
        now: Instant,
    ) -> Result<Vec<Vec<ServerId>>, MetaError> {
        let mut candidates = self.candidates(servers, exclude, now);
        if candidates.len() < replicas && !exclude.is_empty() {
            candidates = self.candidates(servers, &BTreeSet::new(), now);
        }
        if candidates.len() < min_copy.max(1) {
            let full = servers
                .values()
                .filter(|r| self.state_of(r, now) == ServerState::Up && self.live[&r.id].full())
                .count();
            if candidates.len() + full >= min_copy.max(1) {
                return Err(MetaError::new(
                    ErrorKind::NoSpace,
                    format!(
                        "the cluster is full: {full} of the {} chunkservers up have less free \
                         space than their reserve, and a new chunk needs {min_copy} with room; \
                         delete data or add chunkservers (reads go on)",
                        candidates.len() + full
                    ),
                ));
            }
            return Err(MetaError::new(
                ErrorKind::NoServers,
                format!(
                    "need {min_copy} chunkservers up for a new chunk ({replicas} for all its \
                     copies), {} are",
                    candidates.len()
                ),
            ));
        }
        let replicas = replicas.min(candidates.len());
        Ok((0..count)
            .map(|_| Self::choose(&candidates, replicas, &[]))
            .collect())
    }

    /// A server for one more copy of a chunk held by `existing`: up, not one of them, on
    /// another rack (then host) than the good copies where possible.
    pub fn place_copy(
        &self,
        servers: &BTreeMap<ServerId, ServerRecord>,
        existing: &[ServerId],
        good: &[ServerId],
        now: Instant,
    ) -> Option<ServerId> {
        let exclude: BTreeSet<ServerId> = existing.iter().copied().collect();
        let candidates = self.candidates(servers, &exclude, now);
        if candidates.is_empty() {
            return None;
        }
        let chosen: Vec<&ServerRecord> = good.iter().filter_map(|s| servers.get(s)).collect();
        Self::choose(&candidates, chosen.len() + 1, &chosen)
            .last()
            .copied()
    }

    /// Adds servers to `already` until there are `replicas`; returns the new ones' ids after
    /// `already`'s.
    fn choose(
        candidates: &[(&ServerRecord, f64)],
        replicas: usize,
        already: &[&ServerRecord],
    ) -> Vec<ServerId> {
        let mut rng = rand::rng();
        let mut chosen: Vec<&ServerRecord> = already.to_vec();
        {
            while chosen.len() < replicas {
                let fresh = |c: &&(&ServerRecord, f64)| !chosen.iter().any(|s| s.id == c.0.id);
                let new_rack = |c: &&(&ServerRecord, f64)| {
                    c.0.rack.is_empty() || !chosen.iter().any(|s| s.rack == c.0.rack)
                };
                let new_host = |c: &&(&ServerRecord, f64)| {
                    c.0.host.is_empty() || !chosen.iter().any(|s| s.host == c.0.host)
                };
                let mut pool: Vec<_> = candidates
                    .iter()
                    .filter(fresh)
                    .filter(new_rack)
                    .filter(new_host)
                    .collect();
                if pool.is_empty() {
                    pool = candidates.iter().filter(fresh).filter(new_host).collect();
                }
                if pool.is_empty() {
                    pool = candidates.iter().filter(fresh).collect();
                }
                let total: f64 = pool.iter().map(|c| c.1).sum();
                let mut x = rng.random::<f64>() * total;
                let mut pick = pool[pool.len() - 1].0;
                for c in &pool {
                    if x < c.1 {
                        pick = c.0;
                        break;
                    }
                    x -= c.1;
                }
                chosen.push(pick);
            }
        }
        chosen.iter().map(|s| s.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::State;

    fn rec(id: u64, host: &str, rack: &str) -> ServerRecord {
        ServerRecord {
            id,
            addr: format!("127.0.0.1:{id}"),
            host: host.into(),
            rack: rack.into(),
            draining: false,
        }
    }

    fn hb(server_id: u64, full_report: bool, chunks: Vec<u64>, deleted: Vec<u64>) -> Heartbeat {
        Heartbeat {
            server_id,
            capacity: 100 << 30,
            used: 0,
            chunk_count: 0,
            load: 0,
            healthy: true,
            pid: 0,
            full_report,
            chunks: chunks
                .into_iter()
                .map(|c| {
                    (
                        c,
                        Reported {
                            length: 0,
                            sealed: false,
                        },
                    )
                })
                .collect(),
            deleted,
            repaired: vec![],
            corrupt: vec![],
            scrub: [0; 3],
            scrub_pass: ScrubPass::default(),
            traffic: [0; 5],
            repairing: vec![],
        }
    }

    /// A state with a capability key (servers without keys take no new chunks).
    fn keyed() -> State {
        let mut st = State::default();
        st.apply(&crate::state::Command::RotateKey {
            secret: [1; cairn_proto::cap::KEY_BYTES],
            now_ms: 0,
        })
        .unwrap();
        st
    }

    fn beat(r: &mut Registry, id: u64, used: u64, now: Instant) {
        r.heartbeat(
            Heartbeat {
                used,
                ..hb(id, true, vec![], vec![])
            },
            &keyed(),
            now,
        );
    }

    /// `missing_replicas` (status's totals) counts a copy on a server that is down or whose
    /// report lacks it — what repair replaces — not only the latter.
    #[test]
    fn replicas_on_down_servers_are_missing() {
        use crate::state::{ChunkUpdate, Command, Lease, Policy};
        let mut st = keyed();
        let lease = Lease {
            holder: "w".into(),
            expires_ms: u64::MAX,
        };
        st.apply(&Command::Create {
            path: "/f".into(),
            policy: Policy::default(),
            parents: false,
            now_ms: 1,
            lease: Some(lease),
            placements: vec![vec![1, 2, 3]],
            groups: false,
            mode: None,
        })
        .unwrap();
        let chunk = st.chunks().next().expect("allocated").id;
        st.apply(&Command::Commit {
            path: "/f".into(),
            holder: "w".into(),
            now_ms: 2,
            updates: vec![ChunkUpdate {
                chunk_id: chunk,
                length: 10,
                sealed: true,
            }],
            trim: false,
            release: true,
            seal: true,
            lease_until_ms: 0,
            drops: vec![],
            remove: vec![],
        })
        .unwrap();
        let t0 = Instant::now();
        let mut reg = Registry::new(RegistryOptions::default());
        for id in 1..=3 {
            reg.heartbeat(hb(id, true, vec![chunk], vec![]), &st, t0);
        }
        assert_eq!(reg.missing_replicas(&st, t0), 0);
        // Server 3 falls silent past down_after; server 2 reports without the chunk.
        let later = t0 + reg.opts.down_after + Duration::from_secs(1);
        reg.heartbeat(hb(1, true, vec![chunk], vec![]), &st, later);
        reg.heartbeat(hb(2, true, vec![], vec![]), &st, later);
        assert_eq!(reg.missing_replicas(&st, later), 2);
    }

    #[test]
    fn servers_without_keys_take_no_new_chunks() {
        let now = Instant::now();
        let mut reg = Registry::new(RegistryOptions::default());
        let servers: BTreeMap<_, _> = (1..=3).map(|id| (id, rec(id, "", ""))).collect();
        for id in 1..=3 {
            reg.heartbeat(hb(id, true, vec![], vec![]), &State::default(), now);
        }
        let e = reg
            .place(&servers, 3, 2, 1, &BTreeSet::new(), now)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::NoServers);
        for id in 1..=3 {
            beat(&mut reg, id, 0, now);
        }
        assert_eq!(
            reg.place(&servers, 3, 2, 1, &BTreeSet::new(), now).unwrap()[0].len(),
            3
        );
    }

    #[test]
    fn placement_spreads_over_racks_and_skips_down_servers() {
        let now = Instant::now();
        let mut reg = Registry::new(RegistryOptions::default());
        let mut servers = BTreeMap::new();
        for (id, rack) in [(1, "r1"), (2, "r1"), (3, "r2"), (4, "r2"), (5, "r3")] {
            servers.insert(id, rec(id, &format!("h{id}"), rack));
            beat(&mut reg, id, 0, now);
        }
        for p in reg
            .place(&servers, 3, 2, 200, &BTreeSet::new(), now)
            .unwrap()
        {
            let mut racks: Vec<_> = p.iter().map(|id| servers[id].rack.clone()).collect();
            racks.sort();
            racks.dedup();
            assert_eq!(racks.len(), 3, "three copies on three racks: {p:?}");
        }
        // Server 5 (the only one of rack r3) goes silent: copies still land on distinct servers.
        let later = now + Duration::from_secs(20);
        for id in 1..=4 {
            beat(&mut reg, id, 0, later);
        }
        assert_eq!(reg.state_of(&servers[&5], later), ServerState::Down);
        for p in reg
            .place(&servers, 3, 2, 50, &BTreeSet::new(), later)
            .unwrap()
        {
            assert!(!p.contains(&5));
            let mut d = p.clone();
            d.sort();
            d.dedup();
            assert_eq!(d.len(), 3);
        }
        let e = reg
            .place(&servers, 5, 5, 1, &BTreeSet::new(), later)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::NoServers);
        // Fewer servers up than copies, but a MinCopy quorum: as many copies as servers.
        let p = reg
            .place(&servers, 5, 3, 1, &BTreeSet::new(), later)
            .unwrap();
        assert_eq!(p[0].len(), 4);
        // Excluded servers are avoided while enough others are up, used when not.
        let ex = BTreeSet::from([1, 2]);
        for p in reg.place(&servers, 2, 2, 50, &ex, later).unwrap() {
            assert!(!p.contains(&1) && !p.contains(&2), "{p:?}");
        }
        let p = reg.place(&servers, 3, 2, 1, &ex, later).unwrap();
        assert_eq!(p[0].len(), 3);
    }

    #[test]
    fn full_servers_take_no_new_chunks_and_a_full_cluster_says_so() {
        let now = Instant::now();
        let mut reg = Registry::new(RegistryOptions::default());
        let mut servers = BTreeMap::new();
        // 100 GiB each; server 3 has 10 MiB free (under the 64 MiB reserve).
        for id in 1..=3 {
            servers.insert(id, rec(id, "", ""));
            beat(
                &mut reg,
                id,
                if id == 3 { (100 << 30) - (10 << 20) } else { 0 },
                now,
            );
        }
        for p in reg
            .place(&servers, 2, 2, 100, &BTreeSet::new(), now)
            .unwrap()
        {
            assert!(!p.contains(&3), "{p:?}");
        }
        // Three copies wanted, two servers with room: two copies (repair adds the third later).
        assert_eq!(
            reg.place(&servers, 3, 2, 1, &BTreeSet::new(), now).unwrap()[0].len(),
            2
        );
        assert_eq!(reg.place_copy(&servers, &[1, 2], &[1, 2], now), None);
        beat(&mut reg, 2, (100 << 30) - (1 << 20), now);
        let e = reg
            .place(&servers, 3, 2, 1, &BTreeSet::new(), now)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::NoSpace, "{e}");
        assert!(e.message.contains("full"), "{e}");
        // Down servers are not a space problem.
        let later = now + Duration::from_secs(3600);
        let e = reg
            .place(&servers, 3, 2, 1, &BTreeSet::new(), later)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::NoServers, "{e}");
        assert_eq!(reserve(256 << 20), 16 << 20);
        assert_eq!(reserve(8 << 30), 64 << 20);
    }

    #[test]
    fn placement_prefers_free_space() {
        let now = Instant::now();
        let mut reg = Registry::new(RegistryOptions::default());
        let mut servers = BTreeMap::new();
        for id in 1..=4 {
            servers.insert(id, rec(id, "", ""));
            beat(&mut reg, id, if id == 4 { 99 << 30 } else { 0 }, now);
        }
        let n4 = reg
            .place(&servers, 1, 1, 3000, &BTreeSet::new(), now)
            .unwrap()
            .iter()
            .filter(|p| p[0] == 4)
            .count();
        // Server 4 has 1/100 of the others' free space: ~3 of 3000 expected.
        assert!(n4 < 60, "full server chosen {n4} times of 3000");
    }

    #[test]
    fn chunks_of_deleted_files_go_at_once() {
        let now = Instant::now();
        let mut reg = Registry::new(RegistryOptions::default());
        let mut st = keyed();
        let f = st
            .apply(&crate::state::Command::Create {
                path: "/f".into(),
                mode: None,
                policy: crate::state::Policy {
                    replicas: 1,
                    compression: false,
                    min_copy: 0,
                    ec: None,
                },
                parents: false,
                now_ms: 0,
                lease: None,
                placements: vec![vec![7], vec![7]],
                groups: false,
            })
            .unwrap();
        let ids: Vec<u64> = f
            .inode
            .unwrap()
            .file()
            .unwrap()
            .chunks
            .iter()
            .map(|c| c.id)
            .collect();
        let hb = |chunks: Vec<u64>| hb(7, true, chunks, vec![]);
        assert!(reg.heartbeat(hb(ids.clone()), &st, now).delete.is_empty());
        st.apply(&crate::state::Command::Delete { path: "/f".into() })
            .unwrap();
        let mut d = reg.heartbeat(hb(ids.clone()), &st, now).delete;
        d.sort();
        assert_eq!(
            d, ids,
            "deleted file's chunks are named at the next heartbeat"
        );
    }

    #[test]
    fn orphans_are_deleted_after_grace() {
        let now = Instant::now();
        let mut reg = Registry::new(RegistryOptions {
            orphan_grace: Duration::from_secs(10),
            ..Default::default()
        });
        let st = State::default();
        let hb = |full, chunks: Vec<u64>, deleted: Vec<u64>| hb(7, full, chunks, deleted);
        assert!(
            reg.heartbeat(hb(false, vec![], vec![]), &st, now)
                .send_full_report
        );
        assert!(
            reg.heartbeat(hb(true, vec![42], vec![]), &st, now)
                .delete
                .is_empty()
        );
        let a = reg.heartbeat(
            hb(false, vec![], vec![]),
            &st,
            now + Duration::from_secs(11),
        );
        assert_eq!(a.delete, vec![42]);
        let a = reg.heartbeat(
            hb(false, vec![], vec![42]),
            &st,
            now + Duration::from_secs(12),
        );
        assert!(a.delete.is_empty());
        assert_eq!(reg.pending_deletes(), 0);
    }

    /// A master leading a term it did not lead before forgets what the servers reported in
    /// its earlier term: each is asked for a full report, and a chunk created meanwhile (its
    /// report went to another leader) is not taken for missing.
    #[test]
    fn a_new_term_asks_every_server_for_a_full_report() {
        let now = Instant::now();
        let mut reg = Registry::new(RegistryOptions::default());
        let mut st = State::default();
        reg.lead(3);
        assert!(
            reg.heartbeat(hb(1, false, vec![], vec![]), &st, now)
                .send_full_report
        );
        let a = reg.heartbeat(hb(1, true, vec![], vec![]), &st, now);
        assert!(!a.send_full_report);
        // The same term again changes nothing.
        reg.lead(3);
        assert!(
            !reg.heartbeat(hb(1, false, vec![], vec![]), &st, now)
                .send_full_report
        );
        // Term 5 (another master led term 4, and server 1 told it of chunk c).
        let c = open_file_on_1_2_3(&mut st);
        reg.lead(5);
        assert!(reg.live.is_empty());
        assert!(
            reg.heartbeat(hb(1, false, vec![], vec![]), &st, now)
                .send_full_report
        );
        reg.heartbeat(hb(1, true, vec![c], vec![]), &st, now);
        assert!(reg.live[&1].reported.as_ref().unwrap().contains_key(&c));
    }

    /// A leader whose state lacks entries committed before its term deletes no orphan: one
    /// of them may make the chunk a location.
    #[test]
    fn no_orphan_is_deleted_before_the_state_is_settled() {
        let now = Instant::now();
        let mut reg = Registry::new(RegistryOptions::default());
        let mut st = State::default();
        let c = open_file_on_1_2_3(&mut st);
        // Server 9 holds c (say a repair's copy recorded in an entry not applied yet).
        reg.settled = false;
        reg.heartbeat(hb(9, true, vec![c], vec![]), &st, now);
        let a = reg.heartbeat(
            hb(9, false, vec![], vec![]),
            &st,
            now + Duration::from_secs(120),
        );
        assert!(a.delete.is_empty());
        assert_eq!(reg.pending_deletes(), 1);
        reg.settled = true;
        let a = reg.heartbeat(
            hb(9, false, vec![], vec![]),
            &st,
            now + Duration::from_secs(121),
        );
        assert_eq!(a.delete, vec![c]);
    }

    /// Creates /f, written by "w", with one chunk on servers 1, 2, 3; returns the chunk.
    fn open_file_on_1_2_3(st: &mut State) -> ChunkId {
        use crate::state::{Command, Lease, Policy};
        st.apply(&Command::Create {
            path: "/f".into(),
            mode: None,
            policy: Policy {
                replicas: 3,
                compression: false,
                min_copy: 2,
                ec: None,
            },
            parents: false,
            now_ms: 0,
            lease: Some(Lease {
                holder: "w".into(),
                expires_ms: 1_000_000,
            }),
            placements: vec![vec![1, 2, 3]],
            groups: false,
        })
        .unwrap();
        st.chunks().next().unwrap().id
    }

    /// A sealed chunk on [1, 2, 3] whose server 3 goes down is copied to server 4 from a good
    /// copy; the new location replaces 3, and 3's copy is an orphan when it comes back.
    #[test]
    fn a_down_servers_chunks_are_repaired_elsewhere() {
        down_server_repair(false);
    }

    /// The same in a namespace larger than the scan's slice: the file's inode is in the
    /// second slice, so each pass takes two ticks and its findings show when it ends.
    #[test]
    fn the_repair_scan_walks_a_large_namespace_in_slices() {
        down_server_repair(true);
    }

    fn down_server_repair(large: bool) {
        use crate::state::{ChunkUpdate, Command};
        let t0 = Instant::now();
        let mut reg = Registry::new(RegistryOptions {
            repair_after: Duration::from_secs(3),
            ..Default::default()
        });
        let mut st = keyed();
        for id in 1..=4 {
            st.apply(&Command::Register {
                server: rec(id, &format!("h{id}"), ""),
            })
            .unwrap();
        }
        if large {
            for i in 0..crate::repair::SCAN_BUDGET {
                st.apply(&Command::Mkdir {
                    path: format!("/d{i}"),
                    parents: false,
                    now_ms: 0,
                    policy: None,
                    mode: None,
                })
                .unwrap();
            }
        }
        let chunk = open_file_on_1_2_3(&mut st);
        // One tick per slice of the inodes.
        let scan = |reg: &mut Registry, st: &State, now: Instant| {
            for _ in 0..if large { 2 } else { 1 } {
                reg.scan_repairs(st, now);
            }
        };
        st.apply(&Command::Commit {
            path: "/f".into(),
            holder: "w".into(),
            now_ms: 1,
            updates: vec![ChunkUpdate {
                chunk_id: chunk,
                length: 5000,
                sealed: true,
            }],
            trim: false,
            release: true,
            seal: false,
            lease_until_ms: 0,
            drops: vec![],
            remove: Vec::new(),
        })
        .unwrap();
        let full = |id: u64, chunks: &[u64]| Heartbeat {
            chunks: chunks
                .iter()
                .map(|c| {
                    (
                        *c,
                        Reported {
                            length: 5000,
                            sealed: true,
                        },
                    )
                })
                .collect(),
            ..hb(id, true, vec![], vec![])
        };
        for id in 1..=3 {
            reg.heartbeat(full(id, &[chunk]), &st, t0);
        }
        reg.heartbeat(full(4, &[]), &st, t0);
        scan(&mut reg, &st, t0);
        assert_eq!(reg.repairs.under_replicated, 0);

        // 20 s later server 3 is down; the others beat on.
        let t1 = t0 + Duration::from_secs(20);
        for id in [1, 2] {
            reg.heartbeat(full(id, &[chunk]), &st, t1);
        }
        reg.heartbeat(full(4, &[]), &st, t1);
        scan(&mut reg, &st, t1);
        assert!(
            reg.repairs.take_tasks(4).is_empty(),
            "not before repair_after"
        );
        let t2 = t1 + Duration::from_secs(4);
        for id in [1, 2] {
            reg.heartbeat(full(id, &[chunk]), &st, t2);
        }
        if large {
            // Half a pass: the first slice holds no chunk, nothing is counted yet.
            reg.scan_repairs(&st, t2);
            assert_eq!(reg.repairs.under_replicated, 0);
            reg.scan_repairs(&st, t2);
        } else {
            reg.scan_repairs(&st, t2);
        }
        assert_eq!(reg.repairs.under_replicated, 1);
        assert_eq!(reg.repairs.under_replicated_bytes, 5000);
        let a = reg.heartbeat(full(4, &[]), &st, t2);
        assert_eq!(a.repairs.len(), 1);
        let task = &a.repairs[0];
        assert_eq!((task.chunk_id, task.length), (chunk, 5000));
        let mut sources: Vec<u64> = task.sources.iter().map(|s| s.id).collect();
        sources.sort();
        assert_eq!(sources, vec![1, 2]);
        assert!(a.repair_bytes_per_sec > 0);
        scan(&mut reg, &st, t2);
        assert_eq!(reg.repairs.running(), 1, "one task per chunk at a time");

        // The copy shows up in 4's report while it runs: not an orphan.
        let mut busy = full(4, &[chunk]);
        busy.full_report = false;
        busy.repairing = vec![chunk];
        assert!(reg.heartbeat(busy, &st, t2).delete.is_empty());
        // Done: the new location replaces the down one.
        let mut done = hb(4, false, vec![], vec![]);
        done.repaired = vec![RepairResult {
            chunk_id: chunk,
            ok: true,
            length: 5000,
            stream_length: 0,
            error: String::new(),
        }];
        let a = reg.heartbeat(done, &st, t2);
        assert_eq!(
            a.finished,
            vec![Command::Repaired {
                chunk_id: chunk,
                length: 5000,
                server: 4,
                remove: vec![3],
                member: None,
            }]
        );
        st.apply(&a.finished[0]).unwrap();
        reg.repairs.committed(chunk, true, t2);
        assert_eq!(st.chunk(chunk).unwrap().1.servers, vec![1, 2, 4]);
        assert_eq!((reg.repairs.done, reg.repairs.bytes), (1, 5000));
        scan(&mut reg, &st, t2);
        assert_eq!(reg.repairs.under_replicated, 0);
        // Server 3 comes back with its old copy: deleted at once.
        let back = reg.heartbeat(full(3, &[chunk]), &st, t2);
        assert_eq!(back.delete, vec![chunk]);
    }

    /// A replica a writer dropped is no longer a location, and its copy is deleted.
    #[test]
    fn a_dropped_replica_is_an_orphan() {
        use crate::state::Command;
        let now = Instant::now();
        let mut reg = Registry::new(RegistryOptions::default());
        let mut st = keyed();
        let chunk = open_file_on_1_2_3(&mut st);
        assert!(
            reg.heartbeat(hb(3, true, vec![chunk], vec![]), &st, now)
                .delete
                .is_empty()
        );
        st.apply(&Command::Commit {
            path: "/f".into(),
            holder: "w".into(),
            now_ms: 1,
            updates: vec![],
            trim: false,
            release: false,
            seal: false,
            lease_until_ms: 0,
            drops: vec![(chunk, 3)],
            remove: Vec::new(),
        })
        .unwrap();
        assert_eq!(st.chunk(chunk).unwrap().1.servers, vec![1, 2]);
        let a = reg.heartbeat(hb(3, false, vec![], vec![]), &st, now);
        assert_eq!(a.delete, vec![chunk]);
    }
}
