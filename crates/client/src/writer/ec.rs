//! Writing a file whose policy is `ec:K+M` (docs/erasure-coding.md §3).
//!
//! Whole stripes go to the current *chunk group*: the client encodes the M parity cells and
//! sends member `i` its cells, and a stripe is acknowledged once all K+M members hold it
//! durably. Bytes of a stripe that is not full yet are made durable in a *tail*: a replicated
//! chunk with M+1 copies (all durable before the acknowledgement), after the group in the
//! file. When the stripe fills, it is written to the group and one commit records the group's
//! new length and removes the tails; until that commit the group's new stripes do not count
//! (a group's stripes past its committed length count only while nothing after it in the file
//! holds bytes), so a reader or a recovering writer sees the bytes once, in the tails.
//!
//! When the group cannot take the next stripe (full, or a member failed), it is sealed at its
//! acknowledged stripes and its tails are sealed as they are: they stay in the file, and the
//! next group starts after them. So no group is ever written before a tail with data.

use super::{FlatLogFile, Piece, Src, Stuck, seal_update};
use crate::fs::{Error, Result};
use bytes::Bytes;
use cairn_ec::{Codec, ReedSolomon, StripeLayout};
use cairn_rpc::{MetaError, pb};
use std::time::Instant;

/// The EC state of a writer.
pub(super) struct EcWriter {
    pub layout: StripeLayout,
    codec: ReedSolomon,
    /// Bytes of the stripe being filled: acknowledged, held by `tails`.
    pending: Vec<u8>,
    /// Tail chunks holding `pending`, in order.
    tails: Vec<u64>,
    /// A chunk that is not the active one but still open: (id, acknowledged chunk bytes).
    parked_group: Option<(u64, u64)>,
    parked_tail: Option<(u64, u64)>,
    /// The group holds stripes whose length the masters have not recorded.
    dirty: bool,
}

/// Bytes per cell: the masters' default for new groups (`cairn_master::state::DEFAULT_CELL`);
/// a group with another cell is refused.
pub(super) const CELL: u32 = 64 << 10;

/// Stripes written in one go at most (each member gets up to this many cells per request).
const MAX_STRIPES: u64 = 16;

impl EcWriter {
    pub fn new(k: u32, m: u32, cell: u32) -> Option<Self> {
        Some(Self {
            layout: StripeLayout::new(k, m, cell)?,
            codec: ReedSolomon::new(k as usize, m as usize).ok()?,
            pending: Vec::new(),
            tails: Vec::new(),
            parked_group: None,
            parked_tail: None,
            dirty: false,
        })
    }
}

impl FlatLogFile {
    /// Appends `rest` to an EC file: whole stripes to the group, the rest to the tail.
    pub(super) async fn append_ec(&mut self, rest: &mut Src<'_>) -> Result<()> {
        let retry_for = self.client.inner.opts.retry_for;
        let give_up = Instant::now() + retry_for;
        while !rest.is_empty() {
            let ec = self.ec.as_ref().expect("an EC file");
            let sb = ec.layout.stripe_bytes();
            let pending = ec.pending.len() as u64;
            if pending + rest.len() as u64 >= sb {
                let n = self.write_stripes(rest).await;
                if let Err(why) = n {
                    self.leave_group(&why).await?;
                    if Instant::now() >= give_up {
                        return Err(Error::Writer(format!(
                            "{}: no chunk group took the stripe within {retry_for:?}: {why}",
                            self.path
                        )));
                    }
                }
            } else {
                let data = rest.head(rest.len());
                if let Err(why) = self.write_tail(data.clone()).await? {
                    self.stats.switches += 1;
                    tracing::warn!(path = %self.path, %why, "sealing the tail and going on in a new one");
                    self.finish_chunk(false).await?;
                    if Instant::now() >= give_up {
                        return Err(Error::Writer(format!(
                            "{}: no tail chunk took the append within {retry_for:?}: {why}",
                            self.path
                        )));
                    }
                    continue;
                }
                self.ec
                    .as_mut()
                    .expect("ec")
                    .pending
                    .extend_from_slice(&data);
                self.length += data.len() as u64;
                rest.advance(data.len());
            }
        }
        Ok(())
    }

    /// Writes as many whole stripes as `pending` and `rest` make (and the group has room
    /// for) to the group, then folds: `rest` advances past what it gave.
    async fn write_stripes(&mut self, rest: &mut Src<'_>) -> std::result::Result<(), String> {
        self.activate_group().await.map_err(|e| e.to_string())?;
        let chunk_size = self.client.inner.opts.chunk_size;
        let a = self.active.as_ref().expect("group active");
        let ec = self.ec.as_ref().expect("ec");
        let (l, cell) = (ec.layout, u64::from(ec.layout.cell));
        let room = (chunk_size - a.acked) / cell;
        let pending = ec.pending.len() as u64;
        let n = ((pending + rest.len() as u64) / l.stripe_bytes())
            .min(room)
            .min(MAX_STRIPES);
        debug_assert!(n > 0, "a group with room is active");
        let take = (n * l.stripe_bytes() - pending) as usize;
        let head = rest.head(take);
        let pieces =
            encode(&ec.codec, &l, [&ec.pending, &head], a.acked).map_err(|e| e.to_string())?;
        match self.replicate(pieces).await {
            Ok(()) => {}
            Err(Stuck::Switch(why)) => return Err(why),
        }
        rest.advance(take);
        self.length += take as u64;
        let a = self.active.as_ref().expect("group active");
        let (id, user) = (a.id, a.acked * a.scale);
        self.chunks[a.idx].length = user;
        let ec = self.ec.as_mut().expect("ec");
        if ec.pending.is_empty() {
            ec.dirty = true;
        } else {
            // The fold: the group's new length and the tails' removal in one commit.
            ec.pending.clear();
            self.remove = std::mem::take(&mut ec.tails);
            ec.parked_tail = None;
            let update = group_update(id, user);
            self.commit(vec![update], false, false, false)
                .await
                .map_err(|e| e.to_string())?;
            self.ec.as_mut().expect("ec").dirty = false;
        }
        if self.active.as_ref().is_some_and(|a| a.acked >= chunk_size) {
            self.finish_chunk(false).await.map_err(|e| e.to_string())?;
            self.ec.as_mut().expect("ec").dirty = false;
        }
        Ok(())
    }

    /// The group cannot go on (`why`): it is sealed at its acknowledged stripes, and the
    /// tails holding the partial stripe are sealed as they are and stay in the file.
    async fn leave_group(&mut self, why: &str) -> Result<()> {
        tracing::warn!(path = %self.path, %why, "sealing the chunk group and going on in a new one");
        self.stats.switches += 1;
        metrics::counter!("cairn_client_chasing_total", "event" => "switch").increment(1);
        if self.active.as_ref().is_some_and(|a| a.scale > 1) {
            self.finish_chunk(false).await?;
        }
        self.seal_tails().await?;
        let ec = self.ec.as_mut().expect("ec");
        ec.parked_group = None;
        ec.dirty = false;
        Ok(())
    }

    /// Seals the tails as they are: the partial stripe's bytes stay in them for good.
    async fn seal_tails(&mut self) -> Result<()> {
        if self.active.as_ref().is_some_and(|a| a.scale == 1) {
            self.finish_chunk(false).await?;
        }
        let ec = self.ec.as_mut().expect("ec");
        let parked = ec.parked_tail.take();
        ec.pending.clear();
        ec.tails.clear();
        let mut updates = Vec::new();
        if let Some((id, acked)) = parked {
            let idx = self.index_of(id)?;
            updates.push(seal_update(&mut self.chunks[idx], acked));
        }
        if !updates.is_empty() {
            self.commit(updates, false, false, false).await?;
        }
        Ok(())
    }

    /// Appends `data` to the tail (after the group's length is recorded, if it was not).
    /// `Ok(Err(why))`: the tail cannot go on; seal it and try again.
    async fn write_tail(&mut self, data: Bytes) -> Result<std::result::Result<(), String>> {
        self.activate_tail().await?;
        // Bytes of a tail sealed short go first, into the new tail.
        while let Some(b) = self.rewrite.pop_front() {
            let a = self.active.as_ref().expect("tail active");
            let piece = Piece {
                offset: a.acked,
                crc: cairn_proto::frame::crc32c(&b),
                data: b.clone(),
            };
            if let Err(Stuck::Switch(why)) = self.replicate(vec![piece]).await {
                self.rewrite.push_front(b);
                return Ok(Err(why));
            }
            self.stats.rewritten += b.len() as u64;
        }
        let a = self.active.as_ref().expect("tail active");
        let piece = Piece {
            offset: a.acked,
            crc: cairn_proto::frame::crc32c(&data),
            data,
        };
        Ok(match self.replicate(vec![piece]).await {
            Ok(()) => Ok(()),
            Err(Stuck::Switch(why)) => Err(why),
        })
    }

    /// Makes the current group active: the parked one, or the next spare group after
    /// everything that holds bytes.
    async fn activate_group(&mut self) -> Result<()> {
        if self.active.as_ref().is_some_and(|a| a.scale > 1) {
            return Ok(());
        }
        self.park();
        if let Some((id, acked)) = self.ec.as_mut().expect("ec").parked_group.take() {
            self.activate(self.index_of(id)?, acked);
            return Ok(());
        }
        let from = self.after_data();
        self.next_chunk_from(from, Some(true)).await?;
        let a = self.active.as_ref().expect("group active");
        let c = &self.chunks[a.idx];
        if c.ec_cell != CELL || c.servers.len() != (c.ec_data + c.ec_parity) as usize {
            return Err(MetaError::internal(format!(
                "chunk group {} has {}+{} cells of {} bytes on {} servers; this client writes \
                 cells of {CELL}",
                c.id,
                c.ec_data,
                c.ec_parity,
                c.ec_cell,
                c.servers.len()
            ))
            .into());
        }
        Ok(())
    }

    /// Makes the tail active: the parked one, or a new tail after everything that holds
    /// bytes. A tail always follows the current group (one is made current first), so that
    /// the stripe it holds the start of is folded into a group before it in the file. The
    /// group's stripes are recorded first: once a tail after it holds bytes, a group's
    /// unrecorded stripes no longer count.
    async fn activate_tail(&mut self) -> Result<()> {
        if self.active.as_ref().is_some_and(|a| a.scale == 1) {
            return Ok(());
        }
        if self.ec.as_ref().expect("ec").parked_group.is_none() {
            self.activate_group().await?;
        }
        self.park();
        let ec = self.ec.as_mut().expect("ec");
        if let Some((id, acked)) = ec.parked_tail.take() {
            self.activate(self.index_of(id)?, acked);
            return Ok(());
        }
        let k = u64::from(ec.layout.k);
        if ec.dirty
            && let Some((id, acked)) = ec.parked_group
        {
            self.commit(vec![group_update(id, acked * k)], false, false, false)
                .await?;
            self.ec.as_mut().expect("ec").dirty = false;
        }
        let from = self.after_data();
        self.next_chunk_from(from, Some(false)).await?;
        let id = self.active.as_ref().expect("tail active").id;
        self.ec.as_mut().expect("ec").tails.push(id);
        Ok(())
    }

    fn index_of(&self, id: u64) -> Result<usize> {
        self.chunks
            .iter()
            .position(|c| c.id == id)
            .ok_or_else(|| MetaError::internal(format!("chunk {id} left the file")).into())
    }

    /// Index after the last chunk that holds bytes (or is sealed, or is parked).
    fn after_data(&self) -> usize {
        let ec = self.ec.as_ref().expect("ec");
        let parked = [ec.parked_group, ec.parked_tail]
            .into_iter()
            .flatten()
            .filter_map(|(id, _)| self.chunks.iter().position(|c| c.id == id))
            .map(|i| i + 1);
        self.chunks
            .iter()
            .rposition(|c| c.sealed || c.length > 0)
            .map_or(0, |i| i + 1)
            .max(parked.max().unwrap_or(0))
    }

    /// Stops the active chunk's pipes without sealing it; it stays open to resume. Every
    /// member (or tail copy) holds every acknowledged byte: MinCopy is all of them.
    fn park(&mut self) {
        let Some(a) = self.active.take() else {
            return;
        };
        for p in &a.pipes {
            p.task.abort();
        }
        let ec = self.ec.as_mut().expect("ec");
        let slot = if a.scale > 1 {
            &mut ec.parked_group
        } else {
            &mut ec.parked_tail
        };
        *slot = Some((a.id, a.acked));
    }

    /// Seals the chunk groups a previous writer left open (after its tails were recovered):
    /// at the committed length when a later chunk holds bytes (stripes past it may be a
    /// tail's bytes folded in), else at the whole stripes every answering member holds (at
    /// least K must answer). Members holding more are cut there.
    pub(super) async fn recover_groups(
        &mut self,
        updates: &mut Vec<pb::ChunkUpdate>,
    ) -> Result<()> {
        for i in 0..self.chunks.len() {
            let c = &self.chunks[i];
            let Some(l) = crate::group::layout(c).filter(|_| !c.sealed) else {
                continue;
            };
            let later = self.chunks[i + 1..].iter().any(|x| x.length > 0);
            let len = if later {
                c.length
            } else {
                let r = self.client.replicas(c).await;
                if !r.exists {
                    continue; // never written: a spare, still usable
                }
                let len = crate::group::stripes_held(&r, &l).ok_or_else(|| {
                    MetaError::new(
                        cairn_rpc::ErrorKind::Unavailable,
                        format!(
                            "{}: chunk group {} was left open and fewer than {} of its members answer",
                            self.path, c.id, l.k
                        ),
                    )
                })?;
                len.max(c.length)
            };
            let (id, member) = (c.id, len / u64::from(l.k));
            let servers = c.servers.clone();
            let sealed = self.seal_all(id, member, &servers).await;
            for (s, r) in sealed {
                if let Err(e) = r {
                    tracing::warn!(chunk = id, server = s, error = %e, "group member not sealed during recovery");
                }
            }
            updates.push(seal_update(&mut self.chunks[i], len));
        }
        Ok(())
    }

    /// Updates for closing: the parked chunks sealed at what they acknowledged.
    pub(super) fn close_parked(&mut self) -> Vec<pb::ChunkUpdate> {
        let Some(ec) = self.ec.as_mut() else {
            return Vec::new();
        };
        let k = u64::from(ec.layout.k);
        let parked = [
            ec.parked_group.take().map(|(id, a)| (id, a * k)),
            ec.parked_tail.take(),
        ];
        let mut updates = Vec::new();
        for (id, len) in parked.into_iter().flatten() {
            if let Some(c) = self.chunks.iter_mut().find(|c| c.id == id) {
                updates.push(seal_update(c, len));
            }
        }
        updates
    }
}

fn group_update(id: u64, user: u64) -> pb::ChunkUpdate {
    pb::ChunkUpdate {
        chunk_id: id,
        length: user,
        sealed: false,
    }
}

/// The K+M member pieces of whole stripes — the bytes of `parts` one after the other —
/// starting at member offset `offset`: member `i` gets cell `i` of every stripe, in order (the
/// code works on each byte position on its own, so the stripes' cells concatenated encode as
/// one longer cell). The user's bytes are copied once, into the data members' pieces.
fn encode(
    codec: &ReedSolomon,
    l: &StripeLayout,
    parts: [&[u8]; 2],
    offset: u64,
) -> std::result::Result<Vec<Piece>, MetaError> {
    let cell = l.cell as usize;
    let k = l.k as usize;
    let total = parts[0].len() + parts[1].len();
    debug_assert!(total.is_multiple_of(k * cell));
    let stripes = total / (k * cell);
    let mut shards: Vec<Vec<u8>> = (0..k).map(|_| Vec::with_capacity(stripes * cell)).collect();
    for s in 0..stripes {
        for (i, shard) in shards.iter_mut().enumerate() {
            let mut at = (s * k + i) * cell;
            let mut want = cell;
            for p in parts {
                if at >= p.len() {
                    at -= p.len();
                    continue;
                }
                let n = want.min(p.len() - at);
                shard.extend_from_slice(&p[at..at + n]);
                want -= n;
                at = 0;
                if want == 0 {
                    break;
                }
            }
        }
    }
    let refs: Vec<&[u8]> = shards.iter().map(Vec::as_slice).collect();
    let parity = codec
        .encode(&refs)
        .map_err(|e| MetaError::internal(format!("encoding a stripe: {e}")))?;
    Ok(shards
        .into_iter()
        .chain(parity)
        .map(|s| {
            let data = Bytes::from(s);
            Piece {
                offset,
                crc: cairn_proto::frame::crc32c(&data),
                data,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_get_their_cells_of_every_stripe_and_any_k_decode() {
        let l = StripeLayout::new(4, 2, 64).unwrap();
        let codec = ReedSolomon::new(4, 2).unwrap();
        let data: Vec<u8> = (0..3 * 4 * 64).map(|i| (i * 7 + i / 251) as u8).collect();
        // Split anywhere between the pending bytes and the append's: the same pieces.
        let whole = encode(&codec, &l, [&data, &[]], 128).unwrap();
        for cut in [0, 1, 63, 64, 200, data.len()] {
            let (a, b) = data.split_at(cut);
            let p = encode(&codec, &l, [a, b], 128).unwrap();
            assert!(
                p.iter().zip(&whole).all(|(x, y)| x.data == y.data),
                "cut at {cut}"
            );
        }
        for (i, p) in whole.iter().take(4).enumerate() {
            assert_eq!(p.offset, 128);
            for s in 0..3 {
                let cell = &data[(s * 4 + i) * 64..][..64];
                assert_eq!(&p.data[s * 64..][..64], cell, "member {i} stripe {s}");
            }
        }
        // Members 0 and 3 lost: the other four give them back.
        let mut cells: Vec<Option<Vec<u8>>> = whole.iter().map(|p| Some(p.data.to_vec())).collect();
        cells[0] = None;
        cells[3] = None;
        codec.reconstruct(&mut cells).unwrap();
        assert_eq!(cells[0].as_deref(), Some(&whole[0].data[..]));
        assert_eq!(cells[3].as_deref(), Some(&whole[3].data[..]));
    }
}
