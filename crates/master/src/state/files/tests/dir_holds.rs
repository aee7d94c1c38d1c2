//! A directory held for the mount that made it, and the inode numbers it reserves for
//! creates answered before they reach the masters (docs/files.md "A create that does not
//! wait").

use super::*;

/// `mkdir` of `path` by `mount` reserving `reserve` numbers at `at` ms.
fn mkdir(s: &mut State, path: &str, mount: &str, reserve: u32, at: u64) -> FileReply {
    apply(
        s,
        FileOp::Make {
            path: path.into(),
            node: NewNode::Directory,
            mode: 0o755,
            uid: 0,
            gid: 0,
            now: t(at),
            hold: String::new(),
            mount: mount.into(),
            ino: 0,
            reserve,
        },
    )
    .unwrap()
}

/// A create of `path` by `mount` numbered `ino` (0: by the masters) at `at` ms (the file
/// not held: holds.rs tests that).
fn create(
    s: &mut State,
    path: &str,
    mount: &str,
    ino: u64,
    at: u64,
) -> Result<FileReply, MetaError> {
    apply(
        s,
        FileOp::Make {
            path: path.into(),
            node: NewNode::Regular,
            mode: 0o644,
            uid: 0,
            gid: 0,
            now: t(at),
            hold: String::new(),
            mount: mount.into(),
            ino,
            reserve: 0,
        },
    )
}

fn lookup(s: &State, path: &str, mount: &str, now_ms: u64) -> Result<FileReply, MetaError> {
    s.file_query_at(
        &FileQuery::Lookup {
            path: path.into(),
            mount: mount.into(),
        },
        Some(now_ms),
    )
}

fn readdir(s: &State, path: &str, mount: &str, now_ms: u64) -> Result<FileReply, MetaError> {
    s.file_query_at(
        &FileQuery::Readdir {
            path: path.into(),
            ino: 0,
            after: String::new(),
            limit: 100,
            mount: mount.into(),
        },
        Some(now_ms),
    )
}

fn held_kind(r: Result<FileReply, MetaError>) -> Option<ErrorKind> {
    r.err().map(|e| e.kind)
}

#[test]
fn a_reserving_mkdir_holds_the_directory_for_its_mount_until_the_hold_lapses() {
    let mut s = State::default();
    let (attr, first, count) = match mkdir(&mut s, "/d", "mount-a", 8, 10_000) {
        FileReply::Made {
            attr, first, count, ..
        } => (attr, first, count),
        other => panic!("{other:?}"),
    };
    assert_eq!(count, 8);
    assert!(first > attr.ino, "the numbers follow the directory's own");
    let until = 10_000 + cairn_rpc::files::DIR_HOLD_MS;
    // The holder reads it all: a name it has not made is not there.
    assert_eq!(
        kind(lookup(&s, "/d/f", "mount-a", 10_001)),
        ErrorKind::NotFound
    );
    readdir(&s, "/d", "mount-a", 10_001).unwrap();
    // Anyone else waits for a name not there, and for the listing; not for the directory.
    for other in ["mount-b", ""] {
        assert_eq!(
            held_kind(lookup(&s, "/d/f", other, 10_001)),
            Some(ErrorKind::LeaseHeld)
        );
        assert_eq!(
            held_kind(readdir(&s, "/d", other, until - 1)),
            Some(ErrorKind::LeaseHeld)
        );
        lookup(&s, "/d", other, 10_001).unwrap();
    }
    // Unless unchecked (the holder's own state machine reads: no clock).
    assert_eq!(
        kind(s.file_query(&FileQuery::Lookup {
            path: "/d/f".into(),
            mount: "mount-b".into()
        })),
        ErrorKind::NotFound
    );
    // A name the holder made is there for everyone.
    create(&mut s, "/d/f", "mount-a", first, 10_002).unwrap();
    lookup(&s, "/d/f", "mount-b", 10_003).unwrap();
    // Past the hold, nothing waits.
    assert_eq!(
        kind(lookup(&s, "/d/g", "mount-b", until)),
        ErrorKind::NotFound
    );
    readdir(&s, "/d", "mount-b", until).unwrap();
    // A mkdir without a reservation, or not a mount's, holds nothing.
    assert!(matches!(
        mkdir(&mut s, "/e", "mount-a", 0, 10_000),
        FileReply::Attr(_)
    ));
    assert!(matches!(
        mkdir(&mut s, "/g", "", 8, 10_000),
        FileReply::Made { .. }
    ));
    for d in ["/e", "/g"] {
        readdir(&s, d, "mount-b", 10_001).unwrap();
    }
}

#[test]
fn changes_that_add_or_take_names_wait_for_another_mounts_directory() {
    let mut s = State::default();
    mkdir(&mut s, "/d", "mount-a", 8, 10_000);
    make(&mut s, "/x", NewNode::Regular);
    make(&mut s, "/e", NewNode::Directory);
    let now = 10_001;
    let op = |path: &str, mount: &str| FileOp::Make {
        path: path.into(),
        node: NewNode::Regular,
        mode: 0o644,
        uid: 0,
        gid: 0,
        now: t(now),
        hold: String::new(),
        mount: mount.into(),
        ino: 0,
        reserve: 0,
    };
    let rename = |from: &str, to: &str, mount: &str| FileOp::Rename {
        from: from.into(),
        ino: 0,
        to: to.into(),
        flags: Default::default(),
        now: t(now),
        mount: mount.into(),
    };
    let held = |op: &FileOp| held_kind(s.check_dir_holds(op, now).map(|()| FileReply::Done));
    // The holder's own changes go; another mount's wait.
    assert_eq!(held(&op("/d/f", "mount-a")), None);
    assert_eq!(held(&op("/d/f", "mount-b")), Some(ErrorKind::LeaseHeld));
    assert_eq!(held(&op("/e/f", "mount-b")), None, "another directory");
    assert_eq!(
        held(&rename("/x", "/d/x", "mount-b")),
        Some(ErrorKind::LeaseHeld)
    );
    assert_eq!(
        held(&rename("/d", "/d2", "mount-b")),
        Some(ErrorKind::LeaseHeld)
    );
    assert_eq!(
        held(&rename("/e", "/d", "mount-b")),
        Some(ErrorKind::LeaseHeld)
    );
    assert_eq!(held(&rename("/x", "/d/x", "mount-a")), None);
    let link = FileOp::Link {
        from: "/x".into(),
        ino: 0,
        to: "/d/l".into(),
        now: t(now),
        mount: "mount-b".into(),
    };
    assert_eq!(held(&link), Some(ErrorKind::LeaseHeld));
    let rmdir = |mount: &str| FileOp::Remove {
        path: "/d".into(),
        ino: 0,
        dir: true,
        now: t(now),
        mount: mount.into(),
    };
    assert_eq!(held(&rmdir("mount-b")), Some(ErrorKind::LeaseHeld));
    assert_eq!(held(&rmdir("mount-a")), None);
    // Past the hold: nothing waits.
    let later = 10_000 + cairn_rpc::files::DIR_HOLD_MS;
    assert!(s.check_dir_holds(&op("/d/f", "mount-b"), later).is_ok());
}

#[test]
fn a_renewed_directory_hold_lasts_from_the_renewal() {
    let mut s = State::default();
    let dir = match mkdir(&mut s, "/d", "mount-a", 8, 10_000) {
        FileReply::Made { attr, .. } => attr,
        other => panic!("{other:?}"),
    };
    let renew = |holder: &str| FileOp::Hold {
        path: "/d".into(),
        ino: dir.ino,
        holder: holder.into(),
        now: t(12_000),
    };
    // Another mount's renewal changes nothing; the holder's extends it.
    apply(&mut s, renew("mount-b")).unwrap();
    let first_end = 10_000 + cairn_rpc::files::DIR_HOLD_MS;
    assert!(lookup(&s, "/d/f", "mount-b", first_end).is_err_and(|e| e.kind == ErrorKind::NotFound));
    apply(&mut s, renew("mount-a")).unwrap();
    let e = lookup(&s, "/d/f", "mount-b", first_end).unwrap_err();
    assert_eq!(e.kind, ErrorKind::LeaseHeld, "{e}");
    let end = 12_000 + cairn_rpc::files::DIR_HOLD_MS;
    assert_eq!(
        kind(lookup(&s, "/d/f", "mount-b", end)),
        ErrorKind::NotFound
    );
}

#[test]
fn a_create_takes_only_a_reserved_unused_number() {
    let mut s = State::default();
    let (first, count) = match mkdir(&mut s, "/d", "mount-a", 4, 10_000) {
        FileReply::Made { first, count, .. } => (first, count),
        other => panic!("{other:?}"),
    };
    let a = match create(&mut s, "/d/a", "mount-a", first, 10_001).unwrap() {
        FileReply::Attr(a) => a,
        other => panic!("{other:?}"),
    };
    assert_eq!(a.ino, first);
    assert_eq!(map(&s, "/d/a").0.ino, first);
    // Used already, past what was handed out, or of another partition's range: refused,
    // and nothing made.
    let past = first + u64::from(count) + 1000;
    let other = crate::state::partitions::id_base(3) + 5;
    for (name, ino) in [("b", first), ("c", past), ("e", other)] {
        let path = format!("/d/{name}");
        let r = create(&mut s, &path, "mount-a", ino, 10_002);
        assert_eq!(kind(r), ErrorKind::InvalidArgument, "{name}");
        assert_eq!(
            kind(lookup(&s, &path, "mount-a", 10_002)),
            ErrorKind::NotFound
        );
    }
    // The masters' own numbers never meet the reserved ones.
    let b = make(&mut s, "/d/m", NewNode::Regular);
    assert!(
        b.ino >= first + u64::from(count),
        "{} after the reservation",
        b.ino
    );
    create(&mut s, "/d/z", "mount-a", first + 3, 10_003).unwrap();
    // A reservation is bounded.
    match mkdir(&mut s, "/big", "mount-a", u32::MAX, 10_000) {
        FileReply::Made { count, .. } => assert_eq!(count, cairn_rpc::files::RESERVE_MAX),
        other => panic!("{other:?}"),
    }
}
