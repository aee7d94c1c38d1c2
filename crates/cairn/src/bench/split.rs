//! `cairn bench split`: what moving a populated directory into a partition costs (issue 39;
//! docs/partitions.md "A split with copying") and what a rename across partitions costs,
//! each next to its floor in the same run: the copy's rows per second against the rate the
//! same rows were created at, the longest pause a writer under the directory saw against its
//! median create, and a rename across partitions against a rename inside one.
//!
//! Each round fills a new directory `/bench-split-R` with `--files` empty files (metadata
//! only, `--depth` at a time, 100 per directory), splits it into a new partition while a
//! prober creates files in it, renames one file back and forth inside the root and across
//! to the partition, then a directory of `--dir-files` files (whose rows the rename across
//! copies: the floor is the rate they were created at, and the same directory's rename
//! inside the root), then deletes every file and directory it made except the partition's
//! top: a partition's top cannot be deleted and there is no merge yet, so each round leaves
//! one empty directory and its partition behind (it says so at the end). Run it on a scratch
//! cluster.

use super::median;
use cairn_client::{Client, CreateOptions};
use cairn_rpc::pb;
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    cluster: crate::cluster::ClusterArgs,
    /// Files in each directory moved.
    #[arg(long, default_value_t = 20_000)]
    files: usize,
    /// Creates in flight while filling it.
    #[arg(long, default_value_t = 32)]
    depth: usize,
    /// Rounds (each a new directory and partition); medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Renames timed each way per round.
    #[arg(long, default_value_t = 200)]
    renames: usize,
    /// Files in the directory renamed across partitions (0: none).
    #[arg(long, default_value_t = 2_000)]
    dir_files: usize,
    /// Renames of that directory timed each way per round.
    #[arg(long, default_value_t = 3)]
    dir_renames: usize,
    /// Instead of splits: hash a flat directory of `--files` files over this many partitions
    /// each round (docs/partitions.md "Hashed directories"), against the same directory
    /// unhashed: its copy's rows per second against their creates, a whole listing and
    /// creates before and after.
    #[arg(long, default_value_t = 0)]
    hash_shards: u32,
    /// Print only JSON lines.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Round {
    round: usize,
    files: usize,
    /// Floor: the rows created per second filling the directory.
    create_rows_per_sec: f64,
    /// Seconds the split call took (the copy and its Raft writes).
    split_secs: f64,
    copy_rows_per_sec: f64,
    /// `copy_rows_per_sec / create_rows_per_sec`.
    copy_over_create: f64,
    /// The longest a create under the directory took while it moved, and the median.
    probe_max_ms: f64,
    probe_p50_ms: f64,
    /// Median rename latency inside the root and across partitions, and the ratio.
    rename_inside_us: f64,
    rename_across_us: f64,
    across_over_inside: f64,
    /// The directory of `dir_files` files: the rows created per second filling it (floor),
    /// its median rename inside the root and across partitions, and the rows the rename
    /// across carried per second.
    dir_create_rows_per_sec: f64,
    dir_rename_inside_ms: f64,
    dir_rename_across_ms: f64,
    dir_rows_per_sec: f64,
    dir_rows_over_create: f64,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let masters = a.cluster.masters()?;
    anyhow::ensure!(
        a.depth >= 1 && a.files >= 1,
        "--depth and --files must be at least 1"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let client = rt.block_on(Client::with_options(
        &masters,
        crate::cluster::client_options()?,
    ))?;
    // Its channels are made in the runtime.
    let admin = {
        let _in = rt.enter();
        crate::cluster::masters_client(&masters)?
    };
    if a.hash_shards >= 2 {
        let mut rounds = Vec::new();
        for r in 1..=a.rounds {
            let round = rt.block_on(hash_round(&client, &admin, &a, r))?;
            println!("{}", serde_json::to_string(&round)?);
            rounds.push(round);
        }
        let med = |f: fn(&HashRound) -> f64| median(rounds.iter().map(f).collect());
        println!(
            "{}",
            serde_json::json!({
                "median": true,
                "rounds": rounds.len(),
                "files": a.files,
                "shards": a.hash_shards,
                "create_rows_per_sec": med(|r| r.create_rows_per_sec),
                "copy_rows_per_sec": med(|r| r.copy_rows_per_sec),
                "copy_over_create": med(|r| r.copy_rows_per_sec / r.create_rows_per_sec),
                "list_plain_ms": med(|r| r.list_plain_ms),
                "list_hashed_ms": med(|r| r.list_hashed_ms),
                "list_hashed_over_plain": med(|r| r.list_hashed_ms / r.list_plain_ms),
                "create_after_rows_per_sec": med(|r| r.create_after_rows_per_sec),
                "create_after_over_before": med(|r| r.create_after_rows_per_sec / r.create_rows_per_sec),
            })
        );
        eprintln!(
            "left behind: {} empty hashed directories /bench-hash-R-{} and their partitions (a hashed directory cannot be deleted yet)",
            rounds.len(),
            std::process::id()
        );
        return Ok(());
    }
    let mut rounds = Vec::new();
    for r in 1..=a.rounds {
        let round = rt.block_on(one_round(&client, &admin, &a, r))?;
        if a.json {
            println!("{}", serde_json::to_string(&round)?);
        } else {
            println!(
                "round {r}: {} files; created {:.0} rows/s; split {:.2} s = {:.0} rows/s ({:.2}x the creates); \
                 a create under it waited up to {:.0} ms (p50 {:.1} ms); rename inside {:.0} us, across {:.0} us ({:.2}x); \
                 a directory of {} files renamed inside {:.1} ms, across {:.1} ms = {:.0} rows/s ({:.2}x the creates)",
                round.files,
                round.create_rows_per_sec,
                round.split_secs,
                round.copy_rows_per_sec,
                round.copy_over_create,
                round.probe_max_ms,
                round.probe_p50_ms,
                round.rename_inside_us,
                round.rename_across_us,
                round.across_over_inside,
                a.dir_files,
                round.dir_rename_inside_ms,
                round.dir_rename_across_ms,
                round.dir_rows_per_sec,
                round.dir_rows_over_create
            );
        }
        rounds.push(round);
    }
    let med = |f: fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    let summary = serde_json::json!({
        "median": true,
        "rounds": rounds.len(),
        "files": a.files,
        "create_rows_per_sec": med(|r| r.create_rows_per_sec),
        "copy_rows_per_sec": med(|r| r.copy_rows_per_sec),
        "copy_over_create": med(|r| r.copy_over_create),
        "probe_max_ms": med(|r| r.probe_max_ms),
        "rename_inside_us": med(|r| r.rename_inside_us),
        "rename_across_us": med(|r| r.rename_across_us),
        "across_over_inside": med(|r| r.across_over_inside),
        "dir_files": a.dir_files,
        "dir_rename_inside_ms": med(|r| r.dir_rename_inside_ms),
        "dir_rename_across_ms": med(|r| r.dir_rename_across_ms),
        "dir_rows_per_sec": med(|r| r.dir_rows_per_sec),
        "dir_rows_over_create": med(|r| r.dir_rows_over_create),
    });
    println!("{summary}");
    if !a.json {
        eprintln!(
            "left behind: {} empty partition top(s) /bench-split-R-{} (a partition's top cannot be deleted; no merge yet)",
            rounds.len(),
            std::process::id()
        );
    }
    Ok(())
}

async fn touch(c: &Client, path: &str) -> anyhow::Result<()> {
    try_touch(c, path)
        .await
        .map_err(|e| anyhow::anyhow!("{path}: {e}"))
}

async fn try_touch(c: &Client, path: &str) -> Result<(), cairn_client::Error> {
    let opts = CreateOptions {
        parents: true,
        ..CreateOptions::default()
    };
    c.create(path, opts).await?.close().await.map(|_| ())
}

/// Creates `path`, asking again while the masters answer `unavailable` (a client gives up
/// after its retry time, shorter than a large copy's freeze). An attempt that landed
/// before its answer was lost shows as `already exists` on the next one.
async fn touch_until_it_lands(c: &Client, path: &str) -> anyhow::Result<()> {
    use cairn_rpc::ErrorKind;
    loop {
        match try_touch(c, path).await {
            Ok(()) => return Ok(()),
            Err(cairn_client::Error::Meta(e)) if e.kind == ErrorKind::AlreadyExists => {
                return Ok(());
            }
            Err(cairn_client::Error::Meta(e)) if e.kind == ErrorKind::Unavailable => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => anyhow::bail!("{path}: {e}"),
        }
    }
}

#[derive(Serialize)]
struct HashRound {
    round: usize,
    files: usize,
    /// Floor: the directory's files created per second, unhashed.
    create_rows_per_sec: f64,
    /// The whole directory listed (pages of 1 000), unhashed and hashed.
    list_plain_ms: f64,
    list_hashed_ms: f64,
    /// The hash's copy: the split call's seconds and rows per second.
    hash_secs: f64,
    copy_rows_per_sec: f64,
    /// A quarter as many files again, created in the hashed directory.
    create_after_rows_per_sec: f64,
}

/// One round of `--hash-shards`: a flat directory filled, listed, hashed, listed, added to,
/// emptied.
async fn hash_round(
    c: &Client,
    admin: &cairn_rpc::Masters,
    a: &Args,
    r: usize,
) -> anyhow::Result<HashRound> {
    let top = format!("/bench-hash-{r}-{}", std::process::id());
    let fill = |names: Vec<String>| {
        let c = c.clone();
        async move {
            super::each(&Arc::new(names), a.depth, move |p| {
                let c = c.clone();
                async move { touch(&c, &p).await }
            })
            .await
        }
    };
    let before: Vec<String> = (0..a.files).map(|i| format!("{top}/f{i}")).collect();
    let fill_secs = fill(before.clone()).await?;
    let t = Instant::now();
    let n = c.list(&top).await?.len();
    let list_plain_ms = t.elapsed().as_secs_f64() * 1e3;
    anyhow::ensure!(n == a.files, "{top} lists {n} of {} files", a.files);
    let t = Instant::now();
    let req = pb::SplitRequest {
        path: top.clone(),
        shards: a.hash_shards,
        ..Default::default()
    };
    admin
        .send(req, |mut m, r| async move { m.split_partition(r).await })
        .await?;
    let hash_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let n = c.list(&top).await?.len();
    let list_hashed_ms = t.elapsed().as_secs_f64() * 1e3;
    anyhow::ensure!(n == a.files, "hashed {top} lists {n} of {} files", a.files);
    let after: Vec<String> = (0..a.files / 4).map(|i| format!("{top}/g{i}")).collect();
    let after_secs = fill(after.clone()).await?;
    for p in before.iter().chain(&after) {
        c.delete(p).await.map_err(|e| anyhow::anyhow!("{p}: {e}"))?;
    }
    Ok(HashRound {
        round: r,
        files: a.files,
        create_rows_per_sec: a.files as f64 / fill_secs,
        list_plain_ms,
        list_hashed_ms,
        hash_secs,
        copy_rows_per_sec: a.files as f64 / hash_secs,
        create_after_rows_per_sec: after.len() as f64 / after_secs,
    })
}

async fn one_round(
    c: &Client,
    admin: &cairn_rpc::Masters,
    a: &Args,
    r: usize,
) -> anyhow::Result<Round> {
    let top = format!("/bench-split-{r}-{}", std::process::id());
    let paths: Vec<String> = (0..a.files)
        .map(|i| format!("{top}/d{}/f{i}", i / 100))
        .collect();
    // Fill (the floor: the same rows created).
    let fill_secs = super::each(&Arc::new(paths.clone()), a.depth, {
        let c = c.clone();
        move |p| {
            let c = c.clone();
            async move { touch(&c, &p).await }
        }
    })
    .await?;
    let rows = (a.files + a.files.div_ceil(100)) as f64;
    let create_rows_per_sec = rows / fill_secs;
    // Split while a prober creates under the directory.
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (c, stop, top) = (c.clone(), stop.clone(), top.clone());
        tokio::spawn(async move {
            let mut took = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                touch_until_it_lands(&c, &format!("{top}/probe/p{i}")).await?;
                took.push(t.elapsed().as_secs_f64() * 1e3);
                i += 1;
            }
            Ok::<(Vec<f64>, usize), anyhow::Error>((took, i))
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let req = pb::SplitRequest {
        path: top.clone(),
        ..Default::default()
    };
    admin
        .send(req, |mut m, r| async move { m.split_partition(r).await })
        .await?;
    let split_secs = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let (took, probes) = prober.await??;
    let probe_max_ms = took.iter().copied().fold(0.0, f64::max);
    let probe_p50_ms = median(took);
    // Renames: one file inside the root, one across.
    touch(c, &format!("/bench-split-rename-{r}/a")).await?;
    let inside = renames(
        c,
        &format!("/bench-split-rename-{r}/a"),
        &format!("/bench-split-rename-{r}/b"),
        a.renames,
    )
    .await?;
    let across = renames(
        c,
        &format!("/bench-split-rename-{r}/a"),
        &format!("{top}/renamed"),
        a.renames,
    )
    .await?;
    // A directory of files: across (its rows copied) and inside the root.
    let dir = format!("/bench-split-rename-{r}/dir");
    let (dir_create, dir_inside, dir_across) = if a.dir_files > 0 {
        let files: Vec<String> = (0..a.dir_files).map(|i| format!("{dir}/f{i}")).collect();
        let secs = super::each(&Arc::new(files.clone()), a.depth, {
            let c = c.clone();
            move |p| {
                let c = c.clone();
                async move { touch(&c, &p).await }
            }
        })
        .await?;
        let inside = renames(
            c,
            &dir,
            &format!("/bench-split-rename-{r}/dir2"),
            a.dir_renames,
        )
        .await?;
        let across = renames(c, &dir, &format!("{top}/dir"), a.dir_renames).await?;
        for p in files.iter().chain([&dir]) {
            c.delete(p).await.map_err(|e| anyhow::anyhow!("{p}: {e}"))?;
        }
        ((a.dir_files + 1) as f64 / secs, inside / 1e3, across / 1e3)
    } else {
        (0.0, 0.0, 0.0)
    };
    let dir_rows_per_sec = match dir_across {
        0.0 => 0.0,
        ms => a.dir_files as f64 / (ms / 1e3),
    };
    for p in [
        format!("/bench-split-rename-{r}/a"),
        format!("/bench-split-rename-{r}"),
    ] {
        c.delete(&p)
            .await
            .map_err(|e| anyhow::anyhow!("{p}: {e}"))?;
    }
    // Clean up what this round wrote.
    for p in paths
        .iter()
        .cloned()
        .chain((0..probes).map(|i| format!("{top}/probe/p{i}")))
    {
        c.delete(&p)
            .await
            .map_err(|e| anyhow::anyhow!("{p}: {e}"))?;
    }
    // Then the directories below the partition's top (the top stays: see the module doc).
    for p in (0..a.files.div_ceil(100))
        .map(|d| format!("{top}/d{d}"))
        .chain([format!("{top}/probe")])
    {
        c.delete(&p)
            .await
            .map_err(|e| anyhow::anyhow!("{p}: {e}"))?;
    }
    Ok(Round {
        round: r,
        files: a.files,
        create_rows_per_sec,
        split_secs,
        copy_rows_per_sec: rows / split_secs,
        copy_over_create: rows / split_secs / create_rows_per_sec,
        probe_max_ms,
        probe_p50_ms,
        rename_inside_us: inside,
        rename_across_us: across,
        across_over_inside: across / inside,
        dir_create_rows_per_sec: dir_create,
        dir_rename_inside_ms: dir_inside,
        dir_rename_across_ms: dir_across,
        dir_rows_per_sec,
        dir_rows_over_create: match dir_create {
            0.0 => 0.0,
            c => dir_rows_per_sec / c,
        },
    })
}

/// Renames `a` to `b` and back `n` times each; the median latency in µs. Leaves it at `a`.
async fn renames(c: &Client, a: &str, b: &str, n: usize) -> anyhow::Result<f64> {
    let mut took = Vec::new();
    for _ in 0..n {
        for (from, to) in [(a, b), (b, a)] {
            let t = Instant::now();
            c.rename(from, to)
                .await
                .map_err(|e| anyhow::anyhow!("{from} → {to}: {e}"))?;
            took.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(median(took))
}
