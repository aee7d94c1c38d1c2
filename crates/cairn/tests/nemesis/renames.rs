//! Renames across partitions under the faults (the masters' two-phase commit through the
//! root, crates/master/src/state/txn.rs): files, and a directory holding files, go back and
//! forth between a scenario's directory in the root partition and one in partition 1 while
//! masters are killed. A rename that failed may have happened (its reply lost), so the
//! renamer looks where the file or directory is before the next one. At the end each is in
//! exactly one place with its bytes.

use crate::common::bytes;
use cairn_client::{Client, CreateOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Files each scenario renames.
pub const RENAMED: usize = 3;
/// Files in the directory each scenario renames (item `RENAMED`, `dir`).
const IN_DIR: usize = 2;
const LEN: usize = 20_000;

#[derive(Debug, Default)]
pub struct Renamed {
    pub renames: u64,
    pub errors: u64,
    /// Files found in neither place, in both, or with other bytes.
    pub lost: u64,
}

/// Where item `k` may be: file `r{k}`, or for `k == RENAMED` the directory `dir`.
fn places(a: &str, b: &str, k: usize) -> [String; 2] {
    match k {
        RENAMED => [format!("{a}/dir"), format!("{b}/dir")],
        _ => [format!("{a}/r{k}"), format!("{b}/r{k}")],
    }
}

/// The files of item `k` below its place `at`, with the seeds of their bytes.
fn files_of(at: &str, k: usize, seed: u64) -> Vec<(String, u64)> {
    match k {
        RENAMED => (0..IN_DIR)
            .map(|i| (format!("{at}/f{i}"), seed + 100 + i as u64))
            .collect(),
        _ => vec![(at.to_owned(), seed + k as u64)],
    }
}

/// Where item `k` is: 0 or 1, `None` for neither or both (asked until the masters answer).
/// Both or neither is asked again for a while: a rename whose driver was killed between the
/// destination's install and the source's removal shows in both places until the next
/// leader of the root finishes it (docs/partitions.md).
async fn whereis(c: &Client, p: &[String; 2]) -> Option<usize> {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match whereis_now(c, p).await {
            Some(i) => return Some(i),
            None if std::time::Instant::now() >= until => return None,
            None => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

async fn whereis_now(c: &Client, p: &[String; 2]) -> Option<usize> {
    let mut found = [false; 2];
    for (i, path) in p.iter().enumerate() {
        found[i] = loop {
            match c.stat(path).await {
                Ok(_) => break true,
                Err(cairn_client::Error::Meta(m)) if m.kind == cairn_rpc::ErrorKind::NotFound => {
                    break false;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
    }
    match found {
        [true, false] => Some(0),
        [false, true] => Some(1),
        _ => None,
    }
}

/// Renames `RENAMED` files between `a` and `b` until `stop`, then checks them and deletes
/// them.
pub async fn renamer(c: Client, a: String, b: String, seed: u64, stop: Arc<AtomicBool>) -> Renamed {
    let mut out = Renamed::default();
    let mut at = [0usize; RENAMED + 1];
    for k in 0..=RENAMED {
        for (path, s) in files_of(&places(&a, &b, k)[0], k, seed) {
            let opts = CreateOptions {
                parents: true,
                ..CreateOptions::default()
            };
            // `already exists`: this create's own first try, committed by a master that
            // stopped before answering (a create is not idempotent: docs/masters.md); the
            // file is empty and held by this client, which opens it again.
            let mut w = match c.create(&path, opts).await {
                Ok(w) => w,
                Err(cairn_client::Error::Meta(e))
                    if e.kind == cairn_rpc::ErrorKind::AlreadyExists =>
                {
                    c.open_append(&path)
                        .await
                        .unwrap_or_else(|e| panic!("{path}: opening again: {e}"))
                }
                Err(e) => panic!("{path}: {e}"),
            };
            w.append(&bytes(s, 0, LEN)).await.unwrap();
            w.close().await.unwrap();
        }
    }
    c.mkdir(&b, true)
        .await
        .unwrap_or_else(|e| panic!("{b}: {e}"));
    let mut k = 0;
    while !stop.load(Ordering::Relaxed) {
        let p = places(&a, &b, k);
        match c.rename(&p[at[k]], &p[1 - at[k]]).await {
            Ok(()) => {
                out.renames += 1;
                at[k] = 1 - at[k];
            }
            Err(_) => {
                out.errors += 1;
                match whereis(&c, &p).await {
                    Some(i) => at[k] = i,
                    None => {
                        eprintln!("  RENAMED {} / {}: in neither place or both", p[0], p[1]);
                        out.lost += 1;
                        return out;
                    }
                }
            }
        }
        k = (k + 1) % (RENAMED + 1);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    for (k, was) in at.iter().enumerate() {
        let p = places(&a, &b, k);
        let Some(i) = whereis(&c, &p).await else {
            eprintln!("  RENAMED {} / {}: in neither place or both", p[0], p[1]);
            out.lost += 1;
            continue;
        };
        if i != *was {
            eprintln!(
                "  RENAMED {}: at {} after its last answered rename",
                p[*was], p[i]
            );
        }
        for (path, s) in files_of(&p[i], k, seed) {
            match c.read(&path, 0, LEN).await {
                Ok(got) if got == bytes(s, 0, LEN) => {}
                Ok(_) => {
                    eprintln!("  RENAMED {path}: other bytes");
                    out.lost += 1;
                }
                Err(e) => {
                    eprintln!("  RENAMED {path}: unreadable: {e}");
                    out.lost += 1;
                }
            }
            if k == RENAMED {
                let _ = c.delete(&path).await;
            }
        }
        let _ = c.delete(&p[i]).await;
    }
    out
}
