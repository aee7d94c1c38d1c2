//! The file service's reads (`FileQuery`) and the holds they honour: a file another mount
//! made, closed and has not committed yet is answered `lease-held` to everyone else until
//! the holder's first commit (docs/files.md "A close that does not wait"); so are, in a
//! directory another mount made a moment ago, lookups of names it does not hold, its
//! listing and any change that would add a name to it or take it away (docs/files.md "A
//! create that does not wait").

use super::*;

impl State {
    /// `FileOp::Hold`: the hold of `holder` on the file at `path` (inode `ino`) lasts
    /// [`cairn_rpc::files::HOLD_MS`] from `now`; on a directory,
    /// [`cairn_rpc::files::DIR_HOLD_MS`].
    pub(super) fn renew_hold(
        &mut self,
        path: &str,
        ino: u64,
        holder: &str,
        now: Time,
    ) -> Result<(), MetaError> {
        let node = self.node(path, ino)?;
        if node
            .posix
            .as_ref()
            .and_then(|p| p.hold.as_ref())
            .is_some_and(|l| l.holder == holder)
        {
            if let Some(l) = self.posix_mut(node.id).hold.as_mut() {
                l.expires_ms = now.as_ms().saturating_add(cairn_rpc::files::DIR_HOLD_MS);
            }
            return Ok(());
        }
        if node
            .file()
            .and_then(|f| f.lease.as_ref())
            .is_some_and(|l| l.holder == holder)
            && let Some(i) = self.inodes.get_mut(&node.id)
            && let Kind::File(f) = &mut i.kind
            && let Some(l) = &mut f.lease
        {
            l.expires_ms = now.as_ms().saturating_add(cairn_rpc::files::HOLD_MS);
        }
        Ok(())
    }

    /// Answers a file service read (all but `Statfs`, which needs the chunkservers), holds
    /// unchecked.
    ///
    /// # Errors
    /// As [`State::file_query_at`].
    pub fn file_query(&self, q: &FileQuery) -> Result<FileReply, MetaError> {
        self.file_query_at(q, None)
    }

    /// Answers a file service read at `now_ms`, the leader's clock: a lookup or map of a
    /// file another mount holds then answers `lease-held` (`None`: holds unchecked).
    ///
    /// # Errors
    /// The lookup's errors; `not-found` for a stale inode number; `lease-held`.
    pub fn file_query_at(
        &self,
        q: &FileQuery,
        now_ms: Option<u64>,
    ) -> Result<FileReply, MetaError> {
        match q {
            FileQuery::Lookup { path, mount } => {
                let node = match self.lookup(path) {
                    Ok(n) => self.linked(n),
                    Err(e) => return Err(self.missing(path, mount, now_ms, e)),
                };
                check_hold(path, &node, mount, now_ms)?;
                Ok(FileReply::Attr(self.node_attr(&node)))
            }
            FileQuery::Readdir {
                path,
                ino,
                after,
                limit,
                mount,
            } => {
                let dir = self.node(path, *ino)?;
                check_dir_hold(path, &dir, mount, now_ms)?;
                let limit = (*limit).clamp(1, cairn_rpc::files::READDIR_MAX) as usize;
                let (page, more) = self.list_page(path, after, limit)?;
                Ok(FileReply::Readdir {
                    entries: page
                        .iter()
                        .map(|i| Entry {
                            name: i.name.clone(),
                            attr: self.node_attr(&self.linked(i.clone())),
                        })
                        .collect(),
                    more,
                })
            }
            FileQuery::Map { path, ino, mount } => {
                let node = match self.node(path, *ino) {
                    Ok(n) => n,
                    Err(e) => return Err(self.missing(path, mount, now_ms, e)),
                };
                check_hold(path, &node, mount, now_ms)?;
                let data = match node.posix.as_ref().and_then(|p| p.extents.clone()) {
                    Some(x) => Data::Extents(x),
                    None => Data::Own,
                };
                let target = node
                    .posix
                    .as_ref()
                    .filter(|p| p.kind == NodeType::Symlink)
                    .map(|p| p.target.clone());
                Ok(FileReply::Map {
                    attr: self.node_attr(&node),
                    data,
                    target,
                })
            }
            FileQuery::Xattrs { path, ino } => {
                let node = self.node(path, *ino)?;
                Ok(FileReply::Xattrs(
                    node.posix
                        .as_ref()
                        .map(|p| p.xattrs.clone())
                        .unwrap_or_default(),
                ))
            }
            FileQuery::Statfs => Err(MetaError::internal("statfs is answered by the service")),
        }
    }

    /// What a read of `path` that found nothing (`e`) answers `mount`: `lease-held` while
    /// its directory is held for another mount, whose create of the name may not have
    /// reached the masters yet; else `e`.
    fn missing(&self, path: &str, mount: &str, now_ms: Option<u64>, e: MetaError) -> MetaError {
        if e.kind != ErrorKind::NotFound || now_ms.is_none() {
            return e;
        }
        let parent = cairn_rpc::files::parent_of(path);
        match self.lookup(parent) {
            Ok(dir) => check_dir_hold(parent, &dir, mount, now_ms)
                .err()
                .unwrap_or(e),
            Err(_) => e,
        }
    }

    /// Whether the change `op`, asked at `now_ms` (the leader's clock), must wait for a
    /// directory another mount holds: a name added to one (a make, link or rename's
    /// destination), or the directory itself removed, renamed or replaced. Checked by the
    /// leader before the change is proposed, as reads are: `lease-held`, which the mount
    /// retries.
    ///
    /// # Errors
    /// `lease-held`.
    pub fn check_dir_holds(&self, op: &FileOp, now_ms: u64) -> Result<(), MetaError> {
        let mount = op.mount();
        let now = Some(now_ms);
        let parent_of = |p: &str| -> Result<(), MetaError> {
            let parent = cairn_rpc::files::parent_of(p);
            match self.lookup(parent) {
                Ok(dir) => check_dir_hold(parent, &dir, mount, now),
                Err(_) => Ok(()),
            }
        };
        let itself = |p: &str| -> Result<(), MetaError> {
            match self.lookup(p) {
                Ok(node) => check_dir_hold(p, &node, mount, now),
                Err(_) => Ok(()),
            }
        };
        match op {
            FileOp::Make { path, .. } => parent_of(path),
            FileOp::Link { to, .. } => parent_of(to),
            FileOp::Rename { from, to, .. } => {
                parent_of(to)?;
                itself(from)?;
                itself(to)
            }
            FileOp::Remove {
                path, dir: true, ..
            } => itself(path),
            _ => Ok(()),
        }
    }
}

/// Whether `mount` may see all of directory `dir` (at `path`) at `now_ms`: `lease-held`
/// while it is held for another mount (docs/files.md "A create that does not wait").
fn check_dir_hold(
    path: &str,
    dir: &Inode,
    mount: &str,
    now_ms: Option<u64>,
) -> Result<(), MetaError> {
    let Some(now_ms) = now_ms else { return Ok(()) };
    match dir.posix.as_ref().and_then(|p| p.hold.as_ref()) {
        Some(l) if l.holder != mount && l.expires_ms > now_ms => Err(MetaError::new(
            ErrorKind::LeaseHeld,
            format!(
                "{path}: mount {} made this directory and makes names in it (held {} ms \
                 more at most)",
                l.holder,
                l.expires_ms - now_ms
            ),
        )),
        _ => Ok(()),
    }
}

/// Whether `mount` may read `node` (at `path`) at `now_ms`: `lease-held` while another
/// mount holds it — made it, closed it, and has not committed its bytes yet (docs/files.md
/// "A close that does not wait"). Only the file service's files are held (a `cairn fs`
/// writer's lease is not a hold).
fn check_hold(path: &str, node: &Inode, mount: &str, now_ms: Option<u64>) -> Result<(), MetaError> {
    let Some(now_ms) = now_ms else { return Ok(()) };
    if node.posix.as_ref().is_none_or(|p| p.extents.is_none()) {
        return Ok(());
    }
    match node.file().and_then(|f| f.lease.as_ref()) {
        Some(l) if l.holder != mount && l.expires_ms > now_ms => Err(MetaError::new(
            ErrorKind::LeaseHeld,
            format!(
                "{path}: mount {} closed it and commits its bytes (held {} ms more at most)",
                l.holder,
                l.expires_ms - now_ms
            ),
        )),
        _ => Ok(()),
    }
}
