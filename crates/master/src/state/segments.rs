//! A partition's side of segment collection (docs/files.md "Segment collection"): what its
//! files name of each segment (the inodes' tallies, kv/tally.rs), the segments it was told are
//! being collected (*condemned*: a write naming one is refused, so a mount that stalled with
//! an append in flight cannot make a deleted segment's bytes a file's), and how many times
//! rows arrived from another partition (moves and renames across partitions), which lets a
//! collector that reads the partitions one after another notice a file that moved past it.

use super::{Reply, Response, State};
use crate::kv::{Cell, Table, TableDef};
use cairn_rpc::files::Extent;
use cairn_rpc::{ErrorKind, MetaError};

/// Condemned segment → when it was condemned (ms).
pub const CONDEMNED: TableDef = TableDef::new("condemned_segments", 1);
/// How many times rows arrived from another partition.
pub const ARRIVALS: TableDef = super::disk::cell("segment_arrivals");

/// The most segments one [`super::Command::CondemnSegments`] names.
pub const MAX_CONDEMN: usize = 4096;

pub(super) fn condemned_table() -> Table<u64, u64> {
    Table::memory(CONDEMNED)
}

/// What one partition holds of a segment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentUse {
    /// Bytes of files' extents in it.
    pub bytes: u64,
    /// Extents in it.
    pub extents: u64,
    /// A write naming it is refused here.
    pub condemned: bool,
}

impl State {
    /// This partition's arrivals so far, and its use of each of `segs`.
    pub fn segment_use(&self, segs: &[u64]) -> (u64, Vec<SegmentUse>) {
        let used = segs
            .iter()
            .map(|s| {
                let [bytes, extents] = self.inodes.tally(*s);
                SegmentUse {
                    bytes,
                    extents,
                    condemned: self.condemned.contains_key(s),
                }
            })
            .collect();
        (*self.segment_arrivals, used)
    }

    /// Condemned segments, in number order, up to `max` after `after`.
    pub fn condemned_segments(&self, after: Option<u64>, max: usize) -> Vec<(u64, u64)> {
        let from = match after {
            Some(a) => std::ops::Bound::Excluded(a),
            None => std::ops::Bound::Unbounded,
        };
        self.condemned
            .range((from, std::ops::Bound::Unbounded))
            .take(max)
            .map(|(k, v)| (k, *v))
            .collect()
    }

    pub(super) fn condemn_segments(&mut self, segs: &[u64], now_ms: u64) -> Response {
        if segs.len() > MAX_CONDEMN || segs.contains(&0) {
            return Err(MetaError::invalid(format!(
                "condemn 1 to {MAX_CONDEMN} segments, never segment 0 (a file's own log)"
            )));
        }
        for s in segs {
            if !self.condemned.contains_key(s) {
                self.condemned.insert(*s, now_ms);
            }
        }
        Ok(Reply::default())
    }

    /// Rows arrived from another partition (a move's load, a rename's install).
    pub(super) fn rows_arrived(&mut self) {
        *self.segment_arrivals += 1;
    }

    /// Refuses extents in a condemned segment: the mount appends them again elsewhere.
    pub(super) fn check_condemned(&self, path: &str, extents: &[Extent]) -> Result<(), MetaError> {
        match extents.iter().find(|e| self.condemned.contains_key(&e.seg)) {
            Some(e) => Err(MetaError::new(
                ErrorKind::Sealed,
                format!(
                    "{path}: segment {:016x} is being collected: write the bytes to another",
                    e.seg
                ),
            )),
            None => Ok(()),
        }
    }
}

/// A cell's type for the arrivals (see [`ARRIVALS`]).
pub(super) type Arrivals = Cell<u64>;
