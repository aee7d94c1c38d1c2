//! Renames across partitions under the faults (the masters' two-phase commit through the
//! root, crates/master/src/state/txn.rs): files go back and forth between a scenario's
//! directory in the root partition and one in partition 1 while masters are killed. A
//! rename that failed may have happened (its reply lost), so the renamer looks where the file
//! is before the next one. At the end each file is in exactly one place with its bytes.

use crate::common::bytes;
use cairn_client::{Client, CreateOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Files each scenario renames.
pub const RENAMED: usize = 3;
const LEN: usize = 20_000;

#[derive(Debug, Default)]
pub struct Renamed {
    pub renames: u64,
    pub errors: u64,
    /// Files found in neither place, in both, or with other bytes.
    pub lost: u64,
}

fn places(a: &str, b: &str, k: usize) -> [String; 2] {
    [format!("{a}/r{k}"), format!("{b}/r{k}")]
}

/// Where file `k` is: 0 or 1, `None` for neither or both (asked until the masters answer).
async fn whereis(c: &Client, p: &[String; 2]) -> Option<usize> {
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
    let mut at = [0usize; RENAMED];
    for k in 0..RENAMED {
        let path = &places(&a, &b, k)[0];
        let opts = CreateOptions {
            parents: true,
            ..CreateOptions::default()
        };
        let mut w = c
            .create(path, opts)
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        w.append(&bytes(seed + k as u64, 0, LEN)).await.unwrap();
        w.close().await.unwrap();
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
        k = (k + 1) % RENAMED;
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
        match c.read(&p[i], 0, LEN).await {
            Ok(got) if got == bytes(seed + k as u64, 0, LEN) => {}
            Ok(_) => {
                eprintln!("  RENAMED {}: other bytes", p[i]);
                out.lost += 1;
            }
            Err(e) => {
                eprintln!("  RENAMED {}: unreadable: {e}", p[i]);
                out.lost += 1;
            }
        }
        let _ = c.delete(&p[i]).await;
    }
    out
}
