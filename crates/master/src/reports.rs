//! What clients report about the chunkservers (seeds/004 §6.2): each busy client sends its
//! blacklists every couple of seconds; the leader stops placing new chunks on a server that
//! at least half of the reporting clients list. Leader memory only: a new leader starts
//! empty and learns again within one report interval.
//!
//! Votes belong to authenticated principals, not to the client ids callers make up: a user
//! has one vote however many clients (or invented ids) it reports from; a process holding the
//! cluster secret has one per client id (servers are trusted with everything anyway). The
//! map is bounded ([`MAX_VOTERS`]) and a report lists only servers the cluster has.

use crate::state::ServerId;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// A client's report counts for this long.
pub const REPORT_TTL: Duration = Duration::from_secs(10);

/// Servers are avoided when listed by at least this fraction of the reporting clients.
pub const AVOID_FRACTION: f64 = 0.5;

/// Voters remembered at most; a new one beyond them is refused until reports expire.
pub const MAX_VOTERS: usize = 10_000;

/// Who a report's vote belongs to: the authenticated user, or a trusted process's client.
pub fn voter(who: &cairn_rpc::auth::Principal, client_id: &str) -> String {
    use cairn_rpc::auth::Principal;
    let name = crate::audit::principal_name(who);
    match who {
        Principal::User { .. } | Principal::Service(_) => name,
        Principal::Server(_) | Principal::Open => format!("{name}/{client_id}"),
    }
}

#[derive(Default)]
pub struct Reports {
    by_client: HashMap<String, (Instant, Vec<ServerId>)>,
}

/// [`MAX_VOTERS`] have reports that count now.
#[derive(Debug)]
pub struct TooManyVoters;

impl Reports {
    /// Records a voter's report: the servers on its blacklists (replacing its last report).
    pub fn record(
        &mut self,
        voter: String,
        listed: Vec<ServerId>,
        now: Instant,
    ) -> Result<(), TooManyVoters> {
        if !self.by_client.contains_key(&voter) && self.by_client.len() >= MAX_VOTERS {
            self.by_client
                .retain(|_, (t, _)| now.saturating_duration_since(*t) < REPORT_TTL);
            if self.by_client.len() >= MAX_VOTERS {
                return Err(TooManyVoters);
            }
        }
        self.by_client.insert(voter, (now, listed));
        self.by_client
            .retain(|_, (t, _)| now.saturating_duration_since(*t) < REPORT_TTL);
        Ok(())
    }

    fn fresh(&self, now: Instant) -> impl Iterator<Item = &Vec<ServerId>> {
        self.by_client
            .values()
            .filter(move |(t, _)| now.saturating_duration_since(*t) < REPORT_TTL)
            .map(|(_, l)| l)
    }

    /// Clients with a report in the last [`REPORT_TTL`].
    pub fn active(&self, now: Instant) -> usize {
        self.fresh(now).count()
    }

    /// How many clients list each server.
    pub fn reporters(&self, now: Instant) -> BTreeMap<ServerId, u32> {
        let mut m = BTreeMap::new();
        for l in self.fresh(now) {
            for &s in l {
                *m.entry(s).or_insert(0) += 1;
            }
        }
        m
    }

    /// The servers new chunks avoid: listed by at least [`AVOID_FRACTION`] of the reporting
    /// clients, the most reported first, at most a third of the `servers` registered (so
    /// placement keeps room; it also falls back to every up server when too few remain).
    pub fn avoided(&self, servers: usize, now: Instant) -> BTreeSet<ServerId> {
        let need = ((self.active(now) as f64 * AVOID_FRACTION).ceil() as u32).max(1);
        let mut v: Vec<(u32, ServerId)> = self
            .reporters(now)
            .into_iter()
            .filter(|&(_, n)| n >= need)
            .map(|(s, n)| (n, s))
            .collect();
        v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        v.into_iter().take(servers / 3).map(|(_, s)| s).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_many_clients_report_is_avoided() {
        let mut r = Reports::default();
        let now = Instant::now();
        r.record("a".into(), vec![3], now).unwrap();
        r.record("b".into(), vec![3, 4], now).unwrap();
        r.record("c".into(), vec![], now).unwrap();
        r.record("d".into(), vec![], now).unwrap();
        // 4 reporting clients: 2 are needed. 3 has two, 4 one.
        assert_eq!(r.avoided(9, now), BTreeSet::from([3]));
        assert_eq!(r.reporters(now)[&4], 1);
        // Never more than a third of the servers.
        assert!(r.avoided(2, now).is_empty());
    }

    #[test]
    fn reports_expire_and_are_replaced() {
        let mut r = Reports::default();
        let now = Instant::now();
        r.record("a".into(), vec![3], now).unwrap();
        assert_eq!(r.avoided(3, now), BTreeSet::from([3]));
        r.record("a".into(), vec![], now).unwrap();
        assert!(r.avoided(3, now).is_empty());
        r.record("a".into(), vec![3], now).unwrap();
        assert!(r.avoided(3, now + REPORT_TTL).is_empty());
        assert_eq!(r.active(now + REPORT_TTL), 0);
    }

    #[test]
    fn one_user_is_one_vote_and_the_voters_are_bounded() {
        use cairn_rpc::auth::Principal;
        let mut r = Reports::default();
        let now = Instant::now();
        let mallory = Principal::User {
            name: "mallory".into(),
            admin: false,
        };
        for i in 0..50 {
            r.record(voter(&mallory, &format!("made-up-{i}")), vec![3], now)
                .unwrap();
        }
        for name in ["a", "b", "c"] {
            let u = Principal::User {
                name: name.into(),
                admin: false,
            };
            r.record(voter(&u, "x"), vec![], now).unwrap();
        }
        assert_eq!(r.active(now), 4);
        assert!(
            r.avoided(9, now).is_empty(),
            "50 made-up ids outvoted 3 users"
        );
        // Processes with the cluster secret vote per client.
        let gw = Principal::Server("s3".into());
        assert_ne!(voter(&gw, "1"), voter(&gw, "2"));
        // Bounded: a new voter beyond the bound is refused while the others are fresh, and
        // taken once they expire.
        for i in r.active(now)..MAX_VOTERS {
            r.record(format!("v{i}"), vec![], now).unwrap();
        }
        assert!(r.record("one more".into(), vec![], now).is_err());
        r.record("user:a".into(), vec![], now).unwrap(); // a known voter still reports
        assert!(
            r.record("one more".into(), vec![], now + REPORT_TTL)
                .is_ok()
        );
    }
}
