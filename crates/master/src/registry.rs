//! The leader's live view of the chunkservers: heartbeats, loads and reported chunks.
//!
//! None of this is replicated. A new leader starts empty, asks every server for a full chunk
//! report on its first heartbeat, and counts a server as down until it has heard from it.

use crate::state::{ChunkId, ServerId, ServerRecord, State};
use cairn_rpc::{ErrorKind, MetaError};
use rand::Rng;
use std::collections::{BTreeMap, HashMap, HashSet};
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
}

impl Default for RegistryOptions {
    fn default() -> Self {
        Self {
            suspect_after: Duration::from_secs(5),
            down_after: Duration::from_secs(15),
            orphan_grace: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    Up,
    Suspect,
    Down,
    Draining,
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
    pub reported: Option<HashSet<ChunkId>>,
    /// Chunks it holds that no file owns, and since when.
    orphans: HashMap<ChunkId, Instant>,
}

#[derive(Default)]
pub struct Registry {
    pub opts: RegistryOptions,
    pub live: BTreeMap<ServerId, Live>,
}

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
    pub chunks: Vec<ChunkId>,
    pub deleted: Vec<ChunkId>,
}

pub struct HeartbeatAnswer {
    pub send_full_report: bool,
    pub delete: Vec<ChunkId>,
}

impl Registry {
    pub fn new(opts: RegistryOptions) -> Self {
        Self {
            opts,
            live: BTreeMap::new(),
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
    pub fn heartbeat(&mut self, hb: Heartbeat, state: &State, now: Instant) -> HeartbeatAnswer {
        let live = self.live.entry(hb.server_id).or_insert_with(|| Live {
            last: now,
            capacity: 0,
            used: 0,
            chunk_count: 0,
            load: 0,
            healthy: true,
            pid: 0,
            reported: None,
            orphans: HashMap::new(),
        });
        live.last = now;
        live.capacity = hb.capacity;
        live.used = hb.used;
        live.chunk_count = hb.chunk_count;
        live.load = hb.load;
        live.healthy = hb.healthy;
        live.pid = hb.pid;
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
            };
        }
        // Reconcile: a chunk no file owns becomes an orphan; after the grace period it is
        // deleted. The grace covers a chunk whose file is being created right now.
        let reported = live.reported.as_ref().expect("set above");
        live.orphans
            .retain(|c, _| reported.contains(c) && !state.owns_chunk(*c));
        for &c in reported {
            if !state.owns_chunk(c) {
                live.orphans.entry(c).or_insert(now);
            }
        }
        // Chunk ids are never reused: an id below the next one to be allocated that no file
        // owns was deleted or trimmed, and goes now. A higher id (allocated by a log entry this
        // master has not applied yet) waits out the grace period.
        let grace = self.opts.orphan_grace;
        let next = state.next_chunk_id();
        let delete = live
            .orphans
            .iter()
            .filter(|(c, since)| **c < next || now.duration_since(**since) >= grace)
            .map(|(c, _)| *c)
            .collect();
        HeartbeatAnswer {
            send_full_report: false,
            delete,
        }
    }

    /// Chunks waiting to be deleted on some server.
    pub fn pending_deletes(&self) -> u64 {
        self.live.values().map(|l| l.orphans.len() as u64).sum()
    }

    /// Replicas the namespace places on a server whose full report lacks them. Chunks never
    /// written (length 0, unsealed) are not counted: they are created by their first append.
    pub fn missing_replicas(&self, state: &State) -> u64 {
        let mut n = 0;
        for c in state.chunks() {
            if c.length == 0 && !c.sealed {
                continue;
            }
            for s in &c.servers {
                if let Some(Some(r)) = self.live.get(s).map(|l| l.reported.as_ref())
                    && !r.contains(&c.id)
                {
                    n += 1;
                }
            }
        }
        n
    }

    /// Chooses the servers of `count` new chunks with `replicas` copies each: distinct
    /// servers, distinct racks (then hosts) while there are enough, at random weighted by free
    /// space and divided by load.
    ///
    /// # Errors
    /// Fewer than `replicas` servers are up.
    pub fn place(
        &self,
        servers: &BTreeMap<ServerId, ServerRecord>,
        replicas: usize,
        count: usize,
        now: Instant,
    ) -> Result<Vec<Vec<ServerId>>, MetaError> {
        let candidates: Vec<(&ServerRecord, f64)> = servers
            .values()
            .filter(|r| self.state_of(r, now) == ServerState::Up)
            .map(|r| {
                let l = &self.live[&r.id];
                let free = l.capacity.saturating_sub(l.used).max(1 << 20) as f64;
                (r, free / (1.0 + f64::from(l.load)))
            })
            .collect();
        if candidates.len() < replicas {
            return Err(MetaError::new(
                ErrorKind::NoServers,
                format!(
                    "need {replicas} chunkservers up for a new chunk, {} are",
                    candidates.len()
                ),
            ));
        }
        let mut rng = rand::rng();
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            let mut chosen: Vec<&ServerRecord> = Vec::with_capacity(replicas);
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
            out.push(chosen.iter().map(|s| s.id).collect());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            chunks,
            deleted,
        }
    }

    fn beat(r: &mut Registry, id: u64, used: u64, now: Instant) {
        r.heartbeat(
            Heartbeat {
                used,
                ..hb(id, true, vec![], vec![])
            },
            &State::default(),
            now,
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
        for p in reg.place(&servers, 3, 200, now).unwrap() {
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
        for p in reg.place(&servers, 3, 50, later).unwrap() {
            assert!(!p.contains(&5));
            let mut d = p.clone();
            d.sort();
            d.dedup();
            assert_eq!(d.len(), 3);
        }
        let e = reg.place(&servers, 5, 1, later).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NoServers);
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
            .place(&servers, 1, 3000, now)
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
        let mut st = State::default();
        let f = st
            .apply(&crate::state::Command::Create {
                path: "/f".into(),
                policy: crate::state::Policy {
                    replicas: 1,
                    compression: false,
                },
                parents: false,
                now_ms: 0,
                lease: None,
                placements: vec![vec![7], vec![7]],
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
}
