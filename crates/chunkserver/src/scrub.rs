//! The scrubber (docs/erasure-coding.md §5): reads every chunk of this server's stores
//! in the background, at a capped rate and behind foreground requests, so that bits that rot
//! on a disk are found before a reader needs them. The chunk store checks every unit's CRC32C
//! as it reads; the scrubber also checks the whole chunk's CRC against the one the store keeps
//! for its acknowledged bytes.
//!
//! Pacing: a pass reads every copy within `period` (default a week, as Ceph's deep scrub).
//! Before each piece the scrubber sets its rate to the bytes the pass has left over the time
//! it has left (aiming a tenth of the period early), so a disk's used bytes set the rate (8 TB in a week: 13 MiB/s), never under
//! 256 KiB/s (a small disk's pass ends early) and always within the chunkserver's background
//! bandwidth; a pass that ends early waits out its period, and one that cannot keep up (its rate above the background bandwidth)
//! says so (`behind`). Copies written after a pass went by are read by the next one: every
//! byte is read within two periods of being written.
//!
//! A bad copy is not deleted here (every copy might be bad): it is named to the masters with
//! each heartbeat, who stop counting it as a good copy, so that repair copies the chunk from a
//! good one — onto this server if no other can take it — after which the bad copy is gone.

use crate::Chunkserver;
use crate::repair::Bucket;
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Bytes read per request.
const PIECE: usize = 1 << 20;
/// How long a piece waits while foreground requests are being served.
const YIELD: Duration = Duration::from_millis(5);

/// The slowest the scrubber reads while a pass has bytes left (a few seconds a piece at
/// most, so that progress shows and a nearly empty disk's pass does not crawl).
const MIN_RATE: u64 = 256 << 10;

#[derive(Debug, Clone, Copy)]
pub struct ScrubOptions {
    /// A pass reads every copy within this time; zero turns the scrubber off.
    pub period: Duration,
    /// A fixed read rate in bytes/s instead of the one the period sets (0: from the period).
    pub bytes_per_sec: u64,
}

impl Default for ScrubOptions {
    fn default() -> Self {
        Self {
            period: DEFAULT_PERIOD,
            bytes_per_sec: 0,
        }
    }
}

/// A week, as Ceph's deep scrub.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(7 * 24 * 3600);

/// What the scrubber did, since the server started.
#[derive(Debug, Default)]
pub struct ScrubStats {
    pub bytes: AtomicU64,
    pub chunks: AtomicU64,
    pub passes: AtomicU64,
    /// Bad copies found (each counted once).
    pub corrupt: AtomicU64,
    /// The pass running (or the last one): bytes read and bytes it set out to read.
    pub pass_done: AtomicU64,
    pub pass_total: AtomicU64,
    /// When the pass running must end, in ms since the Unix epoch (0: none yet).
    pub pass_due_ms: AtomicU64,
    /// The rate the pass reads at now, bytes/s.
    pub rate: AtomicU64,
    /// The pass needs more than the background bandwidth to end in time.
    pub behind: AtomicBool,
}

/// A pass's progress, for heartbeats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    pub done: u64,
    pub total: u64,
    pub due_ms: u64,
    pub rate: u64,
    pub behind: bool,
}

impl ScrubStats {
    pub fn progress(&self) -> Progress {
        Progress {
            done: self.pass_done.load(Ordering::Relaxed),
            total: self.pass_total.load(Ordering::Relaxed),
            due_ms: self.pass_due_ms.load(Ordering::Relaxed),
            rate: self.rate.load(Ordering::Relaxed),
            behind: self.behind.load(Ordering::Relaxed),
        }
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The rate that reads `left` bytes in `time_left`: at least [`MIN_RATE`], and with no time
/// left, as fast as the background bandwidth lets (`None`).
pub(crate) fn pace(left: u64, time_left: Duration) -> Option<u64> {
    let secs = time_left.as_secs_f64();
    if secs < 0.001 {
        return None;
    }
    Some(((left as f64 / secs).ceil() as u64).max(MIN_RATE))
}

pub struct Scrubber {
    cs: Arc<Chunkserver>,
    opts: ScrubOptions,
    bucket: Bucket,
    pub stats: ScrubStats,
}

impl Scrubber {
    /// Starts the scrubber (unless its period is zero).
    pub fn spawn(cs: Arc<Chunkserver>, opts: ScrubOptions) -> Arc<Self> {
        let s = Arc::new(Self {
            cs,
            opts,
            bucket: Bucket::new(opts.bytes_per_sec.max(MIN_RATE)),
            stats: ScrubStats::default(),
        });
        if !opts.period.is_zero() {
            tokio::spawn(s.clone().run());
        }
        s
    }

    async fn run(self: Arc<Self>) {
        loop {
            let began = Instant::now();
            let due = began + self.opts.period;
            self.stats.pass_due_ms.store(
                unix_ms(SystemTime::now() + self.opts.period),
                Ordering::Relaxed,
            );
            self.pass(due).await;
            self.stats.passes.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("cairn_chunkserver_scrub_passes_total").increment(1);
            self.stats.rate.store(0, Ordering::Relaxed);
            // A pass that ended early waits out its period.
            tokio::time::sleep_until(due.into()).await;
        }
    }

    /// One pass over every chunk of every store, ending by `due`.
    async fn pass(&self, due: Instant) {
        // What this pass reads: the copies here now, up to their acknowledged lengths.
        let mut plan = Vec::new();
        let mut total = 0u64;
        for store in self.cs.disks().stores() {
            for id in store.list() {
                if let Ok(st) = store.stat(id) {
                    total += st.length;
                    plan.push((store.clone(), id, st.length));
                }
            }
        }
        self.stats.pass_total.store(total, Ordering::Relaxed);
        self.stats.pass_done.store(0, Ordering::Relaxed);
        metrics::gauge!("cairn_chunkserver_scrub_pass_bytes").set(total as f64);
        let mut planned = 0u64;
        for (store, id, length) in plan {
            planned += length;
            self.check_one(&store, id, due).await;
            // Progress follows the plan: a copy deleted, repaired or grown meanwhile counts
            // as what the pass set out to read.
            self.stats.pass_done.store(planned, Ordering::Relaxed);
        }
    }

    async fn check_one(&self, store: &Arc<cairn_chunkstore::ChunkStore>, id: u64, due: Instant) {
        if self.cs.corrupt().contains(&id) {
            return; // known bad: waiting for its repair
        }
        // Open chunks too (writers close files without sealing the copies): up to the length
        // acknowledged now, whose bytes never change.
        let Ok(st) = store.stat(id) else { return };
        match self.check(store, id, st.length, st.crc32c, due).await {
            Ok(()) => {
                self.stats.chunks.fetch_add(1, Ordering::Relaxed);
            }
            Err(Bad::Gone) => {}
            Err(Bad::Corrupt(why)) => {
                tracing::error!(chunk = id, %why, "scrub found a bad copy");
                self.stats.corrupt.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("cairn_chunkserver_scrub_corrupt_total").increment(1);
                self.cs.corrupt_mut().insert(id);
            }
        }
    }

    /// Reads chunk `id` whole: every unit's CRC, then the chunk's.
    async fn check(
        &self,
        store: &Arc<cairn_chunkstore::ChunkStore>,
        id: u64,
        length: u64,
        crc32c: u32,
        due: Instant,
    ) -> Result<(), Bad> {
        let mut off = 0u64;
        let mut crc = 0u32;
        while off < length {
            let n = (length - off).min(PIECE as u64) as usize;
            while self.cs.load() > 0 {
                tokio::time::sleep(YIELD).await;
            }
            self.set_pace(due);
            self.bucket.take(n as u64).await;
            self.cs.background(n as u64, Duration::ZERO).await;
            let store = store.clone();
            let r = tokio::task::spawn_blocking(move || store.read_buf(id, off, n))
                .await
                .map_err(|e| Bad::Corrupt(format!("scrub task: {e}")))?;
            match r {
                Ok(buf) => {
                    crc = cairn_chunkstore::checksum::crc32c_combine(crc, buf.crc32c(), n);
                }
                Err(cairn_chunkstore::Error::NotFound { .. }) => return Err(Bad::Gone),
                Err(e @ cairn_chunkstore::Error::Corruption { .. }) => {
                    return Err(Bad::Corrupt(e.to_string()));
                }
                Err(e) => {
                    // An I/O error or a chunk deleted meanwhile: not a finding.
                    tracing::warn!(chunk = id, error = %e, "scrub read failed");
                    return Err(Bad::Gone);
                }
            }
            self.stats.bytes.fetch_add(n as u64, Ordering::Relaxed);
            self.stats.pass_done.fetch_add(n as u64, Ordering::Relaxed);
            metrics::counter!("cairn_chunkserver_scrub_bytes_total").increment(n as u64);
            off += n as u64;
        }
        if crc != crc32c {
            return Err(Bad::Corrupt(format!(
                "whole-chunk CRC32C {crc:#010x}, the store recorded {crc32c:#010x}"
            )));
        }
        Ok(())
    }

    /// Sets the rate for the next piece: fixed, or the pass's bytes left over its time left,
    /// capped by the background bandwidth (beyond which the pass is `behind`).
    fn set_pace(&self, due: Instant) {
        let background = self.cs.background_rate().max(1);
        let rate = if self.opts.bytes_per_sec > 0 {
            self.opts.bytes_per_sec
        } else {
            let left = self
                .stats
                .pass_total
                .load(Ordering::Relaxed)
                .saturating_sub(self.stats.pass_done.load(Ordering::Relaxed));
            // Aim a tenth of the period early: copies written meanwhile do not make it late.
            let aim = due.checked_sub(self.opts.period / 10).unwrap_or(due);
            pace(left, aim.saturating_duration_since(Instant::now())).unwrap_or(u64::MAX)
        };
        self.stats
            .behind
            .store(rate > background, Ordering::Relaxed);
        let rate = rate.min(background);
        self.stats.rate.store(rate, Ordering::Relaxed);
        metrics::gauge!("cairn_chunkserver_scrub_rate_bytes_per_sec").set(rate as f64);
        self.bucket.set_rate(rate);
    }

    /// The bad copies still on this server, for the masters.
    pub fn bad(&self) -> Vec<u64> {
        let disks = self.cs.disks();
        let mut bad = self.cs.corrupt_mut();
        bad.retain(|id| disks.find(*id).is_ok());
        bad.iter().copied().collect()
    }
}

enum Bad {
    /// The chunk is no longer there (deleted or repaired meanwhile).
    Gone,
    Corrupt(String),
}

/// The set of bad copies, shared by the scrubber and the repairer.
pub type BadSet = Mutex<BTreeSet<u64>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pace_spreads_what_is_left_over_the_time_left() {
        let week = Duration::from_secs(7 * 24 * 3600);
        // 8 TB in a week: about 13 MiB/s.
        let r = pace(8_000_000_000_000, week).unwrap();
        assert!((13_000_000..13_500_000).contains(&r), "{r}");
        // Little to read: never slower than the floor.
        assert_eq!(pace(1 << 20, week), Some(MIN_RATE));
        // Half the time left for all of it: twice as fast.
        assert_eq!(pace(100 << 20, Duration::from_secs(50)), Some(2 << 20));
        // No time left: as fast as the background bandwidth lets.
        assert_eq!(pace(1 << 20, Duration::ZERO), None);
    }
}
