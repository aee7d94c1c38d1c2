//! An open file's bytes at the mount: reads over the extents and this mount's dirty ranges,
//! writes into the dirty ranges, and flushes — the ranges appended to the mount's segment,
//! then their extents committed at the masters (docs/files.md "Writes, flushes").

use crate::shared::{DIRTY_FILE_MAX, FileState, Shared, client_errno, errno, time_of};
use cairn_rpc::files::{Attr, Data, FileOp, FileReply};
use cairn_rpc::{ErrorKind, MetaError};
use fuser::Errno;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Inserts `data` at `offset` into non-overlapping `dirty` ranges, replacing what it covers
/// and joining ranges it touches; the change in dirty bytes. A range the write starts in or
/// touches is extended in place, so a sequential writer's write costs its own length, not
/// the range's (tar's 10 KiB records into a 7 MiB file copied the whole range each time:
/// 106 ms of the mount's CPU a MiB; BENCHMARKS.md, session 55).
pub(crate) fn add_dirty(dirty: &mut BTreeMap<u64, Vec<u8>>, offset: u64, data: &[u8]) -> isize {
    let end = offset + data.len() as u64;
    let mut removed = 0usize;
    let mut tail = Vec::new();
    // A range before that reaches the new one: its head comes first, its bytes past the
    // write last.
    let (start, mut merged) = match dirty.range(..=offset).next_back() {
        Some((&o, prev)) if o + prev.len() as u64 >= offset => {
            let mut prev = dirty.remove(&o).expect("found");
            removed += prev.len();
            if o + prev.len() as u64 > end {
                tail = prev.split_off((end - o) as usize);
            }
            prev.truncate((offset - o) as usize);
            (o, prev)
        }
        _ => (offset, Vec::new()),
    };
    merged.extend_from_slice(data);
    merged.extend_from_slice(&tail);
    // Ranges that start inside the write or at its end.
    let overlapping: Vec<u64> = dirty.range(start..=end).map(|(&o, _)| o).collect();
    for o in overlapping {
        let r = dirty.remove(&o).expect("listed");
        removed += r.len();
        let r_end = o + r.len() as u64;
        if r_end > end {
            merged.extend_from_slice(&r[(end - o) as usize..]);
        }
    }
    let added = merged.len();
    dirty.insert(start, merged);
    added as isize - removed as isize
}

/// The node's attributes a change answered, if it did.
fn attr_of(r: FileReply) -> Option<Attr> {
    match r {
        FileReply::Attr(a) => Some(a),
        _ => None,
    }
}

/// Where a write of `data` at `offset` ends, if the file may reach it.
fn write_end(offset: u64, data: &[u8]) -> Result<u64, Errno> {
    let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
    if end > cairn_rpc::files::MAX_FILE_SIZE {
        return Err(Errno::EFBIG);
    }
    Ok(end)
}

/// A write into the file's dirty ranges (its size known).
fn put_dirty(st: &mut FileState, offset: u64, end: u64, data: &[u8]) {
    if let Some(f) = st.fresh.as_mut() {
        // A write after a new file's utimens: the write's time is the file's mtime.
        f.changes.mtime = None;
    }
    let delta = add_dirty(&mut st.dirty, offset, data);
    st.dirty_bytes = st.dirty_bytes.saturating_add_signed(delta);
    st.dirty_since.get_or_insert_with(Instant::now);
    st.size = Some(st.size.unwrap_or(0).max(end));
}

impl Shared {
    /// The file's extents, read from the masters when not known here.
    pub(crate) async fn map_of(&self, ino: u64, st: &mut FileState) -> Result<Data, Errno> {
        if let Some(m) = &st.map {
            return Ok(m.clone());
        }
        let path = self.path(ino)?;
        match self.query(&self.map_query(path, ino)).await? {
            FileReply::Map { attr, data, .. } => {
                if st.size.is_none() {
                    st.size = Some(attr.size);
                }
                st.map = Some(data.clone());
                Ok(data)
            }
            _ => Err(Errno::EIO),
        }
    }

    pub(crate) async fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        // The file's lock is held while the map, the size and this mount's unflushed writes
        // over the range are taken, not while the bytes are read: a read that waits on a
        // slow or failing replica must not hold up the file's flushes (a close waited 56 s
        // on one in the nemesis). The result is the file as it was when the read started.
        let (data, file_size, over) = {
            let st = self.state(ino);
            let mut st = st.lock().await;
            let data = self.map_of(ino, &mut st).await?;
            let file_size = st.size.unwrap_or(0);
            if offset >= file_size {
                return Ok(Vec::new());
            }
            let end = offset.saturating_add(u64::from(size)).min(file_size);
            let over: Vec<(u64, Vec<u8>)> = st
                .dirty
                .range(..end)
                .filter_map(|(&o, d)| {
                    let d_end = o + d.len() as u64;
                    let (lo, hi) = (o.max(offset), d_end.min(end));
                    (lo < hi).then(|| (lo, d[(lo - o) as usize..(hi - o) as usize].to_vec()))
                })
                .collect();
            (data, file_size, over)
        };
        let path = self.path(ino)?;
        let mut out = self
            .client
            .read_mapped(&path, &data, file_size, offset, size as usize)
            .await
            .map_err(|e| {
                tracing::warn!(ino, error = %e, "reading a file's bytes");
                client_errno(&e)
            })?;
        // This mount's unflushed writes over them.
        for (lo, d) in over {
            let at = (lo - offset) as usize;
            out[at..at + d.len()].copy_from_slice(&d);
        }
        Ok(out)
    }

    pub(crate) async fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let end = write_end(offset, data)?;
        let st = self.state(ino);
        let mut st = st.lock().await;
        if st.size.is_none() {
            // The size a write past the end extends from.
            self.map_of(ino, &mut st).await?;
        }
        put_dirty(&mut st, offset, end, data);
        if st.dirty_bytes >= DIRTY_FILE_MAX {
            self.flush_locked(ino, &mut st).await?;
        }
        Ok(())
    }

    /// A write answered on the kernel's thread, without a task: when the file's lock is
    /// free, its size known and the write leaves it under [`DIRTY_FILE_MAX`] (no flush, no
    /// call). `None`: it needs [`Shared::write`].
    pub(crate) fn write_now(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
    ) -> Option<Result<(), Errno>> {
        let end = match write_end(offset, data) {
            Ok(end) => end,
            Err(e) => return Some(Err(e)),
        };
        let st = self.files.lock().get(&ino).cloned()?;
        let mut st = st.try_lock().ok()?;
        if st.size.is_none() || st.dirty_bytes.saturating_add(data.len()) >= DIRTY_FILE_MAX {
            return None;
        }
        put_dirty(&mut st, offset, end, data);
        Some(Ok(()))
    }

    /// Makes the file's dirty ranges durable and its own: records in the segment, then one
    /// commit of their extents (several for very many ranges).
    pub(crate) async fn flush_locked(&self, ino: u64, st: &mut FileState) -> Result<(), Errno> {
        if st.dirty.is_empty() {
            return self.flush_attrs(ino, st).await;
        }
        let path = self.path(ino)?;
        // A new file's attribute changes go with its first bytes.
        let then = st
            .fresh
            .as_ref()
            .filter(|f| f.waiting())
            .map(|f| f.changes.clone());
        let policy = self.policy_of(ino);
        // A stream of writes has segments of its own while the file is open, so that
        // deleting or rewriting it frees whole segments (docs/files.md "Large files").
        let own =
            if st.dirty_bytes >= crate::segment::OWN_SEGMENT_FLUSH || self.segments.has_own(ino) {
                ino
            } else {
                0
            };
        let mut tries = 0;
        // Before the bytes go: an answer is kept only if no other change began since.
        let asked = self.known.lock().asking();
        let (extents, answered) = loop {
            let pieces: Vec<(u64, u64, Vec<u8>)> = st
                .dirty
                .iter()
                .map(|(&offset, d)| (ino, offset, d.clone()))
                .collect();
            let extents = crate::warn_if_slow(
                "a segment append",
                ino,
                self.segments.write(&policy, own, pieces),
            )
            .await
            .map_err(|e| match e {
                Some(e) => {
                    tracing::warn!(ino, error = %e, "flushing a file's writes");
                    client_errno(&e)
                }
                None => Errno::EIO,
            })?;
            match self
                .commit_extents(&path, ino, st.size.unwrap_or(0), &extents, then.clone())
                .await
            {
                Ok(answered) => break (extents, answered),
                // The segment is being collected (this mount stalled past its lease): the
                // bytes go again, to a new segment, once.
                Err(e) if e.kind == ErrorKind::Sealed && tries == 0 => {
                    tracing::warn!(ino, error = %e, "a segment is being collected; writing again");
                    for seg in extents.iter().map(|e| e.seg).collect::<BTreeSet<_>>() {
                        self.segments.abandon(seg).await;
                    }
                    tries += 1;
                }
                Err(e) => return Err(errno(&e)),
            }
        };
        if let Some(Data::Extents(x)) = &mut st.map {
            for e in &extents {
                cairn_rpc::files::overlay(x, *e);
            }
        } else {
            st.map = None;
        }
        st.dirty.clear();
        st.dirty_bytes = 0;
        st.dirty_since = None;
        // Its bytes are readable now: later changes go to the masters at once.
        st.fresh = None;
        if let Some(a) = answered {
            self.known.lock().learnt(&a, asked);
        }
        Ok(())
    }

    /// A new file's first commit when it has no dirty bytes (a `touch`; a `chmod` after a
    /// flush that found nothing to write): no bytes, the attribute changes that wait, and
    /// the end of the masters' hold (`FileOp::Write` with no extents).
    async fn flush_attrs(&self, ino: u64, st: &mut FileState) -> Result<(), Errno> {
        let Some(f) = st.fresh.as_ref() else {
            return Ok(());
        };
        let op = FileOp::Write {
            path: self.path(ino)?,
            ino,
            extents: Vec::new(),
            size: st.size.unwrap_or(0),
            then: f.waiting().then(|| f.changes.clone()),
            now: time_of(SystemTime::now()),
        };
        // A create answered early: its make goes with this (early.rs), or before it.
        let asked = self.known.lock().asking();
        let answered = match self.unpark(ino) {
            Some(p) => match self.commit_with_make(ino, p, &op).await? {
                Ok(r) => r,
                // The make is done; the commit goes again alone (a hold that ended is
                // waited for there; any other error is its own again).
                Err(_) => self.op(&op).await?,
            },
            None => {
                self.made(ino).await?;
                self.op(&op).await?
            }
        };
        st.fresh = None;
        st.dirty_since = None;
        if let Some(a) = attr_of(answered) {
            self.known.lock().learnt(&a, asked);
        }
        Ok(())
    }

    /// Commits `extents` of the file at the masters (several writes for very many; `then`
    /// goes with each, so the first bytes are never read under older attributes and a time
    /// set is the file's after the last).
    async fn commit_extents(
        &self,
        path: &str,
        ino: u64,
        size: u64,
        extents: &[cairn_rpc::files::Extent],
        then: Option<cairn_rpc::files::SetAttr>,
    ) -> Result<Option<Attr>, MetaError> {
        let mut last = None;
        for part in extents.chunks(cairn_rpc::files::MAX_WRITE_EXTENTS) {
            let op = FileOp::Write {
                path: path.to_owned(),
                ino,
                extents: part.to_vec(),
                size,
                then: then.clone(),
                now: time_of(SystemTime::now()),
            };
            // A create answered early: its make goes with the first part (early.rs), or
            // before it.
            if let Some(p) = self.unpark(ino) {
                let with = self.commit_with_make(ino, p, &op);
                match crate::warn_if_slow("the masters' make and commit", ino, with).await {
                    Ok(Ok(r)) => {
                        last = attr_of(r);
                        continue;
                    }
                    Ok(Err(e)) if e.kind != ErrorKind::Sealed => {}
                    Ok(Err(e)) => return Err(e),
                    Err(n) => {
                        return Err(MetaError::internal(format!(
                            "{path}: its create failed ({n:?})"
                        )));
                    }
                }
            } else if let Err(n) = self.made(ino).await {
                return Err(MetaError::internal(format!(
                    "{path}: its create failed ({n:?})"
                )));
            }
            let commit = self.client.masters().file_op(&op);
            last =
                attr_of(crate::warn_if_slow("the masters' commit of extents", ino, commit).await?);
        }
        Ok(last)
    }

    pub(crate) async fn flush(&self, ino: u64) -> Result<(), Errno> {
        let st = self.files.lock().get(&ino).cloned();
        match st {
            Some(st) => {
                let mut g =
                    crate::warn_if_slow("the file's lock, to flush it", ino, st.lock()).await;
                self.flush_locked(ino, &mut g).await
            }
            None => Ok(()),
        }
    }

    /// Flushes every file whose oldest dirty range is older than `age`.
    pub(crate) async fn flush_older(&self, age: Duration) {
        let files: Vec<(u64, Arc<tokio::sync::Mutex<FileState>>)> = self
            .files
            .lock()
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        for (ino, st) in files {
            let mut st = st.lock().await;
            if st.dirty_since.is_some_and(|t| t.elapsed() >= age)
                && let Err(e) = self.flush_locked(ino, &mut st).await
            {
                tracing::warn!(ino, errno = ?e, "background flush failed; will try again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_ranges_merge_and_replace() {
        let mut d = BTreeMap::new();
        assert_eq!(add_dirty(&mut d, 10, b"abc"), 3);
        assert_eq!(add_dirty(&mut d, 20, b"xyz"), 3);
        // Touching the first at its end joins it.
        assert_eq!(add_dirty(&mut d, 13, b"de"), 2);
        assert_eq!(d[&10], b"abcde");
        // Covering the first's tail up to the second's start joins all three.
        assert_eq!(add_dirty(&mut d, 12, b"12345678"), 5);
        assert_eq!(d.len(), 1);
        assert_eq!(d[&10], b"ab12345678xyz");
        // Inside: replaces bytes, no growth.
        assert_eq!(add_dirty(&mut d, 11, b"Q"), 0);
        assert_eq!(d[&10], b"aQ12345678xyz");
        // Before, not touching: a range of its own.
        assert_eq!(add_dirty(&mut d, 0, b"0"), 1);
        assert_eq!(d.len(), 2);
    }

    /// Random writes agree with a model (the file's bytes and which are dirty): ranges
    /// stay sorted, apart and joined where they touch, and the deltas add up.
    #[test]
    fn dirty_ranges_match_a_model() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..200 {
            let mut d: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
            let (mut bytes, mut set) = (vec![0u8; 512], vec![false; 512]);
            let mut total = 0isize;
            for i in 0..40 {
                let offset = next(400);
                // Sequential runs half the time: the writer's next write at the range's end.
                let offset = match d.iter().next_back() {
                    Some((&o, r)) if next(2) == 0 && o + r.len() as u64 <= 400 => {
                        o + r.len() as u64
                    }
                    _ => offset,
                };
                let len = 1 + next(100);
                let data: Vec<u8> = (0..len).map(|j| (round + i + j) as u8 | 1).collect();
                total += add_dirty(&mut d, offset, &data);
                for (j, b) in data.iter().enumerate() {
                    bytes[offset as usize + j] = *b;
                    set[offset as usize + j] = true;
                }
                let mut last_end = None;
                let mut counted = 0;
                for (&o, r) in &d {
                    assert!(!r.is_empty());
                    if let Some(e) = last_end {
                        assert!(o > e, "round {round}: ranges {e}..{o} touch or overlap");
                    }
                    for (j, b) in r.iter().enumerate() {
                        assert!(set[o as usize + j], "round {round}: a clean byte is dirty");
                        assert_eq!(
                            *b,
                            bytes[o as usize + j],
                            "round {round} at {}",
                            o as usize + j
                        );
                    }
                    counted += r.len();
                    last_end = Some(o + r.len() as u64);
                }
                assert_eq!(counted, set.iter().filter(|s| **s).count(), "round {round}");
                assert_eq!(total, counted as isize, "round {round}");
            }
        }
    }
}
