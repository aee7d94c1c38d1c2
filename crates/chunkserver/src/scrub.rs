//! The scrubber (docs/erasure-coding.md §5): reads every chunk of this server's stores
//! in the background, at a capped rate and behind foreground requests, so that bits that rot
//! on a disk are found before a reader needs them. The chunk store checks every unit's CRC32C
//! as it reads; the scrubber also checks the whole chunk's CRC against the one the store keeps
//! for its acknowledged bytes.
//!
//! A bad copy is not deleted here (every copy might be bad): it is named to the masters with
//! each heartbeat, who stop counting it as a good copy, so that repair copies the chunk from a
//! good one — onto this server if no other can take it — after which the bad copy is gone.

use crate::Chunkserver;
use crate::repair::Bucket;
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bytes read per request.
const PIECE: usize = 1 << 20;
/// How long a piece waits while foreground requests are being served.
const YIELD: Duration = Duration::from_millis(5);

#[derive(Debug, Clone, Copy)]
pub struct ScrubOptions {
    /// Bytes/s the scrubber reads at most; 0 turns it off.
    pub bytes_per_sec: u64,
    /// Pause between the end of a pass and the start of the next.
    pub every: Duration,
}

/// What the scrubber did, since the server started.
#[derive(Debug, Default)]
pub struct ScrubStats {
    pub bytes: AtomicU64,
    pub chunks: AtomicU64,
    pub passes: AtomicU64,
    /// Bad copies found (each counted once).
    pub corrupt: AtomicU64,
}

pub struct Scrubber {
    cs: Arc<Chunkserver>,
    opts: ScrubOptions,
    bucket: Bucket,
    pub stats: ScrubStats,
}

impl Scrubber {
    /// Starts the scrubber (unless its rate is 0).
    pub fn spawn(cs: Arc<Chunkserver>, opts: ScrubOptions) -> Arc<Self> {
        let s = Arc::new(Self {
            cs,
            opts,
            bucket: Bucket::new(opts.bytes_per_sec.max(1)),
            stats: ScrubStats::default(),
        });
        if opts.bytes_per_sec > 0 {
            tokio::spawn(s.clone().run());
        }
        s
    }

    async fn run(self: Arc<Self>) {
        loop {
            self.pass().await;
            self.stats.passes.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("cairn_chunkserver_scrub_passes_total").increment(1);
            tokio::time::sleep(self.opts.every).await;
        }
    }

    /// One pass over every chunk of every store.
    async fn pass(&self) {
        for store in self.cs.disks().stores() {
            for id in store.list() {
                if self.cs.corrupt().contains(&id) {
                    continue; // known bad: waiting for its repair
                }
                // Open chunks too (writers close files without sealing the copies): up to the
                // length acknowledged now, whose bytes never change.
                let Ok(st) = store.stat(id) else { continue };
                match self.check(store, id, st.length, st.crc32c).await {
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
        }
    }

    /// Reads chunk `id` whole: every unit's CRC, then the chunk's.
    async fn check(
        &self,
        store: &Arc<cairn_chunkstore::ChunkStore>,
        id: u64,
        length: u64,
        crc32c: u32,
    ) -> Result<(), Bad> {
        let mut off = 0u64;
        let mut crc = 0u32;
        while off < length {
            let n = (length - off).min(PIECE as u64) as usize;
            while self.cs.load() > 0 {
                tokio::time::sleep(YIELD).await;
            }
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
