//! The namespace's calls (files and directories). Each is answered by the partition that
//! holds its path (docs/partitions.md): the root's map routes it, the partition's group
//! applies it, and the root's state places new chunks and signs capabilities. Partitions'
//! leadership follows the root's, so the root's leader answers every call.

use super::{Inner, as_user, check_read, now_ms};
use crate::convert;
use crate::groups::Hosted;
use crate::state::partitions::{PartitionId, ROOT_PARTITION};
use crate::state::{Command, Inode, Lease, Policy, Reply, State, perm};
use cairn_proto::cap;
use cairn_rpc::auth::Principal;
use cairn_rpc::{ErrorKind, MetaError, pb};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

/// A call's partition, hosted and led by this master (which leads the root too).
pub(super) struct Routed {
    pub h: Arc<Hosted>,
    /// The partition's top directory (`/` for the root).
    pub top: String,
}

impl Routed {
    fn is_root(&self) -> bool {
        self.h.id == ROOT_PARTITION
    }

    /// Refuses `path` when it is the top of a partition's subtree (which only a split or a
    /// merge moves).
    pub(super) fn not_top(&self, path: &str, what: &str) -> Result<(), MetaError> {
        if !self.is_root() && path == self.top {
            return Err(MetaError::invalid(format!(
                "{path} is the top of partition {}'s subtree: it cannot be {what}",
                self.h.id
            )));
        }
        Ok(())
    }
}

/// How long a call waits for its partition's leadership to come to the root's leader.
const LEAD_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The directory above `path` (`/` for a top-level name).
fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

impl Inner {
    /// The partition that holds `path`, when this master leads the root and that partition.
    ///
    /// # Errors
    /// `NotLeader` (the root's leader), `Unavailable` while the partition's leadership moves
    /// here.
    pub(super) async fn route(&self, path: &str) -> Result<Routed, MetaError> {
        self.leader_check()?;
        let r = self.sm.lock().state.route(path);
        self.auto_split
            .note(&self.opts.split, r.partition, &r.top, path);
        Ok(Routed {
            h: self.led_soon(r.partition).await?,
            top: r.top,
        })
    }

    /// [`Inner::led`], waiting up to [`LEAD_WAIT`] for a hosted partition's leadership to
    /// follow the root's here (after a new root leader: about a second).
    pub(super) async fn led_soon(&self, p: PartitionId) -> Result<Arc<Hosted>, MetaError> {
        let until = Instant::now() + LEAD_WAIT;
        loop {
            match self.led(p) {
                Ok(h) => return Ok(h),
                Err(e) if Instant::now() >= until || self.groups.get(p).is_none() => {
                    return Err(e);
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        }
    }

    /// Partition `p`, hosted and led here.
    pub(super) fn led(&self, p: PartitionId) -> Result<Arc<Hosted>, MetaError> {
        let h = self.groups.get(p).ok_or_else(|| {
            MetaError::new(
                ErrorKind::Unavailable,
                format!(
                    "partition {p} is not hosted by this master, the root's leader (a \
                     partition serves where the root's leader is one of its members)"
                ),
            )
        })?;
        if p != ROOT_PARTITION {
            h.leader_check().map_err(|_| {
                MetaError::new(
                    ErrorKind::Unavailable,
                    format!("partition {p}'s leadership is moving to the root's leader (retry)"),
                )
            })?;
        }
        Ok(h)
    }

    /// A linearizable read point in the call's partition.
    pub(super) async fn barrier(&self, r: &Routed) -> Result<(), MetaError> {
        if r.is_root() {
            self.read_barrier().await.map(|_| ())
        } else {
            r.h.read_barrier().await.map(|_| ())
        }
    }

    /// A read point for a call that places chunks: the root's (placement reads its servers)
    /// and the call's partition's.
    async fn barrier_placing(&self, r: &Routed) -> Result<(), MetaError> {
        self.read_barrier().await?;
        if !r.is_root() {
            r.h.read_barrier().await?;
        }
        Ok(())
    }

    /// Applies `cmd` in partition `h`.
    pub(super) async fn write_to(&self, h: &Hosted, cmd: Command) -> Result<Reply, MetaError> {
        if h.id == ROOT_PARTITION {
            return self.write(cmd).await;
        }
        if super::frees(&cmd) {
            self.registry.lock().freed(Instant::now());
        }
        h.write(cmd).await
    }

    /// `f` on partition `h`'s state and the root's (locked root first, as everywhere).
    pub(super) fn states<T>(&self, h: &Hosted, f: impl FnOnce(&State, &State) -> T) -> T {
        let root = self.sm.lock();
        if h.id == ROOT_PARTITION {
            return f(&root.state, &root.state);
        }
        let part = h.sm.lock();
        f(&part.state, &root.state)
    }

    /// For a call in a partition other than the root: a user must be able to search the
    /// directories above its top (the partition checks the rest), which are in the
    /// partitions holding them — the root, or for a subtree inside another partition's (a
    /// nested split, a hashed directory's shard) that one and the ones above it.
    pub(super) fn check_above(&self, r: &Routed, who: &Principal) -> Result<(), MetaError> {
        let Principal::User { name, admin: false } = who else {
            return Ok(());
        };
        if r.is_root() {
            return Ok(());
        }
        let mut top = r.top.clone();
        loop {
            let parent = parent_of(&top).to_owned();
            let route = self.sm.lock().state.route(&parent);
            let check = |st: &State| {
                let dir = st.lookup(&parent)?;
                st.check_inode(dir.id, name, perm::SEARCH)
            };
            if route.partition == ROOT_PARTITION {
                return check(&self.sm.lock().state);
            }
            let h = self.groups.get(route.partition).ok_or_else(|| {
                MetaError::new(
                    ErrorKind::Unavailable,
                    format!("partition {} is not hosted here (retry)", route.partition),
                )
            })?;
            check(&h.sm.lock().state)?;
            top = route.top;
        }
    }

    /// The default policy of a new file at `path`: its partition's nearest directory's, else
    /// the root's above the partition's top.
    fn inherited_policy(&self, r: &Routed, path: &str) -> Option<Policy> {
        self.states(&r.h, |part, root| {
            part.inherited_policy(path).or_else(|| match r.is_root() {
                true => None,
                false => root.inherited_policy(parent_of(&r.top)),
            })
        })
    }

    /// Applies `cmd` for `who` in `r` and answers with the node at `path` it touched.
    async fn node_write(
        &self,
        r: &Routed,
        who: &Principal,
        cmd: Command,
        path: &str,
    ) -> Result<pb::NodeReply, MetaError> {
        self.check_above(r, who)?;
        let reply = self.write_to(&r.h, as_user(who, cmd)?).await?;
        let ino = reply.inode.ok_or_else(|| MetaError::internal("no inode"))?;
        Ok(self.states(&r.h, |part, root| {
            convert::node_reply(part, root, path, &ino)
        }))
    }

    /// The reply to a writer's call: its chunks signed for writing, with the file's writer
    /// epoch.
    pub(super) fn file_reply(
        &self,
        ino: Option<Inode>,
        who: &Principal,
    ) -> Result<pb::FileReply, MetaError> {
        let ino = ino.ok_or_else(|| MetaError::internal("command returned no inode"))?;
        let (mut r, signer) = {
            let a = self.sm.lock();
            let signer = crate::caps::Signer::of(&a.state, now_ms(), who);
            (convert::file_reply(&a.state, &ino), signer)
        };
        // Signed outside the state's lock: one HMAC per chunk of the file.
        if let (Some(s), Some(f), Some(meta)) = (signer, r.file.as_mut(), ino.file()) {
            s.sign_file(f, cap::WRITE, meta.writer_epoch);
        }
        Ok(r)
    }

    /// A create's command, routed: placement of its first chunks happens here, on the
    /// leader.
    pub(super) async fn create_command(
        &self,
        r: pb::CreateRequest,
        who: &Principal,
    ) -> Result<(Routed, Command), MetaError> {
        let path = convert::path(&r.path)?;
        let routed = self.route(&path).await?;
        self.check_above(&routed, who)?;
        let policy = match &r.policy {
            Some(p) => convert::policy(Some(p))?,
            None => self.inherited_policy(&routed, &path).unwrap_or_default(),
        };
        let count = convert::chunk_count(r.chunks)?;
        let now = now_ms();
        let lease = if r.client_id.is_empty() {
            None
        } else {
            Some(Lease {
                holder: convert::client_id(&r.client_id)?,
                expires_ms: self.lease_until(now),
            })
        };
        self.check_placeable(&policy)?;
        let (placements, groups) = self.place(&policy, false, count, &BTreeSet::new())?;
        let cmd = Command::Create {
            path,
            policy,
            parents: r.parents,
            now_ms: now,
            lease,
            placements,
            groups,
            mode: convert::mode(r.mode)?,
        };
        Ok((routed, as_user(who, cmd)?))
    }

    /// A commit's command, routed.
    pub(super) async fn commit_command(
        &self,
        r: &pb::CommitRequest,
        who: &Principal,
    ) -> Result<(Routed, Command), MetaError> {
        let now = now_ms();
        let path = convert::path(&r.path)?;
        let routed = self.route(&path).await?;
        self.check_above(&routed, who)?;
        let cmd = Command::Commit {
            path,
            holder: convert::client_id(&r.client_id)?,
            now_ms: now,
            updates: convert::updates(&r.updates)?,
            trim: r.trim,
            release: r.release,
            seal: r.seal,
            lease_until_ms: self.lease_until(now),
            drops: convert::drops(&r.drops)?,
            remove: convert::remove(&r.remove)?,
        };
        Ok((routed, as_user(who, cmd)?))
    }

    /// A delete's command, routed.
    pub(super) async fn delete_command(
        &self,
        r: &pb::PathRequest,
        who: &Principal,
    ) -> Result<(Routed, Command), MetaError> {
        let path = convert::path(&r.path)?;
        let routed = self.route(&path).await?;
        routed.not_top(&path, "deleted")?;
        self.check_above(&routed, who)?;
        Ok((routed, as_user(who, Command::Delete { path })?))
    }

    /// The policy of the file at `path` in `r`.
    fn policy_of(&self, r: &Routed, path: &str) -> Result<Policy, MetaError> {
        let a = r.h.sm.lock();
        let ino = a.state.lookup(path)?;
        ino.file().map(|f| f.policy).ok_or_else(|| {
            MetaError::new(ErrorKind::IsADirectory, format!("{path}: is a directory"))
        })
    }

    pub(super) async fn mkdir(
        &self,
        who: &Principal,
        r: pb::MkdirRequest,
    ) -> Result<pb::NodeReply, MetaError> {
        let path = convert::path(&r.path)?;
        let routed = self.route(&path).await?;
        let cmd = Command::Mkdir {
            path: path.clone(),
            parents: r.parents,
            now_ms: now_ms(),
            policy: r
                .policy
                .as_ref()
                .map(|p| convert::policy(Some(p)))
                .transpose()?,
            mode: convert::mode(r.mode)?,
        };
        self.node_write(&routed, who, cmd, &path).await
    }

    pub(super) async fn open_write(
        &self,
        who: &Principal,
        r: pb::OpenWriteRequest,
    ) -> Result<pb::FileReply, MetaError> {
        let path = convert::path(&r.path)?;
        let holder = convert::client_id(&r.client_id)?;
        let count = convert::chunk_count(r.chunks)?;
        let routed = self.route(&path).await?;
        self.check_above(&routed, who)?;
        self.barrier_placing(&routed).await?;
        let policy = self.policy_of(&routed, &path)?;
        let (placements, groups) = self.place(&policy, false, count, &BTreeSet::new())?;
        let now = now_ms();
        let cmd = Command::OpenWrite {
            path,
            now_ms: now,
            lease: Lease {
                holder,
                expires_ms: self.lease_until(now),
            },
            placements,
            groups,
            continue_below: r.continue_below,
        };
        let reply = self.write_to(&routed.h, as_user(who, cmd)?).await?;
        let mut r = self.file_reply(reply.inode, who)?;
        r.continued_chunk = reply.chunk.unwrap_or(0);
        Ok(r)
    }

    pub(super) async fn stat(
        &self,
        who: &Principal,
        r: pb::PathRequest,
    ) -> Result<pb::NodeReply, MetaError> {
        let path = convert::path(&r.path)?;
        let routed = self.route(&path).await?;
        self.check_above(&routed, who)?;
        self.barrier(&routed).await?;
        let (mut r, signer) = self.states(&routed.h, |part, root| {
            // Through a hard link's entry, its node (state/files/links.rs).
            let ino = part.linked(part.lookup(&path)?);
            // A file's stat hands out capabilities to read it: read permission; a directory's
            // needs only the way to it.
            let want = if ino.file().is_some() { perm::READ } else { 0 };
            check_read(part, who, &ino, want)?;
            let signer = crate::caps::Signer::of(root, now_ms(), who);
            Ok::<_, MetaError>((convert::node_reply(part, root, &path, &ino), signer))
        })?;
        if let (Some(s), Some(f)) = (signer, r.file.as_mut()) {
            s.sign_file(f, cap::READ, 0);
        }
        Ok(r)
    }

    pub(super) async fn list(
        &self,
        who: &Principal,
        r: pb::ListRequest,
    ) -> Result<pb::ListReply, MetaError> {
        let path = convert::path(&r.path)?;
        let routed = self.route(&path).await?;
        self.check_above(&routed, who)?;
        self.barrier(&routed).await?;
        let limit = match r.limit {
            0 => cairn_rpc::LIST_WHOLE_MAX,
            n => n.min(cairn_rpc::LIST_PAGE_MAX) as usize,
        };
        // A hashed directory's entries are its shards' (hashed.rs); the map first, then the
        // partition (the root's lock before any other's).
        let shards = self.shards_of(&path);
        let local = {
            let a = routed.h.sm.lock();
            let dir = a.state.lookup(&path)?;
            let want = if dir.file().is_some() { 0 } else { perm::READ };
            check_read(&a.state, who, &dir, want)?;
            match shards {
                Some(_) => None,
                None => {
                    let (page, more) = a.state.list_page(&path, &r.after, limit)?;
                    let entries: Vec<pb::DirEntry> = page
                        .iter()
                        .map(|i| convert::dir_entry(i, &a.state.linked(i.clone())))
                        .collect();
                    Some((entries, more))
                }
            }
        };
        let (entries, more) = match local {
            Some(l) => l,
            None => {
                let shards = shards.unwrap_or_default();
                self.list_hashed(&shards, &path, &r.after, limit).await?
            }
        };
        if more && r.limit == 0 {
            return Err(MetaError::invalid(format!(
                "{path} holds more than {} entries: list it in pages (ListRequest after and \
                 limit; this client does not)",
                cairn_rpc::LIST_WHOLE_MAX
            )));
        }
        Ok(pb::ListReply { entries, more })
    }

    pub(super) async fn rename(
        &self,
        who: &Principal,
        r: pb::RenameRequest,
    ) -> Result<(), MetaError> {
        let from = convert::path(&r.from)?;
        let to = convert::path(&r.to)?;
        let routed = self.route(&from).await?;
        routed.not_top(&from, "renamed")?;
        let dest = self.sm.lock().state.route(&to);
        self.check_above(&routed, who)?;
        if dest.partition != routed.h.id {
            let dest = Routed {
                h: self.led_soon(dest.partition).await?,
                top: dest.top,
            };
            dest.not_top(&to, "replaced")?;
            self.check_above(&dest, who)?;
            return self
                .rename_across(who, from, to, routed.h.id, dest.h.id)
                .await;
        }
        let cmd = Command::Rename {
            from,
            to,
            now_ms: now_ms(),
        };
        self.write_to(&routed.h, as_user(who, cmd)?).await?;
        Ok(())
    }

    pub(super) async fn set_attr(
        &self,
        who: &Principal,
        r: pb::SetAttrRequest,
    ) -> Result<pb::NodeReply, MetaError> {
        let path = convert::path(&r.path)?;
        let routed = self.route(&path).await?;
        let mode = convert::mode(r.mode)?;
        let cmd = Command::SetAttr {
            path: path.clone(),
            mode,
            owner: r.owner.clone(),
        };
        // A hashed directory's own attributes are on its source and on every shard.
        let shards = self.shards_of(&path);
        let before = match (routed.is_root(), &shards) {
            (true, None) => None,
            _ => routed.h.sm.lock().state.lookup(&path).ok(),
        };
        let reply = self.node_write(&routed, who, cmd.clone(), &path).await?;
        if let Some(shards) = &shards {
            self.set_attr_shards(shards, cmd).await?;
        }
        // A partition's narrowed rights are revoked by the root (revoke.rs; the root's own
        // files by its own change): the partition's files below, and a hashed directory's
        // shards' files. A master that stops between the writes leaves the capabilities
        // already handed out valid until they expire.
        if let Some(b) = before {
            let narrowed = mode.is_some_and(|m| b.mode & !m != 0)
                || r.owner.as_ref().is_some_and(|o| *o != b.owner);
            if narrowed {
                let mut files = match routed.is_root() {
                    true => Vec::new(),
                    false => routed.h.sm.lock().state.revocation_targets(b.id),
                };
                for &p in shards.iter().flatten() {
                    let h = self.led_soon(p).await?;
                    let below = h.sm.lock().state.revocation_targets(crate::state::ROOT);
                    files.extend(below);
                }
                if !files.is_empty() {
                    self.write(Command::Revoke { files }).await?;
                }
            }
        }
        Ok(reply)
    }

    pub(super) async fn allocate(
        &self,
        who: &Principal,
        r: pb::AllocateRequest,
    ) -> Result<pb::FileReply, MetaError> {
        let path = convert::path(&r.path)?;
        let holder = convert::client_id(&r.client_id)?;
        let count = convert::chunk_count(r.chunks)?;
        let exclude = convert::exclude(&r.exclude)?;
        let routed = self.route(&path).await?;
        self.check_above(&routed, who)?;
        self.barrier_placing(&routed).await?;
        let policy = self.policy_of(&routed, &path)?;
        let (placements, groups) = self.place(&policy, r.tail, count, &exclude)?;
        let cmd = Command::Allocate {
            path,
            holder,
            now_ms: now_ms(),
            placements,
            groups,
        };
        let reply = self.write_to(&routed.h, as_user(who, cmd)?).await?;
        self.file_reply(reply.inode, who)
    }

    /// Chunks by id, each from the partition that allocated it.
    pub(super) async fn locate(
        &self,
        who: &Principal,
        r: pb::LocateRequest,
    ) -> Result<pb::LocateReply, MetaError> {
        let ids = convert::locate(&r)?;
        self.read_barrier().await?;
        // Ids of partitions the map does not hold are unknown chunks, as any id never issued.
        let known: BTreeSet<PartitionId> = {
            let root = self.sm.lock();
            root.state.partitions().partitions.keys().copied().collect()
        };
        // Each chunk's partition: the one that allocated it, unless its forwards say the
        // file moved (each read at a barrier of the allocating partition).
        let mut parts = BTreeMap::new();
        for p in ids
            .iter()
            .map(|id| crate::state::partitions::partition_of(*id))
        {
            if p != ROOT_PARTITION && known.contains(&p) && !parts.contains_key(&p) {
                let h = self.led_soon(p).await?;
                h.read_barrier().await?;
                parts.insert(p, h);
            }
        }
        let homes: Vec<PartitionId> = ids.iter().map(|id| self.chunk_home(*id)).collect();
        for p in homes.iter().copied() {
            if p != ROOT_PARTITION && known.contains(&p) && !parts.contains_key(&p) {
                let h = self.led_soon(p).await?;
                h.read_barrier().await?;
                parts.insert(p, h);
            }
        }
        let mut missing = Vec::new();
        let (mut chunks, servers, signer) = {
            let root = self.sm.lock();
            let guards: BTreeMap<_, _> = parts.iter().map(|(p, h)| (*p, h.sm.lock())).collect();
            let state_of = |p: PartitionId| match p {
                ROOT_PARTITION => Some(&root.state),
                p => guards.get(&p).map(|g| &g.state),
            };
            let chunks: Vec<pb::ChunkMeta> = ids
                .iter()
                .zip(&homes)
                .enumerate()
                .map(|(i, (id, p))| {
                    let Some(st) = state_of(*p) else {
                        return Ok(pb::ChunkMeta::default());
                    };
                    match st.chunk(*id) {
                        // Read permission on the chunk's file, as for a stat of it.
                        Some((ino, c)) => {
                            check_read(st, who, &ino, perm::READ).map(|()| convert::chunk(&c))
                        }
                        None => {
                            missing.push(i);
                            Ok(pb::ChunkMeta::default())
                        }
                    }
                })
                .collect::<Result<_, MetaError>>()?;
            let servers = convert::server_addrs(&root.state, &chunks);
            (
                chunks,
                servers,
                crate::caps::Signer::of(&root.state, now_ms(), who),
            )
        };
        // A chunk not where its forwards said: its file moved meanwhile; asked again.
        if missing
            .iter()
            .any(|i| self.chunk_home(ids[*i]) != homes[*i])
        {
            return Err(MetaError::new(
                ErrorKind::Unavailable,
                "a chunk's file moved to another partition (retry)",
            ));
        }
        if let Some(s) = signer {
            for c in chunks.iter_mut().filter(|c| c.id != 0) {
                c.cap = s.sign(c.id, c.version, cap::READ, 0);
            }
        }
        Ok(pb::LocateReply { chunks, servers })
    }
}
