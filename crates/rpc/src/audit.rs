//! Audit logs (docs/security.md "Audit"): one JSON object per line — who did what to which
//! path or object, from where, and how it ended — written by a thread of its own to
//! `DIR/PREFIX.YYYY-MM-DD.jsonl`, a new file each UTC day with the newest `keep` kept
//! (tracing-appender's rolling files), mode 0600 like every file a Cairn server makes.
//!
//! Callers never wait for the disk: records go through a bounded queue and are written in
//! batches; a record that finds the queue full is dropped and counted
//! (`cairn_audit_dropped_total`, and a warning). Lines are written within milliseconds but
//! not fsynced: a crash may lose the last few.

use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

/// Records queued at most before new ones are dropped.
const QUEUE: usize = 65_536;

/// An audit log, or none.
#[derive(Clone, Default)]
pub struct Audit {
    tx: Option<SyncSender<serde_json::Value>>,
}

impl std::fmt::Debug for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Audit({})", if self.is_on() { "on" } else { "off" })
    }
}

impl Audit {
    /// No audit log: records are discarded.
    pub fn off() -> Self {
        Self::default()
    }

    /// Opens (creating) `dir` and starts the writer thread.
    ///
    /// # Errors
    /// The directory cannot be made or its newest file opened.
    pub fn open(dir: &Path, prefix: &str, keep: usize) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let w = tracing_appender::rolling::RollingFileAppender::builder()
            .rotation(tracing_appender::rolling::Rotation::DAILY)
            .filename_prefix(prefix)
            .filename_suffix("jsonl")
            .max_log_files(keep.max(1))
            .build(dir)
            .map_err(std::io::Error::other)?;
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        std::thread::Builder::new()
            .name(format!("audit-{prefix}"))
            .spawn(move || write_all(w, rx))?;
        Ok(Self { tx: Some(tx) })
    }

    pub fn is_on(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues `record` (a JSON object), adding its `time` (RFC 3339, UTC, ms).
    pub fn record(&self, mut record: serde_json::Value) {
        let Some(tx) = &self.tx else { return };
        if let Some(o) = record.as_object_mut() {
            o.insert("time".into(), now_rfc3339().into());
        }
        match tx.try_send(record) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                metrics::counter!("cairn_audit_dropped_total").increment(1);
                tracing::warn!("audit queue full: a record was dropped");
            }
            Err(TrySendError::Disconnected(_)) => {
                metrics::counter!("cairn_audit_dropped_total").increment(1);
            }
        }
    }
}

/// Now as RFC 3339 in UTC with milliseconds, always 24 characters
/// (`2026-11-27T04:15:00.120Z`).
fn now_rfc3339() -> String {
    static FORMAT: std::sync::LazyLock<Vec<time::format_description::BorrowedFormatItem>> =
        std::sync::LazyLock::new(|| {
            time::format_description::parse_borrowed::<2>(
                "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z",
            )
            .expect("a valid format")
        });
    time::OffsetDateTime::now_utc()
        .format(&FORMAT[..])
        .unwrap_or_default()
}

/// The writer thread: batches what is queued, one write and flush per batch.
fn write_all(mut w: impl std::io::Write, rx: Receiver<serde_json::Value>) {
    let mut buf = Vec::with_capacity(64 << 10);
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(r) = next {
            if serde_json::to_writer(&mut buf, &r).is_ok() {
                buf.push(b'\n');
            }
            next = if buf.len() < 1 << 20 {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        if let Err(e) = w.write_all(&buf).and_then(|()| w.flush()) {
            tracing::warn!(error = %e, "audit log write failed");
        }
        buf.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_json_lines_with_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let a = Audit::open(dir.path(), "audit", 3).unwrap();
        for i in 0..100 {
            a.record(serde_json::json!({"call": "Create", "n": i}));
        }
        Audit::off().record(serde_json::json!({"ignored": true}));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let files: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            assert_eq!(files.len(), 1, "{files:?}");
            let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                name.starts_with("audit.") && name.ends_with(".jsonl"),
                "{name}"
            );
            let text = std::fs::read_to_string(&files[0]).unwrap();
            let lines: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            if lines.len() == 100 {
                for (i, l) in lines.iter().enumerate() {
                    assert_eq!(l["n"], i);
                    let t = l["time"].as_str().unwrap();
                    assert!(t.ends_with('Z') && t.len() == 24, "{t}");
                }
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} lines",
                lines.len()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
