use super::*;
use crate::state::tests::create_file;
use cairn_rpc::files::FileReply;

pub(super) fn t(ms: u64) -> Time {
    Time::from_ms(ms)
}

pub(super) fn apply(s: &mut State, op: FileOp) -> Result<FileReply, MetaError> {
    s.apply(&Command::Files(Box::new(op)))
        .map(|r| r.file.expect("a file reply"))
}

pub(super) fn make(s: &mut State, path: &str, node: NewNode) -> Attr {
    match apply(
        s,
        FileOp::Make {
            path: path.into(),
            node,
            mode: 0o640,
            uid: 1000,
            gid: 100,
            now: t(5000),
            hold: String::new(),
            mount: String::new(),
            ino: 0,
            reserve: 0,
        },
    )
    .unwrap()
    {
        FileReply::Attr(a) => a,
        other => panic!("{other:?}"),
    }
}

pub(super) fn ext(offset: u64, len: u64, seg: u64, seg_offset: u64) -> Extent {
    Extent {
        offset,
        len,
        seg,
        seg_offset,
    }
}

pub(super) fn map(s: &State, path: &str) -> (Attr, Data) {
    match s
        .file_query(&FileQuery::Map {
            path: path.into(),
            ino: 0,
            mount: String::new(),
        })
        .unwrap()
    {
        FileReply::Map { attr, data, .. } => (attr, data),
        other => panic!("{other:?}"),
    }
}

pub(super) fn kind(r: Result<FileReply, MetaError>) -> ErrorKind {
    r.expect_err("refused").kind
}

#[test]
fn nodes_are_made_with_their_posix_attributes() {
    let mut s = State::default();
    let d = make(&mut s, "/d", NewNode::Directory);
    assert_eq!(
        (d.kind, d.mode, d.uid, d.gid, d.nlink),
        (NodeType::Directory, 0o640, 1000, 100, 2)
    );
    let f = make(&mut s, "/d/f", NewNode::Regular);
    assert_eq!((f.kind, f.size, f.nlink), (NodeType::Regular, 0, 1));
    let l = make(
        &mut s,
        "/d/l",
        NewNode::Symlink {
            target: "../x".into(),
        },
    );
    assert_eq!((l.kind, l.size), (NodeType::Symlink, 4));
    match s
        .file_query(&FileQuery::Map {
            path: "/d/l".into(),
            ino: l.ino,
            mount: String::new(),
        })
        .unwrap()
    {
        FileReply::Map { target, .. } => assert_eq!(target.as_deref(), Some("../x")),
        other => panic!("{other:?}"),
    }
    make(&mut s, "/d/p", NewNode::Fifo);
    let c = make(&mut s, "/d/c", NewNode::CharDevice { rdev: 0x0103 });
    assert_eq!((c.kind, c.rdev), (NodeType::CharDevice, 0x0103));
    make(&mut s, "/d/sub", NewNode::Directory);
    // A subdirectory counts in its parent's links; the parent's times are the change's.
    let (d2, _) = map(&s, "/d");
    assert_eq!(d2.nlink, 3);
    assert_eq!(d2.mtime, t(5000));
    // Listed in name order, with attributes.
    match s
        .file_query(&FileQuery::Readdir {
            path: "/d".into(),
            ino: d.ino,
            after: String::new(),
            limit: 3,
            mount: String::new(),
        })
        .unwrap()
    {
        FileReply::Readdir { entries, more } => {
            let names: Vec<_> = entries.iter().map(|e| e.name.as_str()).collect();
            assert_eq!(names, ["c", "f", "l"]);
            assert!(more);
            assert_eq!(entries[1].attr.ino, f.ino);
        }
        other => panic!("{other:?}"),
    }
    // Refusals: exists, missing parent, a name too long, an empty link.
    let again = FileOp::Make {
        path: "/d/f".into(),
        node: NewNode::Regular,
        mode: 0o600,
        uid: 0,
        gid: 0,
        now: t(1),
        hold: String::new(),
        mount: String::new(),
        ino: 0,
        reserve: 0,
    };
    assert_eq!(kind(apply(&mut s, again)), ErrorKind::AlreadyExists);
    let orphan = FileOp::Make {
        path: "/nope/f".into(),
        node: NewNode::Regular,
        mode: 0o600,
        uid: 0,
        gid: 0,
        now: t(1),
        hold: String::new(),
        mount: String::new(),
        ino: 0,
        reserve: 0,
    };
    assert_eq!(kind(apply(&mut s, orphan)), ErrorKind::NotFound);
    let empty_link = FileOp::Make {
        path: "/d/e".into(),
        node: NewNode::Symlink {
            target: String::new(),
        },
        mode: 0o777,
        uid: 0,
        gid: 0,
        now: t(1),
        hold: String::new(),
        mount: String::new(),
        ino: 0,
        reserve: 0,
    };
    assert_eq!(kind(apply(&mut s, empty_link)), ErrorKind::InvalidArgument);
}

#[test]
fn writes_lay_extents_and_truncate_cuts_them() {
    let mut s = State::default();
    let f = make(&mut s, "/f", NewNode::Regular);
    let write = |s: &mut State, extents: Vec<Extent>, size: u64| {
        apply(
            s,
            FileOp::Write {
                path: "/f".into(),
                ino: f.ino,
                extents,
                size,
                then: None,
                now: t(9000),
            },
        )
    };
    write(&mut s, vec![ext(0, 8192, 5, 0)], 8192).unwrap();
    write(&mut s, vec![ext(4096, 100, 6, 40)], 0).unwrap();
    let (a, data) = map(&s, "/f");
    assert_eq!(a.size, 8192);
    assert_eq!(a.mtime, t(9000));
    assert_eq!(
        data,
        Data::Extents(vec![
            ext(0, 4096, 5, 0),
            ext(4096, 100, 6, 40),
            ext(4196, 3996, 5, 4196)
        ])
    );
    // A write past the end makes the file longer, with a hole.
    write(&mut s, vec![ext(1 << 20, 10, 6, 200)], 0).unwrap();
    assert_eq!(map(&s, "/f").0.size, (1 << 20) + 10);
    // Truncate down cuts, up extends with a hole.
    let trunc = |s: &mut State, size: u64| {
        apply(
            s,
            FileOp::SetAttr {
                path: "/f".into(),
                ino: f.ino,
                attr: SetAttr {
                    size: Some(size),
                    ..SetAttr::default()
                },
                now: t(9500),
            },
        )
    };
    trunc(&mut s, 4100).unwrap();
    let (a, data) = map(&s, "/f");
    assert_eq!(a.size, 4100);
    assert_eq!(
        data,
        Data::Extents(vec![ext(0, 4096, 5, 0), ext(4096, 4, 6, 40)])
    );
    trunc(&mut s, 1 << 30).unwrap();
    assert_eq!(map(&s, "/f").0.size, 1 << 30);
    // Refused: segment 0, an empty extent, a stale inode, a directory.
    assert_eq!(
        kind(write(&mut s, vec![ext(0, 1, 0, 0)], 0)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(write(&mut s, vec![ext(0, 0, 1, 0)], 0)),
        ErrorKind::InvalidArgument
    );
    let stale = FileOp::Write {
        path: "/f".into(),
        ino: f.ino + 100,
        extents: vec![ext(0, 1, 1, 0)],
        size: 1,
        then: None,
        now: t(1),
    };
    assert_eq!(kind(apply(&mut s, stale)), ErrorKind::NotFound);
    let d = make(&mut s, "/d", NewNode::Directory);
    let to_dir = FileOp::Write {
        path: "/d".into(),
        ino: d.ino,
        extents: vec![ext(0, 1, 1, 0)],
        size: 1,
        then: None,
        now: t(1),
    };
    assert_eq!(kind(apply(&mut s, to_dir)), ErrorKind::IsADirectory);
}

/// The segments' tallies (bytes and extents each segment holds for files) follow writes,
/// overwrites, truncates, holes, renames over a file and unlinks, and the consistency check
/// agrees with them at every step: what a segment collector asks before deleting a segment.
#[test]
fn segment_tallies_follow_every_change_to_extents() {
    let mut s = State::default();
    let a = make(&mut s, "/a", NewNode::Regular);
    let b = make(&mut s, "/b", NewNode::Regular);
    let write = |s: &mut State, path: &str, ino: u64, extents: Vec<Extent>| {
        apply(
            s,
            FileOp::Write {
                path: path.into(),
                ino,
                extents,
                size: 0,
                then: None,
                now: t(9000),
            },
        )
        .unwrap();
    };
    let tally = |s: &State, seg: u64| {
        assert_eq!(s.check().problems, 0, "{:?}", s.check().listed);
        s.inodes.tally(seg)
    };
    write(&mut s, "/a", a.ino, vec![ext(0, 8192, 5, 0)]);
    write(
        &mut s,
        "/b",
        b.ino,
        vec![ext(0, 100, 5, 8192), ext(100, 50, 6, 0)],
    );
    assert_eq!(tally(&s, 5), [8292, 2]);
    assert_eq!(tally(&s, 6), [50, 1]);
    // An overwrite in the middle splits a's extent: two pieces of segment 5, one of 6.
    write(&mut s, "/a", a.ino, vec![ext(4096, 100, 6, 50)]);
    assert_eq!(tally(&s, 5), [8192, 3]);
    assert_eq!(tally(&s, 6), [150, 2]);
    // A truncate cuts; a hole punched cuts.
    let setsize = FileOp::SetAttr {
        path: "/a".into(),
        ino: a.ino,
        attr: SetAttr {
            size: Some(4100),
            ..SetAttr::default()
        },
        now: t(9500),
    };
    apply(&mut s, setsize).unwrap();
    assert_eq!(tally(&s, 5), [4196, 2]);
    assert_eq!(tally(&s, 6), [54, 2]);
    let punch = FileOp::Punch {
        path: "/a".into(),
        ino: a.ino,
        offset: 0,
        len: 4096,
        now: t(9900),
    };
    apply(&mut s, punch).unwrap();
    assert_eq!(tally(&s, 5), [100, 1]);
    // b renamed over a: a's extents are gone with it.
    let rename = FileOp::Rename {
        from: "/b".into(),
        ino: b.ino,
        to: "/a".into(),
        flags: RenameFlags::default(),
        now: t(9950),
        mount: String::new(),
    };
    apply(&mut s, rename).unwrap();
    assert_eq!(tally(&s, 5), [100, 1]);
    assert_eq!(tally(&s, 6), [50, 1]);
    let unlink = FileOp::Remove {
        path: "/a".into(),
        ino: b.ino,
        dir: false,
        now: t(9990),
        mount: String::new(),
    };
    apply(&mut s, unlink).unwrap();
    assert_eq!(tally(&s, 5), [0, 0]);
    assert_eq!(tally(&s, 6), [0, 0]);
    assert!(s.inodes.tallies().is_empty());
}

/// A condemned segment (being collected) is named by no new write: the write is refused
/// (`Sealed`, the mount appends the bytes again elsewhere), writes to other segments go on,
/// and the partition reports each segment's use and its arrivals.
#[test]
fn a_write_naming_a_condemned_segment_is_refused() {
    let mut s = State::default();
    let f = make(&mut s, "/f", NewNode::Regular);
    let write = |s: &mut State, seg: u64| {
        apply(
            s,
            FileOp::Write {
                path: "/f".into(),
                ino: f.ino,
                extents: vec![ext(0, 10, 9, 0), ext(10, 10, seg, 0)],
                size: 0,
                then: None,
                now: t(9000),
            },
        )
    };
    write(&mut s, 7).unwrap();
    let condemn =
        |s: &mut State, segs: Vec<u64>| s.apply(&Command::CondemnSegments { segs, now_ms: 1 });
    condemn(&mut s, vec![7, 8]).unwrap();
    condemn(&mut s, vec![8]).unwrap();
    assert!(
        condemn(&mut s, vec![0]).is_err(),
        "segment 0 is a file's own log"
    );
    let e = write(&mut s, 8).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Sealed, "{e}");
    write(&mut s, 10).unwrap();
    let (arrivals, used) = s.segment_use(&[7, 8, 9, 10]);
    assert_eq!(arrivals, 0);
    let got: Vec<_> = used
        .iter()
        .map(|u| (u.bytes, u.extents, u.condemned))
        .collect();
    // 7 lost its extent to the second write (the same range), which went to 10.
    assert_eq!(
        got,
        [(0, 0, true), (0, 0, true), (10, 1, false), (10, 1, false)]
    );
    assert_eq!(s.condemned_segments(None, 10), [(7, 1), (8, 1)]);
    assert_eq!(s.condemned_segments(Some(7), 10), [(8, 1)]);
}

#[test]
fn a_punched_hole_cuts_extents_and_keeps_the_size() {
    let mut s = State::default();
    let f = make(&mut s, "/f", NewNode::Regular);
    let punch = |s: &mut State, path: &str, ino: u64, offset: u64, len: u64| {
        apply(
            s,
            FileOp::Punch {
                path: path.into(),
                ino,
                offset,
                len,
                now: t(9900),
            },
        )
    };
    apply(
        &mut s,
        FileOp::Write {
            path: "/f".into(),
            ino: f.ino,
            extents: vec![ext(0, 8192, 5, 0)],
            size: 8192,
            then: None,
            now: t(9000),
        },
    )
    .unwrap();
    punch(&mut s, "/f", f.ino, 100, 4000).unwrap();
    // Past the end: nothing to cut, and the size stays.
    punch(&mut s, "/f", f.ino, 1 << 20, 10).unwrap();
    let (a, data) = map(&s, "/f");
    assert_eq!(a.size, 8192);
    assert_eq!(a.mtime, t(9900));
    assert_eq!(
        data,
        Data::Extents(vec![ext(0, 100, 5, 0), ext(4100, 4092, 5, 4100)])
    );
    assert_eq!(
        kind(punch(&mut s, "/f", f.ino, 0, 0)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(punch(&mut s, "/f", f.ino, u64::MAX, 2)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(punch(&mut s, "/f", f.ino + 1, 0, 1)),
        ErrorKind::NotFound
    );
    let d = make(&mut s, "/d", NewNode::Directory);
    assert_eq!(
        kind(punch(&mut s, "/d", d.ino, 0, 1)),
        ErrorKind::IsADirectory
    );
}

#[test]
fn a_file_cairn_fs_wrote_reads_its_own_log_until_a_mount_writes_it() {
    let mut s = State::default();
    let ino = create_file(&mut s, "/logs/app", 1);
    let (a, data) = map(&s, "/logs/app");
    assert_eq!(data, Data::Own);
    assert_eq!((a.kind, a.uid, a.nlink), (NodeType::Regular, 0, 1));
    // Its committed bytes become extents of segment 0 (its own log) under the write.
    let own = ino.file().unwrap().committed_length();
    apply(
        &mut s,
        FileOp::Write {
            path: "/logs/app".into(),
            ino: ino.id,
            extents: vec![ext(0, 1, 9, 0)],
            size: 0,
            then: None,
            now: t(1),
        },
    )
    .unwrap();
    let (_, data) = map(&s, "/logs/app");
    let mut want = vec![ext(0, 1, 9, 0)];
    if own > 1 {
        want.push(ext(1, own - 1, 0, 1));
    }
    assert_eq!(data, Data::Extents(want));
}

#[test]
fn unlink_and_rmdir_refuse_the_wrong_kind_and_full_directories() {
    let mut s = State::default();
    let d = make(&mut s, "/d", NewNode::Directory);
    let f = make(&mut s, "/d/f", NewNode::Regular);
    let remove = |s: &mut State, path: &str, ino: u64, dir: bool| {
        apply(
            s,
            FileOp::Remove {
                path: path.into(),
                ino,
                dir,
                now: t(7000),
                mount: String::new(),
            },
        )
    };
    assert_eq!(
        kind(remove(&mut s, "/d", d.ino, false)),
        ErrorKind::IsADirectory
    );
    assert_eq!(
        kind(remove(&mut s, "/d/f", f.ino, true)),
        ErrorKind::NotADirectory
    );
    assert_eq!(
        kind(remove(&mut s, "/d", d.ino, true)),
        ErrorKind::DirectoryNotEmpty
    );
    remove(&mut s, "/d/f", f.ino, false).unwrap();
    assert_eq!(map(&s, "/d").0.mtime, t(7000));
    remove(&mut s, "/d", d.ino, true).unwrap();
    assert!(s.lookup("/d").is_err());
    assert_eq!(map(&s, "/").0.nlink, 2);
}

#[test]
fn renames_replace_exchange_and_refuse_as_posix_says() {
    let mut s = State::default();
    let a = make(&mut s, "/a", NewNode::Regular);
    let b = make(&mut s, "/b", NewNode::Regular);
    let d = make(&mut s, "/d", NewNode::Directory);
    let e = make(&mut s, "/e", NewNode::Directory);
    make(&mut s, "/e/x", NewNode::Regular);
    let rename = |s: &mut State, from: &str, ino: u64, to: &str, flags: RenameFlags| {
        apply(
            s,
            FileOp::Rename {
                from: from.into(),
                ino,
                to: to.into(),
                flags,
                now: t(8000),
                mount: String::new(),
            },
        )
    };
    let plain = RenameFlags::default();
    // Over a file: replaces it.
    rename(&mut s, "/a", a.ino, "/b", plain).unwrap();
    assert_eq!(s.lookup("/b").unwrap().id, a.ino);
    assert!(s.inode(b.ino).is_none());
    // A file over a directory, a directory over a file, over a full directory: refused.
    assert_eq!(
        kind(rename(&mut s, "/b", a.ino, "/d", plain)),
        ErrorKind::IsADirectory
    );
    assert_eq!(
        kind(rename(&mut s, "/d", d.ino, "/b", plain)),
        ErrorKind::NotADirectory
    );
    assert_eq!(
        kind(rename(&mut s, "/d", d.ino, "/e", plain)),
        ErrorKind::DirectoryNotEmpty
    );
    // Below itself: refused.
    assert_eq!(
        kind(rename(&mut s, "/e", e.ino, "/e/y", plain)),
        ErrorKind::InvalidArgument
    );
    // No-replace over an existing entry: refused; exchange swaps a file and a directory.
    let noreplace = RenameFlags {
        noreplace: true,
        exchange: false,
    };
    assert_eq!(
        kind(rename(&mut s, "/b", a.ino, "/d", noreplace)),
        ErrorKind::AlreadyExists
    );
    let exchange = RenameFlags {
        noreplace: false,
        exchange: true,
    };
    rename(&mut s, "/b", a.ino, "/e", exchange).unwrap();
    assert_eq!(s.lookup("/e").unwrap().id, a.ino);
    assert_eq!(s.lookup("/b").unwrap().id, e.ino);
    assert_eq!(s.lookup("/b/x").unwrap().name, "x");
    assert_eq!(
        kind(rename(&mut s, "/e", a.ino, "/missing", exchange)),
        ErrorKind::NotFound
    );
    // A directory over an empty one replaces it; the root's links follow.
    rename(&mut s, "/b", e.ino, "/d", plain).unwrap();
    assert!(s.inode(d.ino).is_none());
    assert_eq!(map(&s, "/").0.nlink, 3);
    // The old inode number at a path is stale.
    assert_eq!(
        kind(rename(&mut s, "/d", d.ino, "/z", plain)),
        ErrorKind::NotFound
    );
}

#[test]
fn setattr_changes_mode_owners_and_times_and_narrowing_revokes() {
    let mut s = State::default();
    let f = make(&mut s, "/f", NewNode::Regular);
    let gen_before = s.revocations().generation();
    let a = match apply(
        &mut s,
        FileOp::SetAttr {
            path: "/f".into(),
            ino: f.ino,
            attr: SetAttr {
                mode: Some(0o600),
                uid: Some(7),
                gid: Some(8),
                atime: Some(Time { secs: -1, nanos: 5 }),
                mtime: Some(t(42)),
                size: None,
            },
            now: t(10_000),
        },
    )
    .unwrap()
    {
        FileReply::Attr(a) => a,
        other => panic!("{other:?}"),
    };
    assert_eq!((a.mode, a.uid, a.gid), (0o600, 7, 8));
    assert_eq!(a.atime, Time { secs: -1, nanos: 5 });
    assert_eq!((a.mtime, a.ctime), (t(42), t(10_000)));
    assert!(
        s.revocations().generation() > gen_before,
        "0640 → 0600 narrows"
    );
}

#[test]
fn a_user_changes_only_what_the_bits_let_them() {
    let mut s = State::default();
    let admin = Actor {
        user: "root".into(),
        admin: true,
    };
    let alice = Actor {
        user: "alice".into(),
        admin: false,
    };
    let as_ = |s: &mut State, actor: &Actor, op: FileOp| {
        s.apply(&Command::As {
            actor: actor.clone(),
            cmd: Box::new(Command::Files(Box::new(op))),
        })
    };
    let mk = |path: &str, mode: u16| FileOp::Make {
        path: path.into(),
        node: NewNode::Directory,
        mode,
        uid: 0,
        gid: 0,
        now: t(1),
        hold: String::new(),
        mount: String::new(),
        ino: 0,
        reserve: 0,
    };
    as_(&mut s, &admin, mk("/closed", 0o755)).unwrap();
    as_(&mut s, &admin, mk("/open", 0o777)).unwrap();
    let denied = as_(&mut s, &alice, mk("/closed/x", 0o755)).unwrap_err();
    assert_eq!(denied.kind, ErrorKind::PermissionDenied);
    as_(&mut s, &alice, mk("/open/mine", 0o700)).unwrap();
    assert_eq!(s.lookup("/open/mine").unwrap().owner, "alice");
    // Not hers: no chmod.
    let chmod = FileOp::SetAttr {
        path: "/closed".into(),
        ino: 0,
        attr: SetAttr {
            mode: Some(0o777),
            ..SetAttr::default()
        },
        now: t(2),
    };
    assert_eq!(
        as_(&mut s, &alice, chmod).unwrap_err().kind,
        ErrorKind::PermissionDenied
    );
}

#[test]
fn xattrs_are_set_replaced_removed_and_bounded() {
    let mut s = State::default();
    let f = make(&mut s, "/f", NewNode::Regular);
    let set = |s: &mut State, name: &str, value: Option<&[u8]>, flags: XattrSet| {
        apply(
            s,
            FileOp::SetXattr {
                path: "/f".into(),
                ino: f.ino,
                name: name.into(),
                value: value.map(<[u8]>::to_vec),
                flags,
                now: t(7000),
            },
        )
    };
    let all = |s: &State| match s
        .file_query(&FileQuery::Xattrs {
            path: "/f".into(),
            ino: f.ino,
        })
        .unwrap()
    {
        FileReply::Xattrs(x) => x,
        other => panic!("{other:?}"),
    };
    assert!(all(&s).is_empty());
    // XATTR_REPLACE of a missing one, and removing one, answer "no such attribute".
    assert_eq!(
        set(&mut s, "user.a", Some(b"1"), XattrSet::Replace).unwrap(),
        FileReply::NoXattr
    );
    assert_eq!(
        set(&mut s, "user.a", None, XattrSet::Any).unwrap(),
        FileReply::NoXattr
    );
    match set(&mut s, "user.a", Some(b"1"), XattrSet::Create).unwrap() {
        FileReply::Attr(a) => assert_eq!(a.ctime, t(7000)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        kind(set(&mut s, "user.a", Some(b"2"), XattrSet::Create)),
        ErrorKind::AlreadyExists
    );
    set(&mut s, "user.a", Some(b"22"), XattrSet::Replace).unwrap();
    set(&mut s, "trusted.b", Some(b""), XattrSet::Any).unwrap();
    assert_eq!(
        all(&s),
        [
            ("trusted.b".to_string(), Vec::new()),
            ("user.a".to_string(), b"22".to_vec())
        ]
        .into()
    );
    // Bad names and values are refused; so is more than XATTRS_MAX in all.
    for bad in ["user.", "system.posix_acl_access", "nonsense"] {
        assert_eq!(
            kind(set(&mut s, bad, Some(b"1"), XattrSet::Any)),
            ErrorKind::InvalidArgument,
            "{bad}"
        );
    }
    let big = vec![7u8; cairn_rpc::files::XATTR_SIZE_MAX];
    set(&mut s, "user.big1", Some(&big), XattrSet::Any).unwrap();
    assert_eq!(
        kind(set(&mut s, "user.big2", Some(&big), XattrSet::Any)),
        ErrorKind::NoSpace
    );
    // Replacing one with a value of the same size fits (its old bytes do not count).
    set(&mut s, "user.big1", Some(&big), XattrSet::Any).unwrap();
    set(&mut s, "user.big1", None, XattrSet::Any).unwrap();
    set(&mut s, "user.big2", Some(&big), XattrSet::Any).unwrap();
    assert_eq!(all(&s).len(), 3);
    // A directory holds them too; a stale inode number is refused.
    make(&mut s, "/d", NewNode::Directory);
    apply(
        &mut s,
        FileOp::SetXattr {
            path: "/d".into(),
            ino: 0,
            name: "user.d".into(),
            value: Some(b"x".to_vec()),
            flags: XattrSet::Any,
            now: t(7100),
        },
    )
    .unwrap();
    let stale = FileOp::SetXattr {
        path: "/d".into(),
        ino: f.ino,
        name: "user.d".into(),
        value: None,
        flags: XattrSet::Any,
        now: t(7200),
    };
    assert_eq!(kind(apply(&mut s, stale)), ErrorKind::NotFound);
}

mod attrs_with_bytes;
mod dir_holds;
mod holds;
