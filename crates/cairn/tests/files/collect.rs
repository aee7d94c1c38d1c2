//! Segment collection (docs/files.md "Segment collection"): segments no file names are
//! deleted — a killed mount's, one whose files were all overwritten — and the files in the
//! others read on whole.

use super::{Mount, read_all};
use crate::common::{Cluster, bytes, cairn, run_ok};
use std::collections::BTreeSet;
use std::fs;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_no_file_names_are_collected_and_the_rest_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    // Rounds twice a second; a segment unwritten for 2 s (and held by no writer) is looked
    // at. Leases last 5 s here (tests/common).
    let collect = ["--segment-collect-secs", "0.5", "--segment-grace-secs", "2"];
    let cl = Cluster::start_full(dir.path(), 1, 3, &collect, &[]).await;
    let masters = cl.master_addrs();
    let segments = || -> BTreeSet<String> {
        let out = run_ok(
            cairn()
                .args(["fs", "--cluster", &masters.join(","), "ls", "/.fs/seg"])
                .env("CAIRN_LOG", "error"),
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let wait = |what: &str, done: &dyn Fn(&BTreeSet<String>) -> bool| {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let s = segments();
            if done(&s) {
                return s;
            }
            assert!(Instant::now() < until, "{what}: segments {s:?}");
            std::thread::sleep(Duration::from_millis(300));
        }
    };

    // A's segment holds /keep (and the bytes of a file since deleted); A stops (sealed).
    let a = Mount::start(&masters, &dir.path().join("a"));
    let keep = bytes(1, 0, 300_000);
    fs::write(a.path("keep"), &keep).unwrap();
    fs::write(a.path("gone"), bytes(2, 0, 200_000)).unwrap();
    fs::remove_file(a.path("gone")).unwrap();
    a.stop();
    let first = segments();
    assert_eq!(first.len(), 1, "{first:?}");

    // B writes a file and deletes it, and is killed: its segment is left unsealed and its
    // lease lapses. It is collected; A's is not (it holds /keep).
    let b = Mount::start(&masters, &dir.path().join("b"));
    fs::write(b.path("tmp"), bytes(3, 0, 100_000)).unwrap();
    fs::remove_file(b.path("tmp")).unwrap();
    b.kill();
    let both = segments();
    assert_eq!(both.len(), 2, "{both:?}");
    wait("the killed mount's segment is collected", &|s| *s == first);

    // /keep reads whole; overwritten whole, A's segment holds nothing any file names and goes.
    let c = Mount::start(&masters, &dir.path().join("c"));
    assert!(
        read_all(&c.path("keep")) == keep,
        "/keep after a collection"
    );
    let new = bytes(4, 0, 300_000);
    fs::write(c.path("keep"), &new).unwrap();
    let last = wait("the overwritten file's segment is collected", &|s| {
        s.is_disjoint(&first) && !s.is_empty()
    });
    assert_eq!(last.len(), 1, "c's open segment only: {last:?}");
    // Read through another mount (no cache of c's) after the collection.
    let d = Mount::start(&masters, &dir.path().join("d"));
    assert!(
        read_all(&d.path("keep")) == new,
        "/keep after its old segment went"
    );

    // A mount stopped (SIGSTOP) past its lease while its open segment loses its last file
    // is collected under it; continued, it writes on (a new segment) and loses nothing.
    let e = Mount::start(&masters, &dir.path().join("e"));
    fs::write(e.path("e1"), bytes(5, 0, 100_000)).unwrap();
    let with_e = segments();
    let pid = e.child.as_ref().unwrap().id() as libc::pid_t;
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    fs::remove_file(d.path("e1")).unwrap();
    wait("the stopped mount's segment is collected", &|s| {
        s.len() < with_e.len()
    });
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let e2 = bytes(6, 0, 150_000);
    fs::write(e.path("e2"), &e2).unwrap();
    std::thread::sleep(cairn_files::ATTR_TTL + Duration::from_millis(300));
    assert!(read_all(&d.path("e2")) == e2, "a write after the stall");
    e.stop();
    d.stop();
    c.stop();
    // The killed mount's directory, cleared by a new mount there.
    Mount::start(&masters, &dir.path().join("b")).stop();
}

/// A file written as a stream has segments of its own (docs/files.md "Large files"):
/// deleted, they go whole, while the small files' shared segment stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_file_has_segments_of_its_own_that_go_whole_when_it_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let collect = ["--segment-collect-secs", "0.5", "--segment-grace-secs", "2"];
    let cl = Cluster::start_full(dir.path(), 1, 3, &collect, &[]).await;
    let masters = cl.master_addrs();
    let c = cl.client().await;
    let lengths = async || -> Vec<u64> {
        let mut v = Vec::new();
        for e in c.list("/.fs/seg").await.unwrap() {
            v.push(
                c.stat(&format!("/.fs/seg/{}", e.name))
                    .await
                    .unwrap()
                    .length,
            );
        }
        v.sort_unstable();
        v
    };
    let a = Mount::start(&masters, &dir.path().join("a"));
    let small = bytes(7, 0, 10_000);
    fs::write(a.path("small"), &small).unwrap();
    let large = bytes(8, 0, 20 << 20);
    fs::write(a.path("large"), &large).unwrap();
    let both = lengths().await;
    assert_eq!(both.len(), 2, "{both:?}");
    // Every flush at DIRTY_FILE_MAX goes to the file's own segment; on a loaded machine the
    // background flush (FLUSH_EVERY) may take the stream's first few MiB before it reaches
    // that, and those share the small files' segment (seen under the whole suite).
    assert!(both[0] < 8 << 20 && both[1] >= 12 << 20, "{both:?}");
    assert!(
        read_all(&a.path("large")) == large,
        "the large file reads whole"
    );
    fs::remove_file(a.path("large")).unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let now = lengths().await;
        if now.len() == 1 {
            assert_eq!(now[0], both[0], "the shared segment stays");
            break;
        }
        assert!(
            Instant::now() < until,
            "the large file's segment stays: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(fs::read(a.path("small")).unwrap(), small);
    a.stop();
}
