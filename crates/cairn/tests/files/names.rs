//! Names of any bytes but `/` and NUL (docs/files.md "Names"): made, listed, renamed and
//! read back byte for byte, as symbolic links' targets too; 255 bytes at most.

use super::{Mount, errno};
use crate::common::Cluster;
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_of_any_bytes_are_kept_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let a = Mount::start(&masters, &dir.path().join("a"));
    fs::create_dir(a.path("n")).unwrap();
    let names: [&[u8]; 5] = [
        b"latin-1 caf\xe9",
        b"\xff\xfe",
        "plane 16 \u{10ff41}".as_bytes(),
        "utf-8 café".as_bytes(),
        &[0x80; 255],
    ];
    for (i, n) in names.iter().enumerate() {
        fs::write(a.path("n").join(OsStr::from_bytes(n)), [i as u8; 3]).unwrap();
    }
    let listed: BTreeSet<Vec<u8>> = fs::read_dir(a.path("n"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_vec())
        .collect();
    let want: BTreeSet<Vec<u8>> = names.iter().map(|n| n.to_vec()).collect();
    assert_eq!(listed, want);
    for (i, n) in names.iter().enumerate() {
        assert_eq!(
            fs::read(a.path("n").join(OsStr::from_bytes(n))).unwrap(),
            [i as u8; 3]
        );
    }
    // 256 bytes: too long, as on ext4.
    assert_eq!(
        errno(fs::write(
            a.path("n").join(OsStr::from_bytes(&[0x80; 256])),
            b"x"
        )),
        libc::ENAMETOOLONG
    );
    // Renamed to another such name; a symbolic link whose target is not UTF-8.
    let to = a.path("n").join(OsStr::from_bytes(b"moved \xc3"));
    fs::rename(a.path("n").join(OsStr::from_bytes(b"\xff\xfe")), &to).unwrap();
    assert_eq!(fs::read(&to).unwrap(), [1u8; 3]);
    let target = OsStr::from_bytes(b"moved \xc3");
    std::os::unix::fs::symlink(target, a.path("n/link")).unwrap();
    assert_eq!(fs::read_link(a.path("n/link")).unwrap().as_os_str(), target);
    assert_eq!(fs::symlink_metadata(a.path("n/link")).unwrap().len(), 7);
    assert_eq!(fs::read(a.path("n/link")).unwrap(), [1u8; 3]);
    a.stop();
}
