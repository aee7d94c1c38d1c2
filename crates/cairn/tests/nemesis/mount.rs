//! The nemesis's file-service workload: a `cairn mount` process, and a writer that creates,
//! writes, fsyncs, closes, renames, truncates, deletes and reads files through the kernel,
//! checked against a model of what each name may hold — what fsync, close and the calls the
//! masters answer at once (create, truncate, rename, unlink) made durable, and the writes
//! since, any prefix of which a killed mount may have flushed (a flush takes all of a file's
//! dirty ranges at once: docs/files.md).

use super::*;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::IntoRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::AtomicU64;

/// Names the writer uses in its scenario's directory.
const FS_NAMES: usize = 6;
/// Files stay below this many bytes.
const FS_MAX: u64 = 96 << 10;

fn mounted(dir: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == dir.to_str() && l.contains(" - fuse"))
}

/// The `cairn mount` process the scenarios' file writers use.
pub(super) struct MountSvc {
    pub(super) dir: PathBuf,
    masters: Vec<String>,
    child: Option<Child>,
    /// Bumped at every start and every kill, so odd while a mount serves and even while none
    /// does: what a name was known to hold before may have been lost with the previous
    /// mount's unflushed writes, and what a read finds while none serves is not the file
    /// system's (between `cairn mount` clearing the dead mount and mounting, the directory
    /// beneath answers: every name absent — seed 62, scenario 160).
    pub(super) generation: Arc<AtomicU64>,
}

impl MountSvc {
    pub(super) fn start(dir: &Path, masters: &[String]) -> Self {
        let mut m = Self {
            dir: dir.to_owned(),
            masters: masters.to_vec(),
            child: None,
            generation: Arc::new(AtomicU64::new(0)),
        };
        m.start_proc();
        m
    }

    /// Starts the mount process and waits until the directory answers (a dead mount left
    /// there is cleared by `cairn mount` first).
    pub(super) fn start_proc(&mut self) {
        assert!(self.child.is_none(), "the mount is running");
        let _ = std::fs::create_dir(&self.dir);
        let child = common::cairn()
            .args(["mount", "--cluster", &self.masters.join(",")])
            .arg(&self.dir)
            .env(
                "CAIRN_LOG",
                std::env::var("CAIRN_TEST_LOG").unwrap_or("error".into()) + ",fuser=error",
            )
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start cairn mount");
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(60);
        while !(mounted(&self.dir) && std::fs::read_dir(&self.dir).is_ok()) {
            assert!(
                Instant::now() < until,
                "{} never mounted again",
                self.dir.display()
            );
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("cairn mount {} exited {st}", self.dir.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// SIGKILL: its unflushed writes are lost; the directory answers ENOTCONN until the next
    /// start.
    pub(super) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            self.generation.fetch_add(1, Ordering::SeqCst);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for MountSvc {
    fn drop(&mut self) {
        self.kill();
        if let Ok(c) = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes()) {
            // SAFETY: a NUL-terminated path; a lazy unmount of our own mount.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// What one name may hold: the states since its last durable point, oldest first (`None`:
/// absent). When `exact`, the last is what the mount shows (it answered every call since).
#[derive(Debug, Clone)]
pub(super) struct FsName {
    pub(super) states: Vec<Option<Vec<u8>>>,
    pub(super) exact: bool,
    /// The mount's generation when the name was last learned or changed.
    pub(super) generation: u64,
}

impl FsName {
    fn last(&self) -> Option<&Vec<u8>> {
        self.states.last().and_then(Option::as_ref)
    }

    /// A call answered: `state` is durable (the masters committed it, or fsync or close
    /// flushed it).
    fn durable(&mut self, state: Option<Vec<u8>>) {
        self.states = vec![state];
        self.exact = true;
    }

    /// A call answered whose state a crash of the mount may lose (a write).
    fn pending(&mut self, state: Option<Vec<u8>>) {
        self.states.push(state);
    }

    /// A call that failed: it may or may not have happened.
    fn maybe(&mut self, state: Option<Vec<u8>>) {
        self.states.push(state);
        self.exact = false;
    }

    /// Checks what a read found and learns it. In the generation the name was last known in
    /// and `exact`, only the last state is allowed; else any of the states, and a read in a
    /// newer generation shows what the previous mount left durable. Returns whether the read
    /// was allowed (what it found is learned either way).
    pub(super) fn learn(&mut self, got: Option<Vec<u8>>, generation: u64) -> bool {
        let ok = if self.exact && self.generation == generation {
            self.states.last() == Some(&got)
        } else {
            match self.states.iter().rposition(|s| *s == got) {
                Some(i) if self.generation == generation => {
                    self.states.truncate(i + 1);
                    true
                }
                Some(_) => {
                    self.states = vec![got.clone()];
                    true
                }
                None => false,
            }
        };
        if !ok {
            self.states = vec![got];
        }
        self.exact = true;
        self.generation = generation;
        ok
    }
}

#[derive(Debug, Default)]
pub(super) struct FsSeen {
    pub(super) ops: u64,
    pub(super) errors: u64,
    /// fsyncs, fdatasyncs and closes answered (durable points).
    pub(super) synced: u64,
    /// Closes of new files answered before their flush (no durable point).
    pub(super) behind: u64,
    pub(super) checked: u64,
    pub(super) bad: u64,
    /// Renames by hard link whose link was answered.
    pub(super) linked: u64,
}

fn describe(s: &Option<Vec<u8>>) -> String {
    match s {
        None => "absent".into(),
        Some(b) => format!("{} bytes crc {:08x}", b.len(), crc32c::crc32c(b)),
    }
}

/// Checks what a read of name `i` found against the model, learns it, and counts it.
fn check(n: &mut FsName, i: usize, got: Option<Vec<u8>>, g: u64, seen: &mut FsSeen, when: &str) {
    seen.checked += 1;
    let want = n.states.clone();
    if !n.learn(got.clone(), g) {
        seen.bad += 1;
        eprintln!(
            "  FILE BAD f{i} {when}: read {}, allowed {:?}",
            describe(&got),
            want.iter().map(describe).collect::<Vec<_>>()
        );
        for w in &want {
            eprintln!("    against {}: {}", describe(w), differences(&got, w));
        }
    }
}

/// Where `got` differs from `want`: the first few byte ranges, and whether `got` holds zeros
/// there (a hole where data was) — what a bad read report needs to tell a lost extent from a
/// misplaced or stale one.
fn differences(got: &Option<Vec<u8>>, want: &Option<Vec<u8>>) -> String {
    let (Some(g), Some(w)) = (got, want) else {
        return "one is absent".into();
    };
    let mut out = Vec::new();
    let n = g.len().min(w.len());
    let mut i = 0;
    while i < n && out.len() < 6 {
        if g[i] == w[i] {
            i += 1;
            continue;
        }
        let start = i;
        while i < n && g[i] != w[i] {
            i += 1;
        }
        let zeros = g[start..i].iter().all(|&b| b == 0);
        out.push(format!(
            "[{start}, {i}){}",
            if zeros { " read as zeros" } else { "" }
        ));
    }
    if g.len() != w.len() {
        out.push(format!("lengths {} and {}", g.len(), w.len()));
    }
    if out.is_empty() {
        "equal".into()
    } else {
        out.join(", ")
    }
}

/// Reads `path` whole (`None`: absent); `Err` for any other failure.
fn read_name(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match File::open(path) {
        Ok(mut f) => {
            let mut v = Vec::new();
            f.read_to_end(&mut v)?;
            Ok(Some(v))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Closes `f` and says whether close(2) succeeded (a FUSE flush: the file's writes durable).
fn close(f: File) -> bool {
    // SAFETY: the descriptor is ours alone (into_raw_fd gave up the File's ownership).
    unsafe { libc::close(f.into_raw_fd()) == 0 }
}

/// The writer of one scenario (a thread): random operations on `FS_NAMES` names in `dir`
/// until `stop`; returns its model and the files it left open (to be dropped after the mount
/// is killed, so that the kill, not their close, decides what survives).
pub(super) fn fs_writer(
    dir: PathBuf,
    mut names: Vec<FsName>,
    generation: Arc<AtomicU64>,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> (Vec<FsName>, Vec<File>, FsSeen) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seen = FsSeen::default();
    let mut open: BTreeMap<usize, (File, u64)> = BTreeMap::new();
    // Names whose file this writer made and nothing has committed since (no fsync, truncate,
    // rename or unlink): a close answers before its flush (docs/files.md "A close that does
    // not wait"), so it is no durable point.
    let mut behind: BTreeSet<usize> = BTreeSet::new();
    // A name to unlink before anything else: one of two names of one file (a rename by
    // link whose unlink failed, or a link that may have been made).
    let mut unlink_first: Option<usize> = None;
    let path = |i: usize| dir.join(format!("f{i}"));
    // CAIRN_NEMESIS_FS_TRACE=1: every operation and the model after it, on stderr (to replay
    // a bad read's history: the same seed gives the same operations until a call fails).
    let tracing = std::env::var("CAIRN_NEMESIS_FS_TRACE").is_ok_and(|v| v == "1");
    let mut step = 0u64;
    let mut trace = |names: &[FsName], i: usize, what: String| {
        if tracing {
            step += 1;
            let states: Vec<String> = names[i].states.iter().map(describe).collect();
            eprintln!("  fs {step}: f{i} {what} → {states:?}");
            if let Ok(to) = std::env::var("CAIRN_NEMESIS_FS_DUMP") {
                // Each state's bytes, to tell what a bad read holds.
                for (k, st) in names[i].states.iter().enumerate() {
                    if let Some(b) = st {
                        let _ = std::fs::write(format!("{to}/{step}-f{i}-{k}.bin"), b);
                    }
                }
            }
        }
    };
    while !stop.load(Ordering::Relaxed) {
        let g = generation.load(Ordering::SeqCst);
        // Files opened under an older mount are dead.
        open.retain(|_, (_, fg)| *fg == g);
        if g.is_multiple_of(2) {
            // No mount serves: nothing to do until one does.
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        // A name left tied to another by a hard link goes first (see the rename by link).
        if let Some(k) = unlink_first {
            match std::fs::remove_file(path(k)) {
                Ok(()) => {}
                // A retried call may find it done.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(_) => {
                    seen.errors += 1;
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            }
            names[k].durable(None);
            unlink_first = None;
            trace(&names, k, "unlinked (a rename by link)".into());
            continue;
        }
        let i = rng.random_range(0..FS_NAMES);
        // Known first: after a failed call or a new mount, what is there is read and checked.
        if !names[i].exact || names[i].generation != g {
            match read_name(&path(i)) {
                Ok(got) if generation.load(Ordering::SeqCst) == g => {
                    check(&mut names[i], i, got, g, &mut seen, "while running");
                }
                _ => {
                    seen.errors += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            continue;
        }
        seen.ops += 1;
        let op = rng.random_range(0..70);
        match op {
            // Write (creating the file when absent).
            0..=29 => {
                if names[i].last().is_none() {
                    match OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(path(i))
                    {
                        Ok(f) => {
                            // Made, but not durable yet: in a directory the mount made a
                            // moment ago the create answers before the masters make the
                            // file (docs/files.md "A create that does not wait"), so the
                            // mount killed now may leave no file.
                            names[i].pending(Some(Vec::new()));
                            open.insert(i, (f, g));
                            behind.insert(i);
                        }
                        Err(_) => {
                            seen.errors += 1;
                            names[i].maybe(Some(Vec::new()));
                            continue;
                        }
                    }
                }
                if let std::collections::btree_map::Entry::Vacant(e) = open.entry(i) {
                    match OpenOptions::new().write(true).open(path(i)) {
                        Ok(f) => {
                            e.insert((f, g));
                        }
                        Err(_) => {
                            seen.errors += 1;
                            names[i].exact = false;
                            continue;
                        }
                    }
                }
                let len = rng.random_range(1..=16_384u64);
                let off = rng.random_range(0..=FS_MAX - len);
                let mut data = vec![0u8; len as usize];
                rng.fill(&mut data[..]);
                let before = names[i].last().cloned().unwrap_or_default();
                let with = |upto: u64| {
                    let mut next = before.clone();
                    if next.len() < upto as usize {
                        next.resize(upto as usize, 0);
                    }
                    next[off as usize..upto as usize]
                        .copy_from_slice(&data[..(upto - off) as usize]);
                    Some(next)
                };
                // The kernel may send one write(2) as several FUSE writes (a write that starts
                // inside a page not in its cache ends its first request at the page's end),
                // and a flush between them (another descriptor's close, a late release) makes
                // the first part durable alone: after a crash, the write may show torn at a
                // page boundary, in offset order — as on a local file system, where a crash
                // before fsync leaves any prefix of the pages written (nemesis seed 62,
                // scenario 68).
                let torn: Vec<u64> = (off / 4096 + 1..)
                    .map(|p| p * 4096)
                    .take_while(|&b| b < off + len)
                    .collect();
                match open[&i].0.write_all_at(&data, off) {
                    Ok(()) => {
                        for &b in &torn {
                            names[i].pending(with(b));
                        }
                        names[i].pending(with(off + len));
                    }
                    Err(_) => {
                        seen.errors += 1;
                        for &b in &torn {
                            names[i].maybe(with(b));
                        }
                        names[i].maybe(with(off + len));
                        open.remove(&i);
                    }
                }
                trace(&names, i, format!("write [{off}, {})", off + len));
            }
            // fsync or fdatasync.
            30..=39 => {
                let Some((f, _)) = open.get(&i) else { continue };
                let r = if op < 35 { f.sync_all() } else { f.sync_data() };
                match r {
                    Ok(()) => {
                        seen.synced += 1;
                        let last = names[i].states.pop().expect("a state");
                        names[i].durable(last);
                        behind.remove(&i);
                    }
                    Err(_) => seen.errors += 1,
                }
                trace(&names, i, "fsync".into());
            }
            // close.
            40..=47 => {
                let Some((f, _)) = open.remove(&i) else {
                    continue;
                };
                if !close(f) {
                    seen.errors += 1;
                } else if behind.contains(&i) {
                    // Answered before its flush: what it wrote stays pending.
                    seen.behind += 1;
                } else {
                    seen.synced += 1;
                    let last = names[i].states.pop().expect("a state");
                    names[i].durable(last);
                }
                trace(&names, i, "close".into());
            }
            // rename over another name (closing both first: an open file whose name is
            // replaced is not served yet, docs/files.md).
            48..=53 => {
                let j = (i + rng.random_range(1..FS_NAMES)) % FS_NAMES;
                if names[i].last().is_none() || !names[j].exact || names[j].generation != g {
                    continue;
                }
                let mut closed = true;
                for k in [i, j] {
                    if let Some((f, _)) = open.remove(&k) {
                        if !close(f) {
                            closed = false;
                        } else if !behind.contains(&k) {
                            let last = names[k].states.pop().expect("a state");
                            names[k].durable(last);
                        }
                    }
                }
                if !closed {
                    seen.errors += 1;
                    names[i].exact = false;
                    names[j].exact = false;
                    continue;
                }
                let from = names[i].states.clone();
                if names[j].last().is_none() && rng.random_bool(0.5) {
                    // A rename by hard link (`ln f{i} f{j} && rm f{i}`): the link, answered
                    // by the masters, is durable; until f{i} is unlinked nothing else runs,
                    // so no write lands on a file the model holds under one name only.
                    match std::fs::hard_link(path(i), path(j)) {
                        Ok(()) => {
                            seen.linked += 1;
                            names[j].states = from;
                            unlink_first = Some(i);
                        }
                        Err(_) => {
                            seen.errors += 1;
                            unlink_first = Some(j);
                        }
                    }
                    trace(&names, j, format!("linked to f{i}"));
                    continue;
                }
                match std::fs::rename(path(i), path(j)) {
                    Ok(()) => {
                        // The mount commits a file's bytes before its rename: what a
                        // close left pending is durable now.
                        names[j].durable(from.last().cloned().expect("a state"));
                        names[i].durable(None);
                        behind.remove(&i);
                        behind.remove(&j);
                    }
                    Err(_) => {
                        // Done or not (a retried call may find it done).
                        seen.errors += 1;
                        names[j].states.extend(from);
                        names[j].exact = false;
                        names[i].maybe(None);
                    }
                }
                trace(&names, j, format!("renamed from f{i}"));
            }
            // unlink.
            54..=57 => {
                if names[i].last().is_none() {
                    continue;
                }
                if let Some((f, _)) = open.remove(&i)
                    && !close(f)
                {
                    seen.errors += 1;
                    names[i].exact = false;
                    continue;
                }
                match std::fs::remove_file(path(i)) {
                    Ok(()) => {
                        names[i].durable(None);
                        behind.remove(&i);
                    }
                    Err(_) => {
                        seen.errors += 1;
                        names[i].maybe(None);
                    }
                }
                trace(&names, i, "unlink".into());
            }
            // truncate (the mount flushes, then the masters commit the size: durable).
            58..=61 => {
                let Some(last) = names[i].last().cloned() else {
                    continue;
                };
                let size = rng.random_range(0..=FS_MAX);
                let mut next = last;
                next.resize(size as usize, 0);
                let r = match open.get(&i) {
                    Some((f, _)) => f.set_len(size),
                    None => OpenOptions::new()
                        .write(true)
                        .open(path(i))
                        .and_then(|f| f.set_len(size)),
                };
                match r {
                    Ok(()) => {
                        // Flushed first, then the size committed.
                        names[i].durable(Some(next));
                        behind.remove(&i);
                    }
                    Err(_) => {
                        seen.errors += 1;
                        names[i].maybe(Some(next));
                        open.remove(&i);
                    }
                }
                trace(&names, i, format!("truncate to {size}"));
            }
            // A read through a new open: exactly what the mount last answered.
            _ => match read_name(&path(i)) {
                Ok(got) if generation.load(Ordering::SeqCst) == g => {
                    check(&mut names[i], i, got, g, &mut seen, "while running");
                }
                _ => {
                    seen.errors += 1;
                    names[i].exact = false;
                }
            },
        }
    }
    let files = open.into_values().map(|(f, _)| f).collect();
    (names, files, seen)
}

/// A fresh model: every name absent.
pub(super) fn fs_names(generation: u64) -> Vec<FsName> {
    (0..FS_NAMES)
        .map(|_| FsName {
            states: vec![None],
            exact: true,
            generation,
        })
        .collect()
}

/// Every this many scenarios the end check kills the mount first (the others read through
/// the mount that ran). Not every one: a killed mount abandons its open segment, which
/// nothing reclaims yet (docs/files.md "Planned": segment collection) and which costs each of
/// its chunks' replicas a chunk-store allocation (~0.7 MiB); killed at every scenario's end,
/// the run's 256 MiB disks filled at scenario 149 (RELIABILITY.md, session 49).
pub(super) const FS_KILL_EVERY: u64 = 4;

/// The end of a scenario: when `kill`, the mount killed with the writer's files still open
/// (their unflushed writes lost) and started again; then every name read and checked against
/// what was durable (after a kill) or what the mount last answered, retrying for up to a
/// minute while the cluster recovers; the directory lists exactly the names that hold a file.
pub(super) fn fs_check_at_end(
    m: &mut MountSvc,
    kill: bool,
    dir: &Path,
    names: &mut [FsName],
    open: Vec<File>,
    seen: &mut FsSeen,
) {
    // Without a kill they are closed after the check: until then their writes are the
    // mount's to show.
    let mut open = Some(open);
    if kill {
        m.kill();
        drop(open.take());
        m.start_proc();
    }
    let g = m.generation.load(Ordering::SeqCst);
    for (i, n) in names.iter_mut().enumerate() {
        let p = dir.join(format!("f{i}"));
        let until = Instant::now() + Duration::from_secs(60);
        let got = loop {
            match read_name(&p) {
                Ok(got) => break got,
                Err(e) if Instant::now() > until => {
                    eprintln!("  FILE UNREADABLE f{i} at the end (mount killed: {kill}): {e}");
                    seen.bad += 1;
                    break None;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(300)),
            }
        };
        let when = format!("at the end (mount killed: {kill})");
        check(n, i, got, g, seen, &when);
    }
    let mut listed: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    listed.sort();
    let want: Vec<String> = (0..names.len())
        .filter(|&i| names[i].last().is_some())
        .map(|i| format!("f{i}"))
        .collect();
    if listed != want {
        eprintln!("  FILE DIRECTORY lists {listed:?}, files {want:?}");
        seen.bad += 1;
    }
    drop(open);
}

/// Canary for the model: after a kill only what a durable point or a later write left is
/// allowed; while the mount lives only its last answer.
#[test]
fn the_file_checker_refuses_what_no_durable_point_allows() {
    let mut n = FsName {
        states: vec![None],
        exact: true,
        generation: 1,
    };
    n.durable(Some(b"a".to_vec()));
    n.pending(Some(b"ab".to_vec()));
    n.pending(Some(b"abc".to_vec()));
    // Same mount: only the last.
    assert!(!n.clone().learn(Some(b"ab".to_vec()), 1));
    assert!(n.clone().learn(Some(b"abc".to_vec()), 1));
    // After a kill: the durable state or any prefix of the writes since, nothing else.
    assert!(n.clone().learn(Some(b"a".to_vec()), 2));
    assert!(n.clone().learn(Some(b"ab".to_vec()), 2));
    assert!(!n.clone().learn(None, 2));
    assert!(!n.clone().learn(Some(b"x".to_vec()), 2));
    // Learned in the new mount: that is durable now.
    let mut m = n.clone();
    assert!(m.learn(Some(b"ab".to_vec()), 2));
    assert!(!m.learn(Some(b"abc".to_vec()), 3));
    // A write torn at a page boundary: one of the states after a kill (the writer pushes
    // each torn prefix before the whole write), never in the same mount.
    let mut t = n.clone();
    t.pending(Some(b"abcT".to_vec()));
    t.pending(Some(b"abcTT".to_vec()));
    assert!(t.clone().learn(Some(b"abcT".to_vec()), 2));
    assert!(!t.clone().learn(Some(b"abcT".to_vec()), 1));
    assert!(t.clone().learn(Some(b"abcTT".to_vec()), 1));
    // A failed call: either way, then what is read is known.
    n.maybe(None);
    assert!(n.clone().learn(None, 1));
    assert!(n.clone().learn(Some(b"abc".to_vec()), 1));
    assert!(!n.learn(Some(b"zz".to_vec()), 1));
}

/// Replays a scenario's file writer on a local directory: `CAIRN_NEMESIS_FS_SEED` (the
/// scenario's seed, as its line prints it) for `CAIRN_NEMESIS_FS_MS` milliseconds; with
/// `CAIRN_NEMESIS_FS_TRACE=1` each operation and the model after it are printed — the same
/// operations a scenario ran until its first failed call.
#[test]
#[ignore = "a tool: replays a scenario's file writer"]
fn replay_the_file_writer() {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let seed = env("CAIRN_NEMESIS_FS_SEED").expect("CAIRN_NEMESIS_FS_SEED");
    let dir = tempfile::tempdir().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let ms = env("CAIRN_NEMESIS_FS_MS").unwrap_or(300);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(ms));
        s.store(true, Ordering::Relaxed);
    });
    // Generation 1: a mount serves (odd).
    let (_, _, seen) = fs_writer(
        dir.path().to_owned(),
        fs_names(1),
        Arc::new(AtomicU64::new(1)),
        seed,
        stop,
    );
    assert_eq!(seen.bad, 0);
}
