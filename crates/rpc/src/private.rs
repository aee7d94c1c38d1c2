//! What Cairn's servers write is for their own user only (docs/security.md, "At rest"): every
//! directory they create is 0700 and every file 0600, and a data directory made by an older
//! version is closed when a server starts.

use std::path::Path;

/// Makes every file and directory this process creates from now on private to its user
/// (umask 077). Servers call it first thing; the CLI's downloads keep the user's umask.
pub fn restrict_umask() {
    // SAFETY: umask only sets the process's file-mode creation mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
}

/// Removes group and other permissions from `dir` and everything under it (regular files and
/// directories only: devices and sockets are the operator's; symbolic links are not followed).
/// Returns how many it changed. A missing `dir` changes nothing.
///
/// # Errors
/// A directory cannot be read or a mode cannot be changed.
pub fn close_tree(dir: &Path) -> std::io::Result<usize> {
    use std::os::unix::fs::PermissionsExt;
    let mut changed = 0;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(p) = todo.pop() {
        let meta = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let ft = meta.file_type();
        if !(ft.is_dir() || ft.is_file()) {
            continue;
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode & !0o077))?;
            changed += 1;
        }
        if ft.is_dir() {
            for e in std::fs::read_dir(&p)? {
                todo.push(e?.path());
            }
        }
    }
    Ok(changed)
}

/// [`close_tree`] with the log line a server writes when it closed anything (an existing
/// cluster made by a version that left its files readable by others).
pub fn close_data_dir(dir: &Path) {
    match close_tree(dir) {
        Ok(0) => {}
        Ok(n) => tracing::warn!(
            dir = %dir.display(),
            changed = n,
            "closed files and directories others could read (now 0600 and 0700)"
        ),
        Err(e) => tracing::warn!(
            dir = %dir.display(),
            error = %e,
            "could not close the data directory to other users"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn close_tree_takes_group_and_other_bits_away() {
        let d = tempfile::tempdir().unwrap();
        let sub = d.path().join("raft-log");
        std::fs::create_dir(&sub).unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755)).unwrap();
        let f = sub.join("1.wal");
        std::fs::write(&f, b"x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let exec = d.path().join("run.sh");
        std::fs::write(&exec, b"x").unwrap();
        std::fs::set_permissions(&exec, std::fs::Permissions::from_mode(0o755)).unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("link")).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();

        assert_eq!(close_tree(d.path()).unwrap(), 4);
        assert_eq!(mode(d.path()), 0o700);
        assert_eq!(mode(&sub), 0o700);
        assert_eq!(mode(&f), 0o600);
        assert_eq!(mode(&exec), 0o700);
        // What a link points at is not the data directory's.
        assert_eq!(mode(outside.path()), 0o644);
        assert_eq!(close_tree(d.path()).unwrap(), 0);
        assert_eq!(close_tree(&d.path().join("missing")).unwrap(), 0);
    }
}
