//! Reading chunk groups (erasure-coded chunks, docs/erasure-coding.md §2 and §4).
//!
//! A read goes to the data members holding the range, one request per member (a member's
//! part of a user range is contiguous in it). If a member fails, returns a CRC error, or the
//! reads have not all answered within the backup-read delay (and the backup budget has a
//! token), the read turns *degraded*: the stripes of the range are read from every member
//! that can answer, the first K to answer are decoded, and the range is cut from the
//! rebuilt data cells.

use crate::fs::{Client, Error, Replicas, Result};
use crate::health::Op;
use cairn_ec::{Codec, ReedSolomon, StripeLayout};
use cairn_rpc::pb;
use futures::StreamExt;
use futures::future::join_all;
use futures::stream::FuturesUnordered;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// The stripe layout of a chunk group; `None` for a replicated chunk.
pub(crate) fn layout(c: &pb::ChunkMeta) -> Option<StripeLayout> {
    if c.ec_data == 0 {
        return None;
    }
    StripeLayout::new(c.ec_data, c.ec_parity, c.ec_cell)
}

/// The whole stripes, in user bytes, that every member in `r` holds; `None` when fewer than K
/// of them answered.
pub(crate) fn stripes_held(r: &Replicas, l: &StripeLayout) -> Option<u64> {
    if r.lengths.len() < l.k as usize {
        return None;
    }
    let least = r.lengths.iter().map(|x| x.1).min().unwrap_or(0);
    Some(least / u64::from(l.cell) * l.stripe_bytes())
}

impl Client {
    /// User bytes every answering member of an open group holds (whole stripes), and whether
    /// some member did not answer. `None` when fewer than K answered: the length is unknown.
    pub(crate) async fn group_length(
        &self,
        c: &pb::ChunkMeta,
        l: &StripeLayout,
    ) -> (Option<u64>, bool) {
        let r = self.replicas(c).await;
        (stripes_held(&r, l), r.lengths.len() < c.servers.len())
    }

    /// `n` bytes at `from` of member `i` of group `c`.
    async fn read_member(
        &self,
        c: &pb::ChunkMeta,
        i: usize,
        from: u64,
        n: usize,
    ) -> Result<Vec<u8>> {
        self.on_timed(c.servers[i], Op::Read, n, |d| async move {
            d.read(c.id, from, n).await
        })
        .await
    }

    /// Reads `len` user bytes at `offset` of a compressed group (docs/formats/compressed-block.md):
    /// the stored range of the blocks holding them, each block decoded and its CRC checked
    /// against the user's bytes. The block index is read once per chunk and cached.
    pub(crate) async fn read_compressed(
        &self,
        c: &pb::ChunkMeta,
        l: &StripeLayout,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let block = u64::from(c.lz4_block);
        let bad = |why: String| Error::NoReplica {
            chunk: c.id,
            last: format!("compressed group: {why}"),
        };
        if block == 0 || block > cairn_ec::block::MAX_BLOCK as u64 {
            return Err(bad(format!("block size {block}")));
        }
        let blocks = c.length.div_ceil(block);
        let index_len = cairn_ec::block::index_len(blocks as usize) as u64;
        let blocks_end = c
            .lz4_stream
            .checked_sub(index_len)
            .ok_or_else(|| bad(format!("stream of {} bytes", c.lz4_stream)))?;
        let cached = self.inner.block_indexes.lock().get(&c.id).cloned();
        let index = match cached {
            Some(i) => i,
            None => {
                let raw = self
                    .read_group(c, l, blocks_end, index_len as usize)
                    .await?;
                let i = cairn_ec::block::decode_index(&raw, blocks as u32, c.lz4_block, blocks_end)
                    .map_err(|e| bad(e.to_string()))?;
                let i = std::sync::Arc::new(i);
                self.inner.block_indexes.lock().put(c.id, i.clone());
                i
            }
        };
        let first = offset / block;
        let last = (offset + len as u64 - 1) / block;
        if last >= blocks {
            return Err(bad(format!("range past the chunk's {} bytes", c.length)));
        }
        let (lo, hi) = (index[first as usize], index[last as usize + 1]);
        let stored = self.read_group(c, l, lo, (hi - lo) as usize).await?;
        let mut user = Vec::with_capacity(((last - first + 1) * block) as usize);
        let mut pos = 0usize;
        for b in first..=last {
            let want = (c.length - b * block).min(block) as usize;
            let before = user.len();
            let n = cairn_ec::block::decode(&stored[pos..], &mut user)
                .map_err(|e| bad(format!("block {b}: {e}")))?;
            if user.len() - before != want {
                return Err(bad(format!(
                    "block {b} holds {} bytes, not {want}",
                    user.len() - before
                )));
            }
            pos += n;
        }
        let from = (offset - first * block) as usize;
        Ok(user[from..from + len].to_vec())
    }

    /// Reads `len` user bytes at `offset` of group `c`.
    pub(crate) async fn read_group(
        &self,
        c: &pb::ChunkMeta,
        l: &StripeLayout,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        let pieces: Vec<cairn_ec::Piece> = l.pieces(offset, len as u64).collect();
        // Each data member's part: one contiguous range of the member.
        let mut ranges: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for p in &pieces {
            let r = ranges
                .entry(p.chunk)
                .or_insert((p.chunk_offset, p.chunk_offset));
            r.0 = r.0.min(p.chunk_offset);
            r.1 = r.1.max(p.chunk_offset + p.len);
        }
        let reads = join_all(ranges.iter().map(|(&m, &(from, to))| async move {
            (
                m,
                self.read_member(c, m as usize, from, (to - from) as usize)
                    .await,
            )
        }));
        tokio::pin!(reads);
        let delay = ranges
            .keys()
            .map(|&m| self.inner.health.backup_delay(c.servers[m as usize], len))
            .max()
            .unwrap_or_default();
        let results = tokio::select! {
            r = &mut reads => Some(r),
            () = tokio::time::sleep(delay) => None,
        };
        let results = match results {
            Some(r) => r,
            None if self.inner.health.take_backup() => {
                let none = BTreeMap::new();
                return self
                    .read_degraded(c, l, &pieces, offset, len, &none, "slow")
                    .await;
            }
            None => reads.await,
        };
        let mut bufs = BTreeMap::new();
        let mut failed = None;
        for (m, r) in results {
            let want = (ranges[&m].1 - ranges[&m].0) as usize;
            match r {
                Ok(data) if data.len() == want => {
                    bufs.insert(m, data);
                }
                Ok(data) => {
                    failed = Some(format!(
                        "member {m} returned {} of {want} bytes",
                        data.len()
                    ));
                }
                Err(e) => {
                    tracing::debug!(chunk = c.id, member = m, error = %e, "degraded read");
                    failed = Some(e.to_string());
                }
            }
        }
        if let Some(why) = failed {
            // The members that answered keep their bytes where they cover whole stripes.
            let stripes = l.stripes(offset, len as u64);
            let cell = u64::from(l.cell);
            let whole = (stripes.start * cell, stripes.end * cell);
            let have: BTreeMap<u32, Vec<u8>> = bufs
                .into_iter()
                .filter(|(m, _)| ranges[m] == whole)
                .collect();
            return self
                .read_degraded(c, l, &pieces, offset, len, &have, &why)
                .await;
        }
        let mut out = vec![0u8; len];
        for p in &pieces {
            let from = (p.chunk_offset - ranges[&p.chunk].0) as usize;
            out[p.at as usize..][..p.len as usize]
                .copy_from_slice(&bufs[&p.chunk][from..][..p.len as usize]);
        }
        Ok(out)
    }

    /// Reads the stripes of the range from K members and decodes the data cells. `have`
    /// holds members already read over exactly those stripes; the others are asked parity
    /// first, no more at a time than are still needed, a failed one replaced by the next.
    #[allow(clippy::too_many_arguments)]
    async fn read_degraded(
        &self,
        c: &pb::ChunkMeta,
        l: &StripeLayout,
        pieces: &[cairn_ec::Piece],
        offset: u64,
        len: usize,
        have: &BTreeMap<u32, Vec<u8>>,
        why: &str,
    ) -> Result<Vec<u8>> {
        self.inner
            .health
            .stats
            .degraded_reads
            .fetch_add(1, Ordering::Relaxed);
        metrics::counter!("cairn_client_degraded_reads_total").increment(1);
        let (k, width) = (l.k as usize, (l.k + l.m) as usize);
        let stripes = l.stripes(offset, len as u64);
        let cell = u64::from(l.cell);
        let from = stripes.start * cell;
        let n = ((stripes.end - stripes.start) * cell) as usize;
        let mut cells: Vec<Option<Vec<u8>>> = vec![None; width];
        for (&m, data) in have {
            cells[m as usize] = Some(data.clone());
        }
        let mut got = have.len();
        // Parity members first (the data members not read yet are likely the failed ones).
        let mut order: Vec<usize> = (k..width)
            .chain(0..k)
            .filter(|i| cells[*i].is_none())
            .collect();
        order.reverse();
        let read = |i: usize| async move { (i, self.read_member(c, i, from, n).await) };
        let mut inflight = FuturesUnordered::new();
        while inflight.len() < k.saturating_sub(got) {
            let Some(i) = order.pop() else { break };
            inflight.push(read(i));
        }
        let mut last = why.to_owned();
        while got < k {
            let Some((i, r)) = inflight.next().await else {
                return Err(Error::NoReplica {
                    chunk: c.id,
                    last: format!(
                        "{got} of the group's {width} members could serve stripes {stripes:?}, \
                         {k} are needed; last error: {last}"
                    ),
                });
            };
            match r {
                Ok(data) if data.len() == n => {
                    cells[i] = Some(data);
                    got += 1;
                    continue;
                }
                Ok(data) => last = format!("member {i} returned {} of {n} bytes", data.len()),
                Err(e) => last = e.to_string(),
            }
            if let Some(j) = order.pop() {
                inflight.push(read(j));
            }
        }
        drop(inflight);
        let codec = ReedSolomon::new(k, width - k).map_err(|e| Error::NoReplica {
            chunk: c.id,
            last: e.to_string(),
        })?;
        codec
            .reconstruct(&mut cells)
            .map_err(|e| Error::NoReplica {
                chunk: c.id,
                last: e.to_string(),
            })?;
        let mut out = vec![0u8; len];
        for p in pieces {
            let at = (p.chunk_offset - from) as usize;
            let shard = cells[p.chunk as usize].as_ref().expect("reconstructed");
            out[p.at as usize..][..p.len as usize].copy_from_slice(&shard[at..][..p.len as usize]);
        }
        Ok(out)
    }
}
