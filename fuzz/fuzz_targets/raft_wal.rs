//! A master's Raft log files from arbitrary bytes: opening the log (replaying its records) and
//! reading every entry back (log id and vote JSON, entry payload JSON). Never panics: bad bytes
//! are an error or a shorter log.
#![no_main]
use cairn_master::store::open_db;
use cairn_master::wal::{DIR, LogStore};
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// A master directory with a log of one file, made once; each input replaces that file.
fn setup() -> &'static (PathBuf, PathBuf) {
    static DIRS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    DIRS.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("cairn-fuzz-raft-wal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let db = open_db(&dir.join("master.redb")).unwrap();
        drop(LogStore::open(&dir, &db, Duration::ZERO).unwrap());
        let file = std::fs::read_dir(dir.join(DIR))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "wal"))
            .expect("a new log has one file");
        (dir, file)
    })
}

fuzz_target!(|data: &[u8]| {
    let (dir, file) = setup();
    // Opening may add a file (the next open chunk); start each input from one file.
    for e in std::fs::read_dir(dir.join(DIR)).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|e| e == "wal") && &p != file {
            std::fs::remove_file(p).unwrap();
        }
    }
    std::fs::write(file, data).unwrap();
    let db = open_db(&dir.join("master.redb")).unwrap();
    if let Ok(log) = LogStore::open(dir, &db, Duration::ZERO) {
        let _ = log.entries(0, u64::MAX);
    }
});
