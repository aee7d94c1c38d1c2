//! What the masters' own checks say after each scenario: the metadata consistency check of
//! every partition and the comparison of the masters' copies (docs/operations.md).

use super::Totals;
use super::common::{self, Cluster};
use std::time::{Duration, Instant};

/// The masters' metadata consistency check (`cairn admin check`) of every partition, through
/// leader changes for up to 30 s; its problems are counted and printed.
pub(super) async fn check_metadata(cl: &Cluster, t: &mut Totals) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let reply = loop {
        match cl
            .masters()
            .send(cairn_rpc::pb::Empty {}, |mut c, r| async move {
                c.check_metadata(r).await
            })
            .await
        {
            // A partition whose leadership was still moving is reported unchecked (nothing
            // read): asked again, as a failed call is.
            Ok(r) if r.partitions.len() >= 2 && r.partitions.iter().all(|p| p.inodes > 0) => {
                break r;
            }
            Ok(r) if Instant::now() > deadline => {
                eprintln!("  METADATA CHECK read nothing of a partition within 30 s: {r:?}");
                t.metadata_problems += 1;
                return;
            }
            Err(e) if Instant::now() > deadline => {
                eprintln!("  METADATA CHECK could not run within 30 s: {e}");
                t.metadata_problems += 1;
                return;
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    };
    t.metadata_checks += 1;
    for p in &reply.partitions {
        for l in &p.listed {
            eprintln!("  METADATA partition {}: {l}", p.partition);
        }
        t.metadata_problems += p.problems;
    }
}

/// Compares the masters' copies of each partition (`cairn admin digests`): copies at one log
/// entry must be equal. Whether the masters stood at one entry together within the rounds
/// (background repairs and conversions still write) is counted, not required.
pub(super) async fn compare_copies(cl: &Cluster, t: &mut Totals) {
    let addrs = cl.master_addrs().join(",");
    let out = tokio::task::spawn_blocking(move || {
        common::cairn()
            .args([
                "admin",
                "--cluster",
                &addrs,
                "digests",
                "--json",
                "--rounds",
                "25",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        eprintln!(
            "  COPIES not compared: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        t.copies_uncompared += 1;
        return;
    };
    for p in v["partitions"].as_array().into_iter().flatten() {
        let diverged = p["diverged"].as_array().map_or(0, Vec::len);
        if diverged > 0 {
            eprintln!(
                "  COPIES DIVERGED partition {}: {}",
                p["partition"], p["diverged"]
            );
            t.copies_diverged += 1;
        } else if p["compared"] == true {
            t.copies_compared += 1;
        } else {
            t.copies_uncompared += 1;
        }
    }
}
