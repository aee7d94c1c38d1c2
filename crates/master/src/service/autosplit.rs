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
//!   load). When none can go, a directory taking more than four fifths whose calls no
//!   tracked subdirectory of it takes half of — one hot directory, its calls spread over its
//!   entries — is hashed over [`AUTO_HASH_SHARDS`] new partitions instead (state/hashed.rs).

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

/// Shards a directory hashed on its own (by load) is spread over.
pub const AUTO_HASH_SHARDS: u32 = 4;

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
    /// Calls below each directory one to [`LOAD_LEVELS`] levels below its partition's top.
    dirs: HashMap<(PartitionId, String), DirLoad>,
}

/// The calls below one directory in a window.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DirLoad {
    calls: u64,
    /// Levels below its partition's top.
    level: usize,
    /// The entry right below it that the first call went to, and the calls that went to
    /// another: none when they all go to one entry (hashing would not spread them).
    first: String,
    elsewhere: u64,
}

/// How deep below a partition's top the directories holding a call are counted: splits
/// take the first two levels; the third tells whether a directory's calls go into one
/// subdirectory (hashing it would not spread them).
const LOAD_LEVELS: usize = 3;

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

/// The directories one to [`LOAD_LEVELS`] levels below `top` that `path` is inside of (not
/// the entry itself: a directory holding it), with their levels and the entry right below
/// each that `path` goes into.
fn load_keys(top: &str, path: &str) -> Vec<(String, usize, String)> {
    let rest = if top == "/" {
        path.trim_start_matches('/')
    } else {
        path.strip_prefix(top)
            .map_or("", |r| r.trim_start_matches('/'))
    };
    let comps: Vec<&str> = rest.split('/').filter(|c| !c.is_empty()).collect();
    let base = top.trim_end_matches('/').to_owned();
    (1..=LOAD_LEVELS)
        .filter(|n| comps.len() > *n)
        .map(|n| {
            (
                format!("{base}/{}", comps[..n].join("/")),
                n,
                comps[n].to_owned(),
            )
        })
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
        for (k, level, entry) in load_keys(top, path) {
            let full = l.dirs.len() >= LOAD_KEYS;
            match l.dirs.get_mut(&(p, k.clone())) {
                Some(d) => {
                    d.calls += 1;
                    d.elsewhere += u64::from(d.first != entry);
                }
                None if !full => {
                    let d = DirLoad {
                        calls: 1,
                        level,
                        first: entry,
                        elsewhere: 0,
                    };
                    l.dirs.insert((p, k), d);
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
                .filter(|((q, _), d)| {
                    *q == p && d.level <= 2 && d.calls * 5 >= total && d.calls * 5 <= total * 4
                })
                .map(|((_, d), l)| (l.calls.abs_diff(total / 2), d.clone(), l.calls))
                .collect();
            candidates.sort_unstable();
            // Only a subtree a split moves within a client's retries (counted, up to that).
            let mut small = Vec::new();
            for (_, d, n) in candidates.into_iter().take(TRIES) {
                if self.rows_below(p, &d, AUTO_MOVE_ROWS).await <= AUTO_MOVE_ROWS {
                    small.push((d, n));
                }
            }
            if self.split_one(p, "load", rate as u64, small).await {
                continue;
            }
            // No directory to split off: one that takes nearly all the calls, spread over its
            // entries, is hashed.
            for (d, n) in hot_directories(&load.dirs, p, total) {
                // Quietly past what may not go (the services' own directories…).
                let movable = self.led(p).is_ok_and(|h| {
                    h.sm.lock()
                        .state
                        .check_movable(&d)
                        .is_ok_and(|d| d.is_some())
                });
                if !movable || self.rows_below(p, &d, AUTO_MOVE_ROWS).await > AUTO_MOVE_ROWS {
                    continue;
                }
                match self.hash_directory(&d, AUTO_HASH_SHARDS, &[]).await {
                    Ok(shards) => {
                        metrics::counter!("cairn_master_auto_splits_total", "reason" => "load-hash")
                            .increment(1);
                        tracing::info!(path = %d, from = p, ?shards, rate = rate as u64, calls = n,
                            "directory hashed on its own");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(path = %d, from = p, error = %e,
                            "automatic hashing refused");
                    }
                }
            }
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

/// Directories of partition `p`, one or two levels below its top, that took more than four
/// fifths of its `total` calls, spread over their entries: at least half went elsewhere than
/// to the entry the first went to, and no directory right below took half. The hottest
/// first.
fn hot_directories(
    dirs: &HashMap<(PartitionId, String), DirLoad>,
    p: PartitionId,
    total: u64,
) -> Vec<(String, u64)> {
    let mut hot: Vec<(String, u64)> = dirs
        .iter()
        .filter(|((q, _), l)| {
            *q == p
                && l.level < LOAD_LEVELS
                && l.calls * 5 > total * 4
                && l.elsewhere * 2 >= l.calls
        })
        .filter(|((_, d), l)| {
            let below = format!("{d}/");
            !dirs.iter().any(|((q, c), m)| {
                *q == p
                    && c.strip_prefix(&below).is_some_and(|r| !r.contains('/'))
                    && m.calls * 2 > l.calls
            })
        })
        .map(|((_, d), l)| (d.clone(), l.calls))
        .collect();
    hot.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    hot.truncate(TRIES);
    hot
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hot_directory_spread_over_its_entries_is_found() {
        // Each with its calls spread (all but one elsewhere than the first entry).
        let d = |entries: &[(&str, u64)]| -> HashMap<(PartitionId, String), DirLoad> {
            entries
                .iter()
                .map(|(k, n)| {
                    let l = DirLoad {
                        calls: *n,
                        level: k.matches('/').count(),
                        first: "e".into(),
                        elsewhere: n - 1,
                    };
                    ((0, (*k).to_owned()), l)
                })
                .collect()
        };
        // /hot takes 95 of 100 calls, spread (no child of it takes half): hashed.
        let flat = d(&[("/hot", 95), ("/hot/a", 10), ("/other", 5)]);
        assert_eq!(hot_directories(&flat, 0, 100), [("/hot".to_owned(), 95)]);
        // Its calls go into one subdirectory: that one is hot instead, when its own calls
        // spread; not when they go on into one below it (or are too deep to tell).
        let deep = d(&[("/hot", 95), ("/hot/x", 90)]);
        assert_eq!(hot_directories(&deep, 0, 100), [("/hot/x".to_owned(), 90)]);
        let deeper = d(&[("/hot", 95), ("/hot/x", 90), ("/hot/x/y", 90)]);
        assert!(hot_directories(&deeper, 0, 100).is_empty());
        // Not four fifths: none. Another partition's: none.
        assert!(hot_directories(&d(&[("/warm", 70)]), 0, 100).is_empty());
        assert!(hot_directories(&flat, 1, 100).is_empty());
        // Every call to one file: nothing to spread.
        let mut one = flat.clone();
        one.get_mut(&(0, "/hot".to_owned())).unwrap().elsewhere = 0;
        assert!(hot_directories(&one, 0, 100).is_empty());
    }

    #[test]
    fn load_counts_the_directories_holding_a_call() {
        let keys = |top: &str, path: &str| -> Vec<String> {
            load_keys(top, path)
                .into_iter()
                .map(|(k, _, _)| k)
                .collect()
        };
        assert_eq!(keys("/", "/a/b/c"), ["/a", "/a/b"]);
        assert_eq!(keys("/", "/a/b"), ["/a"]);
        assert!(keys("/", "/a").is_empty());
        assert_eq!(keys("/p", "/p/x/y/z/w"), ["/p/x", "/p/x/y", "/p/x/y/z"]);
        assert_eq!(load_keys("/p", "/p/x/y/z/w")[2].1, 3);
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
        let d0 = &l.dirs[&(0, "/d0".to_owned())];
        assert_eq!((d0.calls, d0.level, d0.elsewhere), (2, 1, 0));
        a.note(&SplitPolicy { load: 0, ..on }, 0, "/", "/x/y");
        assert!(a.take().totals.is_empty(), "off: nothing counted");
    }
}
