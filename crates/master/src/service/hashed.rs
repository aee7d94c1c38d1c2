//! Directories hashed over several partitions, at the service (state/hashed.rs): making one
//! (`cairn admin partition split PATH --shards K`; a populated one's rows move by hash through
//! the split's copy, `drive_move`), listing one (a merge of its shards' pages), and changing
//! its own attributes (on its source and every shard).

use super::Inner;
use crate::state::Command;
use crate::state::partitions::{PartitionId, ROOT_PARTITION};
use cairn_rpc::{MetaError, pb};
use std::time::{Duration, Instant};

impl Inner {
    /// Hashes the directory at `path` — missing or empty, in any partition — over `k` new
    /// partitions hosted by `members` (the root's voters when empty); the shards. Asked again
    /// for a directory hashed already, it answers its shards.
    ///
    /// 1. each shard applies `InitPartition` (the directory as its top, with the source's
    ///    owner and mode; its inherited default policy kept on it);
    /// 2. the source, `HashDir` (checked as it applies: the directory is still missing or
    ///    empty, and may go); from then on it refuses paths below it;
    /// 3. when the source is not the root, the root's `DelegateHashed`: the map routes below
    ///    the directory by hash.
    ///
    /// A run that stops after 1 leaves partitions that hold only the directory's top and that
    /// nothing routes to: the next run takes them ([`Inner::unused_partitions_for`]); one that
    /// stops after 2 is finished by running it again.
    pub(super) async fn hash_directory(
        &self,
        path: &str,
        k: u32,
        members: &[u64],
    ) -> Result<Vec<PartitionId>, MetaError> {
        let max = crate::state::hashed::MAX_DIR_SHARDS;
        if k < 2 || k as usize > max {
            return Err(MetaError::invalid(format!(
                "a directory is hashed over 2 to {max} partitions, not {k}"
            )));
        }
        self.read_barrier().await?;
        let (route, hashed) = {
            let st = &self.sm.lock().state;
            (st.route(path), st.hashed().get(path).cloned())
        };
        if let Some(shards) = hashed {
            return Ok(shards);
        }
        let src = route.partition;
        let s = self.led_soon(src).await?;
        s.read_barrier().await?;
        // Hashed at the source already (a run that stopped before the map was told), or
        // its rows moving there now (driven to the end).
        let (at_source, moving) = {
            let st = &s.sm.lock().state;
            let moving = st
                .moving()
                .filter(|m| m.path == path && !st.move_shards().is_empty())
                .map(|_| st.move_shards().to_vec());
            (st.hashed().get(path).cloned(), moving)
        };
        if let Some(shards) = at_source {
            if src != ROOT_PARTITION {
                self.delegate_hashed(path, src, &shards).await?;
            }
            return Ok(shards);
        }
        if let Some(shards) = moving {
            self.drive_move(src).await?;
            return Ok(shards);
        }
        let (owner, mode, policy, populated) = {
            let a = s.sm.lock();
            // A populated directory's rows move by hash (a split's copy, spread).
            let populated = match a.state.check_splittable(path) {
                Ok(_) => false,
                Err(e) if e.kind == cairn_rpc::ErrorKind::DirectoryNotEmpty => true,
                Err(e) => return Err(e),
            };
            // Its entries go apart by name: no hard link may be among them (links.rs).
            a.state.refuse_ties(path, true)?;
            let (owner, mode) = match a.state.lookup(path) {
                Ok(ino) => (ino.owner.clone(), ino.mode),
                Err(_) => (String::new(), crate::state::perm::DEFAULT_DIR_MODE),
            };
            (owner, mode, a.state.inherited_policy(path), populated)
        };
        // Partitions an earlier run made for PATH and stopped before using (its leader lost
        // between the shards' init and the source's change: the client asks again) are
        // taken first, so that a run asked again completes the first rather than leaving
        // partitions nothing routes to.
        let mut shards = self.unused_partitions_for(path, k as usize).await;
        while shards.len() < k as usize {
            shards.push(self.add_partition(members).await?);
        }
        self.host_partitions().await;
        let now = super::now_ms();
        for &p in &shards {
            let h = {
                let until = Instant::now() + Duration::from_secs(15);
                loop {
                    match self.led(p) {
                        Ok(h) => break h,
                        Err(e) if Instant::now() >= until => return Err(e),
                        Err(_) => {
                            self.host_partitions().await;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            };
            let init = Command::InitPartition {
                partition: p,
                path: path.to_owned(),
                owner: owner.clone(),
                mode,
                now_ms: now,
            };
            self.write_to(&h, init).await?;
            self.inherit_condemned(&h).await?;
            if let Some(policy) = policy {
                let keep = Command::Mkdir {
                    path: path.to_owned(),
                    parents: true,
                    now_ms: now,
                    policy: Some(policy),
                    mode: None,
                };
                self.write_to(&h, keep).await?;
            }
        }
        if populated {
            // Refused while a rename across partitions holds a path below (milliseconds):
            // asked again here, as a split's.
            let until = Instant::now() + Duration::from_secs(10);
            loop {
                let begin = Command::BeginHashMove {
                    path: path.to_owned(),
                    shards: shards.clone(),
                    now_ms: now,
                };
                match self.write_to(&s, begin).await {
                    Ok(_) => break,
                    Err(e)
                        if e.kind == cairn_rpc::ErrorKind::Unavailable
                            && Instant::now() < until =>
                    {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
            self.drive_move(src).await?;
        } else {
            let hash = Command::HashDir {
                path: path.to_owned(),
                shards: shards.clone(),
                mode,
                now_ms: now,
            };
            self.write_to(&s, hash).await?;
            if src != ROOT_PARTITION {
                self.delegate_hashed(path, src, &shards).await?;
            }
        }
        tracing::info!(
            path,
            ?shards,
            source = src,
            populated,
            "directory hashed over partitions"
        );
        Ok(shards)
    }

    /// Up to `k` partitions in the map that hold only `path`'s top (initialized for it) and
    /// that nothing routes to or moves into: made for `path` by a run that stopped.
    pub(super) async fn unused_partitions_for(&self, path: &str, k: usize) -> Vec<PartitionId> {
        let candidates: Vec<PartitionId> = {
            let st = &self.sm.lock().state;
            let used: std::collections::BTreeSet<PartitionId> = st
                .subtrees()
                .values()
                .copied()
                .chain(st.hashed().values().flatten().copied())
                .collect();
            st.partitions()
                .partitions
                .keys()
                .copied()
                .filter(|p| !used.contains(p))
                .collect()
        };
        let mut out = Vec::new();
        for p in candidates {
            if out.len() == k {
                break;
            }
            let Ok(h) = self.led_soon(p).await else {
                continue;
            };
            if h.read_barrier().await.is_err() {
                continue;
            }
            let unused = {
                let st = &h.sm.lock().state;
                st.home().partition == p
                    && st.home().path == path
                    && st.inode_count() == 1
                    && st.moving().is_none()
                    && !st.load_sealed()
            };
            // Nor a receiver of a move under way at another partition.
            let receiving = self.groups.all().iter().any(|g| {
                let st = &g.sm.lock().state;
                st.moving().is_some_and(|m| m.to == p) || st.move_shards().contains(&p)
            });
            if unused && !receiving {
                out.push(p);
            }
        }
        out
    }

    async fn delegate_hashed(
        &self,
        path: &str,
        from: PartitionId,
        shards: &[PartitionId],
    ) -> Result<(), MetaError> {
        let cmd = Command::DelegateHashed {
            path: path.to_owned(),
            from,
            shards: shards.to_vec(),
        };
        self.write(cmd).await.map(|_| ())
    }

    /// The shards of the directory at `path` when it is hashed (the root's map).
    pub(super) fn shards_of(&self, path: &str) -> Option<Vec<PartitionId>> {
        self.sm.lock().state.hashed().get(path).cloned()
    }

    /// A page of a hashed directory's entries: each shard's page from the same place,
    /// merged in name order and cut at `limit` (exact: an entry missing from a shard's page
    /// comes after that page's `limit`, so after at least `limit` of the merge). Memory is
    /// K pages.
    pub(super) async fn list_hashed(
        &self,
        shards: &[PartitionId],
        path: &str,
        after: &str,
        limit: usize,
    ) -> Result<(Vec<pb::DirEntry>, bool), MetaError> {
        let mut all = Vec::new();
        let mut more = false;
        for &p in shards {
            let h = self.led_soon(p).await?;
            h.read_barrier().await?;
            let a = h.sm.lock();
            let (page, cut) = a.state.list_page(path, after, limit)?;
            more |= cut;
            all.extend(
                page.iter()
                    .map(|i| crate::convert::dir_entry(i, &a.state.linked(i.clone()))),
            );
            drop(a);
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        if all.len() > limit {
            all.truncate(limit);
            more = true;
        }
        Ok((all, more))
    }

    /// After a hashed directory's own attributes changed at its source: the same change in
    /// each shard, where its copy is the shards' top (checked for every call below it). A
    /// master that stops in between leaves shards with the old bits until the change is made
    /// again.
    pub(super) async fn set_attr_shards(
        &self,
        shards: &[PartitionId],
        cmd: Command,
    ) -> Result<(), MetaError> {
        for &p in shards {
            let h = self.led_soon(p).await?;
            self.write_to(&h, cmd.clone()).await?;
        }
        Ok(())
    }
}
