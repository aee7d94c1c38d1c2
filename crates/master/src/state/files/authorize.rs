//! Who may change a file service node: the checks `cairn fs` makes of the same changes
//! (perm.rs), with POSIX's rules for the owner (docs/files.md "One namespace").

use super::*;

impl State {
    /// Whether `user` may apply `op` (admins are not asked): as `cairn fs` checks the same
    /// changes (perm.rs), with POSIX's rules for the owner.
    ///
    /// # Errors
    /// `PermissionDenied`, or the lookup's error.
    pub(in crate::state) fn authorize_files(
        &self,
        user: &str,
        op: &FileOp,
    ) -> Result<(), MetaError> {
        match op {
            FileOp::Make { path, .. } => self.check_new_entry(path, user),
            FileOp::Remove { path, .. } => {
                let ino = self.lookup(path)?;
                self.check_inode(ino.parent, user, perm::WRITE | perm::SEARCH)
            }
            FileOp::Rename { from, to, .. } => {
                let ino = self.lookup(from)?;
                self.check_inode(ino.parent, user, perm::WRITE | perm::SEARCH)?;
                self.check_new_entry(to, user)
            }
            FileOp::Link { from, to, .. } => {
                self.check_reach(self.lookup(from)?.id, user)?;
                self.check_new_entry(to, user)
            }
            FileOp::SetAttr { path, attr, .. } => {
                let entry = self.lookup(path)?;
                self.check_reach(entry.id, user)?;
                if attr.size.is_some() {
                    self.check_inode(entry.id, user, perm::WRITE)?;
                }
                check_owner(path, attr, &self.linked(entry), user)
            }
            FileOp::Write { path, then, .. } => {
                let ino = self.linked(self.check_path(path, user, perm::WRITE)?);
                match then {
                    Some(then) => check_owner(path, then, &ino, user),
                    None => Ok(()),
                }
            }
            FileOp::Punch { path, .. } => self.check_path(path, user, perm::WRITE).map(|_| ()),
            // As the write it waits for.
            FileOp::Hold { path, .. } => self.check_path(path, user, perm::WRITE).map(|_| ()),
            // As the kernel checks user.* (write permission on the node); trusted.* and
            // security.* the kernel keeps to privileged processes, and the masters to the
            // node's owner.
            FileOp::SetXattr { path, name, .. } => {
                let ino = self.check_path(path, user, perm::WRITE)?;
                if !name.starts_with("user.") && ino.owner != user {
                    return Err(MetaError::new(
                        ErrorKind::PermissionDenied,
                        format!("{path}: only its owner sets {name}"),
                    ));
                }
                Ok(())
            }
        }
    }

    /// Write and search on the directory a new entry at `path` goes in.
    fn check_new_entry(&self, path: &str, user: &str) -> Result<(), MetaError> {
        let parent = match path.rfind('/') {
            Some(0) | None => "/",
            Some(i) => &path[..i],
        };
        let dir = self.lookup(parent)?;
        self.check_inode(dir.id, user, perm::WRITE | perm::SEARCH)
    }
}

/// Only a node's owner changes its mode or owners.
fn check_owner(path: &str, attr: &SetAttr, node: &Inode, user: &str) -> Result<(), MetaError> {
    let owner_only = attr.mode.is_some() || attr.uid.is_some() || attr.gid.is_some();
    if owner_only && node.owner != user {
        return Err(MetaError::new(
            ErrorKind::PermissionDenied,
            format!("{path}: only its owner changes its mode or owners"),
        ));
    }
    Ok(())
}

/// A write's attribute change: a `setattr` without a size.
pub(super) fn check_then(path: &str, then: &SetAttr) -> Result<(), MetaError> {
    perm::check_mode(then.mode)?;
    if then.size.is_some() {
        return Err(MetaError::invalid(format!(
            "{path}: a write's attribute change has no size (a truncate is a setattr of its own)"
        )));
    }
    Ok(())
}
