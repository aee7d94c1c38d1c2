//! Handing freed memory back to the system.
//!
//! glibc's malloc keeps what a process frees in its per-thread arenas for reuse; a master's
//! bursts (a snapshot's commit, a follower's catch-up, a batch of large entries) left ~80 MiB
//! resident above its live heap, whose caches are bounded (BENCHMARKS.md "Where a master's
//! memory goes"). [`spawn_trimmer`] asks malloc to return the free pages of every arena every
//! [`TRIM_EVERY`].

use std::time::{Duration, Instant};

/// How often [`spawn_trimmer`] trims.
pub const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Trims the heap every `every` until the returned task is aborted; the time each trim took is
/// `cairn_master_heap_trim_seconds`.
pub fn spawn_trimmer(every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let took = tokio::task::spawn_blocking(|| {
                let start = Instant::now();
                trim();
                start.elapsed()
            })
            .await;
            if let Ok(took) = took {
                metrics::histogram!("cairn_master_heap_trim_seconds").record(took.as_secs_f64());
            }
        }
    })
}

/// Returns the free memory of every malloc arena to the system (glibc's `malloc_trim`, which
/// since 2.8 also releases whole free pages inside an arena, not only its top).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim takes no pointers and only walks malloc's own arenas under their locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}
