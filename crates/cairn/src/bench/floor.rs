//! The physical floor: the same I/O as the store does, with nothing around it.
//!
//! `depth` threads each own a slice of a byte range of a file and loop sequentially through it:
//! O_DIRECT `pwrite` of `size` bytes + `fdatasync` (append floor: a preallocated, zero-filled
//! file beside the store), or O_DIRECT `pread` of `size` bytes (read floor: the store's own
//! data region, so that the floor reads the very bytes, device locations and cache state the
//! store reads).

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
}

/// Opens (creating and zero-filling if needed) the floor file of `bytes`.
pub fn floor_file(dir: &Path, bytes: u64) -> anyhow::Result<Arc<FileDisk>> {
    let path = dir.join("floor.dat");
    if let Ok(m) = std::fs::metadata(&path) {
        if m.len() == bytes {
            return Ok(Arc::new(FileDisk::open(&path)?));
        }
        std::fs::remove_file(&path)?;
    }
    Ok(Arc::new(FileDisk::create(&path, bytes, true)?))
}

#[allow(clippy::too_many_arguments)]
pub fn run(
    disk: Arc<FileDisk>,
    range: (u64, u64),
    write: bool,
    size: usize,
    depth: usize,
    seconds: f64,
    durable: bool,
) -> anyhow::Result<FloorResult> {
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
            std::thread::spawn(move || -> std::io::Result<hdrhistogram::Histogram<u64>> {
                let mut h = histogram();
                let mut buf = AlignedBuf::zeroed(size);
                buf.iter_mut()
                    .enumerate()
                    .for_each(|(i, b)| *b = (i * 7 + t) as u8);
                let base = start + t as u64 * region;
                let mut off = 0u64;
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
                Ok(h)
            })
        })
        .collect();
    let mut all = histogram();
    for t in threads {
        all.add(t.join().expect("floor thread")?)
            .expect("same bounds");
    }
    let seconds = t0.elapsed().as_secs_f64();
    Ok(FloorResult {
        ops: all.len(),
        seconds,
        latency: Latency::of(&all),
    })
}
