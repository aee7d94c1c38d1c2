//! How one client sees the chunkservers (seeds/000 §3.3; docs/client.md "Backup reads and
//! blacklists"): the latency of each server for each kind and size of request, the two
//! blacklists, and the budget of backup reads.
//!
//! - A server that *failed* (connection refused or lost, a disk error) goes on the
//!   deterministic list at once.
//! - A server that is *slow* — the median of its recent latencies for a kind and size of
//!   request is `r` times the median over all servers with samples of that class — goes on the
//!   non-deterministic list with probability `(r - slow_from) / (slow_certain - slow_from)`,
//!   checked at most every [`EVAL_EVERY`]; certainly at `slow_certain` times the median or when
//!   a request times out.
//! - Every `probe_every` the listed servers whose grace has run out are pinged (with the others
//!   for comparison): a failed server that answers is released; a slow one when its ping is
//!   within `slow_from` of the median ping. A server listed again within [`FLAP_WINDOW`] of its
//!   release stays twice as long each time (up to 16 × `grace`), which stops flapping.
//! - At most `blacklist_cap` of the known servers are listed at once, so that a sick client
//!   cannot talk itself out of the whole cluster.
//!
//! Listed servers are read last and excluded when the writer asks for chunks; the client also
//! reports its lists to the masters, who stop placing new chunks on a server that many clients
//! report.

use crate::data::Error as DataError;
use cairn_proto::frame::Status;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Recent samples kept per server and request class.
const WINDOW: usize = 32;
/// Samples a class needs before its latency counts.
const MIN_SAMPLES: usize = 8;
/// A slow server is considered at most this often.
pub const EVAL_EVERY: Duration = Duration::from_millis(100);
/// Listed again this soon after a release: the grace doubles.
pub const FLAP_WINDOW: Duration = Duration::from_secs(30);

/// Settings of backup reads and blacklisting (part of [`crate::ClientOptions`]).
#[derive(Debug, Clone)]
pub struct HealthOptions {
    /// Send a read to a second replica when the first has not answered after its delay.
    pub backup_reads: bool,
    /// Backup-read tokens earned per read; a backup costs one (0.1: at most one read in ten
    /// is doubled, over time).
    pub backup_ratio: f64,
    /// Tokens the backup-read bucket holds at most (the burst).
    pub backup_burst: f64,
    /// The backup delay is the server's p95 for reads of that size, but at least this.
    pub backup_min_delay: Duration,
    /// The backup delay for a server without enough samples yet.
    pub backup_default_delay: Duration,
    /// A server this many times slower than the median may be blacklisted...
    pub slow_from: f64,
    /// ...and is certainly blacklisted at this many times.
    pub slow_certain: f64,
    /// Largest fraction of the known servers on the blacklists at once.
    pub blacklist_cap: f64,
    /// How often listed servers are probed.
    pub probe_every: Duration,
    /// Shortest time on a list (doubling for servers that flap).
    pub grace: Duration,
    /// How often the lists are reported to the masters.
    pub report_every: Duration,
}

impl Default for HealthOptions {
    fn default() -> Self {
        Self {
            backup_reads: true,
            backup_ratio: 0.1,
            backup_burst: 10.0,
            backup_min_delay: Duration::from_millis(1),
            backup_default_delay: Duration::from_millis(50),
            slow_from: 2.0,
            slow_certain: 5.0,
            blacklist_cap: 1.0 / 3.0,
            probe_every: Duration::from_secs(1),
            grace: Duration::from_secs(2),
            report_every: Duration::from_secs(2),
        }
    }
}

/// The kind of a request, for latency classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
}

/// Latency class: kind × size (≤ 4 KiB, ≤ 64 KiB, ≤ 1 MiB, larger).
fn class(op: Op, bytes: usize) -> usize {
    let size = match bytes {
        0..=4096 => 0,
        4097..=65536 => 1,
        65537..=1048576 => 2,
        _ => 3,
    };
    size + if op == Op::Write { 4 } else { 0 }
}
const CLASSES: usize = 8;
/// Metric labels of the classes.
const CLASS_NAMES: [&str; CLASSES] = [
    "read_4k",
    "read_64k",
    "read_1m",
    "read_large",
    "write_4k",
    "write_64k",
    "write_1m",
    "write_large",
];

/// Which list a server is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ListKind {
    /// The deterministic list: the server failed.
    Failed,
    /// The non-deterministic list: the server is slow.
    Slow,
}

impl ListKind {
    pub fn name(self) -> &'static str {
        match self {
            ListKind::Failed => "failed",
            ListKind::Slow => "slow",
        }
    }
}

/// One server on a blacklist.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Listed {
    pub server: u64,
    pub kind: ListKind,
    pub reason: String,
    /// Milliseconds on the list so far.
    pub for_ms: u64,
}

/// Counters of backup reads and blacklisting.
#[derive(Debug, Default)]
pub struct HealthStats {
    pub reads: AtomicU64,
    /// Backup reads sent, and how many answered first.
    pub backups_sent: AtomicU64,
    pub backups_won: AtomicU64,
    /// Backup reads the token bucket refused.
    pub backups_denied: AtomicU64,
    pub listed_failed: AtomicU64,
    pub listed_slow: AtomicU64,
    pub released: AtomicU64,
    /// Listings refused because the cap was reached.
    pub cap_refusals: AtomicU64,
    pub probes: AtomicU64,
    /// Reads of a chunk group that decoded (a member failed or was slow).
    pub degraded_reads: AtomicU64,
}

/// A plain copy of [`HealthStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct HealthCounts {
    pub reads: u64,
    pub backups_sent: u64,
    pub backups_won: u64,
    pub backups_denied: u64,
    pub listed_failed: u64,
    pub listed_slow: u64,
    pub released: u64,
    pub cap_refusals: u64,
    pub probes: u64,
    pub degraded_reads: u64,
}

impl HealthStats {
    pub fn snapshot(&self) -> HealthCounts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        HealthCounts {
            reads: g(&self.reads),
            backups_sent: g(&self.backups_sent),
            backups_won: g(&self.backups_won),
            backups_denied: g(&self.backups_denied),
            listed_failed: g(&self.listed_failed),
            listed_slow: g(&self.listed_slow),
            released: g(&self.released),
            cap_refusals: g(&self.cap_refusals),
            probes: g(&self.probes),
            degraded_reads: g(&self.degraded_reads),
        }
    }
}

#[derive(Clone)]
struct Window {
    samples: [u32; WINDOW],
    n: usize,
    /// Median and p95 of the window, recomputed as samples arrive.
    p50: u32,
    p95: u32,
}

impl Default for Window {
    fn default() -> Self {
        Self {
            samples: [0; WINDOW],
            n: 0,
            p50: 0,
            p95: 0,
        }
    }
}

impl Window {
    fn add(&mut self, us: u32) {
        self.samples[self.n % WINDOW] = us;
        self.n += 1;
        if self.n < MIN_SAMPLES {
            return;
        }
        // A copy on the stack: no allocation per sample.
        let mut all = self.samples;
        let s = &mut all[..self.n.min(WINDOW)];
        s.sort_unstable();
        self.p50 = s[s.len() / 2];
        self.p95 = s[(s.len() * 95 / 100).min(s.len() - 1)];
    }

    fn ready(&self) -> bool {
        self.n >= MIN_SAMPLES
    }
}

#[derive(Default)]
struct Server {
    windows: [Window; CLASSES],
    listed: Option<Listing>,
    last_eval: Option<Instant>,
    released_at: Option<Instant>,
    /// Times listed again soon after a release, in a row.
    flaps: u32,
    /// Errors since the last report to the masters.
    errors: u64,
}

struct Listing {
    kind: ListKind,
    reason: String,
    since: Instant,
    /// Not probed before this.
    until: Instant,
}

struct State {
    servers: HashMap<u64, Server>,
    /// Servers the masters told this client about (the cap's base).
    known: usize,
    tokens: f64,
    /// Requests seen since the last report (an idle client does not report).
    active: bool,
}

/// Latency, blacklists and backup-read budget of one client.
pub struct Health {
    opts: HealthOptions,
    state: Mutex<State>,
    pub stats: HealthStats,
}

impl Health {
    pub fn new(opts: HealthOptions) -> Self {
        let tokens = opts.backup_burst;
        Self {
            opts,
            state: Mutex::new(State {
                servers: HashMap::new(),
                known: 0,
                tokens,
                active: false,
            }),
            stats: HealthStats::default(),
        }
    }

    pub fn options(&self) -> &HealthOptions {
        &self.opts
    }

    /// The number of servers the client knows (the base of the cap).
    pub fn set_known(&self, n: usize) {
        self.state.lock().known = n;
    }

    /// A request to `server` answered after `took`.
    pub fn sample(&self, server: u64, op: Op, bytes: usize, took: Duration, now: Instant) {
        let k = class(op, bytes);
        let us = u32::try_from(took.as_micros()).unwrap_or(u32::MAX).max(1);
        metrics::histogram!(
            "cairn_client_request_seconds",
            "server" => server.to_string(),
            "class" => CLASS_NAMES[k]
        )
        .record(took.as_secs_f64());
        let mut st = self.state.lock();
        st.active = true;
        let s = st.servers.entry(server).or_default();
        s.windows[k].add(us);
        if s.listed.is_some() || s.last_eval.is_some_and(|t| now - t < EVAL_EVERY) {
            return;
        }
        if !s.windows[k].ready() {
            return;
        }
        s.last_eval = Some(now);
        let mine = f64::from(s.windows[k].p50);
        let Some(ratio) = Self::ratio(&st, k, mine) else {
            return;
        };
        let p = (ratio - self.opts.slow_from) / (self.opts.slow_certain - self.opts.slow_from);
        if p > 0.0 && (p >= 1.0 || rand::random::<f64>() < p) {
            let reason = format!("{ratio:.1}× the median latency");
            self.list(&mut st, server, ListKind::Slow, reason, now);
        }
    }

    /// `latency` relative to the median of the servers with enough samples of class `k`
    /// (`None` with fewer than three such servers: no meaningful median).
    fn ratio(st: &State, k: usize, latency: f64) -> Option<f64> {
        let mut p50s: Vec<u32> = st
            .servers
            .values()
            .filter(|s| s.windows[k].ready())
            .map(|s| s.windows[k].p50)
            .collect();
        if p50s.len() < 3 {
            return None;
        }
        p50s.sort_unstable();
        let median = f64::from(p50s[p50s.len() / 2]).max(1.0);
        Some(latency / median)
    }

    /// A request to `server` failed with `e`: a failure of the server (not of the request)
    /// lists it.
    pub fn failure(&self, server: u64, e: &DataError, now: Instant) {
        let kind = match e {
            DataError::Connect { .. } | DataError::ConnectionLost { .. } => ListKind::Failed,
            DataError::Timeout { .. } => ListKind::Slow,
            DataError::Status {
                status:
                    Status::Io
                    | Status::StoreFailed
                    | Status::NoSpace
                    | Status::ShuttingDown
                    | Status::NotReady,
                ..
            } => ListKind::Failed,
            _ => return,
        };
        let mut st = self.state.lock();
        st.servers.entry(server).or_default().errors += 1;
        self.list(&mut st, server, kind, e.to_string(), now);
    }

    /// The writer dropped `server` from a chunk for lagging behind the other replicas (it
    /// was slower than they were by more than chasing allows).
    pub fn lagged(&self, server: u64, why: &str, now: Instant) {
        let mut st = self.state.lock();
        self.list(
            &mut st,
            server,
            ListKind::Slow,
            format!("dropped by chasing: {why}"),
            now,
        );
    }

    fn list(&self, st: &mut State, server: u64, kind: ListKind, reason: String, now: Instant) {
        let cap = (st.known as f64 * self.opts.blacklist_cap).floor() as usize;
        let listed = st.servers.values().filter(|s| s.listed.is_some()).count();
        let s = st.servers.entry(server).or_default();
        if let Some(l) = &mut s.listed {
            // Already listed: a failure outranks slowness.
            if kind == ListKind::Failed && l.kind == ListKind::Slow {
                l.kind = kind;
                l.reason = reason;
            }
            return;
        }
        if listed >= cap {
            self.stats.cap_refusals.fetch_add(1, Ordering::Relaxed);
            return;
        }
        s.flaps = match s.released_at {
            Some(t) if now - t < FLAP_WINDOW => (s.flaps + 1).min(4),
            _ => 0,
        };
        let grace = self.opts.grace * (1u32 << s.flaps);
        tracing::info!(server, ?kind, %reason, ?grace, "chunkserver blacklisted");
        match kind {
            ListKind::Failed => &self.stats.listed_failed,
            ListKind::Slow => &self.stats.listed_slow,
        }
        .fetch_add(1, Ordering::Relaxed);
        metrics::gauge!(
            "cairn_client_blacklisted",
            "server" => server.to_string(),
            "list" => kind.name()
        )
        .set(1.0);
        s.listed = Some(Listing {
            kind,
            reason,
            since: now,
            until: now + grace,
        });
    }

    pub fn is_listed(&self, server: u64) -> bool {
        self.state
            .lock()
            .servers
            .get(&server)
            .is_some_and(|s| s.listed.is_some())
    }

    /// The servers on the lists now.
    pub fn listed(&self, now: Instant) -> Vec<Listed> {
        let st = self.state.lock();
        let mut v: Vec<Listed> = st
            .servers
            .iter()
            .filter_map(|(&server, s)| {
                s.listed.as_ref().map(|l| Listed {
                    server,
                    kind: l.kind,
                    reason: l.reason.clone(),
                    for_ms: (now - l.since).as_millis() as u64,
                })
            })
            .collect();
        v.sort_by_key(|l| l.server);
        v
    }

    /// Listed servers whose grace has run out: probe them now.
    pub fn due(&self, now: Instant) -> Vec<(u64, ListKind)> {
        let st = self.state.lock();
        st.servers
            .iter()
            .filter_map(|(&id, s)| {
                s.listed
                    .as_ref()
                    .filter(|l| now >= l.until)
                    .map(|l| (id, l.kind))
            })
            .collect()
    }

    /// The result of probing `server`: `took` when it answered, and the median ping of all
    /// the servers probed in the same round. Returns whether the server was released.
    pub fn probed(
        &self,
        server: u64,
        took: Option<Duration>,
        median: Option<Duration>,
        now: Instant,
    ) -> bool {
        self.stats.probes.fetch_add(1, Ordering::Relaxed);
        let mut st = self.state.lock();
        let Some(s) = st.servers.get_mut(&server) else {
            return false;
        };
        let Some(l) = &s.listed else {
            return false;
        };
        let release = match (l.kind, took, median) {
            (_, None, _) => false,
            (ListKind::Failed, Some(_), _) => true,
            (ListKind::Slow, Some(t), Some(m)) => {
                t.as_secs_f64() <= self.opts.slow_from * m.as_secs_f64().max(1e-4)
            }
            (ListKind::Slow, Some(_), None) => true,
        };
        if release {
            tracing::info!(server, "chunkserver released from the blacklist");
            metrics::gauge!(
                "cairn_client_blacklisted",
                "server" => server.to_string(),
                "list" => l.kind.name()
            )
            .set(0.0);
            s.listed = None;
            s.released_at = Some(now);
            // Judge it afresh: its old samples describe the trouble that listed it.
            s.windows = Default::default();
            s.last_eval = None;
            self.stats.released.fetch_add(1, Ordering::Relaxed);
        }
        release
    }

    /// `servers` in the order to read from them: unlisted ones by their median latency for
    /// this class (unmeasured first, to learn them), then slow ones, then failed ones.
    pub fn order(&self, servers: &[u64], op: Op, bytes: usize) -> Vec<u64> {
        let k = class(op, bytes);
        let st = self.state.lock();
        let mut v: Vec<(u8, u32, u64)> = servers
            .iter()
            .map(|&id| match st.servers.get(&id) {
                None => (0, 0, id),
                Some(s) => {
                    let rank = match s.listed.as_ref().map(|l| l.kind) {
                        None => 0,
                        Some(ListKind::Slow) => 1,
                        Some(ListKind::Failed) => 2,
                    };
                    let w = &s.windows[k];
                    (rank, if w.ready() { w.p50 } else { 0 }, id)
                }
            })
            .collect();
        v.sort_by_key(|&(rank, lat, _)| (rank, lat));
        v.into_iter().map(|x| x.2).collect()
    }

    /// How long to wait for `server` before a backup read: its p95 for reads of this size.
    pub fn backup_delay(&self, server: u64, bytes: usize) -> Duration {
        let k = class(Op::Read, bytes);
        let st = self.state.lock();
        let d = match st.servers.get(&server).map(|s| &s.windows[k]) {
            Some(w) if w.ready() => Duration::from_micros(u64::from(w.p95)),
            _ => self.opts.backup_default_delay,
        };
        d.max(self.opts.backup_min_delay)
    }

    /// A read starts: the bucket earns its share of a backup.
    pub fn read_started(&self) {
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        let mut st = self.state.lock();
        st.tokens = (st.tokens + self.opts.backup_ratio).min(self.opts.backup_burst);
    }

    /// Takes a backup-read token, if there is one.
    pub fn take_backup(&self) -> bool {
        let mut st = self.state.lock();
        if st.tokens >= 1.0 {
            st.tokens -= 1.0;
            self.stats.backups_sent.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("cairn_client_backup_reads_total", "result" => "sent").increment(1);
            true
        } else {
            self.stats.backups_denied.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("cairn_client_backup_reads_total", "result" => "denied").increment(1);
            false
        }
    }

    /// What to tell the masters: each listed server with its list, and the errors counted
    /// since the last report (taken); `None` when the client was idle with nothing listed.
    pub fn take_report(&self) -> Option<Vec<(u64, Option<ListKind>, u64)>> {
        let mut st = self.state.lock();
        let active = std::mem::take(&mut st.active);
        let mut v: Vec<(u64, Option<ListKind>, u64)> = st
            .servers
            .iter_mut()
            .filter(|(_, s)| s.listed.is_some() || s.errors > 0)
            .map(|(&id, s)| {
                let e = std::mem::take(&mut s.errors);
                (id, s.listed.as_ref().map(|l| l.kind), e)
            })
            .collect();
        v.sort_by_key(|x| x.0);
        (active || !v.is_empty()).then_some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(known: usize) -> Health {
        let h = Health::new(HealthOptions::default());
        h.set_known(known);
        h
    }

    /// Feeds `n` samples of `us` µs for each server, `EVAL_EVERY` apart.
    fn feed(h: &Health, now: &mut Instant, lat: &[(u64, u64)], n: usize) {
        for _ in 0..n {
            *now += EVAL_EVERY;
            for &(s, us) in lat {
                h.sample(s, Op::Write, 4096, Duration::from_micros(us), *now);
            }
        }
    }

    #[test]
    fn a_server_several_times_slower_than_the_median_is_blacklisted() {
        let h = health(5);
        let mut now = Instant::now();
        feed(
            &h,
            &mut now,
            &[(1, 500), (2, 520), (3, 480), (4, 510), (5, 5000)],
            MIN_SAMPLES + 2,
        );
        let l = h.listed(now);
        assert_eq!(l.len(), 1, "{l:?}");
        assert_eq!((l[0].server, l[0].kind), (5, ListKind::Slow));
        // Reads go to it last.
        assert_eq!(h.order(&[5, 1], Op::Write, 4096), vec![1, 5]);
    }

    #[test]
    fn servers_near_the_median_are_never_listed() {
        let h = health(3);
        let mut now = Instant::now();
        feed(&h, &mut now, &[(1, 500), (2, 900), (3, 700)], 200);
        assert!(h.listed(now).is_empty());
        assert_eq!(h.stats.snapshot().listed_slow, 0);
    }

    #[test]
    fn a_moderately_slow_server_is_listed_with_some_probability() {
        // 3× the median: p = (3 - 2) / (5 - 2) = 1/3 per evaluation; over 100 evaluations it is
        // listed, but not at the first (with probability 2/3 each).
        let mut first_try = 0;
        for _ in 0..30 {
            let h = health(3);
            let mut now = Instant::now();
            feed(&h, &mut now, &[(1, 1000), (2, 1000)], MIN_SAMPLES);
            let mut evals = 0;
            while h.listed(now).is_empty() && evals < 100 {
                feed(&h, &mut now, &[(3, 3000)], 1);
                if h.state.lock().servers[&3].windows[4].ready() {
                    evals += 1;
                }
            }
            assert!(!h.listed(now).is_empty(), "never listed at 3× the median");
            if evals == 1 {
                first_try += 1;
            }
        }
        assert!(
            first_try < 25,
            "listed at the first look {first_try}/30 times"
        );
    }

    #[test]
    fn the_blacklist_never_exceeds_its_cap() {
        let h = health(9);
        let now = Instant::now();
        let e = DataError::Connect {
            addr: "127.0.0.1:1".parse().unwrap(),
            message: "refused".into(),
        };
        for s in 1..=9 {
            h.failure(s, &e, now);
        }
        assert_eq!(h.listed(now).len(), 3);
        assert_eq!(h.stats.snapshot().cap_refusals, 6);
        // With three servers known, one may be listed.
        let h = health(3);
        for s in 1..=3 {
            h.failure(s, &e, now);
        }
        assert_eq!(h.listed(now).len(), 1);
    }

    #[test]
    fn probes_release_after_the_grace_and_flapping_doubles_it() {
        let h = health(3);
        let mut now = Instant::now();
        let e = DataError::Status {
            status: Status::Io,
            offset: 0,
            message: "disk".into(),
        };
        h.failure(2, &e, now);
        assert!(h.due(now).is_empty(), "probed before its grace");
        now += h.options().grace;
        assert_eq!(h.due(now), vec![(2, ListKind::Failed)]);
        assert!(!h.probed(2, None, None, now), "released without an answer");
        assert!(h.probed(2, Some(Duration::from_millis(1)), None, now));
        assert!(!h.is_listed(2));
        // Fails again soon: listed for twice as long.
        h.failure(2, &e, now);
        now += h.options().grace;
        assert!(h.due(now).is_empty());
        now += h.options().grace;
        assert_eq!(h.due(now).len(), 1);
    }

    #[test]
    fn a_slow_server_is_released_only_when_its_ping_is_near_the_median() {
        let h = health(3);
        let now = Instant::now();
        let e = DataError::Timeout {
            addr: "127.0.0.1:1".parse().unwrap(),
            after: Duration::from_secs(5),
        };
        h.failure(3, &e, now);
        let later = now + h.options().grace;
        let ms = Duration::from_millis;
        assert!(!h.probed(3, Some(ms(50)), Some(ms(1)), later));
        assert!(h.probed(3, Some(ms(1)), Some(ms(1)), later));
    }

    #[test]
    fn request_errors_do_not_list() {
        let h = health(3);
        let e = DataError::Status {
            status: Status::WrongOffset,
            offset: 0,
            message: String::new(),
        };
        h.failure(1, &e, Instant::now());
        assert!(!h.is_listed(1));
    }

    #[test]
    fn backup_reads_are_capped_by_the_bucket() {
        let h = health(3);
        let mut sent = 0;
        for _ in 0..1000 {
            h.read_started();
            if h.take_backup() {
                sent += 1;
            }
        }
        // The burst plus one in ten.
        assert!((100..=111).contains(&sent), "{sent} backups for 1000 reads");
    }

    #[test]
    fn the_backup_delay_follows_the_servers_p95() {
        let h = health(3);
        let now = Instant::now();
        assert_eq!(h.backup_delay(1, 4096), h.options().backup_default_delay);
        for i in 0..100u64 {
            h.sample(
                1,
                Op::Read,
                4096,
                Duration::from_micros(1000 + i % 20 * 100),
                now,
            );
        }
        let d = h.backup_delay(1, 4096);
        assert!(
            d >= Duration::from_micros(2600) && d <= Duration::from_micros(3000),
            "{d:?}"
        );
        // Another size class has its own.
        assert_eq!(h.backup_delay(1, 1 << 20), h.options().backup_default_delay);
    }
}
