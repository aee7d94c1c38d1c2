//! Says where a scenario is stuck: each step the scenario awaits is named with [`step`], and a
//! thread prints the step once it has lasted [`STUCK_AFTER`], then every minute (a seed-62 run
//! hung at a scenario's end with nothing to tell which await it was in).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a step may last before the watchdog reports it.
const STUCK_AFTER: Duration = Duration::from_secs(300);

static STEP: Mutex<Option<(u64, &'static str, Instant)>> = Mutex::new(None);

/// Scenario `index` is now waiting for `what`.
pub fn step(index: u64, what: &'static str) {
    *STEP.lock().unwrap_or_else(|e| e.into_inner()) = Some((index, what, Instant::now()));
}

/// Starts the reporting thread (once per run).
pub fn start() {
    std::thread::spawn(|| {
        let mut reported: Option<(u64, &'static str, Instant)> = None;
        loop {
            std::thread::sleep(Duration::from_secs(5));
            let Some((index, what, since)) = *STEP.lock().unwrap_or_else(|e| e.into_inner()) else {
                continue;
            };
            let waited = since.elapsed();
            let last = reported
                .filter(|r| r.0 == index && r.1 == what && r.2 >= since)
                .map(|r| r.2);
            if waited >= STUCK_AFTER && last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
            {
                eprintln!(
                    "  STUCK: scenario {index} has waited {} s for {what}",
                    waited.as_secs()
                );
                reported = Some((index, what, Instant::now()));
            }
        }
    });
}
