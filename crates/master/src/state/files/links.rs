//! Hard links (docs/files.md "Hard links").
//!
//! Every inode has one directory entry, and the tables, the moves between partitions and the
//! check rely on it. A hard link is therefore an inode of its own — a *link entry*, whose
//! `posix.link` names the node it is another name of — in the same partition as that node;
//! the node lists its link entries (`posix.links`, oldest first) and counts its names in
//! `nlink`. Every read and change by path goes to the node (`State::linked`); unlink and
//! rename act on the entry. When the node's own entry is removed while links remain, the node
//! takes the place of its oldest link entry, which goes, so a node is always at one of its
//! names and keeps its inode number.
//!
//! Links never cross partitions: `link(2)` to another partition, and a rename, split or
//! move that would carry a linked node away from one of its other names, is `cross-device`
//! (`EXDEV` to a mount, on which `mv` copies).

use super::*;
use crate::state::disk::LINKS_TALLY;

/// Rows a move's check for links leaving its subtree reads at most; a larger subtree in a
/// partition holding links does not move (move smaller parts).
pub const TIES_CHECK_ROWS: u64 = 200_000;

fn cross(what: String) -> MetaError {
    MetaError::new(ErrorKind::CrossDevice, what)
}

/// The other names `ino` is tied to: its node for a link entry, its link entries for a node.
fn ties(ino: &Inode) -> Vec<InodeId> {
    match &ino.posix {
        Some(p) if p.link != 0 => vec![p.link],
        Some(p) => p.links.clone(),
        None => Vec::new(),
    }
}

impl State {
    /// The node a directory entry names: `ino` itself, or the node a link entry is another
    /// name of.
    pub fn linked(&self, ino: Arc<Inode>) -> Arc<Inode> {
        match ino.posix.as_ref().map(|p| p.link) {
            Some(l) if l != 0 => self.inodes.get(&l).unwrap_or(ino),
            _ => ino,
        }
    }

    /// The entry at `path` and the node it names, which must be inode `ino` (0: any).
    pub(super) fn entry(
        &self,
        path: &str,
        ino: u64,
    ) -> Result<(Arc<Inode>, Arc<Inode>), MetaError> {
        let entry = self.lookup(path)?;
        let node = self.linked(entry.clone());
        if ino != 0 && self.public_id(node.id) != ino {
            return Err(super::stale(path, ino));
        }
        Ok((entry, node))
    }

    /// `link(2)`: a new entry `to` naming the node at `from`.
    pub(super) fn link_node(
        &mut self,
        from: &str,
        ino: u64,
        to: &str,
        now: Time,
    ) -> Result<FileReply, MetaError> {
        let node = self.node(from, ino)?;
        if node.file().is_none() {
            return Err(MetaError::new(
                ErrorKind::PermissionDenied,
                format!("{from}: a directory has no hard links"),
            ));
        }
        cairn_rpc::files::check_name(to.rsplit('/').next().unwrap_or_default())?;
        let (kind, nlink) = (node_type(&node), node.posix.as_ref().map_or(1, |p| p.nlink));
        if nlink >= cairn_rpc::files::LINK_MAX {
            return Err(MetaError::new(
                ErrorKind::TooManyLinks,
                format!(
                    "{from} has {nlink} names: at most {}",
                    cairn_rpc::files::LINK_MAX
                ),
            ));
        }
        // A file `cairn fs` wrote keeps (some of) its bytes in its own log, which a mount
        // reads by the path it opened: not the link's.
        let own = match node.posix.as_ref() {
            None => kind == NodeType::Regular,
            Some(p) => {
                kind == NodeType::Regular
                    && p.extents
                        .as_ref()
                        .is_none_or(|x| x.iter().any(|e| e.seg == 0))
            }
        };
        if own {
            return Err(MetaError::invalid(format!(
                "{from}: a file written by `cairn fs` keeps its bytes in its own log and has no \
                 hard links; copy it through a mount first"
            )));
        }
        match self.local_components(to) {
            Err(e) if e.kind == ErrorKind::Unavailable => {
                return Err(cross(format!(
                    "{from} → {to}: a hard link stays in its node's partition"
                )));
            }
            r => {
                r?;
            }
        }
        let (parent, name) = self.parent_for_new(to, false, now.as_ms())?;
        let entry = Kind::File(FileMeta {
            policy: Policy::default(),
            sealed: true,
            chunks: Vec::new(),
            lease: None,
            writer_epoch: 0,
        });
        let id = self.insert(parent, &name, now.as_ms(), entry, Some(node.mode));
        self.inodes.get_mut(&id).expect("inserted").posix = Some(Box::new(Posix {
            kind,
            uid: 0,
            gid: 0,
            nlink: 0,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            rdev: 0,
            target: String::new(),
            extents: None,
            xattrs: Default::default(),
            link: node.id,
            links: Vec::new(),
            hold: None,
        }));
        let p = self.posix_mut(node.id);
        p.links.push(id);
        p.nlink = 1 + p.links.len() as u32;
        p.ctime = now;
        self.touch_dir(parent, now, 0);
        Ok(FileReply::Attr(self.node_attr(&self.ino(node.id))))
    }

    /// Removes entry `id` from its directory (the caller touches the directory): a link
    /// entry goes, and its node loses a name; a node with links takes the place of its oldest
    /// link entry, which goes; any other node goes, and is answered (its chunks, if any, are
    /// freed by the caller's way). `now` is the node's new ctime (`None`: unchanged).
    pub(crate) fn unlink_entry(&mut self, id: InodeId, now: Option<Time>) -> Option<Inode> {
        let ino = self.ino(id);
        let (link, first) = match &ino.posix {
            Some(p) => (p.link, p.links.first().copied()),
            None => (0, None),
        };
        if link != 0 {
            self.drop_node(id);
            if self.inodes.get(&link).is_some() {
                let p = self.posix_mut(link);
                p.links.retain(|l| *l != id);
                p.nlink = 1 + p.links.len() as u32;
                if let Some(t) = now {
                    p.ctime = t;
                }
            }
            return None;
        }
        let Some(first) = first else {
            return Some(self.drop_node(id));
        };
        let heir = self.drop_node(first);
        let i = self.inodes.get_mut(&id).expect("exists");
        let old = (i.parent, std::mem::replace(&mut i.name, heir.name.clone()));
        i.parent = heir.parent;
        self.dentries.remove(&old);
        self.dentries.insert((heir.parent, heir.name), id);
        let p = self.posix_mut(id);
        p.links.retain(|l| *l != first);
        p.nlink = 1 + p.links.len() as u32;
        if let Some(t) = now {
            p.ctime = t;
        }
        None
    }

    /// Refuses to move the subtree at `path` elsewhere when a node in it is tied by a hard
    /// link to a name outside it — or, with `spread` (a directory hashed over partitions, its
    /// entries going apart), to any other name at all.
    ///
    /// # Errors
    /// `cross-device`; `invalid-argument` when the partition holds links and the subtree
    /// is larger than [`TIES_CHECK_ROWS`].
    pub fn refuse_ties(&self, path: &str, spread: bool) -> Result<(), MetaError> {
        if self.inodes.tally(LINKS_TALLY)[0] == 0 {
            return Ok(());
        }
        let top = match self.lookup(path) {
            Ok(i) => i,
            Err(e) if e.kind == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let top_id = top.id;
        let below = |mut id: InodeId| {
            for _ in 0..=cairn_rpc::MAX_PATH {
                if id == top_id {
                    return true;
                }
                if id == ROOT {
                    return false;
                }
                match self.inodes.get(&id) {
                    Some(i) => id = i.parent,
                    None => return false,
                }
            }
            false
        };
        let mut rows = 0u64;
        let mut stack = vec![top];
        while let Some(ino) = stack.pop() {
            rows += 1;
            if rows > TIES_CHECK_ROWS {
                return Err(MetaError::invalid(format!(
                    "{path} holds more than {TIES_CHECK_ROWS} files and directories, in a \
                     partition that holds hard links: too many to check that none leaves its \
                     other names; move it in parts"
                )));
            }
            let t = ties(&ino);
            if !t.is_empty() && (spread || t.iter().any(|c| !below(*c))) {
                return Err(cross(format!(
                    "{}: a hard link to a name {} does not move apart from it",
                    self.path_of(ino.id),
                    if spread { "beside it" } else { "outside" }
                )));
            }
            if ino.file().is_none() {
                for ((p, _), id) in self.dentries.range((ino.id, String::new())..) {
                    if p != ino.id {
                        break;
                    }
                    stack.push(self.ino(*id));
                }
            }
        }
        Ok(())
    }

    /// Refuses to carry the file at `path` to another partition when it has other names.
    ///
    /// # Errors
    /// `cross-device`.
    pub(crate) fn refuse_tied(&self, ino: &Inode, path: &str) -> Result<(), MetaError> {
        if ties(ino).is_empty() {
            Ok(())
        } else {
            Err(cross(format!(
                "{path} has hard links: it does not move to another partition apart from them"
            )))
        }
    }

    /// The check's part for links: each link entry's node is here and lists it, and each
    /// node's link entries name it; a node's `nlink` is one more than its links. A partition
    /// whose tally counts no tied node is not read again (the check's recount of the tallies
    /// finds a tie the tally missed).
    pub(in crate::state) fn check_links(&self, r: &mut super::super::check::Report) {
        if self.inodes.tally(LINKS_TALLY)[0] == 0 {
            return;
        }
        for (_, ino) in self.inodes.iter() {
            let Some(p) = &ino.posix else { continue };
            if p.link != 0 {
                match self.inodes.get(&p.link) {
                    Some(n) if n.posix.as_ref().is_some_and(|q| q.links.contains(&ino.id)) => {}
                    _ => r.problem(format!(
                        "link entry {} names node {}, which is missing or does not list it",
                        ino.id, p.link
                    )),
                }
                if !p.links.is_empty() {
                    r.problem(format!("link entry {} has links of its own", ino.id));
                }
            } else if !p.links.is_empty() {
                for l in &p.links {
                    if self
                        .inodes
                        .get(l)
                        .and_then(|e| e.posix.as_ref().map(|q| q.link))
                        != Some(ino.id)
                    {
                        r.problem(format!(
                            "node {} lists link entry {l}, which is missing or names another",
                            ino.id
                        ));
                    }
                }
                if p.nlink as usize != 1 + p.links.len() {
                    r.problem(format!(
                        "node {} counts {} names and has {} links",
                        ino.id,
                        p.nlink,
                        p.links.len()
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
