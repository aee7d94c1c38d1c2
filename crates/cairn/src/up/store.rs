//! How big a store file `cairn up` makes: a share of the free space, within bounds.

use std::path::Path;

/// Bytes free to an unprivileged user on the filesystem holding `dir`.
pub(super) fn free_bytes(dir: &Path) -> anyhow::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: statvfs fills the struct it is given; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Smallest and largest store file `cairn up` makes by itself.
const MIN_STORE: u64 = 1 << 30;
const MAX_STORE: u64 = 8 << 30;

/// The size of each new store file: a quarter of `free` shared by `servers`, rounded down to
/// a MiB, between [`MIN_STORE`] and [`MAX_STORE`]. A filesystem too small for that is an
/// error that says what to do, not a cluster that fills up at once.
pub(super) fn store_size(free: u64, servers: usize) -> anyhow::Result<u64> {
    let share = (free / 4 / servers.max(1) as u64) & !((1 << 20) - 1);
    anyhow::ensure!(
        share >= MIN_STORE,
        "{} MiB free where the data directory is: {servers} store file(s) of at least {} MiB \
         each would take more than a quarter of it; free space, or pass --disk-size",
        free >> 20,
        MIN_STORE >> 20
    );
    Ok(share.min(MAX_STORE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_size_is_a_capped_share_of_free_space() {
        const G: u64 = 1 << 30;
        // 80 GiB free, 3 servers: a quarter is 20 GiB, 6.67 GiB each (MiB-aligned).
        let s = store_size(80 * G, 3).unwrap();
        assert_eq!(s, (80 * G / 4 / 3) & !((1 << 20) - 1));
        assert!(s > 6 * G && s < 7 * G);
        assert_eq!(store_size(1000 * G, 3).unwrap(), MAX_STORE);
        assert_eq!(store_size(12 * G, 3).unwrap(), G);
        let err = store_size(10 * G, 3).unwrap_err().to_string();
        assert!(err.contains("--disk-size"), "{err}");
        assert!(free_bytes(Path::new(".")).unwrap() > 0);
    }
}
