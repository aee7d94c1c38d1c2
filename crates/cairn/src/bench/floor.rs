//! The physical floor: the same I/O as the store does, with nothing around it.
//!
//! `depth` threads each own a slice of a byte range of a file and loop sequentially through it:
//! O_DIRECT `pwrite` of `size` bytes + `fdatasync`, or O_DIRECT `pread` of `size` bytes. The
//! chunk store benchmark runs both in the store file's own data region, on the device
//! locations the store's chunks use (reads: the very bytes, in the same cache state); the
//! cluster benchmarks write a preallocated, zero-filled file beside the chunkservers' stores.

use super::{Latency, histogram};
use cairn_chunkstore::buf::AlignedBuf;
use cairn_chunkstore::{Disk, FileDisk};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct FloorResult {
    pub ops: u64,
    pub seconds: f64,
    pub latency: Latency,
    /// The latencies `latency` summarises, for merging runs.
    pub hist: hdrhistogram::Histogram<u64>,
}

/// Opens (creating and zero-filling if needed) the floor file of `bytes`.
pub fn floor_file(dir: &Path, bytes: u64) -> anyhow::Result<Arc<FileDisk>> {
    floor_file_named(dir, "floor.dat", bytes)
}

/// Opens (creating and zero-filling if needed) `dir/name` of `bytes`.
pub fn floor_file_named(dir: &Path, name: &str, bytes: u64) -> anyhow::Result<Arc<FileDisk>> {
    let path = dir.join(name);
    if let Ok(m) = std::fs::metadata(&path) {
        if m.len() == bytes {
            return Ok(Arc::new(FileDisk::open(&path)?));
        }
        std::fs::remove_file(&path)?;
    }
    Ok(Arc::new(FileDisk::create(&path, bytes, true)?))
}

/// A floor: `depth` threads doing `size`-byte O_DIRECT writes (+ `fdatasync` when `durable`)
/// or reads, each sequentially through its share of `range` = (start, length) of `disk`.
/// The disk floor of a cluster benchmark: raw O_DIRECT 1 MiB writes + fdatasync at depth 1
/// for 5 s in a 256 MiB file in `dir` (on the chunkservers' filesystem), in MiB/s.
pub fn write_floor_mib(dir: &Path) -> anyhow::Result<f64> {
    use cairn_chunkstore::Disk;
    std::fs::create_dir_all(dir)?;
    let disk = floor_file(dir, 256 << 20)?;
    let fl = Floor {
        disk: disk.clone(),
        range: (0, disk.capacity()),
        write: true,
        size: 1 << 20,
        depth: 1,
        durable: true,
    }
    .run(5.0)?;
    drop(disk);
    let _ = std::fs::remove_file(dir.join("floor.dat"));
    Ok(fl.ops as f64 / fl.seconds)
}

pub struct Floor {
    pub disk: Arc<FileDisk>,
    pub range: (u64, u64),
    pub write: bool,
    pub size: usize,
    pub depth: usize,
    pub durable: bool,
}

impl Floor {
    /// Runs it for `seconds`, every thread from the start of its share.
    pub fn run(&self, seconds: f64) -> anyhow::Result<FloorResult> {
        self.run_from(seconds, &mut vec![0; self.depth])
    }

    /// [`Floor::run`], with thread `t` starting `cursors[t]` bytes into its share and leaving
    /// there the offset it would have gone on with (a floor measured in slices, between which
    /// something else runs, goes on where it stopped).
    pub fn run_from(&self, seconds: f64, cursors: &mut [u64]) -> anyhow::Result<FloorResult> {
        let Floor {
            ref disk,
            range,
            write,
            size,
            depth,
            durable,
        } = *self;
        anyhow::ensure!(cursors.len() == depth, "one cursor per floor thread");
        let (start, len) = range;
        anyhow::ensure!(
            start + len <= disk.capacity(),
            "floor range past the end of the file"
        );
        let region = len / depth as u64 / size as u64 * size as u64;
        anyhow::ensure!(region >= size as u64, "floor file too small");
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        let t0 = Instant::now();
        let threads: Vec<_> = (0..depth)
            .map(|t| {
                let disk = disk.clone();
                let from = cursors[t] % region;
                std::thread::spawn(
                    move || -> std::io::Result<(hdrhistogram::Histogram<u64>, u64)> {
                        let mut h = histogram();
                        let mut buf = AlignedBuf::zeroed(size);
                        buf.iter_mut()
                            .enumerate()
                            .for_each(|(i, b)| *b = (i * 7 + t) as u8);
                        let base = start + t as u64 * region;
                        let mut off = from;
                        while Instant::now() < deadline {
                            let s = Instant::now();
                            if write {
                                disk.write_at(&buf, base + off)?;
                                if durable {
                                    disk.sync()?;
                                }
                            } else {
                                disk.read_at(&mut buf, base + off)?;
                            }
                            h.record(s.elapsed().as_nanos() as u64).expect("in range");
                            off = (off + size as u64) % region;
                        }
                        Ok((h, off))
                    },
                )
            })
            .collect();
        let mut all = histogram();
        for (t, c) in threads.into_iter().zip(cursors.iter_mut()) {
            let (h, off) = t.join().expect("floor thread")?;
            all.add(h).expect("same bounds");
            *c = off;
        }
        let seconds = t0.elapsed().as_secs_f64();
        Ok(FloorResult {
            ops: all.len(),
            seconds,
            latency: Latency::of(&all),
            hist: all,
        })
    }
}

/// The replicated append floor: one thread per file (each file standing for one replica's
/// chunkserver disk) writes `size` bytes at its next offset + `fdatasync`, all of them at once,
/// round after round; a round takes until the `quorum`-th of them is durable (an append is
/// acknowledged once `quorum` replicas have it). On a machine whose replicas share one disk
/// this is the least a replicated append can cost.
pub fn run_replicated(
    files: &[Arc<FileDisk>],
    size: usize,
    quorum: usize,
    seconds: f64,
) -> anyhow::Result<FloorResult> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Barrier, mpsc};
    anyhow::ensure!(
        (1..=files.len()).contains(&quorum),
        "quorum must be 1..={}",
        files.len()
    );
    let n = files.len();
    let go = Arc::new(Barrier::new(n + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<std::io::Result<Instant>>();
    let threads: Vec<_> = files
        .iter()
        .enumerate()
        .map(|(t, disk)| {
            let (disk, go, stop, tx) = (disk.clone(), go.clone(), stop.clone(), tx.clone());
            std::thread::spawn(move || {
                let mut buf = AlignedBuf::zeroed(size);
                buf.iter_mut()
                    .enumerate()
                    .for_each(|(i, b)| *b = (i * 7 + t) as u8);
                let region = disk.capacity() / size as u64 * size as u64;
                let mut off = 0u64;
                loop {
                    go.wait();
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let r = disk.write_at(&buf, off).and_then(|()| disk.sync());
                    let _ = tx.send(r.map(|()| Instant::now()));
                    off = (off + size as u64) % region;
                }
            })
        })
        .collect();
    drop(tx);
    let mut h = histogram();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let t0 = Instant::now();
    let mut failed = None;
    while failed.is_none() && Instant::now() < deadline {
        let start = Instant::now();
        go.wait();
        let mut done = Vec::with_capacity(n);
        for _ in 0..n {
            match rx.recv() {
                Ok(Ok(at)) => done.push(at),
                Ok(Err(e)) => failed = Some(e),
                Err(_) => anyhow::bail!("a floor thread died"),
            }
        }
        done.sort();
        if let Some(at) = done.get(quorum - 1) {
            h.record(at.duration_since(start).as_nanos() as u64)
                .expect("in range");
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    go.wait();
    for t in threads {
        t.join().expect("floor thread");
    }
    if let Some(e) = failed {
        return Err(e.into());
    }
    Ok(FloorResult {
        ops: h.len(),
        seconds,
        latency: Latency::of(&h),
        hist: h,
    })
}

/// What the conversion floor measured: the replicated 4 KiB append floor alone and while a
/// raw converter runs beside it, and the converter's rate.
pub struct ConvertFloor {
    pub fg_alone: Latency,
    pub fg_during: Latency,
    /// User bytes the raw converter moved per second while the foreground ran.
    pub convert_mib_per_s: f64,
}

/// The least a conversion at `rate` user bytes/s costs the foreground on this machine: the
/// replicated 4 KiB append floor ([`run_replicated`], 3 files, quorum 2) for `seconds` alone,
/// then for `seconds` while one thread does the conversion's own work with nothing around it
/// — O_DIRECT reads of 1 MiB from a source file, an encode into `k + m` cells, a CRC32C of
/// every cell, O_DIRECT writes of the cells (unsynced, as the conversion's members are) and an
/// `fdatasync` per 64 MiB of user bytes (a chunk's seal) — paced to `rate`. Its files go in
/// `dir` and are removed after.
pub fn run_convert(
    dir: &Path,
    rate: u64,
    k: usize,
    m: usize,
    seconds: f64,
) -> anyhow::Result<ConvertFloor> {
    use cairn_ec::{Codec, ReedSolomon};
    use std::sync::atomic::{AtomicBool, Ordering};
    std::fs::create_dir_all(dir)?;
    let replicas = (0..3)
        .map(|i| floor_file_named(dir, &format!("floor-fg{i}.dat"), 64 << 20))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let src = floor_file_named(dir, "floor-src.dat", 256 << 20)?;
    let dst = floor_file_named(dir, "floor-dst.dat", 512 << 20)?;
    let alone = run_replicated(&replicas, 4096, 2, seconds)?;

    let stop = Arc::new(AtomicBool::new(false));
    let codec = ReedSolomon::new(k, m)?;
    let bg = {
        let (stop, src, dst) = (stop.clone(), src.clone(), dst.clone());
        std::thread::spawn(move || -> anyhow::Result<f64> {
            const STEP: usize = 1 << 20;
            let cell = STEP / k;
            let mut input = AlignedBuf::zeroed(STEP);
            let mut cells = AlignedBuf::zeroed(cell * (k + m));
            let (mut rd, mut wr, mut unsynced, mut moved) = (0u64, 0u64, 0u64, 0u64);
            let t0 = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                // Paced: step n starts no earlier than n steps at `rate`.
                let due = Duration::from_secs_f64(moved as f64 / rate.max(1) as f64);
                if let Some(wait) = due.checked_sub(t0.elapsed()) {
                    std::thread::sleep(wait);
                }
                src.read_at(&mut input, rd)?;
                rd = (rd + STEP as u64) % (src.capacity() / STEP as u64 * STEP as u64);
                let (data, parity) = cells.split_at_mut(cell * k);
                data.copy_from_slice(&input[..cell * k]);
                let data_cells: Vec<&[u8]> = data.chunks(cell).collect();
                let mut parity_cells: Vec<&mut [u8]> = parity.chunks_mut(cell).collect();
                codec.encode_into(&data_cells, &mut parity_cells)?;
                let mut crc = 0u32;
                for c in cells.chunks(cell) {
                    crc ^= crc32c::crc32c(c);
                }
                std::hint::black_box(crc);
                let n = cells.len() as u64;
                if wr + n > dst.capacity() {
                    wr = 0;
                }
                dst.write_at(&cells, wr)?;
                wr += n;
                unsynced += STEP as u64;
                if unsynced >= 64 << 20 {
                    dst.sync()?;
                    unsynced = 0;
                }
                moved += STEP as u64;
            }
            Ok(moved as f64 / t0.elapsed().as_secs_f64())
        })
    };
    let during = run_replicated(&replicas, 4096, 2, seconds);
    stop.store(true, Ordering::Relaxed);
    let bg_rate = bg.join().expect("converter thread")?;
    let during = during?;
    drop((replicas, src, dst));
    for name in [
        "floor-fg0.dat",
        "floor-fg1.dat",
        "floor-fg2.dat",
        "floor-src.dat",
        "floor-dst.dat",
    ] {
        let _ = std::fs::remove_file(dir.join(name));
    }
    Ok(ConvertFloor {
        fg_alone: alone.latency,
        fg_during: during.latency,
        convert_mib_per_s: bg_rate / f64::from(1 << 20),
    })
}
