//! What clients report about the chunkservers (seeds/004 §6.2): each busy client sends its
//! blacklists every couple of seconds; the leader stops placing new chunks on a server that
//! at least half of the reporting clients list. Leader memory only: a new leader starts
//! empty and learns again within one report interval.

use crate::state::ServerId;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// A client's report counts for this long.
pub const REPORT_TTL: Duration = Duration::from_secs(10);

/// Servers are avoided when listed by at least this fraction of the reporting clients.
pub const AVOID_FRACTION: f64 = 0.5;

#[derive(Default)]
pub struct Reports {
    by_client: HashMap<String, (Instant, Vec<ServerId>)>,
}

impl Reports {
    /// Records a client's report: the servers on its blacklists (replacing its last report).
    pub fn record(&mut self, client: String, listed: Vec<ServerId>, now: Instant) {
        self.by_client.insert(client, (now, listed));
        self.by_client
            .retain(|_, (t, _)| now.saturating_duration_since(*t) < REPORT_TTL);
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
        r.record("a".into(), vec![3], now);
        r.record("b".into(), vec![3, 4], now);
        r.record("c".into(), vec![], now);
        r.record("d".into(), vec![], now);
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
        r.record("a".into(), vec![3], now);
        assert_eq!(r.avoided(3, now), BTreeSet::from([3]));
        r.record("a".into(), vec![], now);
        assert!(r.avoided(3, now).is_empty());
        r.record("a".into(), vec![3], now);
        assert!(r.avoided(3, now + REPORT_TTL).is_empty());
        assert_eq!(r.active(now + REPORT_TTL), 0);
    }
}
