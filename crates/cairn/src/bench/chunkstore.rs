//! `cairn bench chunkstore`: appends or reads against a chunk store on a real file, next to
//! the raw floor of the same I/O in the same run.

use super::{Latency, cpu_seconds, floor, histogram, loadavg, parse_size};
use anyhow::Context;
use cairn_chunkstore::buf::AlignedBuf;
use cairn_chunkstore::{ChunkStore, Disk, Durability, FileDisk, FormatOptions, OpenOptions};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Directory for the store and floor files (its filesystem is what is measured).
    #[arg(long)]
    dir: PathBuf,
    /// append or read.
    #[arg(long, default_value = "append", value_parser = ["append", "read"])]
    op: String,
    /// Bytes per operation: 4k, 64k, 1m, ...
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    size: u64,
    /// Operations in flight (one thread, and one chunk, each).
    #[arg(long, default_value_t = 1)]
    depth: usize,
    /// Seconds per measurement (the floor and the store each get this long).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Repeat floor + store this many times; one JSON line each.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// The floor and the store take turns in this many slices of `seconds / slices` each (the
    /// floor first in the 1st, 3rd, ... slice, the store first in the others), so that both see
    /// the same host: on a shared machine the disk's speed drifts within seconds. 1 runs the
    /// floor, then the store.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=1000))]
    slices: u32,
    /// Size of the store file.
    #[arg(long, default_value = "4g", value_parser = parse_size)]
    store_size: u64,
    /// sync (default) or none (benchmark-only: no fdatasync, neither in the store nor the floor).
    #[arg(long, default_value = "sync", value_parser = ["sync", "none"])]
    durability: String,
    /// Print only JSON lines.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    op: String,
    size: u64,
    depth: usize,
    durability: String,
    seconds: f64,
    ops: u64,
    errors: u64,
    ops_per_s: f64,
    mib_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
    floor: &'static str,
    floor_p50_us: f64,
    floor_p99_us: f64,
    floor_p999_us: f64,
    floor_ops_per_s: f64,
    floor_mib_per_s: f64,
    ratio_p50: f64,
    ratio_ops: f64,
    /// Slices the floor and store took turns in, and store ÷ floor ops/s of each
    /// floor-and-store pair of slices (their spread is the host's noise).
    slices: u32,
    slice_ratios_ops: Vec<f64>,
    /// CPU time (user + system, all threads) per operation, store and floor.
    cpu_us_per_op: f64,
    floor_cpu_us_per_op: f64,
    /// Appends per flush (group commit), store side.
    appends_per_flush: f64,
    /// Mean time an append spent queued, writing and waiting for its flush and commit
    /// (`Stats::append_*_ns`); appends only.
    append_queue_us: f64,
    append_write_us: f64,
    append_flush_us: f64,
    /// Of the appends, those laid out as large appends: written from the caller's buffer.
    large_appends: u64,
    loadavg: f64,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let size = usize::try_from(a.size)?;
    let write = a.op == "append";
    let durable = a.durability == "sync";
    anyhow::ensure!(
        a.depth >= 1 && a.depth <= 1024,
        "--depth must be in 1..=1024"
    );
    let store_path = a.dir.join("store.cairn");
    let disk = store_file(&store_path, a.store_size)?;
    ChunkStore::format(&*disk, &FormatOptions::default())?;
    let opts = OpenOptions {
        durability: if durable {
            Durability::Sync
        } else {
            Durability::None
        },
        ..OpenOptions::default()
    };
    let (store, _) = ChunkStore::open(disk.clone() as Arc<dyn Disk>, opts)?;
    let store = Arc::new(store);
    let prefilled = if write {
        Vec::new()
    } else {
        prefill(&store, a.store_size, a.depth)?
    };
    // The floor does the store's I/O on the store's own device locations: the store file's data
    // region, where the store puts its chunks (lowest extent first). Reads: the prefilled
    // chunks (the same bytes in the same cache state). Appends: its first GiB at most, written
    // only while the store holds no chunk (every store turn deletes its chunks when it ends).
    // Session 16 measured a separate file beside the store 13-18 % faster for the same writes.
    let bytes = if write {
        ((1u64 << 30).min(disk.capacity() - store.data_offset()) >> 20) << 20
    } else {
        let logical: u64 = prefilled.iter().map(|c| c.1).sum();
        // 4096-byte units carry 4016 data bytes.
        (logical / 4016 * 4096).max(1 << 20)
    };
    if !a.json {
        eprintln!(
            "store {} ({} MiB), floor in its data region; {} {} B x depth {} for {} s per run",
            store_path.display(),
            a.store_size >> 20,
            a.op,
            size,
            a.depth,
            a.seconds
        );
    }
    let floor = floor::Floor {
        disk: disk.clone(),
        range: (store.data_offset(), bytes),
        write,
        size,
        depth: a.depth,
        durable,
    };
    let slice = a.seconds / f64::from(a.slices);
    let mut floor_cursors = vec![0u64; a.depth];
    let mut read_cursors: Vec<(usize, u64)> = (0..a.depth)
        .map(|t| (t % prefilled.len().max(1), 0))
        .collect();
    for _ in 0..a.runs {
        let flushes0 = store.stats().flushes.load(Ordering::Relaxed);
        let appends0 = store.stats().appends.load(Ordering::Relaxed);
        let large0 = store.stats().large_appends.load(Ordering::Relaxed);
        let phases0 = phases(&store);
        let mut f = Totals::default();
        let mut st = Totals::default();
        let mut slice_ratios_ops = Vec::new();
        for k in 0..a.slices {
            let mut pair = [0.0f64; 2];
            for store_turn in [k % 2 == 1, k % 2 == 0] {
                let cpu0 = cpu_seconds();
                if store_turn {
                    let (ops, errors, secs, h) = if write {
                        appends(&store, size, a.depth, slice)?
                    } else {
                        reads(&store, &prefilled, &mut read_cursors, size, a.depth, slice)?
                    };
                    st.add(ops, secs, &h, cpu_seconds() - cpu0)?;
                    st.errors += errors;
                    pair[1] = ops as f64 / secs;
                } else {
                    anyhow::ensure!(
                        !write || store.list().is_empty(),
                        "the append floor writes where the store's chunks go: it needs an empty store"
                    );
                    let r = floor.run_from(slice, &mut floor_cursors)?;
                    f.add(r.ops, r.seconds, &r.hist, cpu_seconds() - cpu0)?;
                    pair[0] = r.ops as f64 / r.seconds;
                }
            }
            slice_ratios_ops.push(pair[1] / pair[0]);
        }
        let (ops, errors, secs) = (st.ops, st.errors, st.seconds);
        let lat = Latency::of(&st.hist);
        let flat = Latency::of(&f.hist);
        let flushes = store.stats().flushes.load(Ordering::Relaxed) - flushes0;
        let appends = store.stats().appends.load(Ordering::Relaxed) - appends0;
        let phase_us = |i: usize| {
            (phases(&store)[i] - phases0[i]) as f64 / 1e3 / appends as f64 // NaN without appends
        };
        let mib = |ops: u64, s: f64| ops as f64 * size as f64 / s / (1 << 20) as f64;
        let floor_ops_per_s = f.ops as f64 / f.seconds;
        let r = Report {
            op: a.op.clone(),
            size: a.size,
            depth: a.depth,
            durability: a.durability.clone(),
            seconds: secs,
            ops,
            errors,
            ops_per_s: ops as f64 / secs,
            mib_per_s: mib(ops, secs),
            p50_us: lat.p50_us,
            p99_us: lat.p99_us,
            p999_us: lat.p999_us,
            max_us: lat.max_us,
            floor: if write && durable {
                "raw O_DIRECT pwrite+fdatasync loop over the store file's data region"
            } else if write {
                "raw O_DIRECT pwrite loop over the store file's data region"
            } else {
                "raw O_DIRECT pread loop over the store file's data region"
            },
            floor_p50_us: flat.p50_us,
            floor_p99_us: flat.p99_us,
            floor_p999_us: flat.p999_us,
            floor_ops_per_s,
            floor_mib_per_s: mib(f.ops, f.seconds),
            ratio_p50: lat.p50_us / flat.p50_us,
            ratio_ops: (ops as f64 / secs) / floor_ops_per_s,
            slices: a.slices,
            slice_ratios_ops,
            cpu_us_per_op: st.cpu * 1e6 / ops.max(1) as f64,
            floor_cpu_us_per_op: f.cpu * 1e6 / f.ops.max(1) as f64,
            appends_per_flush: if flushes > 0 {
                appends as f64 / flushes as f64
            } else {
                f64::NAN
            },
            append_queue_us: phase_us(0),
            append_write_us: phase_us(1),
            append_flush_us: phase_us(2),
            large_appends: store.stats().large_appends.load(Ordering::Relaxed) - large0,
            loadavg: loadavg(),
        };
        println!("{}", serde_json::to_string(&r)?);
    }
    Arc::try_unwrap(store)
        .map_err(|_| anyhow::anyhow!("store still shared"))?
        .close()?;
    Ok(())
}

/// The store's append phase counters: queued, writing, flushing (nanoseconds, summed).
fn phases(store: &ChunkStore) -> [u64; 3] {
    let s = store.stats();
    [
        s.append_queue_ns.load(Ordering::Relaxed),
        s.append_write_ns.load(Ordering::Relaxed),
        s.append_flush_ns.load(Ordering::Relaxed),
    ]
}

/// One side's measurements summed over its slices.
struct Totals {
    ops: u64,
    errors: u64,
    seconds: f64,
    cpu: f64,
    hist: hdrhistogram::Histogram<u64>,
}

impl Default for Totals {
    fn default() -> Self {
        Self {
            ops: 0,
            errors: 0,
            seconds: 0.0,
            cpu: 0.0,
            hist: histogram(),
        }
    }
}

impl Totals {
    fn add(
        &mut self,
        ops: u64,
        seconds: f64,
        hist: &hdrhistogram::Histogram<u64>,
        cpu: f64,
    ) -> anyhow::Result<()> {
        self.ops += ops;
        self.seconds += seconds;
        self.cpu += cpu;
        self.hist.add(hist)?;
        Ok(())
    }
}

/// Opens the store file, creating and zero-filling it once (see `FileDisk::create`).
pub fn store_file(path: &Path, bytes: u64) -> anyhow::Result<Arc<FileDisk>> {
    if let Ok(m) = std::fs::metadata(path) {
        if m.len() == bytes {
            return Ok(Arc::new(FileDisk::open(path)?));
        }
        std::fs::remove_file(path)?;
    }
    Ok(Arc::new(
        FileDisk::create(path, bytes, true)
            .with_context(|| format!("creating {}", path.display()))?,
    ))
}

/// `depth` threads, each appending `size` bytes to its own chunk; a chunk that reaches its
/// share of the store is deleted and replaced, so any run length fits.
fn appends(
    store: &Arc<ChunkStore>,
    size: usize,
    depth: usize,
    seconds: f64,
) -> anyhow::Result<(u64, u64, f64, hdrhistogram::Histogram<u64>)> {
    let space = store.space();
    let data_bytes = space.extent_bytes * space.extents_total as u64 * 98 / 100;
    let cap = (store.max_chunk_bytes())
        .min(data_bytes / (2 * depth as u64))
        .max(size as u64);
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let t0 = Instant::now();
    let threads: Vec<_> = (0..depth)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut h = histogram();
                let mut errors = 0u64;
                // The bytes arrive in an aligned buffer, as a chunkserver receives them, so
                // a large append is written from it without a copy.
                let mut buf = AlignedBuf::zeroed(size.next_multiple_of(64 << 10));
                buf[..size].fill((t as u8) ^ 0x5a);
                let data = Arc::new(buf);
                let mut round = 0u64;
                let mut id = ((t as u64) << 32) | round;
                let _ = store.delete(id);
                store.create(id, 1).expect("create");
                let mut len = 0u64;
                while Instant::now() < deadline {
                    if len + size as u64 > cap {
                        let _ = store.delete(id);
                        round += 1;
                        id = ((t as u64) << 32) | round;
                        let _ = store.delete(id);
                        store.create(id, 1).expect("create");
                        len = 0;
                    }
                    let s = Instant::now();
                    match store.append_aligned(id, len, data.clone(), size) {
                        Ok(n) => {
                            h.record(s.elapsed().as_nanos() as u64).expect("in range");
                            len = n;
                        }
                        Err(_) => {
                            errors += 1;
                            len = store.stat(id).map(|s| s.length).unwrap_or(0);
                        }
                    }
                }
                let _ = store.delete(id);
                (h, errors)
            })
        })
        .collect();
    join_workers(threads, t0)
}

/// Writes sealed 64 MiB chunks (up to half the store, at most 2 GiB) to read back.
fn prefill(
    store: &Arc<ChunkStore>,
    store_size: u64,
    depth: usize,
) -> anyhow::Result<Vec<(u64, u64)>> {
    let total = (store_size / 2).min(2 << 30);
    let chunk = store.max_chunk_bytes();
    let n = (total / chunk).max(depth as u64);
    let piece = 4 << 20;
    let mut chunks = Vec::new();
    for c in 0..n {
        let id = (1 << 62) | c;
        store.create(id, 1)?;
        let data: Vec<u8> = (0..piece).map(|i| (i as u64 ^ c) as u8).collect();
        let mut len = 0;
        let mut pending = Vec::new();
        while len + piece as u64 <= chunk.min(total / n) {
            pending.push(store.append_pipelined(id, len, &data)?);
            len += piece as u64;
        }
        for p in pending {
            p.wait()?;
        }
        store.seal(id)?;
        chunks.push((id, len));
    }
    Ok(chunks)
}

/// `depth` threads reading `size` bytes sequentially through the sealed chunks
/// ([`ChunkStore::read_buf`]), thread `t` from `cursors[t]` (chunk index, offset), where it
/// leaves the position it would go on from.
fn reads(
    store: &Arc<ChunkStore>,
    chunks: &[(u64, u64)],
    cursors: &mut [(usize, u64)],
    size: usize,
    depth: usize,
    seconds: f64,
) -> anyhow::Result<(u64, u64, f64, hdrhistogram::Histogram<u64>)> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let t0 = Instant::now();
    let chunks = Arc::new(chunks.to_vec());
    let threads: Vec<_> = (0..depth)
        .map(|t| {
            let store = store.clone();
            let chunks = chunks.clone();
            let (mut c, mut off) = cursors[t];
            std::thread::spawn(move || {
                let mut h = histogram();
                let mut errors = 0;
                while Instant::now() < deadline {
                    let (id, len) = chunks[c];
                    if off + size as u64 > len {
                        c = (c + depth) % chunks.len();
                        off = 0;
                        continue;
                    }
                    let s = Instant::now();
                    // As a chunkserver reads: the verified bytes in the store's buffer, and
                    // their CRC for the reply (`read_into` adds a copy to the caller's).
                    match store.read_buf(id, off, size) {
                        Ok(r) => {
                            std::hint::black_box(r.crc32c());
                            drop(r);
                            h.record(s.elapsed().as_nanos() as u64).expect("in range");
                        }
                        Err(_) => errors += 1,
                    }
                    off += size as u64;
                }
                (h, errors, (c, off))
            })
        })
        .collect();
    let mut all = histogram();
    let mut errors = 0;
    for (t, cursor) in threads.into_iter().zip(cursors.iter_mut()) {
        let (h, e, at) = t
            .join()
            .map_err(|_| anyhow::anyhow!("benchmark worker panicked"))?;
        all.add(h)?;
        errors += e;
        *cursor = at;
    }
    Ok((all.len(), errors, t0.elapsed().as_secs_f64(), all))
}

/// Joins benchmark workers and merges what they measured: (ops, errors, seconds, latencies).
fn join_workers(
    threads: Vec<std::thread::JoinHandle<(hdrhistogram::Histogram<u64>, u64)>>,
    t0: Instant,
) -> anyhow::Result<(u64, u64, f64, hdrhistogram::Histogram<u64>)> {
    let mut all = histogram();
    let mut errors = 0;
    for t in threads {
        let (h, e) = t
            .join()
            .map_err(|_| anyhow::anyhow!("benchmark worker panicked"))?;
        all.add(h)?;
        errors += e;
    }
    Ok((all.len(), errors, t0.elapsed().as_secs_f64(), all))
}
