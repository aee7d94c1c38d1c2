//! Automatic splits (docs/partitions.md "Automatic splits"): the root's leader splits a
//! subtree off a partition that grew past a size (`SplitPolicy::files` inodes) or carries
//! more than a load (`SplitPolicy::load` calls a second over a window) — through the same
//! split an operator runs (`split_subtree`), so its crash analysis is the split's.
//!
//! - **By size**: a partition holding more inodes than the threshold is scanned (its inodes
//!   in batches, the lock let go between them: `state::sizes`), and the directory whose
//!   subtree is nearest half the partition, and that may move, is split into a new partition.
//! - **By load**: every call routed here counts towards the directories one and two levels
//!   below its partition's top; once a window, a partition that took more calls a second
//!   than the threshold splits off the directory whose share of them is nearest half (between
//!   a fifth and four fifths: a directory that takes nearly all of it would only move the
//!   load).

use super::{Inner, MetaService};
use crate::state::partitions::{PartitionId, ROOT_PARTITION};
use crate::state::sizes::SizeScan;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// When partitions split on their own (`cairn master --split-files`, `--split-load`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPolicy {
    /// A partition holding more inodes than this is split (0: never by size).
    pub files: u64,
    /// A partition taking more calls a second than this, over a window, is split (0: never
    /// by load).
    pub load: u64,
    /// How often the leader looks (and the load's window).
    pub every: Duration,
}

impl Default for SplitPolicy {
    /// 4 million inodes (~460 MB of a partition's store at ~115 bytes a file: BENCHMARKS.md),
    /// 20 000 calls a second (three times what one partition creates at on 2 cores, so a
    /// split by load happens where there are cores for a second group), every 60 s.
    fn default() -> Self {
        Self {
            files: 4_000_000,
            load: 20_000,
            every: Duration::from_secs(60),
        }
    }
}

/// Most rows an automatic split moves: writes below the directory wait while its rows are
/// copied (~8 400 rows a second here: BENCHMARKS.md "Moving a populated directory"), and a
/// client retries for 15 s, so a split on its own stays well inside that (~12 s). A larger
/// subtree is split by an operator, off-peak.
pub const AUTO_MOVE_ROWS: u64 = 100_000;

/// Inodes read per lock hold while a partition is sized.
const SCAN_BATCH: usize = 4096;
/// Most directories tracked for load in a window (calls to others are counted in totals only).
const LOAD_KEYS: usize = 4096;
/// Candidates tried, best first, before giving up on a partition this time.
const TRIES: usize = 8;

/// What the automatic splits keep between looks.
#[derive(Debug)]
pub struct AutoSplit {
    /// A look is running.
    busy: AtomicBool,
    /// Calls routed to each partition, and to directories below their tops, since `since`.
    load: Mutex<Load>,
    /// Partitions sized without a split (no directory could go): their inodes then. One is
    /// sized again once it grew by a tenth (a full scan each look would cost a scan a minute).
    unsplit: Mutex<HashMap<PartitionId, u64>>,
}

#[derive(Debug)]
struct Load {
    since: Instant,
    totals: HashMap<PartitionId, u64>,
    dirs: HashMap<(PartitionId, String), u64>,
}

impl Default for AutoSplit {
    fn default() -> Self {
        Self {
            busy: AtomicBool::new(false),
            unsplit: Mutex::new(HashMap::new()),
            load: Mutex::new(Load {
                since: Instant::now(),
                totals: HashMap::new(),
                dirs: HashMap::new(),
            }),
        }
    }
}

/// The directories one and two levels below `top` that `path` is inside of (not the entry
/// itself: a directory holding it).
fn load_keys(top: &str, path: &str) -> Vec<String> {
    let rest = if top == "/" {
        path.trim_start_matches('/')
    } else {
        path.strip_prefix(top)
            .map_or("", |r| r.trim_start_matches('/'))
    };
    let comps: Vec<&str> = rest.split('/').filter(|c| !c.is_empty()).collect();
    let base = top.trim_end_matches('/').to_owned();
    (1..=2)
        .filter(|n| comps.len() > *n)
        .map(|n| format!("{base}/{}", comps[..n].join("/")))
        .collect()
}

impl AutoSplit {
    /// Counts a call at `path`, routed to partition `p` whose top is `top`.
    pub fn note(&self, policy: &SplitPolicy, p: PartitionId, top: &str, path: &str) {
        if policy.load == 0 {
            return;
        }
        let mut l = self.load.lock();
        *l.totals.entry(p).or_default() += 1;
        for k in load_keys(top, path) {
            let full = l.dirs.len() >= LOAD_KEYS;
            match l.dirs.get_mut(&(p, k.clone())) {
                Some(n) => *n += 1,
                None if !full => {
                    l.dirs.insert((p, k), 1);
                }
                None => {}
            }
        }
    }

    /// The window's counts, and a new window begun.
    fn take(&self) -> Load {
        let mut l = self.load.lock();
        std::mem::replace(
            &mut *l,
            Load {
                since: Instant::now(),
                totals: HashMap::new(),
                dirs: HashMap::new(),
            },
        )
    }
}

impl MetaService {
    /// At the root's leader, once every `SplitPolicy::every`: splits a partition that grew
    /// past the size or load of the policy (in the background; one look at a time).
    pub(crate) fn auto_split(&self) {
        let policy = self.inner.opts.split;
        if policy.files == 0 && policy.load == 0 || self.inner.leader_check().is_err() {
            return;
        }
        let a = &self.inner.auto_split;
        if a.load.lock().since.elapsed() < policy.every || a.busy.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let load = inner.auto_split.take();
            if let Err(e) = inner.split_by_size(&policy).await {
                tracing::warn!(error = %e, "automatic split by size: not done (looked at again)");
            }
            if let Err(e) = inner.split_by_load(&policy, load).await {
                tracing::warn!(error = %e, "automatic split by load: not done (looked at again)");
            }
            inner.auto_split.busy.store(false, Ordering::Release);
        });
    }
}

impl Inner {
    /// The partitions this master leads (the root first), with their inodes.
    fn led_sizes(&self) -> Vec<(PartitionId, u64)> {
        self.groups
            .all()
            .into_iter()
            .filter(|h| h.id == ROOT_PARTITION || h.leader_check().is_ok())
            .map(|h| (h.id, h.sm.lock().state.inode_count()))
            .collect()
    }

    async fn split_by_size(&self, policy: &SplitPolicy) -> Result<(), cairn_rpc::MetaError> {
        if policy.files == 0 {
            return Ok(());
        }
        for (p, inodes) in self.led_sizes() {
            let last = self.auto_split.unsplit.lock().get(&p).copied();
            if inodes <= policy.files || last.is_some_and(|l| inodes < l + l / 10) {
                continue;
            }
            let h = self.led(p)?;
            let started = Instant::now();
            let mut scan = SizeScan::default();
            while !scan.step(&h.sm.lock().state, SCAN_BATCH) {
                tokio::task::yield_now().await;
            }
            // A subtree of at least a tenth of the threshold (smaller ones are not worth a
            // partition), at most what a split moves within a client's retries.
            let least = (policy.files / 10).clamp(1, AUTO_MOVE_ROWS / 2);
            let rows = least..=AUTO_MOVE_ROWS;
            let candidates = scan.candidates(&h.sm.lock().state, rows, TRIES);
            tracing::info!(
                partition = p,
                inodes,
                scan_ms = started.elapsed().as_millis() as u64,
                candidates = candidates.len(),
                "partition sized for a split"
            );
            if self.split_one(p, "size", inodes, candidates).await {
                self.auto_split.unsplit.lock().remove(&p);
            } else {
                self.auto_split.unsplit.lock().insert(p, inodes);
            }
        }
        Ok(())
    }

    async fn split_by_load(
        &self,
        policy: &SplitPolicy,
        load: Load,
    ) -> Result<(), cairn_rpc::MetaError> {
        if policy.load == 0 {
            return Ok(());
        }
        let secs = load.since.elapsed().as_secs_f64().max(1.0);
        for (p, total) in load.totals {
            let rate = total as f64 / secs;
            if rate <= policy.load as f64 || self.led(p).is_err() {
                continue;
            }
            let mut candidates: Vec<(u64, String, u64)> = load
                .dirs
                .iter()
                .filter(|((q, _), n)| *q == p && **n * 5 >= total && **n * 5 <= total * 4)
                .map(|((_, d), n)| (n.abs_diff(total / 2), d.clone(), *n))
                .collect();
            candidates.sort_unstable();
            // Only a subtree a split moves within a client's retries (counted, up to that).
            let mut small = Vec::new();
            for (_, d, n) in candidates.into_iter().take(TRIES) {
                if self.rows_below(p, &d, AUTO_MOVE_ROWS).await <= AUTO_MOVE_ROWS {
                    small.push((d, n));
                }
            }
            self.split_one(p, "load", rate as u64, small).await;
        }
        Ok(())
    }

    /// The rows of the subtree at `path` in partition `p`, counted up to just past `limit`
    /// (the lock let go between batches); past `limit` when it cannot be read.
    pub(super) async fn rows_below(&self, p: PartitionId, path: &str, limit: u64) -> u64 {
        let Ok(h) = self.led(p) else {
            return limit + 1;
        };
        let Ok(mut cursor) = crate::state::moves::RowsCursor::new(&h.sm.lock().state, path) else {
            return limit + 1;
        };
        let mut rows = 0u64;
        while rows <= limit {
            let batch = h.sm.lock().state.rows_batch(&mut cursor);
            match batch {
                Some((inodes, _)) => rows += inodes.len() as u64,
                None => break,
            }
            tokio::task::yield_now().await;
        }
        rows
    }

    /// Splits the first of `candidates` (paths in partition `p`, best first) that may move
    /// into a new partition; whether one did.
    async fn split_one(
        &self,
        p: PartitionId,
        reason: &'static str,
        measure: u64,
        candidates: Vec<(String, u64)>,
    ) -> bool {
        for (path, weight) in candidates {
            let movable = self.led(p).is_ok_and(|h| {
                h.sm.lock()
                    .state
                    .check_movable(&path)
                    .is_ok_and(|d| d.is_some())
            });
            if !movable {
                continue;
            }
            match self.split_subtree(&path, 0, &[]).await {
                Ok(to) => {
                    metrics::counter!("cairn_master_auto_splits_total", "reason" => reason)
                        .increment(1);
                    tracing::info!(%path, from = p, to, reason, measure, weight,
                        "partition split on its own");
                    return true;
                }
                Err(e) => {
                    tracing::warn!(%path, from = p, reason, error = %e, "automatic split refused");
                }
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_counts_the_directories_holding_a_call() {
        let keys = load_keys;
        assert_eq!(keys("/", "/a/b/c"), ["/a", "/a/b"]);
        assert_eq!(keys("/", "/a/b"), ["/a"]);
        assert!(keys("/", "/a").is_empty());
        assert_eq!(keys("/p", "/p/x/y/z/w"), ["/p/x", "/p/x/y"]);
        assert!(keys("/p", "/p").is_empty());
        let a = AutoSplit::default();
        let on = SplitPolicy {
            load: 1,
            ..SplitPolicy::default()
        };
        for i in 0..(LOAD_KEYS + 10) {
            a.note(&on, 0, "/", &format!("/d{i}/f"));
        }
        a.note(&on, 0, "/", "/d0/f");
        let l = a.take();
        assert_eq!(l.totals[&0], LOAD_KEYS as u64 + 11);
        assert_eq!(l.dirs.len(), LOAD_KEYS, "bounded");
        assert_eq!(l.dirs[&(0, "/d0".to_owned())], 2);
        a.note(&SplitPolicy { load: 0, ..on }, 0, "/", "/x/y");
        assert!(a.take().totals.is_empty(), "off: nothing counted");
    }
}
