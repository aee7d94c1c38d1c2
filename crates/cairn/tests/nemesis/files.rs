//! The nemesis's file workload: writers appending verification data, a reader checking
//! every byte it sees, and the final read-back of what was acknowledged.

use super::*;

/// What a writer had acknowledged and what it went through.
#[derive(Debug, Default)]
pub(super) struct Written {
    pub(super) acked: u64,
    pub(super) appends: u64,
    pub(super) errors: u64,
    /// Appends acknowledged at an offset other than the one expected.
    pub(super) misplaced: u64,
}

/// The policy of writer `w`'s file: the last writer's file is erasure-coded (`ec:2+1`, three
/// of the four chunkservers per group, tails of two copies), the one before it is converted
/// (`replicas:3,then:ec:2+1,lz4`, the conversion age is 0), the first has three replicas.
pub(super) fn policy_of(w: usize) -> CreateOptions {
    let text = match WRITERS - w {
        1 => "ec:2+1",
        2 => "replicas:3,then:ec:2+1,lz4",
        _ => return CreateOptions::default(),
    };
    CreateOptions {
        policy: Some(text.parse().expect("a policy")),
        ..CreateOptions::default()
    }
}

pub(super) async fn writer(
    c: Client,
    path: String,
    seed: u64,
    opts: CreateOptions,
    stop: Arc<AtomicBool>,
) -> Written {
    let mut out = Written::default();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut w = loop {
        match c.create(&path, opts.clone()).await {
            Ok(w) => break w,
            Err(e) => {
                eprintln!("  {path}: create failed: {e}");
                out.errors += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    while !stop.load(Ordering::Relaxed) {
        let len = rng.random_range(1..=16 << 10);
        let data = bytes(seed, out.acked, len);
        match w.append(&data).await {
            Ok(at) => {
                if at != out.acked {
                    out.misplaced += 1;
                }
                out.acked += len as u64;
                out.appends += 1;
            }
            Err(e) => {
                // Not a loss (nothing was acknowledged), but the writer noticed: count it and
                // go on with the file, as an application would.
                eprintln!("  {path}: append failed: {e}");
                out.errors += 1;
                drop(w);
                w = loop {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    match c.open_append(&path).await {
                        Ok(w) => break w,
                        Err(e) => eprintln!("  {path}: reopen failed: {e}"),
                    }
                };
                // Recovery keeps what MinCopy replicas hold: at least everything acknowledged,
                // perhaps the failed append's bytes too (the same bytes it would write).
                assert!(
                    w.len() >= out.acked,
                    "{path}: reopened at {} < acked {}",
                    w.len(),
                    out.acked
                );
                out.acked = w.len();
            }
        }
    }
    let mut closed = w.close().await.map(|_| ());
    let mut tries = 0;
    while let Err(e) = closed {
        tries += 1;
        assert!(tries < 50, "{path}: close keeps failing: {e}");
        eprintln!("  {path}: close failed: {e}");
        out.errors += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
        closed = match c.open_append(&path).await {
            Ok(w) => {
                assert!(w.len() >= out.acked, "{path}: reopened short");
                out.acked = w.len();
                w.close().await.map(|_| ())
            }
            Err(e) => Err(e),
        };
    }
    out
}

/// What the reader saw.
#[derive(Debug, Default)]
pub(super) struct Seen {
    pub(super) reads: u64,
    pub(super) bytes: u64,
    /// Reads that returned bytes other than the ones written at that position.
    pub(super) corrupt: u64,
    /// Furthest byte read, per file.
    pub(super) furthest: BTreeMap<String, u64>,
    pub(super) errors: u64,
}

pub(super) async fn reader(
    c: Client,
    files: Vec<(String, u64)>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> Seen {
    let mut out = Seen::default();
    let mut rng = StdRng::seed_from_u64(seed ^ 0xEEAD);
    while !stop.load(Ordering::Relaxed) {
        let (path, fseed) = &files[rng.random_range(0..files.len())];
        let Ok(st) = c.stat(path).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        if st.length == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let off = rng.random_range(0..st.length);
        let len = rng.random_range(1..=(64 << 10).min(st.length - off)) as usize;
        match c.read(path, off, len).await {
            Ok(got) => {
                out.reads += 1;
                out.bytes += got.len() as u64;
                if got != bytes(*fseed, off, len) {
                    eprintln!("  CORRUPT read of {path} [{off}, +{len})");
                    out.corrupt += 1;
                }
                let f = out.furthest.entry(path.clone()).or_default();
                *f = (*f).max(off + len as u64);
            }
            Err(cairn_client::Error::OutOfRange { .. }) => {}
            Err(_) => out.errors += 1,
        }
    }
    out
}

/// Reads `path` back and counts the acknowledged bytes that are missing or wrong.
pub(super) async fn verify(c: &Client, path: &str, seed: u64, acked: u64) -> u64 {
    let st = match c.stat(path).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("  LOSS {path}: stat failed: {e}");
            return acked;
        }
    };
    if st.length < acked {
        eprintln!(
            "  LOSS {path}: {} bytes readable, {acked} acknowledged",
            st.length
        );
        return acked - st.length;
    }
    let mut lost = 0;
    let mut off = 0u64;
    while off < acked {
        let len = (acked - off).min(4 << 20) as usize;
        match c.read(path, off, len).await {
            Ok(got) => {
                let want = bytes(seed, off, len);
                let bad = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                if bad > 0 {
                    eprintln!("  LOSS {path}: {bad} wrong bytes in [{off}, +{len})");
                }
                lost += bad as u64;
            }
            Err(e) => {
                eprintln!("  LOSS {path}: read [{off}, +{len}) failed: {e}");
                lost += len as u64;
            }
        }
        off += len as u64;
    }
    lost
}
