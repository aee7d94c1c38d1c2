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
