//! Splits and moves of subtrees at the service (docs/partitions.md "Split and move"): a
//! split asked for (`split_subtree`), the driver of a move out of the root or of any
//! partition (`drive_move`), and its takeover by the root's next leader (`resume_move`).

use super::{Inner, MetaService};
use crate::state::partitions::{PartitionId, ROOT_PARTITION};
use crate::state::{ChunkId, Command};
use cairn_rpc::MetaError;
use std::collections::BTreeMap;

/// Chunks per `TxForward` a move writes (a chunk id is ~17 bytes of JSON).
pub(super) const FORWARDS_PER_ENTRY: usize = 8192;

impl Inner {
    /// Drives the move out of partition `src` under way, if any (state/moves.rs), to its
    /// end: the rows loaded into the receiving partition in batches, loading sealed there;
    /// the chunks of the subtree that other partitions allocated forwarded by them to the
    /// receiver (`TxForward`); the source's `FinishMove`; and, when the source is not the
    /// root, the root's map told (`DelegateSubtree`). Each step is idempotent, so a driver
    /// that stops anywhere is taken over by the next leader of the root
    /// ([`MetaService::resume_move`]). Returns the rows loaded (0 when loading was sealed
    /// already or no move is under way).
    pub(crate) async fn drive_move(&self, src: PartitionId) -> Result<u64, MetaError> {
        let _one = self.moving.lock().await;
        self.read_barrier().await?;
        let s = self.led_soon(src).await?;
        s.read_barrier().await?;
        let (m, shards) = {
            let a = s.sm.lock();
            let Some(m) = a.state.moving().cloned() else {
                return Ok(0);
            };
            (m, a.state.move_shards().to_vec())
        };
        // The receivers: the one partition, or a hashed directory's shards (state/hashed.rs).
        let hashed = !shards.is_empty();
        let targets = if hashed { shards.clone() } else { vec![m.to] };
        let mut receivers = BTreeMap::new();
        for &t in &targets {
            let h = self.led_soon(t).await?;
            h.read_barrier().await?;
            let sealed = h.sm.lock().state.load_sealed();
            receivers.insert(t, (h, sealed));
        }
        let started = std::time::Instant::now();
        let mut rows = 0u64;
        // Walked again after a takeover that finds loading sealed: the chunks other
        // partitions allocated are still to be forwarded (the source, frozen, holds them);
        // for a hashed directory, every chunk, to its file's shard.
        let mut forwards: BTreeMap<(PartitionId, PartitionId), Vec<ChunkId>> = BTreeMap::new();
        // A hashed directory's: the shard of each directory walked (parents come first).
        let mut dir_shard: std::collections::HashMap<u64, PartitionId> = Default::default();
        let mut cursor = crate::state::moves::RowsCursor::new(&s.sm.lock().state, &m.path)?;
        loop {
            let batch = {
                let a = s.sm.lock();
                if a.state.moving() != Some(&m) {
                    return Err(MetaError::new(
                        cairn_rpc::ErrorKind::Unavailable,
                        format!("the move of {} ended elsewhere", m.path),
                    ));
                }
                a.state.rows_batch(&mut cursor)
            };
            let Some((inodes, policies)) = batch else {
                break;
            };
            let mut parts: BTreeMap<PartitionId, crate::state::moves::LoadBatch> = BTreeMap::new();
            for ino in inodes {
                let to = match hashed {
                    false => m.to,
                    true if ino.parent == crate::state::ROOT => {
                        crate::state::hashed::shard_for(&shards, &ino.name)
                    }
                    true => *dir_shard.get(&ino.parent).ok_or_else(|| {
                        MetaError::internal(format!(
                            "inode {}'s parent {} was not walked before it",
                            ino.id, ino.parent
                        ))
                    })?,
                };
                if ino.file().is_none() {
                    dir_shard.insert(ino.id, to);
                }
                for c in ino
                    .file()
                    .iter()
                    .flat_map(|f| f.chunks.iter().map(|c| c.id))
                {
                    let alloc = crate::state::partitions::partition_of(c);
                    if alloc != src || hashed {
                        forwards.entry((alloc, to)).or_default().push(c);
                    }
                }
                parts.entry(to).or_default().0.push(ino);
            }
            for (id, p) in policies {
                let to = if hashed {
                    dir_shard.get(&id).copied().unwrap_or(m.to)
                } else {
                    m.to
                };
                parts.entry(to).or_default().1.push((id, p));
            }
            for (to, (inodes, policies)) in parts {
                let Some((h, sealed)) = receivers.get(&to) else {
                    continue;
                };
                if *sealed {
                    continue;
                }
                rows += inodes.len() as u64;
                let load = Command::LoadRows {
                    top: m.path.clone(),
                    inodes,
                    policies,
                };
                self.write_to(h, load).await?;
            }
        }
        for (h, sealed) in receivers.values() {
            if !*sealed {
                let seal = Command::SealLoad {
                    top: m.path.clone(),
                };
                self.write_to(h, seal).await?;
            }
        }
        // Before the source lets the rows go: a forward naming the source after it would
        // lead to no file, and the chunk's replicas would be deleted as orphans.
        for ((alloc, to), chunks) in &forwards {
            let a = self.led_soon(*alloc).await?;
            for part in chunks.chunks(FORWARDS_PER_ENTRY) {
                let fwd = Command::TxForward {
                    chunks: part.to_vec(),
                    to: *to,
                };
                self.write_to(&a, fwd).await?;
            }
        }
        self.write_to(
            &s,
            Command::FinishMove {
                path: m.path.clone(),
                to: m.to,
            },
        )
        .await?;
        if src != ROOT_PARTITION {
            let tell = match hashed {
                true => Command::DelegateHashed {
                    path: m.path.clone(),
                    from: src,
                    shards: shards.clone(),
                },
                false => Command::DelegateSubtree {
                    path: m.path.clone(),
                    from: src,
                    to: m.to,
                },
            };
            self.write(tell).await?;
        }
        tracing::info!(path = %m.path, from = src, partition = m.to, ?shards, rows,
            forwarded = forwards.values().map(Vec::len).sum::<usize>(),
            ms = started.elapsed().as_millis() as u64, "subtree moved");
        Ok(rows)
    }

    /// Subtrees partitions led here moved out that the root's map does not send to their
    /// new partition yet (a driver stopped between the source's `FinishMove` and the root's
    /// `DelegateSubtree`): the root is told.
    pub(crate) async fn finish_delegations(&self) -> Result<(), MetaError> {
        for (path, from, to) in self.missing_delegations() {
            self.write(Command::DelegateSubtree { path, from, to })
                .await?;
        }
        for (path, from, shards) in self.missing_hashed() {
            self.write(Command::DelegateHashed { path, from, shards })
                .await?;
        }
        Ok(())
    }

    /// Directories partitions led here hashed that the root's map does not route by hash
    /// yet: (path, from, shards).
    fn missing_hashed(&self) -> Vec<(String, PartitionId, Vec<PartitionId>)> {
        self.missing_in_root(crate::state::State::hashed)
    }

    /// See [`Inner::finish_delegations`]: (path, from, to).
    fn missing_delegations(&self) -> Vec<(String, PartitionId, PartitionId)> {
        self.missing_in_root(crate::state::State::subtrees)
    }

    /// The entries of a path-keyed cell (`of`) of the partitions led here, other than the
    /// root, that the root's same cell (its map) lacks or holds otherwise: (path, partition,
    /// value).
    fn missing_in_root<V: Clone + PartialEq>(
        &self,
        of: fn(&crate::state::State) -> &BTreeMap<String, V>,
    ) -> Vec<(String, PartitionId, V)> {
        let root = self.sm.lock();
        self.groups
            .all()
            .into_iter()
            .filter(|h| h.id != ROOT_PARTITION && h.leader_check().is_ok())
            .flat_map(|h| {
                let st = h.sm.lock();
                of(&st.state)
                    .iter()
                    .filter(|(path, v)| of(&root.state).get(path.as_str()) != Some(*v))
                    .map(|(path, v)| (path.clone(), h.id, v.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

impl MetaService {
    /// At the root's leader, takes over a move under way that no driver here runs (its
    /// driver stopped, or another master's was), out of the root or out of a partition led
    /// here, and tells the root's map of subtrees partitions moved out that it misses.
    pub(crate) fn resume_move(&self) {
        if self.inner.leader_check().is_err() || self.inner.moving.try_lock().is_err() {
            return;
        }
        let sources: Vec<PartitionId> = self
            .inner
            .groups
            .all()
            .into_iter()
            .filter(|h| h.id == ROOT_PARTITION || h.leader_check().is_ok())
            .filter(|h| h.sm.lock().state.moving().is_some())
            .map(|h| h.id)
            .collect();
        if sources.is_empty()
            && self.inner.missing_delegations().is_empty()
            && self.inner.missing_hashed().is_empty()
        {
            return;
        }
        let inner = self.inner.clone();
        tokio::spawn(async move {
            for src in sources {
                if let Err(e) = inner.drive_move(src).await {
                    tracing::warn!(error = %e, from = src, "moving a subtree: not finished (retried)");
                }
            }
            if let Err(e) = inner.finish_delegations().await {
                tracing::warn!(error = %e, "a subtree moved out of a partition: the root's map not told yet (retried)");
            }
        });
    }
}

impl Inner {
    /// Sends the subtree at `path` to partition `to`, a new one hosted by `members` when
    /// `to` is 0; the partition's number (see [`MetaService::split_partition`]). `path` is
    /// in the root partition or below another partition's top (its *source*).
    pub(super) async fn split_subtree(
        &self,
        path: &str,
        to: PartitionId,
        members: &[u64],
    ) -> Result<PartitionId, MetaError> {
        let path = path.to_owned();
        self.read_barrier().await?;
        // A subtree split already is left as it is (a client's retry after the leader
        // changed).
        let (route, split_to) = {
            let st = &self.sm.lock().state;
            (st.route(&path), st.subtrees().get(&path).copied())
        };
        if let Some(p) = split_to
            && (to == 0 || to == p)
        {
            return Ok(p);
        }
        let src = route.partition;
        let s = self.led_soon(src).await?;
        s.read_barrier().await?;
        // The move under way is driven to its end; one its source finished is put in the
        // root's map.
        let (moving, delegated) = {
            let st = &s.sm.lock().state;
            (
                st.moving().filter(|m| m.path == path).map(|m| m.to),
                st.subtrees().get(&path).copied(),
            )
        };
        if let Some(moving_to) = moving {
            self.drive_move(src).await?;
            return Ok(moving_to);
        }
        if let Some(p) = delegated.filter(|_| src != ROOT_PARTITION) {
            self.finish_delegations().await?;
            return Ok(p);
        }
        // Checked before a new partition is made for it (and again as it applies). Out of
        // another partition a subtree always moves by copying, and must exist.
        let populated = {
            let st = &s.sm.lock().state;
            if src == ROOT_PARTITION {
                match st.check_splittable(&path) {
                    Ok(_) => false,
                    Err(e) if e.kind == cairn_rpc::ErrorKind::DirectoryNotEmpty => true,
                    Err(e) => return Err(e),
                }
            } else {
                if st.check_movable(&path)?.is_none() {
                    return Err(MetaError::not_found(format!(
                        "{path} (in partition {src}): a subtree of a partition other than the \
                         root moves as it is, so it must exist"
                    )));
                }
                true
            }
        };
        if to != 0 {
            self.sm.lock().state.check_target(to)?;
        }
        let to = match to {
            // A partition an earlier run made for PATH and stopped before using is taken
            // (its `InitPartition` again is a no-op): the split asked again completes it.
            0 => match self.unused_partitions_for(&path, 1).await.first() {
                Some(p) => *p,
                None => {
                    let id = self.add_partition(members).await?;
                    self.host_partitions().await;
                    id
                }
            },
            id => {
                if !members.is_empty() {
                    return Err(MetaError::invalid(
                        "members are given for a new partition only (to = 0)",
                    ));
                }
                id
            }
        };
        // Its leadership follows the root's: wait for it here.
        let h = {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(15);
            loop {
                match self.led(to) {
                    Ok(h) => break h,
                    Err(e) if std::time::Instant::now() >= until => return Err(e),
                    Err(_) => {
                        self.host_partitions().await;
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
            }
        };
        let (owner, mode, policy) = {
            let a = s.sm.lock();
            let (owner, mode) = match a.state.lookup(&path) {
                Ok(ino) => (ino.owner.clone(), ino.mode),
                Err(_) => (String::new(), crate::state::perm::DEFAULT_DIR_MODE),
            };
            (owner, mode, a.state.inherited_policy(&path))
        };
        let now = super::now_ms();
        self.write_to(
            &h,
            Command::InitPartition {
                partition: to,
                path: path.clone(),
                owner: owner.clone(),
                mode,
                now_ms: now,
            },
        )
        .await?;
        self.inherit_condemned(&h).await?;
        if let Some(p) = policy {
            let keep = Command::Mkdir {
                path: path.clone(),
                parents: true,
                now_ms: now,
                policy: Some(p),
                mode: None,
            };
            self.write_to(&h, keep).await?;
        }
        if populated {
            // Refused while a rename across partitions holds a path below (milliseconds):
            // asked again here rather than by the client, which would make another
            // partition.
            let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                let begin = Command::BeginMove {
                    path: path.clone(),
                    to,
                    now_ms: now,
                };
                match self.write_to(&s, begin).await {
                    Ok(_) => break,
                    Err(e)
                        if e.kind == cairn_rpc::ErrorKind::Unavailable
                            && std::time::Instant::now() < until =>
                    {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
            self.drive_move(src).await?;
        } else {
            self.write(Command::AssignSubtree {
                path,
                partition: to,
                owner,
                mode,
                now_ms: now,
            })
            .await?;
        }
        Ok(to)
    }
}
