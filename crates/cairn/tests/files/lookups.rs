//! Negative lookups answered by the mount (docs/files.md "Negative lookups"): for a second
//! after a mount made a directory it answers a lookup of a name it did not put there
//! itself (ENOENT) without asking the masters — so another mount's new name may be missed
//! for that second, never longer; an open with O_CREAT of such a name opens the file that
//! is there, O_EXCL refuses it; the mount's own makes, renames and removes keep what it
//! answers true. (By default the masters hold a mount's new directory for it, and another
//! mount's new name there waits for the hold, which outlasts the second: nothing is missed —
//! early.rs tests that. These rounds run with `--sync-create`, which holds nothing.)

use super::{Mount, errno, read_all};
use crate::common::Cluster;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_answers_for_the_names_of_a_directory_it_just_made() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let a = Mount::start_with(&masters, &dir.path().join("a"), &["--sync-create"]);
    let b = Mount::start(&masters, &dir.path().join("b"));
    // The window in which `a` answers for the directory, with room for this test's own
    // calls: a round that took longer (a busy machine) is tried again.
    let window = cairn_files::LISTED_FOR - Duration::from_millis(300);
    let mut inside = 0;
    for round in 0..5 {
        let d = format!("d{round}");
        let made = Instant::now();
        fs::create_dir(a.path(&d)).unwrap();
        fs::write(b.path(&format!("{d}/x")), b"from b").unwrap();
        fs::write(b.path(&format!("{d}/y")), b"also b").unwrap();
        let missed = errno(fs::metadata(a.path(&format!("{d}/x"))));
        // O_CREAT without O_EXCL opens what is there, whatever the lookup said: not
        // truncated, the same inode as b's.
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(a.path(&format!("{d}/x")))
            .expect("an O_CREAT open of a name another mount made");
        f.write_all(b"A").unwrap();
        drop(f);
        // O_EXCL: "exists".
        let excl = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(a.path(&format!("{d}/y")));
        let took = made.elapsed();
        assert_eq!(errno(excl), libc::EEXIST, "round {round}");
        assert_eq!(read_all(&a.path(&format!("{d}/x"))), b"Arom b");
        assert_eq!(
            fs::metadata(a.path(&format!("{d}/y"))).unwrap().ino(),
            fs::metadata(b.path(&format!("{d}/y"))).unwrap().ino()
        );
        if took < window {
            // The canary: inside the window `a` answered the lookup itself.
            assert_eq!(
                missed,
                libc::ENOENT,
                "round {round}: inside the window the mount answers for the directory"
            );
            inside += 1;
        }
    }
    assert!(inside > 0, "no round ran inside the {window:?} window");

    // The mount's own changes keep what it answers true.
    let made = Instant::now();
    fs::create_dir(a.path("e")).unwrap();
    fs::write(a.path("e/f"), b"f").unwrap();
    assert_eq!(fs::read(a.path("e/f")).unwrap(), b"f");
    fs::rename(a.path("e/f"), a.path("e/g")).unwrap();
    assert_eq!(errno(fs::metadata(a.path("e/f"))), libc::ENOENT);
    assert_eq!(fs::read(a.path("e/g")).unwrap(), b"f");
    fs::create_dir(a.path("e/h")).unwrap();
    assert!(fs::metadata(a.path("e/h")).unwrap().is_dir());
    std::os::unix::fs::symlink("g", a.path("e/s")).unwrap();
    assert_eq!(fs::read(a.path("e/s")).unwrap(), b"f");
    fs::hard_link(a.path("e/g"), a.path("e/l")).unwrap();
    fs::remove_file(a.path("e/g")).unwrap();
    assert_eq!(errno(fs::metadata(a.path("e/g"))), libc::ENOENT);
    assert_eq!(fs::read(a.path("e/l")).unwrap(), b"f");
    // A rename onto another name of the same node does nothing: both names stay.
    fs::hard_link(a.path("e/l"), a.path("e/m")).unwrap();
    fs::rename(a.path("e/l"), a.path("e/m")).unwrap();
    assert_eq!(fs::read(a.path("e/l")).unwrap(), b"f");
    assert_eq!(fs::read(a.path("e/m")).unwrap(), b"f");
    fs::remove_dir(a.path("e/h")).unwrap();
    assert_eq!(errno(fs::metadata(a.path("e/h"))), libc::ENOENT);
    let mut names: Vec<_> = fs::read_dir(a.path("e"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["l", "m", "s"]);

    // Past the window another mount's new name is seen (after the kernel's own cache).
    let left = cairn_files::LISTED_FOR.saturating_sub(made.elapsed());
    std::thread::sleep(left + Duration::from_millis(100));
    fs::write(b.path("e/late"), b"late").unwrap();
    std::thread::sleep(cairn_files::ATTR_TTL + Duration::from_millis(300));
    assert_eq!(fs::read(a.path("e/late")).unwrap(), b"late");
    drop((a, b));
}
