//! A real process, killed with SIGKILL in the middle of concurrent appends to a real O_DIRECT
//! file, restarted, and checked against the log of acknowledged appends it printed.
//!
//! The test binary re-executes itself as the child (`CAIRN_SIGKILL_CHILD` set). The child
//! prints `ACK <chunk> <end>` after each append is acknowledged; every byte written is a
//! function of (chunk, offset), so the parent can check any byte that recovery returns.

mod common;
use cairn_chunkstore::{ChunkStore, Disk, Error, FileDisk, FormatOptions, OpenOptions};
use common::pattern;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WRITERS: u64 = 8;

fn open(path: &Path) -> ChunkStore {
    let disk: Arc<dyn Disk> = Arc::new(FileDisk::open(path).expect("open device file"));
    ChunkStore::open(disk, OpenOptions::default())
        .expect("recovery")
        .0
}

/// The child: append until killed. Writer `w` owns chunk ids `w * 1_000_000 + k`; when its
/// chunk is full it seals it, moves on to `k + 1` and deletes `k - 2` (announcing `DEL` first,
/// so that the parent stops expecting it before it can disappear).
fn child(path: &Path, seed: u64) {
    let store = Arc::new(open(path));
    let stdout = Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let say = move |line: String| writeln!(stdout.lock().unwrap(), "{line}").unwrap();
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            let say = say.clone();
            std::thread::spawn(move || {
                let base = w * 1_000_000;
                let mut id = store
                    .list()
                    .into_iter()
                    .filter(|&i| i / 1_000_000 == w)
                    .max()
                    .unwrap_or(base);
                let mut x = seed
                    .wrapping_mul(31)
                    .wrapping_add(w)
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    | 1;
                loop {
                    let len = match store.stat(id) {
                        Ok(s) if !s.sealed => s.length,
                        Ok(_) => {
                            id += 1;
                            continue;
                        }
                        Err(Error::NotFound { .. }) => {
                            store.create(id, 1).unwrap();
                            0
                        }
                        Err(e) => panic!("{e}"),
                    };
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // 800 KB: a large append (docs/formats/chunk-store.md §3.2).
                    let n = [1usize, 100, 4096, 5000, 65536, 300_000, 800_000][(x % 7) as usize];
                    if len + n as u64 > store.max_chunk_bytes() {
                        store.seal(id).unwrap();
                        if id >= base + 2 {
                            say(format!("DEL {}", id - 2));
                            let _ = store.delete(id - 2);
                        }
                        id += 1;
                        continue;
                    }
                    let end = store.append(id, len, &pattern(id, len, n)).unwrap();
                    say(format!("ACK {id} {end}"));
                }
            })
        })
        .collect();
    // The writers run until the process is killed; joining only keeps the process alive.
    #[allow(clippy::never_loop)]
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn sigkill_during_concurrent_appends_loses_no_acknowledged_byte() {
    if let Ok(path) = std::env::var("CAIRN_SIGKILL_CHILD") {
        let seed = std::env::var("CAIRN_SIGKILL_SEED")
            .unwrap()
            .parse()
            .unwrap();
        child(Path::new(&path), seed);
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path: PathBuf = dir.path().join("disk0");
    let disk = match FileDisk::create(&path, 192 << 20, true) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            eprintln!(
                "SKIP: O_DIRECT not supported under {}",
                dir.path().display()
            );
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let opts = FormatOptions {
        max_chunk_bytes: 4 << 20,
        ..Default::default()
    };
    ChunkStore::format(&disk, &opts).unwrap();
    drop(disk);

    let mut acked: HashMap<u64, u64> = HashMap::new();
    let mut total_acks = 0;
    for round in 0..5u64 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "sigkill_during_concurrent_appends_loses_no_acknowledged_byte",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("CAIRN_SIGKILL_CHILD", &path)
            .env("CAIRN_SIGKILL_SEED", round.to_string())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join(format!("child{round}.log"))).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        // Read acknowledgements on another thread; kill after a time that varies by round.
        let reader = std::thread::spawn(move || {
            let (mut acks, mut dels) = (Vec::new(), Vec::new());
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // libtest prints "test <name> ... " without a newline before the child's first
                // line, so a marker may follow other text.
                let line = match (line.rfind("ACK "), line.rfind("DEL ")) {
                    (Some(a), Some(d)) => &line[a.max(d)..],
                    (Some(p), None) | (None, Some(p)) => &line[p..],
                    (None, None) => continue,
                };
                if let Some(rest) = line.strip_prefix("ACK ") {
                    let mut it = rest.split(' ').map(|v| v.parse::<u64>().unwrap());
                    acks.push((it.next().unwrap(), it.next().unwrap()));
                } else if let Some(rest) = line.strip_prefix("DEL ") {
                    dels.push(rest.parse::<u64>().unwrap());
                }
            }
            (acks, dels)
        });
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(300 + 170 * round));
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let status = child.wait().unwrap();
        assert!(
            !status.success(),
            "the child must have been killed, not finished"
        );
        let (acks, dels) = reader.join().unwrap();
        if acks.is_empty() {
            let log = std::fs::read_to_string(dir.path().join(format!("child{round}.log")))
                .unwrap_or_default();
            panic!(
                "round {round}: the child acknowledged nothing in {:?}; its stderr:\n{log}",
                t0.elapsed()
            );
        }
        total_acks += acks.len();
        for (id, end) in acks {
            let e = acked.entry(id).or_default();
            *e = (*e).max(end);
        }
        for id in dels {
            acked.remove(&id);
        }

        // Recover and check: every acknowledged byte is there, and every byte served is right.
        let store = open(&path);
        for (id, end) in acked.clone() {
            let stat = store.stat(id).unwrap_or_else(|e| {
                let mine: Vec<_> = store.list().into_iter().filter(|i| i / 1_000_000 == id / 1_000_000).map(|i| store.stat(i).unwrap()).collect();
                panic!("round {round}: chunk {id} (acked to {end}) lost: {e}; the writer's chunks: {mine:?}")
            });
            assert!(
                stat.length >= end,
                "round {round}: chunk {id} has {} bytes, {end} were acknowledged",
                stat.length
            );
            let got = store.read(id, 0, stat.length as usize).unwrap();
            assert!(
                got == pattern(id, 0, stat.length as usize),
                "round {round}: chunk {id}: wrong bytes"
            );
            acked.insert(id, stat.length);
        }
        store.close().unwrap();
    }
    eprintln!("sigkill: 5 kills, {total_acks} acknowledged appends checked");
}
