//! Opening a store: rebuild the index from the newest checkpoint, the operation log, and the
//! self-contained units on the device (docs/formats/chunk-store.md §6).

use crate::buf::AlignedBuf;
use crate::checksum;
use crate::disk::Disk;
use crate::error::{ChunkId, Error, Result};
use crate::format::checkpoint::Checkpoint;
use crate::format::footer::{self, Footer};
use crate::format::log::{self, LogEntry};
use crate::format::segment::{self, SegHeader};
use crate::format::superblock::{SUPERBLOCK_BYTES, Superblock};
use crate::index::{Allocator, ChunkEntry, Index};
use crate::layout::Geometry;
use crate::writer::{self, Tail};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// What recovery found and did.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    pub checkpoint_seq: u64,
    pub log_blocks_replayed: u64,
    pub chunks: usize,
    /// Chunks whose units were read (every chunk not sealed in the checkpoint).
    pub chunks_scanned: usize,
    pub units_read: u64,
    /// First units of free extents read to find extents allocated after the checkpoint.
    pub candidate_extents_read: u64,
    /// Bytes found beyond the checkpointed lengths.
    pub bytes_after_checkpoint: u64,
    /// Chunks whose checkpointed or sealed bytes did not verify. They can be read up to the
    /// damage (reads there return `Corruption`) and sealed, but not appended to.
    pub damaged_chunks: Vec<ChunkId>,
    pub mount_gen: u32,
    pub duration: Duration,
}

/// The state recovery hands to the device thread.
pub(crate) struct Recovered {
    pub index: Index,
    pub alloc: Allocator,
    pub tails: HashMap<ChunkId, Tail>,
    pub damaged: HashSet<ChunkId>,
    pub mount_gen: u32,
    pub next_epoch: u64,
    pub next_lsn: u64,
    pub ckpt_seq: u64,
    pub ckpt_lsn: u64,
}

fn read_aligned(disk: &dyn Disk, offset: u64, len: usize) -> Result<AlignedBuf> {
    let a = disk.alignment().max(1);
    let mut buf = AlignedBuf::zeroed(len.div_ceil(a) * a);
    disk.read_at(&mut buf, offset)
        .map_err(|e| Error::io("recovery read", e))?;
    Ok(buf)
}

/// Reads and checks the superblock.
pub(crate) fn read_superblock(disk: &dyn Disk) -> Result<Geometry> {
    let buf = read_aligned(disk, 0, SUPERBLOCK_BYTES)?;
    let sb = Superblock::decode(&buf).map_err(|source| Error::Format {
        what: "superblock",
        source,
    })?;
    if sb.device_bytes > disk.capacity() {
        return Err(Error::Config(
            "the device is smaller than the store formatted on it",
        ));
    }
    if !(sb.unit_bytes as usize).is_multiple_of(disk.alignment()) {
        return Err(Error::Config(
            "the device's O_DIRECT alignment does not divide the store's unit size",
        ));
    }
    Ok(Geometry::new(sb))
}

fn load_checkpoint(disk: &dyn Disk, geo: &Geometry) -> Result<Checkpoint> {
    let mut best: Option<Checkpoint> = None;
    let mut last_err = None;
    for &off in &geo.sb.ckpt_offsets {
        let head = read_aligned(disk, off, 4096)?;
        let total = match Checkpoint::decode_header(geo.salt, &head) {
            Ok((_, total)) if total <= geo.sb.ckpt_slot_bytes => total,
            Ok(_) => continue,
            Err(e) => {
                last_err = Some(e);
                continue;
            }
        };
        let whole = read_aligned(disk, off, total as usize)?;
        match Checkpoint::decode(geo.salt, &whole, geo.sb.extent_count) {
            Ok(c) if best.as_ref().is_none_or(|b| c.seq > b.seq) => best = Some(c),
            Ok(_) => {}
            Err(e) => last_err = Some(e),
        }
    }
    best.ok_or_else(|| Error::Format {
        what: "checkpoint",
        source: last_err.unwrap_or(crate::format::DecodeError::BadMagic),
    })
}

/// Per-chunk state during recovery.
struct Rec {
    entry: ChunkEntry,
    /// Sealed in the checkpoint: nothing to scan.
    settled: bool,
    /// Sealed by a log record: (length, crc).
    log_seal: Option<(u64, u32)>,
}

/// Recovers the store on `disk`, then makes the new mount generation durable.
pub(crate) fn recover(disk: &dyn Disk) -> Result<(Geometry, Recovered, RecoveryReport)> {
    let t0 = Instant::now();
    let geo = read_superblock(disk)?;
    let ckpt = load_checkpoint(disk, &geo)?;
    let mut report = RecoveryReport {
        checkpoint_seq: ckpt.seq,
        ..Default::default()
    };
    let mut chunks: HashMap<ChunkId, Rec> = HashMap::with_capacity(ckpt.chunks.len());
    for c in &ckpt.chunks {
        let entry = ChunkEntry::from_record(c);
        chunks.insert(
            c.chunk_id,
            Rec {
                entry,
                settled: c.sealed,
                log_seal: None,
            },
        );
    }
    let mut next_epoch = ckpt.next_epoch;

    // The operation log, from the checkpoint on.
    let mut lsn = ckpt.lsn;
    while lsn - ckpt.lsn < geo.log_blocks {
        let block = read_aligned(disk, geo.log_block_offset(lsn), geo.unit)?;
        let Ok(entries) = log::decode_block(geo.salt, lsn, &block) else {
            break;
        };
        for e in entries {
            apply_log(&mut chunks, &mut next_epoch, e);
        }
        lsn += 1;
    }
    report.log_blocks_replayed = lsn - ckpt.lsn;

    // Extents that a chunk may have grown into since the checkpoint.
    let owned: HashSet<u32> = chunks
        .values()
        .flat_map(|r| r.entry.extents.iter().copied())
        .collect();
    let scanning: HashSet<(ChunkId, u64)> = chunks
        .iter()
        .filter(|(_, r)| !r.settled)
        .map(|(&id, r)| (id, r.entry.epoch))
        .collect();
    let mut candidates = Candidates::new();
    if !scanning.is_empty() {
        for e in (0..geo.sb.extent_count).filter(|e| !owned.contains(e)) {
            let unit = read_aligned(disk, geo.extent_offset(e), geo.unit)?;
            report.candidate_extents_read += 1;
            // An extent's first slot is a unit or a large append's segment header.
            let mut names: Vec<(ChunkId, u64, u32)> = (0..footer::SLOTS)
                .filter_map(|slot| {
                    let off = footer::slot_offset(geo.unit, slot);
                    Footer::decode(geo.salt, &unit[off..off + footer::FOOTER_BYTES])
                        .ok()
                        .map(|f| (f.chunk_id, f.epoch, f.unit_index))
                })
                .collect();
            if let Ok(h) = SegHeader::decode(geo.salt, &unit) {
                names.push((h.chunk_id, h.epoch, h.unit_index));
            }
            for (chunk_id, epoch, unit_index) in names {
                if unit_index % geo.units_per_extent == 0 && scanning.contains(&(chunk_id, epoch)) {
                    // Kept, so that choosing among candidates reads nothing again.
                    let v = candidates.entry((chunk_id, epoch, unit_index)).or_default();
                    if v.iter().all(|(x, _)| *x != e) {
                        v.push((e, unit.clone()));
                    }
                }
            }
        }
    }

    // Follow every open chunk's units.
    let mut ids: Vec<ChunkId> = chunks.keys().copied().collect();
    ids.sort_unstable();
    let mut claimed: HashSet<u32> = owned;
    let mut tails = HashMap::new();
    let mut damaged = HashSet::new();
    for id in ids {
        let r = chunks.get_mut(&id).expect("listed");
        if r.settled {
            continue;
        }
        report.chunks_scanned += 1;
        let start = r.entry.length;
        let scan = scan_chunk(
            disk,
            &geo,
            id,
            &r.entry,
            ckpt.mount_gen,
            &candidates,
            &mut claimed,
        )?;
        report.units_read += scan.units_read;
        let mut entry = r.entry.clone();
        entry.length = scan.length;
        entry.crc = scan.crc;
        entry.extents = scan.extents;
        entry.large.extend_from_slice(&scan.large);
        let mut bad = scan.damaged;
        if let Some((len, crc)) = r.log_seal {
            if scan.length < len {
                bad = true;
            } else {
                entry.length = len;
                entry.crc = crc;
                entry.extents.truncate(geo.extents_for(len));
                entry.large.retain(|&(o, _)| o < len);
            }
            entry.sealed = true;
        } else if let Some(t) = scan.tail {
            tails.insert(id, t);
        } else if !entry.length.is_multiple_of(geo.data as u64) {
            // A partial last unit with no footer that describes exactly its bytes.
            bad = true;
        }
        for &e in &entry.extents[geo.extents_for(start).min(entry.extents.len())..] {
            claimed.insert(e);
        }
        report.bytes_after_checkpoint += entry.length.saturating_sub(start);
        if bad {
            tracing::error!(
                chunk_id = id,
                length = entry.length,
                "chunk damaged on the device"
            );
            damaged.insert(id);
            report.damaged_chunks.push(id);
        }
        r.entry = entry;
    }

    // Free space is everything no chunk owns.
    let mut alloc = Allocator::new(geo.sb.extent_count, geo.extents_per_chunk());
    let mut index = Index::default();
    for (id, r) in chunks {
        for &e in &r.entry.extents {
            if !alloc.take(e) {
                tracing::error!(chunk_id = id, extent = e, "extent owned twice");
                damaged.insert(id);
                report.damaged_chunks.push(id);
            }
        }
        index.chunks.insert(id, r.entry);
    }
    report.chunks = index.chunks.len();

    // A new mount generation, durable before the first append: every footer written from now
    // on outranks the units of earlier mounts that recovery just cut off.
    // (The newest checkpoint always carries the newest generation: each open writes one.)
    let mount_gen = ckpt
        .mount_gen
        .checked_add(1)
        .ok_or(Error::Config("mount generation exhausted"))?;
    let new_ckpt = Checkpoint {
        seq: ckpt.seq + 1,
        lsn,
        next_epoch,
        mount_gen,
        chunks: writer::records(&index),
    };
    writer::write_checkpoint(disk, &geo, &new_ckpt)?;
    report.mount_gen = mount_gen;
    report.damaged_chunks.sort_unstable();
    report.damaged_chunks.dedup();
    report.duration = t0.elapsed();
    let rec = Recovered {
        index,
        alloc,
        tails,
        damaged,
        mount_gen,
        next_epoch,
        next_lsn: lsn,
        ckpt_seq: new_ckpt.seq,
        ckpt_lsn: lsn,
    };
    Ok((geo, rec, report))
}

fn apply_log(chunks: &mut HashMap<ChunkId, Rec>, next_epoch: &mut u64, e: LogEntry) {
    match e {
        LogEntry::Create {
            chunk_id,
            epoch,
            version,
        } => {
            let entry = ChunkEntry::empty(epoch, version);
            chunks.insert(
                chunk_id,
                Rec {
                    entry,
                    settled: false,
                    log_seal: None,
                },
            );
            *next_epoch = (*next_epoch).max(epoch + 1);
        }
        LogEntry::Seal {
            chunk_id,
            epoch,
            length,
            crc,
        } => {
            if let Some(r) = chunks.get_mut(&chunk_id).filter(|r| r.entry.epoch == epoch) {
                r.log_seal = Some((length, crc));
            }
        }
        LogEntry::Delete { chunk_id, epoch } => {
            if chunks
                .get(&chunk_id)
                .is_some_and(|r| r.entry.epoch == epoch)
            {
                chunks.remove(&chunk_id);
            }
        }
    }
}

struct Scan {
    length: u64,
    crc: u32,
    extents: Vec<u32>,
    tail: Option<Tail>,
    damaged: bool,
    units_read: u64,
    large: Vec<(u64, u32)>,
}

/// Follows a chunk's units from its checkpointed length while they are valid and full, and
/// returns the length at the last `APPEND_END` reached.
///
/// `gen_floor` starts at the checkpoint's mount generation: any footer that extends the chunk
/// past its checkpointed length was written in that mount or later. The footer that describes
/// exactly the checkpointed bytes of a partial unit is trusted whatever its generation.
fn scan_chunk(
    disk: &dyn Disk,
    geo: &Geometry,
    id: ChunkId,
    entry: &ChunkEntry,
    ckpt_gen: u32,
    candidates: &Candidates,
    claimed: &mut HashSet<u32>,
) -> Result<Scan> {
    let (s, d, upe) = (geo.unit, geo.data as u64, geo.units_per_extent);
    let max_units = geo.sb.max_chunk_bytes.div_ceil(d) as u32;
    let mut extents = entry.extents.clone();
    let (mut len, mut crc) = (entry.length, entry.crc);
    let (mut end, mut end_crc) = (len, crc);
    let mut end_tail: Option<Tail> = None;
    let mut gen_floor = ckpt_gen;
    let mut damaged = false;
    let mut units_read = 0u64;
    let mut large: Vec<(u64, u32)> = Vec::new();
    let mut u = geo.unit_of(len);
    'chain: while u < max_units {
        let ext_i = (u / upe) as usize;
        if ext_i >= extents.len() {
            if !u.is_multiple_of(upe) {
                break;
            }
            let Some(e) = pick_candidate(geo, id, entry.epoch, u, gen_floor, candidates, claimed)
            else {
                break;
            };
            extents.push(e);
        }
        let run = (upe - u % upe).min(max_units - u);
        let buf = read_aligned(disk, geo.unit_offset(extents[ext_i], u), run as usize * s)?;
        for k in 0..run {
            let uu = u + k;
            let unit = &buf[k as usize * s..][..s];
            units_read += 1;
            let ustart = uu as u64 * d;
            let floor = (len - ustart.min(len)) as usize;
            let mut slots: Vec<(usize, Footer)> = (0..footer::SLOTS)
                .filter_map(|slot| {
                    footer::unit_slot_valid(geo.salt, unit, slot, id, entry.epoch, uu)
                        .map(|f| (slot, f))
                })
                .filter(|(_, f)| {
                    let v = f.valid_len as usize;
                    (v == floor && floor > 0) || (v > floor && f.mount_gen >= gen_floor)
                })
                .collect();
            if slots.is_empty() {
                // At a unit boundary the chain may go on through a large append.
                if floor == 0
                    && let Some(f) = scan_large(
                        disk,
                        geo,
                        id,
                        entry.epoch,
                        uu,
                        unit,
                        gen_floor,
                        &mut extents,
                        candidates,
                        claimed,
                    )?
                {
                    crc = checksum::crc32c_combine(crc, f.mid_crc, f.mid_len as usize);
                    len = f.u1 as u64 * d;
                    gen_floor = gen_floor.max(f.mount_gen);
                    units_read += f.slots_read;
                    large.push(f.append);
                    u = f.u1;
                    continue 'chain;
                }
                damaged = floor > 0;
                break 'chain;
            }
            slots.sort_by_key(|(_, f)| f.valid_len);
            for &(slot, f) in &slots {
                let v = f.valid_len as usize;
                if v == floor && (v as u64) < d && end == len {
                    // The trusted partial unit of the checkpoint: the tail unless we go further.
                    end_tail = Some(Tail {
                        unit: uu,
                        buf: AlignedBuf::copy_of(unit),
                        cur_slot: slot,
                        data_crc: f.data_crc,
                    });
                }
                if f.append_end() && ustart + v as u64 > end {
                    end = ustart + v as u64;
                    end_crc = checksum::crc32c_append(crc, &unit[floor..v]);
                    end_tail = ((v as u64) < d).then(|| Tail {
                        unit: uu,
                        buf: AlignedBuf::copy_of(unit),
                        cur_slot: slot,
                        data_crc: f.data_crc,
                    });
                }
            }
            let best = slots
                .iter()
                .map(|(_, f)| *f)
                .max_by_key(|f| (f.mount_gen, f.valid_len))
                .expect("non-empty");
            if best.valid_len as u64 == d {
                crc = checksum::crc32c_append(crc, &unit[floor..d as usize]);
                len = ustart + d;
                gen_floor = gen_floor.max(best.mount_gen);
            } else {
                break 'chain;
            }
        }
        u += run;
    }
    extents.truncate(geo.extents_for(end));
    large.retain(|&(o, _)| o < end);
    let tail = if end % d == 0 {
        None
    } else {
        end_tail.filter(|t| t.unit == geo.unit_of(end))
    };
    Ok(Scan {
        length: end,
        crc: end_crc,
        extents,
        tail,
        damaged,
        units_read,
        large,
    })
}

/// A large append the chain went through.
struct LargeFound {
    append: (u64, u32),
    u1: u32,
    /// CRC32C and length of its middle's logical bytes: `[(u0 + 1)·D, u1·D)`.
    mid_crc: u32,
    mid_len: u64,
    mount_gen: u32,
    slots_read: u64,
}

/// Follows a large append whose first segment header is `first`, at slot `u` of the chunk:
/// every segment must be where the layout puts it, name the same append and mount, and hold
/// data matching its slot CRCs. Extents the append grew into are taken from the candidates.
/// `None` (with nothing taken) when any of it does not verify.
#[allow(clippy::too_many_arguments)]
fn scan_large(
    disk: &dyn Disk,
    geo: &Geometry,
    id: ChunkId,
    epoch: u64,
    u: u32,
    first: &[u8],
    gen_floor: u32,
    extents: &mut Vec<u32>,
    candidates: &Candidates,
    claimed: &mut HashSet<u32>,
) -> Result<Option<LargeFound>> {
    let (s, d, upe) = (geo.unit, geo.data as u64, geo.units_per_extent);
    let Some(h0) = segment::header_at(geo.salt, first, id, epoch, u, gen_floor) else {
        return Ok(None);
    };
    let (o, n) = (h0.append_offset, h0.append_len);
    let Some(plan) = geo
        .plan_large(o, n as usize)
        .filter(|p| p.u0 + 1 == u && p.segs.first().is_some_and(|g| g.slot == u))
    else {
        return Ok(None);
    };
    let (mid_from, mid_to) = ((plan.u0 as u64 + 1) * d - o, plan.u1 as u64 * d - o);
    let (extents_before, mut taken) = (extents.len(), Vec::new());
    let mut mid_crc = 0u32;
    let mut slots_read = 0u64;
    let mut ok = true;
    for seg in &plan.segs {
        let ext_i = (seg.slot / upe) as usize;
        if ext_i >= extents.len() {
            let picked = seg
                .slot
                .is_multiple_of(upe)
                .then(|| pick_candidate(geo, id, epoch, seg.slot, gen_floor, candidates, claimed))
                .flatten();
            match picked {
                Some(e) => {
                    extents.push(e);
                    taken.push(e);
                }
                None => {
                    ok = false;
                    break;
                }
            }
        }
        let data_slots = seg.data_slots(s) as usize;
        let buf = read_aligned(
            disk,
            geo.unit_offset(extents[ext_i], seg.slot),
            (1 + data_slots) * s,
        )?;
        slots_read += 1 + data_slots as u64;
        // Every header of the append was written with it, by the same mount.
        let valid = segment::header_at(geo.salt, &buf[..s], id, epoch, seg.slot, h0.mount_gen)
            .filter(|h| h.mount_gen == h0.mount_gen && h.is_seg_of((o, n), seg, s));
        let Some(h) = valid else {
            ok = false;
            break;
        };
        for (j, &want) in h.slot_crcs.iter().enumerate() {
            let sstart = seg.data_off as u64 + (j * s) as u64;
            let slen = (seg.data_off as u64 + seg.data_len as u64 - sstart).min(s as u64);
            let bytes = &buf[(1 + j) * s..][..slen as usize];
            if checksum::crc32c(bytes) != want {
                ok = false;
                break;
            }
            let (a, b) = (sstart.max(mid_from), (sstart + slen).min(mid_to));
            if a < b {
                mid_crc = checksum::crc32c_append(
                    mid_crc,
                    &bytes[(a - sstart) as usize..(b - sstart) as usize],
                );
            }
        }
        if !ok {
            break;
        }
    }
    if !ok {
        extents.truncate(extents_before);
        for e in taken {
            claimed.remove(&e);
        }
        return Ok(None);
    }
    Ok(Some(LargeFound {
        append: (o, n),
        u1: plan.u1,
        mid_crc,
        mid_len: mid_to - mid_from,
        mount_gen: h0.mount_gen,
        slots_read,
    }))
}

/// First units of free extents, by the `(chunk, epoch, unit index)` their footers name.
type Candidates = HashMap<(ChunkId, u64, u32), Vec<(u32, AlignedBuf)>>;

/// Among the free extents whose first unit names `(id, epoch, u)`, the one with the newest
/// valid footer at or above `gen_floor`.
fn pick_candidate(
    geo: &Geometry,
    id: ChunkId,
    epoch: u64,
    u: u32,
    gen_floor: u32,
    candidates: &Candidates,
    claimed: &mut HashSet<u32>,
) -> Option<u32> {
    let mut best: Option<(u32, u32)> = None;
    for (e, unit) in candidates
        .get(&(id, epoch, u))?
        .iter()
        .filter(|(e, _)| !claimed.contains(e))
    {
        let found = footer::unit_state(geo.salt, unit, id, epoch, u, gen_floor)
            .map(|st| st.best.mount_gen)
            .or_else(|| {
                segment::header_at(geo.salt, unit, id, epoch, u, gen_floor).map(|h| h.mount_gen)
            });
        if let Some(g) = found
            && best.is_none_or(|(_, b)| g > b)
        {
            best = Some((*e, g));
        }
    }
    let (e, _) = best?;
    claimed.insert(e);
    Some(e)
}
