//! A write that carries a new file's attribute changes (`FileOp::Write::then`).

use super::*;

/// A mount's `chmod`, `chown` and `utimens` of a file it made, taken while the file's bytes
/// were not yet committed, travel with the bytes (`FileOp::Write::then`): applied after the
/// extents in the same change (the time set wins over the write's), checked before anything
/// is changed, and only the owner's to make.
#[test]
fn a_write_carries_a_new_files_attribute_changes() {
    let mut s = State::default();
    let f = make(&mut s, "/f", NewNode::Regular);
    let write = |seg: u64, then: SetAttr| FileOp::Write {
        path: "/f".into(),
        ino: f.ino,
        extents: vec![ext(0, 4096, seg, 0)],
        size: 4096,
        then: Some(then),
        now: t(9000),
    };
    let tar = SetAttr {
        mode: Some(0o644),
        uid: Some(0),
        gid: Some(0),
        mtime: Some(t(1234)),
        ..SetAttr::default()
    };
    let FileReply::Attr(a) = apply(&mut s, write(5, tar)).unwrap() else {
        panic!("attributes");
    };
    assert_eq!(
        (a.mode, a.uid, a.gid, a.mtime, a.ctime, a.size),
        (0o644, 0, 0, t(1234), t(9000), 4096)
    );
    let (stored, data) = map(&s, "/f");
    assert_eq!(stored, a);
    assert_eq!(data, Data::Extents(vec![ext(0, 4096, 5, 0)]));
    // A size, or a mode past the bits: refused, and the bytes are not laid either.
    for bad in [
        SetAttr {
            size: Some(1),
            mode: Some(0o600),
            ..SetAttr::default()
        },
        SetAttr {
            mode: Some(0o170_000),
            ..SetAttr::default()
        },
    ] {
        assert_eq!(
            kind(apply(&mut s, write(6, bad))),
            ErrorKind::InvalidArgument
        );
        assert_eq!(map(&s, "/f"), (stored.clone(), data.clone()));
    }
    // Only the owner changes the mode or owners with its bytes; anyone who may write sets
    // the times.
    let actor = |user: &str| Actor {
        user: user.into(),
        admin: false,
    };
    let as_ = |s: &mut State, who: &str, op: FileOp| {
        s.apply(&Command::As {
            actor: actor(who),
            cmd: Box::new(Command::Files(Box::new(op))),
        })
    };
    let admin = Actor {
        user: "root".into(),
        admin: true,
    };
    s.apply(&Command::As {
        actor: admin,
        cmd: Box::new(Command::Files(Box::new(FileOp::Make {
            path: "/open".into(),
            node: NewNode::Directory,
            mode: 0o777,
            uid: 0,
            gid: 0,
            now: t(1),
            hold: String::new(),
            mount: String::new(),
            ino: 0,
            reserve: 0,
        }))),
    })
    .unwrap();
    let mk = FileOp::Make {
        path: "/open/hers".into(),
        node: NewNode::Regular,
        mode: 0o666,
        uid: 1000,
        gid: 1000,
        now: t(1),
        hold: String::new(),
        mount: String::new(),
        ino: 0,
        reserve: 0,
    };
    let FileReply::Attr(hers) = as_(&mut s, "alice", mk).unwrap().file.unwrap() else {
        panic!("attributes");
    };
    let bob_writes = |then: SetAttr| FileOp::Write {
        path: "/open/hers".into(),
        ino: hers.ino,
        extents: vec![ext(0, 10, 7, 0)],
        size: 10,
        then: Some(then),
        now: t(2),
    };
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    let denied = as_(&mut s, "bob", bob_writes(chmod.clone())).unwrap_err();
    assert_eq!(denied.kind, ErrorKind::PermissionDenied);
    let touch = SetAttr {
        mtime: Some(t(3)),
        ..SetAttr::default()
    };
    as_(&mut s, "bob", bob_writes(touch)).unwrap();
    as_(&mut s, "alice", bob_writes(chmod)).unwrap();
    assert_eq!(map(&s, "/open/hers").0.mode, 0o600);
}
