//! `cairn bench chunkstore` runs end to end on a small store: both operations, the floor and
//! the store taking turns in slices, and a report whose figures come from what ran.

use std::process::Command;

fn bench(dir: &std::path::Path, op: &str, slices: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["bench", "chunkstore", "--dir"])
        .arg(dir)
        .args([
            "--op",
            op,
            "--size",
            "64k",
            "--depth",
            "2",
            "--seconds",
            "0.6",
        ])
        .args(["--slices", slices, "--store-size", "64m", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[test]
fn chunkstore_bench_reports_floor_and_store_in_slices() {
    let dir = tempfile::tempdir().unwrap();
    for op in ["append", "read"] {
        let r = bench(dir.path(), op, "3");
        assert_eq!(r["op"], op);
        assert_eq!(r["errors"], 0, "{r}");
        let ops = r["ops"].as_u64().unwrap();
        assert!(ops > 0, "{r}");
        assert_eq!(r["slices"], 3);
        let per_slice: Vec<f64> = r["slice_ratios_ops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(per_slice.len(), 3, "{r}");
        assert!(per_slice.iter().all(|x| x.is_finite() && *x > 0.0), "{r}");
        // The ratio is the store's rate over the floor's, both summed over the slices.
        let (s, f) = (
            r["ops_per_s"].as_f64().unwrap(),
            r["floor_ops_per_s"].as_f64().unwrap(),
        );
        assert!(f > 0.0, "{r}");
        assert!(
            (r["ratio_ops"].as_f64().unwrap() - s / f).abs() < 1e-9,
            "{r}"
        );
        // Each side ran for about its share of the seconds, not the whole of them twice.
        let secs = r["seconds"].as_f64().unwrap();
        assert!((0.5..3.0).contains(&secs), "store ran {secs} s: {r}");
        assert!(r["p50_us"].as_f64().unwrap() > 0.0 && r["floor_p50_us"].as_f64().unwrap() > 0.0);
    }
    // One slice is the floor, then the store.
    let r = bench(dir.path(), "append", "1");
    assert_eq!(r["slice_ratios_ops"].as_array().unwrap().len(), 1, "{r}");
}

/// `cairn bench caps` runs its A/B in one process: both modes measured, no errors, and the
/// canary (an append without a capability while the checks are on) refused.
#[test]
fn caps_bench_measures_both_modes_and_its_canary_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["bench", "caps", "--dir"])
        .arg(dir.path())
        .args([
            "--depth",
            "4",
            "--seconds",
            "0.3",
            "--slices",
            "2",
            "--disk-size",
            "256m",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value =
        serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap();
    assert_eq!(r["errors"], 0, "{r}");
    assert_eq!(r["canary_refused"], true, "{r}");
    for mode in ["on", "off"] {
        assert!(
            r[mode]["deep_appends_per_sec"].as_f64().unwrap() > 0.0,
            "{r}"
        );
        assert!(r[mode]["depth1_p50_us"].as_f64().unwrap() > 0.0, "{r}");
    }
}
