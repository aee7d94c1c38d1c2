//! A create that does not wait (docs/files.md): in a directory a mount made a moment ago, a
//! create answers before the masters make the file, and the masters hold the directory for
//! that mount — so another mount never misses a name the first has answered for, never makes
//! the same name meanwhile, and an `fsync` of the directory makes its new names durable.

use super::{Mount, errno, read_all};
use crate::common::{Cluster, bytes};
use cairn_rpc::files::FileQuery;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_answered_early_are_never_missed_by_another_mount() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let mut a = Mount::start(&masters, &dir.path().join("a"));
    let b = Mount::start(&masters, &dir.path().join("b"));
    let c = cl.client().await;

    // A directory made on A is held for A: a name not in it waits for anyone else (the
    // canary that the hold is there at all; `cairn fs` asks as no mount).
    fs::create_dir(a.path("d")).unwrap();
    let q = FileQuery::Lookup {
        path: "/d/none".into(),
        mount: String::new(),
    };
    let held = c.masters().file_query(&q).await;
    assert_eq!(
        held.as_ref().err().map(|e| e.kind),
        Some(cairn_rpc::ErrorKind::LeaseHeld),
        "a directory the mount made is held for it: {held:?}"
    );
    // Files made in it on A, and read at once on B: there, and whole, every one.
    for i in 0..40u64 {
        let data = bytes(i, 0, 1 + i as usize * 313);
        let name = format!("d/f{i}");
        fs::write(a.path(&name), &data).unwrap();
        assert!(read_all(&b.path(&name)) == data, "{name} read whole on B");
    }
    let mut names: Vec<String> = fs::read_dir(b.path("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut want: Vec<String> = (0..40).map(|i| format!("f{i}")).collect();
    want.sort();
    assert_eq!(names, want, "B lists every name A made");

    // A answers its own `stat` of a directory it made while only its early creates changed
    // it (listed.rs); after any other change — a chmod here — the masters answer again.
    fs::create_dir(a.path("m")).unwrap();
    fs::set_permissions(a.path("m"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(a.path("m/1"), b"1").unwrap();
    let mode = fs::metadata(a.path("m")).unwrap().permissions().mode() & 0o7777;
    assert_eq!(
        mode, 0o700,
        "the chmod shows after a create in the directory"
    );

    // A stopped right after a create in a new directory: B's listing waits for the hold
    // (its make may not have reached the masters), then has the name.
    fs::create_dir(a.path("e")).unwrap();
    fs::write(a.path("e/x"), b"early").unwrap();
    a.pause();
    let lister = {
        let p = b.path("e");
        std::thread::spawn(move || {
            fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect::<Vec<_>>()
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let waited = !lister.is_finished();
    a.resume();
    assert!(waited, "B's listing waited for A's directory");
    assert_eq!(lister.join().unwrap(), ["x"]);
    assert_eq!(read_all(&b.path("e/x")), b"early");

    // O_EXCL on two mounts: the name is A's, and B's exclusive create of it fails, even
    // while A's make may still be behind (A stopped).
    fs::create_dir(a.path("g")).unwrap();
    fs::write(a.path("g/lock"), b"a's").unwrap();
    a.pause();
    let excl = {
        let p = b.path("g/lock");
        std::thread::spawn(move || {
            errno(
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(p),
            )
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    a.resume();
    assert_eq!(
        excl.join().unwrap(),
        libc::EEXIST,
        "B's O_EXCL create of A's name"
    );
    assert_eq!(read_all(&b.path("g/lock")), b"a's");

    // An fsync of the directory makes its new names durable: A killed right after it, B
    // finds every one.
    fs::create_dir(a.path("h")).unwrap();
    for i in 0..20 {
        fs::File::create(a.path(&format!("h/n{i}"))).unwrap();
    }
    fs::File::open(a.path("h")).unwrap().sync_all().unwrap();
    let a_dir = a.dir();
    a.kill();
    let until = Instant::now() + Duration::from_secs(30);
    let count = loop {
        match fs::read_dir(b.path("h")) {
            Ok(d) => break d.count(),
            Err(e) => {
                assert!(Instant::now() < until, "listing h on B: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert_eq!(count, 20, "every name the directory's fsync covered");
    b.stop();
    super::detach_dead(&a_dir);
}

/// `--sync-create`: no directory is held, every create waits for its make.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_create_holds_no_directory() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let a = Mount::start_with(&masters, &dir.path().join("a"), &["--sync-create"]);
    fs::create_dir(a.path("d")).unwrap();
    let c = cl.client().await;
    let q = FileQuery::Lookup {
        path: "/d/none".into(),
        mount: String::new(),
    };
    let r = c.masters().file_query(&q).await;
    assert_eq!(
        r.as_ref().err().map(|e| e.kind),
        Some(cairn_rpc::ErrorKind::NotFound),
        "{r:?}"
    );
    fs::write(a.path("d/f"), b"x").unwrap();
    assert_eq!(c.stat("/d/f").await.unwrap().path, "/d/f");
    a.stop();
}
