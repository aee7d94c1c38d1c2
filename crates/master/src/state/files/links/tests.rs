use super::super::tests::{apply, ext, kind, make, map, t};
use super::*;
use cairn_rpc::files::RenameFlags;

fn link(s: &mut State, from: &str, ino: u64, to: &str) -> Result<FileReply, MetaError> {
    apply(
        s,
        FileOp::Link {
            from: from.into(),
            ino,
            to: to.into(),
            now: t(7000),
            mount: String::new(),
        },
    )
}

fn remove(s: &mut State, path: &str) {
    apply(
        s,
        FileOp::Remove {
            path: path.into(),
            ino: 0,
            dir: false,
            now: t(8000),
            mount: String::new(),
        },
    )
    .unwrap();
}

fn lookup(s: &State, path: &str) -> Result<Attr, MetaError> {
    match s.file_query(&FileQuery::Lookup {
        path: path.into(),
        mount: String::new(),
    })? {
        FileReply::Attr(a) => Ok(a),
        other => panic!("{other:?}"),
    }
}

fn clean(s: &State) {
    let r = s.check();
    assert_eq!(r.problems, 0, "{:?}", r.listed);
}

/// A file with one extent in segment 7.
fn written(s: &mut State, path: &str) -> Attr {
    let a = make(s, path, NewNode::Regular);
    apply(
        s,
        FileOp::Write {
            path: path.into(),
            ino: a.ino,
            extents: vec![ext(0, 100, 7, 32)],
            size: 100,
            then: None,
            now: t(6000),
        },
    )
    .unwrap();
    a
}

#[test]
fn a_link_is_another_name_of_the_same_node() {
    let mut s = State::default();
    make(&mut s, "/d", NewNode::Directory);
    make(&mut s, "/e", NewNode::Directory);
    let f = written(&mut s, "/d/f");
    let a = match link(&mut s, "/d/f", f.ino, "/e/g").unwrap() {
        FileReply::Attr(a) => a,
        other => panic!("{other:?}"),
    };
    assert_eq!((a.ino, a.nlink, a.ctime), (f.ino, 2, t(7000)));
    let g = lookup(&s, "/e/g").unwrap();
    assert_eq!(
        (g.ino, g.nlink, g.size, g.kind),
        (f.ino, 2, 100, NodeType::Regular)
    );
    assert_eq!(map(&s, "/e/g").1, map(&s, "/d/f").1);
    // A change through either name is the node's.
    apply(
        &mut s,
        FileOp::Write {
            path: "/e/g".into(),
            ino: f.ino,
            extents: vec![ext(100, 50, 7, 200)],
            size: 150,
            then: None,
            now: t(7500),
        },
    )
    .unwrap();
    apply(
        &mut s,
        FileOp::SetAttr {
            path: "/e/g".into(),
            ino: f.ino,
            attr: SetAttr {
                mode: Some(0o600),
                ..SetAttr::default()
            },
            now: t(7600),
        },
    )
    .unwrap();
    let f2 = lookup(&s, "/d/f").unwrap();
    assert_eq!((f2.size, f2.mode, f2.nlink), (150, 0o600, 2));
    // A listing shows the node under each name.
    let entries = match s
        .file_query(&FileQuery::Readdir {
            path: "/e".into(),
            ino: 0,
            after: String::new(),
            limit: 10,
            mount: String::new(),
        })
        .unwrap()
    {
        FileReply::Readdir { entries, .. } => entries,
        other => panic!("{other:?}"),
    };
    assert_eq!(entries.len(), 1);
    assert_eq!(
        (entries[0].name.as_str(), entries[0].attr.ino),
        ("g", f.ino)
    );
    assert_eq!(s.inodes.tally(LINKS_TALLY), [2, 0]);
    assert_eq!(
        s.inodes.tally(7),
        [150, 2],
        "the link entry names no segment"
    );
    clean(&s);
    // Refused: a directory, an existing name, a stale inode, a file `cairn fs` wrote.
    let d = lookup(&s, "/d").unwrap();
    assert_eq!(
        kind(link(&mut s, "/d", d.ino, "/e/d2")),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        kind(link(&mut s, "/d/f", f.ino, "/e/g")),
        ErrorKind::AlreadyExists
    );
    assert_eq!(
        kind(link(&mut s, "/d/f", f.ino + 100, "/e/h")),
        ErrorKind::NotFound
    );
    crate::state::tests::create_file(&mut s, "/own", 1);
    assert_eq!(
        kind(link(&mut s, "/own", 0, "/own2")),
        ErrorKind::InvalidArgument
    );
    // A symbolic link, a FIFO: linked as themselves.
    let l = make(&mut s, "/d/l", NewNode::Symlink { target: "f".into() });
    link(&mut s, "/d/l", l.ino, "/d/l2").unwrap();
    let l2 = lookup(&s, "/d/l2").unwrap();
    assert_eq!((l2.ino, l2.kind, l2.nlink), (l.ino, NodeType::Symlink, 2));
    clean(&s);
}

#[test]
fn unlinking_any_name_leaves_the_others_and_the_last_frees_the_node() {
    let mut s = State::default();
    make(&mut s, "/d", NewNode::Directory);
    let f = written(&mut s, "/d/f");
    link(&mut s, "/d/f", f.ino, "/d/g").unwrap();
    link(&mut s, "/d/f", f.ino, "/h").unwrap();
    assert_eq!(lookup(&s, "/h").unwrap().nlink, 3);
    // The node's own name: it takes its oldest link's place, keeping its number.
    remove(&mut s, "/d/f");
    assert_eq!(
        kind(lookup(&s, "/d/f").map(|_| FileReply::Done)),
        ErrorKind::NotFound
    );
    let g = lookup(&s, "/d/g").unwrap();
    assert_eq!((g.ino, g.nlink, g.size, g.ctime), (f.ino, 2, 100, t(8000)));
    assert_eq!(
        s.lookup("/d/g").unwrap().id,
        f.ino,
        "the node is at /d/g now"
    );
    assert_eq!(map(&s, "/h").1, map(&s, "/d/g").1);
    clean(&s);
    // A link's entry.
    remove(&mut s, "/h");
    let g = lookup(&s, "/d/g").unwrap();
    assert_eq!(g.nlink, 1);
    assert_eq!(s.inodes.tally(LINKS_TALLY), [0, 0]);
    assert_eq!(s.inodes.tally(7), [100, 1]);
    clean(&s);
    // The last name: the node goes, and its segment's tally with it.
    remove(&mut s, "/d/g");
    assert!(s.inode(f.ino).is_none());
    assert_eq!(s.inodes.tally(7), [0, 0]);
    clean(&s);
    // `cairn fs rm` of a name is an unlink too.
    let f = written(&mut s, "/d/f");
    link(&mut s, "/d/f", f.ino, "/d/g").unwrap();
    s.apply(&Command::Delete {
        path: "/d/f".into(),
    })
    .unwrap();
    assert_eq!(lookup(&s, "/d/g").unwrap().ino, f.ino);
    clean(&s);
}

#[test]
fn renames_move_names_and_a_rename_between_names_of_one_node_does_nothing() {
    let mut s = State::default();
    make(&mut s, "/d", NewNode::Directory);
    let f = written(&mut s, "/d/f");
    let o = make(&mut s, "/d/o", NewNode::Regular);
    link(&mut s, "/d/f", f.ino, "/d/g").unwrap();
    let rename = |s: &mut State, from: &str, to: &str, flags: RenameFlags| {
        apply(
            s,
            FileOp::Rename {
                from: from.into(),
                ino: 0,
                to: to.into(),
                flags,
                now: t(9000),
                mount: String::new(),
            },
        )
    };
    // Names of one node: nothing happens (rename(2)).
    rename(&mut s, "/d/g", "/d/f", RenameFlags::default()).unwrap();
    assert_eq!(lookup(&s, "/d/g").unwrap().ino, f.ino);
    assert_eq!(lookup(&s, "/d/f").unwrap().nlink, 2);
    // A link's entry moves like any name.
    rename(&mut s, "/d/g", "/g2", RenameFlags::default()).unwrap();
    assert_eq!(lookup(&s, "/g2").unwrap().ino, f.ino);
    // Exchanged with another file.
    let exchange = RenameFlags {
        noreplace: false,
        exchange: true,
    };
    rename(&mut s, "/g2", "/d/o", exchange).unwrap();
    assert_eq!(lookup(&s, "/d/o").unwrap().ino, f.ino);
    assert_eq!(lookup(&s, "/g2").unwrap().ino, o.ino);
    clean(&s);
    // Another file over a name: that name goes, the node keeps the other.
    rename(&mut s, "/g2", "/d/o", RenameFlags::default()).unwrap();
    assert_eq!(lookup(&s, "/d/o").unwrap().ino, o.ino);
    assert_eq!(lookup(&s, "/d/f").unwrap().nlink, 1);
    clean(&s);
    // Over the node's own name while a link remains: the node moves to the link's place.
    link(&mut s, "/d/f", f.ino, "/k").unwrap();
    rename(&mut s, "/d/o", "/d/f", RenameFlags::default()).unwrap();
    assert_eq!(lookup(&s, "/d/f").unwrap().ino, o.ino);
    let k = lookup(&s, "/k").unwrap();
    assert_eq!((k.ino, k.nlink), (f.ino, 1));
    clean(&s);
}

#[test]
fn moves_refuse_to_carry_a_linked_node_away_from_its_other_names() {
    let mut s = State::default();
    make(&mut s, "/a", NewNode::Directory);
    make(&mut s, "/a/in", NewNode::Directory);
    make(&mut s, "/b", NewNode::Directory);
    let f = written(&mut s, "/a/f");
    // No links in the partition: nothing to look at.
    s.refuse_ties("/a", true).unwrap();
    link(&mut s, "/a/f", f.ino, "/a/in/g").unwrap();
    // Both names inside: /a may move, /a/in may not; nor may /a spread by hashing.
    s.refuse_ties("/a", false).unwrap();
    assert_eq!(
        s.refuse_ties("/a/in", false).unwrap_err().kind,
        ErrorKind::CrossDevice
    );
    assert_eq!(
        s.check_movable("/a/in").unwrap_err().kind,
        ErrorKind::CrossDevice
    );
    assert_eq!(
        s.refuse_ties("/a", true).unwrap_err().kind,
        ErrorKind::CrossDevice
    );
    s.refuse_ties("/b", false).unwrap();
    // A rename of either name to another partition is refused at its source.
    for path in ["/a/f", "/a/in/g"] {
        let r = s.apply(&Command::TxLockSource {
            txid: 1,
            path: path.into(),
        });
        assert_eq!(r.unwrap_err().kind, ErrorKind::CrossDevice, "{path}");
    }
    // A check finds a broken tie.
    let id = s.lookup("/a/in/g").unwrap().id;
    s.inodes
        .get_mut(&f.ino)
        .unwrap()
        .posix
        .as_mut()
        .unwrap()
        .links
        .retain(|l| *l != id);
    assert!(s.check().problems > 0);
}
