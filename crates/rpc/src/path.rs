//! Paths of the namespace: absolute, `/`-separated, no empty, `.` or `..` components.

/// Longest path accepted, in bytes: a path from the cluster's root, so a mounted file
/// system's deep trees fit (each call a program makes is held to `PATH_MAX`, 4 096, by the
/// kernel; the path below the mount point may be longer, as on any local file system).
pub const MAX_PATH: usize = 32 << 10;
/// Longest component (file or directory name), in the bytes it stands for
/// (`files::name_bytes`).
pub const MAX_NAME: usize = 255;

/// Why a path is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path must start with '/'")]
    NotAbsolute,
    #[error("path is longer than {MAX_PATH} bytes")]
    TooLong,
    #[error("a path component is longer than {MAX_NAME} bytes")]
    NameTooLong,
    #[error("path has an empty, '.' or '..' component")]
    BadComponent,
    #[error("path contains a NUL byte")]
    Nul,
}

/// The components of an absolute path; `/` has none. A trailing `/` is allowed.
///
/// # Errors
/// The path is relative, too long, has a NUL, or an empty/`.`/`..` component.
pub fn components(path: &str) -> Result<Vec<&str>, PathError> {
    if path.len() > MAX_PATH {
        return Err(PathError::TooLong);
    }
    if path.contains('\0') {
        return Err(PathError::Nul);
    }
    let rest = path.strip_prefix('/').ok_or(PathError::NotAbsolute)?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Ok(Vec::new());
    }
    rest.split('/')
        .map(|c| match c {
            "" | "." | ".." => Err(PathError::BadComponent),
            // In the bytes the name stands for (a mount's names of any bytes: files.rs).
            c if c.len() > MAX_NAME && crate::files::name_bytes(c).len() > MAX_NAME => {
                Err(PathError::NameTooLong)
            }
            c => Ok(c),
        })
        .collect()
}

/// The canonical spelling of a path (`/a/b`, `/` for the root).
///
/// # Errors
/// As [`components`].
pub fn normalize(path: &str) -> Result<String, PathError> {
    let c = components(path)?;
    Ok(format!("/{}", c.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_and_refuses() {
        assert_eq!(components("/").unwrap(), Vec::<&str>::new());
        assert_eq!(components("/a/b/").unwrap(), vec!["a", "b"]);
        assert_eq!(normalize("/a/b/").unwrap(), "/a/b");
        assert_eq!(components("a"), Err(PathError::NotAbsolute));
        assert_eq!(components("/a//b"), Err(PathError::BadComponent));
        assert_eq!(components("/a/../b"), Err(PathError::BadComponent));
        assert_eq!(components("/a\0"), Err(PathError::Nul));
        assert_eq!(
            components(&format!("/{}", "x".repeat(256))),
            Err(PathError::NameTooLong)
        );
        assert_eq!(components(&"/x".repeat(3000)).unwrap().len(), 3000);
        assert_eq!(components(&"/x".repeat(17_000)), Err(PathError::TooLong));
    }
}
