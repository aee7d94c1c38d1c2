//! `cairn bench recovery`: how long opening a store takes after a crash, with a given amount
//! of data written after its last checkpoint; next to a raw O_DIRECT read of that much data.

use super::chunkstore::store_file;
use super::{floor, loadavg, parse_size};
use cairn_chunkstore::{ChunkStore, Disk, FormatOptions, OpenOptions};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// A directory on the disk to measure (ext4 or xfs; O_DIRECT).
    #[arg(long)]
    dir: PathBuf,
    /// Size of the store.
    #[arg(long, default_value = "10g", value_parser = parse_size)]
    store_size: u64,
    /// Data written and checkpointed first.
    #[arg(long, default_value = "6g", value_parser = parse_size)]
    before: u64,
    /// Data written after the last checkpoint, then the process "crashes".
    #[arg(long, default_value = "1g", value_parser = parse_size)]
    after: u64,
}

#[derive(Serialize)]
struct Report {
    store_bytes: u64,
    bytes_before_checkpoint: u64,
    bytes_after_checkpoint: u64,
    recovery_s: f64,
    recovered_bytes_after_checkpoint: u64,
    chunks: usize,
    chunks_scanned: usize,
    units_read: u64,
    candidate_extents_read: u64,
    log_blocks_replayed: u64,
    floor_read_s: f64,
    ratio: f64,
    loadavg: f64,
}

const CHUNK: u64 = 64 << 20;
const PIECE: usize = 1 << 20;

fn write(store: &ChunkStore, id: u64, from: u64, to: u64) -> anyhow::Result<()> {
    let data = vec![(id as u8) | 1; PIECE];
    let mut pending = Vec::new();
    let mut off = from;
    while off < to {
        let n = ((to - off) as usize).min(PIECE);
        pending.push(store.append_pipelined(id, off, &data[..n])?);
        off += n as u64;
        if pending.len() >= 16 {
            for p in pending.drain(..) {
                p.wait()?;
            }
        }
    }
    for p in pending {
        p.wait()?;
    }
    Ok(())
}

pub fn run(a: Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.dir)?;
    let path = a.dir.join("recovery.cairn");
    let disk = store_file(&path, a.store_size)?;
    ChunkStore::format(&*disk, &FormatOptions::default())?;
    let (store, _) = ChunkStore::open(disk.clone() as Arc<dyn Disk>, OpenOptions::default())?;
    // Before the checkpoint: full chunks, most sealed; the last few left open at half length.
    let n_before = (a.before / CHUNK).max(1);
    let open_from = n_before.saturating_sub(8);
    for id in 0..n_before {
        let len = if id >= open_from { CHUNK / 2 } else { CHUNK };
        store.create(id, 1)?;
        write(&store, id, 0, len)?;
        if id < open_from {
            store.seal(id)?;
        }
    }
    store.checkpoint()?;
    // After it: the open chunks grow to full, then new chunks, until `after` bytes.
    let mut left = a.after;
    for id in open_from..n_before {
        let n = left.min(CHUNK / 2);
        write(&store, id, CHUNK / 2, CHUNK / 2 + n)?;
        left -= n;
    }
    let mut id = n_before;
    while left > 0 {
        let n = left.min(CHUNK);
        store.create(id, 1)?;
        write(&store, id, 0, n)?;
        left -= n;
        id += 1;
    }
    store.abandon();
    drop(disk);

    let disk = Arc::new(cairn_chunkstore::FileDisk::open(&path)?);
    let t0 = Instant::now();
    let (store, report) = ChunkStore::open(disk as Arc<dyn Disk>, OpenOptions::default())?;
    let recovery_s = t0.elapsed().as_secs_f64();
    let floor_read_s = read_floor(&a.dir, a.after)?;
    let r = Report {
        store_bytes: a.store_size,
        bytes_before_checkpoint: n_before * CHUNK - (n_before - open_from) * CHUNK / 2,
        bytes_after_checkpoint: a.after,
        recovery_s,
        recovered_bytes_after_checkpoint: report.bytes_after_checkpoint,
        chunks: report.chunks,
        chunks_scanned: report.chunks_scanned,
        units_read: report.units_read,
        candidate_extents_read: report.candidate_extents_read,
        log_blocks_replayed: report.log_blocks_replayed,
        floor_read_s,
        ratio: recovery_s / floor_read_s,
        loadavg: loadavg(),
    };
    anyhow::ensure!(
        report.bytes_after_checkpoint == a.after,
        "recovery found {} bytes after the checkpoint, {} were acknowledged",
        report.bytes_after_checkpoint,
        a.after
    );
    store.close()?;
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}

/// Seconds to read `bytes` sequentially with 1 MiB O_DIRECT reads, one at a time (recovery's
/// own access pattern).
fn read_floor(dir: &std::path::Path, bytes: u64) -> anyhow::Result<f64> {
    use cairn_chunkstore::buf::AlignedBuf;
    let disk = floor::floor_file(dir, bytes.max(1 << 20).div_ceil(1 << 20) << 20)?;
    let mut buf = AlignedBuf::zeroed(1 << 20);
    let t0 = Instant::now();
    let mut off = 0;
    while off < disk.capacity() {
        disk.read_at(&mut buf, off)?;
        off += 1 << 20;
    }
    Ok(t0.elapsed().as_secs_f64())
}
