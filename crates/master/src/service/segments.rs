//! Segment collection at the root's leader (docs/files.md "Segment collection"): deletes the
//! file service's segments that no file names any more — those of deleted and overwritten
//! files, and those a mount killed in the middle left behind.
//!
//! A round, every [`SegmentCollection::every`]:
//! 1. Candidates: segments (files below `/.fs/seg`) no writer holds — sealed, or their lease
//!    lapsed — untouched for [`SegmentCollection::grace`], that no partition names.
//! 2. Condemn them in every partition: from then on a write naming one is refused (the mount
//!    writes the bytes again to another segment), so none gains a file after this step —
//!    a mount that stalled with an append in flight included.
//! 3. Two collects, each reading every partition's use of them and its arrivals counter.
//!    Rows move between partitions installed before removed, and nothing new names a
//!    condemned segment: if no partition's arrivals changed between its two reads, a file
//!    that named a segment at the first collect was seen by it where it was. A segment both
//!    collects found unnamed is deleted; the others stay condemned (their files' bytes stay
//!    readable; nothing is added to them).
//! 4. The partitions are the same at the end as at step 2 (a partition made meanwhile
//!    aborts the round); a partition made later inherits the root's condemned segments
//!    before its rows arrive ([`Inner::inherit_condemned`]).

use super::{Inner, MetaService, now_ms};
use crate::groups::Hosted;
use crate::state::Command;
use crate::state::partitions::{PartitionId, ROOT_PARTITION};
use crate::state::segments::MAX_CONDEMN;
use cairn_rpc::MetaError;
use cairn_rpc::files::SEGMENTS_DIR;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// When segments are collected (`cairn master --segment-collect-secs`, `--segment-grace-secs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentCollection {
    /// Between rounds (zero: never).
    pub every: Duration,
    /// How long a segment is left alone after its last append, seal or lease renewal: longer
    /// than any flush takes from its append to its commit, and the time an open file unlinked
    /// by another mount stays readable on a mount that holds it open.
    pub grace: Duration,
}

impl Default for SegmentCollection {
    fn default() -> Self {
        Self {
            every: Duration::from_secs(30),
            grace: Duration::from_secs(300),
        }
    }
}

/// Segments looked at per round (a page of `/.fs/seg`; the next round goes on after it).
const PAGE: usize = 4096;

/// The collector's memory at this master.
#[derive(Default)]
pub struct Collector {
    running: tokio::sync::Mutex<()>,
    last: parking_lot::Mutex<Option<Instant>>,
    /// The name after which the next round reads `/.fs/seg` (empty: from the first).
    cursor: parking_lot::Mutex<String>,
}

/// What a round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Round {
    /// Segments looked at.
    pub seen: usize,
    /// Unwritten for the grace and named by no partition at first look.
    pub candidates: usize,
    /// Deleted.
    pub collected: usize,
    /// Their bytes (the files' committed lengths).
    pub bytes: u64,
    /// Why the round stopped before deleting (moves under way, partitions made).
    pub aborted: Option<String>,
}

impl MetaService {
    /// At the root's leader, starts a round when one is due and none runs.
    pub(crate) fn collect_segments(&self) {
        let c = self.inner.opts.segments;
        if c.every.is_zero() || self.inner.leader_check().is_err() {
            return;
        }
        {
            let mut last = self.inner.segments.last.lock();
            if last.is_some_and(|t| t.elapsed() < c.every) {
                return;
            }
            *last = Some(Instant::now());
        }
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let Ok(_running) = inner.segments.running.try_lock() else {
                return;
            };
            match inner.segment_round(c.grace).await {
                Ok(r) => {
                    metrics::counter!("cairn_master_segments_collected_total")
                        .increment(r.collected as u64);
                    metrics::counter!("cairn_master_segment_bytes_collected_total")
                        .increment(r.bytes);
                    if r.collected > 0 || r.aborted.is_some() {
                        tracing::info!(?r, "segment collection");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "segment collection: round not finished"),
            }
        });
    }
}

/// A segment's number from its file name (16 hex digits).
fn segment_number(name: &str) -> Option<u64> {
    (name.len() == 16)
        .then(|| u64::from_str_radix(name, 16).ok())
        .flatten()
        .filter(|s| *s != 0)
}

impl Inner {
    /// One round (see the module doc).
    pub(crate) async fn segment_round(&self, grace: Duration) -> Result<Round, MetaError> {
        let mut round = Round::default();
        let now = now_ms();
        let grace_ms = grace.as_millis() as u64;
        let home = match self.route(SEGMENTS_DIR).await {
            Ok(r) => r,
            Err(e) if e.kind == cairn_rpc::ErrorKind::NotFound => return Ok(round),
            Err(e) => return Err(e),
        };
        self.barrier(&home).await?;
        let after = self.segments.cursor.lock().clone();
        // Unwritten for the grace and held by no writer.
        let (page, more) = {
            let st = &home.h.sm.lock().state;
            match st.list_page(SEGMENTS_DIR, &after, PAGE) {
                Ok(p) => p,
                Err(e) if e.kind == cairn_rpc::ErrorKind::NotFound => return Ok(round),
                Err(e) => return Err(e),
            }
        };
        *self.segments.cursor.lock() = if more {
            page.last().map(|i| i.name.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        round.seen = page.len();
        let mut idle: BTreeMap<u64, (String, u64)> = BTreeMap::new();
        for ino in &page {
            let (Some(f), Some(seg)) = (ino.file(), segment_number(&ino.name)) else {
                continue;
            };
            let writer = f
                .lease
                .as_ref()
                .is_some_and(|l| l.expires_ms + grace_ms > now);
            if (f.sealed || !writer) && ino.mtime_ms + grace_ms <= now {
                let path = format!("{SEGMENTS_DIR}/{}", ino.name);
                idle.insert(seg, (path, f.committed_length()));
            }
        }
        if idle.is_empty() {
            return Ok(round);
        }
        let parts = self.partition_ids();
        let mut hosted = Vec::new();
        for p in &parts {
            hosted.push(self.led_soon(*p).await?);
        }
        // Named somewhere already: not a candidate.
        let segs: Vec<u64> = idle.keys().copied().collect();
        let (_, named) = self.collect(&hosted, &segs).await?;
        let candidates: Vec<u64> = segs
            .into_iter()
            .filter(|s| !named.contains(s))
            .take(MAX_CONDEMN)
            .collect();
        round.candidates = candidates.len();
        if candidates.is_empty() {
            return Ok(round);
        }
        for h in &hosted {
            let condemn = Command::CondemnSegments {
                segs: candidates.clone(),
                now_ms: now,
            };
            self.write_to(h, condemn).await?;
        }
        let (first, named1) = self.collect(&hosted, &candidates).await?;
        let (second, named2) = self.collect(&hosted, &candidates).await?;
        if first != second {
            round.aborted = Some("rows arrived in a partition between the two collects".into());
            return Ok(round);
        }
        if self.partition_ids() != parts {
            round.aborted = Some("a partition was made during the round".into());
            return Ok(round);
        }
        for seg in candidates {
            if named1.contains(&seg) || named2.contains(&seg) {
                continue;
            }
            let (path, bytes) = idle.remove(&seg).expect("a candidate is idle");
            match self
                .write_to(&home.h, Command::Delete { path: path.clone() })
                .await
            {
                Ok(_) => {
                    round.collected += 1;
                    round.bytes += bytes;
                }
                Err(e) if e.kind == cairn_rpc::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(%path, error = %e, "deleting a collected segment");
                }
            }
        }
        Ok(round)
    }

    /// Every partition's number (the root's included), in order.
    fn partition_ids(&self) -> Vec<PartitionId> {
        let st = &self.sm.lock().state;
        std::iter::once(ROOT_PARTITION)
            .chain(st.partitions().partitions.keys().copied())
            .collect()
    }

    /// Reads each partition's arrivals and use of `segs` (after a read barrier in each): the
    /// arrivals by partition, and the segments some partition names.
    async fn collect(
        &self,
        hosted: &[Arc<Hosted>],
        segs: &[u64],
    ) -> Result<(Vec<u64>, BTreeSet<u64>), MetaError> {
        let mut arrivals = Vec::new();
        let mut named = BTreeSet::new();
        for h in hosted {
            if h.id == ROOT_PARTITION {
                self.read_barrier().await?;
            } else {
                h.read_barrier().await?;
            }
            let (a, used) = h.sm.lock().state.segment_use(segs);
            arrivals.push(a);
            for (s, u) in segs.iter().zip(used) {
                if u.extents > 0 {
                    named.insert(*s);
                }
            }
        }
        Ok((arrivals, named))
    }

    /// A partition just made (before any row arrives in it) is told every segment the
    /// root has condemned: a stalled mount's write naming a collected segment is refused
    /// there as everywhere.
    pub(super) async fn inherit_condemned(&self, h: &Hosted) -> Result<(), MetaError> {
        let mut after = None;
        loop {
            let batch = self.sm.lock().state.condemned_segments(after, MAX_CONDEMN);
            let Some(last) = batch.last().map(|(s, _)| *s) else {
                return Ok(());
            };
            let condemn = Command::CondemnSegments {
                segs: batch.iter().map(|(s, _)| *s).collect(),
                now_ms: now_ms(),
            };
            self.write_to(h, condemn).await?;
            after = Some(last);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_numbers_are_sixteen_hex_digits_never_zero() {
        assert_eq!(segment_number("00000000000000ff"), Some(255));
        assert_eq!(
            segment_number(&format!("{:016x}", u64::MAX)),
            Some(u64::MAX)
        );
        assert_eq!(segment_number("ff"), None);
        assert_eq!(segment_number("0000000000000000"), None);
        assert_eq!(segment_number("000000000000000g"), None);
    }
}
