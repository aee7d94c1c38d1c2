//! Owners and permission bits of files and directories (docs/security.md, "Who may do
//! what").
//!
//! Every inode has an owner (a user's name; empty for the cluster itself) and POSIX-style
//! bits: the owner's `rwx` (0o700) and everyone else's (0o007). There are no groups yet: the
//! group bits are kept and shown but checked for no one. Servers and admin users pass every
//! check. The checks of a change run inside [`State::apply`] (a [`Command::As`]), so every
//! master decides the same from the same log; reads are checked by the leader on the state it
//! answers from.

use super::{Command, Inode, InodeId, Kind, ROOT, State};
use cairn_rpc::{ErrorKind, MetaError};
use serde::{Deserialize, Serialize};

/// Read: a file's bytes, a directory's entries.
pub const READ: u16 = 0o4;
/// Write: append to a file; add, remove or rename entries of a directory.
pub const WRITE: u16 = 0o2;
/// Search: pass through a directory on the way to what is below it.
pub const SEARCH: u16 = 0o1;
/// Bits of a new file unless the call names them.
pub const DEFAULT_FILE_MODE: u16 = 0o644;
/// Bits of a new directory unless the call names them (and of the root).
pub const DEFAULT_DIR_MODE: u16 = 0o755;
/// The most a mode may hold (setuid, setgid and sticky are kept, not used).
pub const MAX_MODE: u16 = 0o7777;

/// The user a command acts for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    pub user: String,
    /// Admins pass every check (their new files are still theirs).
    pub admin: bool,
}

/// Refuses bits past [`MAX_MODE`].
///
/// # Errors
/// `InvalidArgument`.
pub fn check_mode(mode: Option<u16>) -> Result<(), MetaError> {
    match mode {
        Some(m) if m > MAX_MODE => Err(MetaError::invalid(format!(
            "mode {m:o}: permission bits are at most 7777 (octal)"
        ))),
        _ => Ok(()),
    }
}

pub(super) fn default_mode() -> u16 {
    DEFAULT_DIR_MODE
}

/// Whether `user` has every bit of `want` on `ino`.
pub fn allows(ino: &Inode, user: &str, want: u16) -> bool {
    let bits = if ino.owner == user {
        (ino.mode >> 6) & 0o7
    } else {
        ino.mode & 0o7
    };
    bits & want == want
}

fn denied(what: impl std::fmt::Display) -> MetaError {
    MetaError::new(
        ErrorKind::PermissionDenied,
        format!("{what}: permission denied"),
    )
}

impl State {
    /// Checks that `user` may search every directory above inode `id` (not `id` itself).
    ///
    /// # Errors
    /// `PermissionDenied` naming the first directory that stops them.
    pub fn check_reach(&self, id: InodeId, user: &str) -> Result<(), MetaError> {
        if id == ROOT {
            return Ok(());
        }
        let mut up = self.inodes.get(&id).map_or(ROOT, |i| i.parent);
        loop {
            let Some(dir) = self.inodes.get(&up) else {
                return Ok(());
            };
            if !allows(&dir, user, SEARCH) {
                return Err(denied(format_args!("{} (search)", self.path_of(dir.id))));
            }
            if up == ROOT {
                return Ok(());
            }
            up = dir.parent;
        }
    }

    /// Checks that `user` may reach inode `id` and has `want` on it.
    /// `id` may be a hard link's entry: the way is the entry's, the bits its node's.
    ///
    /// # Errors
    /// `PermissionDenied`.
    pub fn check_inode(&self, id: InodeId, user: &str, want: u16) -> Result<(), MetaError> {
        self.check_reach(id, user)?;
        match self.inodes.get(&id).map(|i| self.linked(i)) {
            Some(ino) if !allows(&ino, user, want) => Err(denied(self.path_of(id))),
            _ => Ok(()),
        }
    }

    /// [`State::check_inode`] of the inode at `path`; answers the node (through a hard
    /// link's entry).
    ///
    /// # Errors
    /// `NotFound` and the like from the lookup, or `PermissionDenied`.
    pub fn check_path(
        &self,
        path: &str,
        user: &str,
        want: u16,
    ) -> Result<std::sync::Arc<Inode>, MetaError> {
        let ino = self.lookup(path)?;
        self.check_inode(ino.id, user, want)?;
        Ok(self.linked(ino))
    }

    /// The path of inode `id` (for messages).
    pub fn path_of(&self, mut id: InodeId) -> String {
        let mut names = Vec::new();
        while id != ROOT {
            let Some(ino) = self.inodes.get(&id) else {
                break;
            };
            names.push(ino.name.clone());
            id = ino.parent;
        }
        names.reverse();
        let top = self.home.path.as_str();
        match (top.is_empty(), names.is_empty()) {
            (true, _) => format!("/{}", names.join("/")),
            (false, true) => top.to_owned(),
            (false, false) => format!("{top}/{}", names.join("/")),
        }
    }

    /// Checks that `user` may add an entry at `path`: write and search on the deepest
    /// directory of `path` that exists (missing ones between it and the entry are made by
    /// `parents`), search on every one above it.
    fn check_new(&self, path: &str, user: &str) -> Result<(), MetaError> {
        let comps = self.local_components(path)?;
        let mut cur = ROOT;
        for name in comps.iter().take(comps.len().saturating_sub(1)) {
            match self.dentries.get(&(cur, (*name).to_owned())) {
                Some(child) if matches!(self.ino(*child).kind, Kind::Dir) => cur = *child,
                // A file on the way or a missing directory: the command's own error, or
                // the directories `parents` makes below `cur`.
                _ => break,
            }
        }
        self.check_inode(cur, user, WRITE | SEARCH)
    }

    /// Checks that `user` may remove or rename the entry at `path`: write and search on its
    /// directory.
    fn check_unlink(&self, path: &str, user: &str) -> Result<(), MetaError> {
        let ino = self.lookup(path)?;
        self.check_inode(ino.parent, user, WRITE | SEARCH)
    }

    /// Whether `actor` may apply `cmd` (admins are not asked).
    ///
    /// # Errors
    /// `PermissionDenied`, or the lookup's error for a path that is not there.
    pub(super) fn authorize(&self, actor: &Actor, cmd: &Command) -> Result<(), MetaError> {
        let user = actor.user.as_str();
        match cmd {
            Command::Mkdir { path, .. } | Command::Create { path, .. } => match self.lookup(path) {
                // Exists: the command answers (`mkdir -p` of a directory that is there) or
                // fails with AlreadyExists; it needs search on the way, and write on a
                // directory whose default policy it sets.
                Ok(ino) => {
                    let sets_policy = matches!(
                        cmd,
                        Command::Mkdir {
                            policy: Some(_),
                            ..
                        }
                    );
                    self.check_inode(ino.id, user, if sets_policy { WRITE } else { 0 })
                }
                Err(_) => self.check_new(path, user),
            },
            Command::OpenWrite { path, .. }
            | Command::Allocate { path, .. }
            | Command::Commit { path, .. } => self.check_path(path, user, WRITE).map(|_| ()),
            Command::Rename { from, to, .. } => {
                self.check_unlink(from, user)?;
                self.check_new(to, user)
            }
            Command::Delete { path } | Command::TxLockSource { path, .. } => {
                self.check_unlink(path, user)
            }
            Command::TxLockDest { path, .. } => self.check_new(path, user),
            Command::SetAttr { path, owner, .. } => {
                if owner.is_some() {
                    return Err(denied(format_args!(
                        "{path}: changing the owner needs an admin; it"
                    )));
                }
                let ino = self.lookup(path)?;
                self.check_reach(ino.id, user)?;
                if ino.owner != user {
                    return Err(denied(format_args!(
                        "{path}: only its owner changes its mode; it"
                    )));
                }
                Ok(())
            }
            Command::Files(op) => self.authorize_files(user, op),
            Command::Batch(cmds) => cmds.iter().try_for_each(|c| self.authorize(actor, c)),
            other => Err(denied(format_args!("{other} (for servers and admins)"))),
        }
    }
}
