//! A new file held by the mount that made it until its first write commits (docs/files.md
//! "A close that does not wait").

use super::*;

fn held(s: &mut State, path: &str, holder: &str, at: u64) -> Attr {
    let made = FileOp::Make {
        path: path.into(),
        node: NewNode::Regular,
        mode: 0o644,
        uid: 1000,
        gid: 100,
        now: t(at),
        hold: holder.into(),
        mount: String::new(),
        ino: 0,
        reserve: 0,
    };
    match apply(s, made).unwrap() {
        FileReply::Attr(a) => a,
        other => panic!("{other:?}"),
    }
}

/// Whether `mount` may look `path` up, and map it, at `now_ms` (a refusal: lease-held).
trait Holds {
    fn check_hold(&self, path: &str, mount: &str, now_ms: u64) -> Result<(), MetaError>;
}

impl Holds for State {
    fn check_hold(&self, path: &str, mount: &str, now_ms: u64) -> Result<(), MetaError> {
        let lookup = FileQuery::Lookup {
            path: path.into(),
            mount: mount.into(),
        };
        let map = FileQuery::Map {
            path: path.into(),
            ino: 0,
            mount: mount.into(),
        };
        let (l, m) = (
            self.file_query_at(&lookup, Some(now_ms)),
            self.file_query_at(&map, Some(now_ms)),
        );
        let kind = |r: &Result<FileReply, MetaError>| r.as_ref().err().map(|e| e.kind);
        assert_eq!(kind(&l), kind(&m), "{path}: a lookup and a map agree");
        // Holds unchecked: never refused for one.
        assert_ne!(
            self.file_query(&lookup).err().map(|e| e.kind),
            Some(ErrorKind::LeaseHeld)
        );
        match l {
            Err(e) if e.kind == ErrorKind::LeaseHeld => Err(e),
            _ => Ok(()),
        }
    }
}

fn write(s: &mut State, path: &str, ino: u64, extents: Vec<Extent>, size: u64, at: u64) {
    let w = FileOp::Write {
        path: path.into(),
        ino,
        extents,
        size,
        then: None,
        now: t(at),
    };
    apply(s, w).unwrap();
}

#[test]
fn a_held_file_waits_for_other_mounts_until_its_first_write() {
    let mut s = State::default();
    make(&mut s, "/d", NewNode::Directory);
    let f = held(&mut s, "/d/f", "mount-a", 10_000);
    // Its maker reads it; another mount, or `cairn fs` (no mount), waits.
    s.check_hold("/d/f", "mount-a", 10_001).unwrap();
    for other in ["mount-b", ""] {
        let e = s.check_hold("/d/f", other, 10_001).unwrap_err();
        assert_eq!(e.kind, ErrorKind::LeaseHeld, "{e}");
    }
    // The first write ends the hold.
    write(
        &mut s,
        "/d/f",
        f.ino,
        vec![ext(0, 4096, 7, 0)],
        4096,
        10_002,
    );
    s.check_hold("/d/f", "mount-b", 10_003).unwrap();
    assert_eq!(map(&s, "/d/f").0.size, 4096);
    // A hold no write ends lapses (its mount died).
    held(&mut s, "/d/g", "mount-a", 20_000);
    let lapse = 20_000 + cairn_rpc::files::HOLD_MS;
    assert!(s.check_hold("/d/g", "mount-b", lapse - 1).is_err());
    s.check_hold("/d/g", "mount-b", lapse).unwrap();
    // Names that are no file of the service's, or none at all: nothing to wait for.
    s.check_hold("/d", "mount-b", 20_001).unwrap();
    s.check_hold("/d/none", "mount-b", 20_001).unwrap();
    // Only regular files are held (a directory made with a hold is not).
    let dir = FileOp::Make {
        path: "/d/sub".into(),
        node: NewNode::Directory,
        mode: 0o755,
        uid: 1000,
        gid: 100,
        now: t(20_000),
        hold: "mount-a".into(),
        mount: String::new(),
        ino: 0,
        reserve: 0,
    };
    apply(&mut s, dir).unwrap();
    s.check_hold("/d/sub", "mount-b", 20_001).unwrap();
}

#[test]
fn an_empty_write_ends_the_hold_and_keeps_the_times() {
    let mut s = State::default();
    make(&mut s, "/d", NewNode::Directory);
    let f = held(&mut s, "/d/f", "mount-a", 10_000);
    // `touch`: a close with no bytes commits nothing but the hold's end.
    write(&mut s, "/d/f", f.ino, Vec::new(), 0, 12_345);
    s.check_hold("/d/f", "mount-b", 12_346).unwrap();
    let (a, data) = map(&s, "/d/f");
    assert_eq!((a.size, a.mtime, a.ctime), (0, t(10_000), t(10_000)));
    assert_eq!(data, Data::Extents(Vec::new()));
    // An empty write past the size still extends it (and is a change).
    write(&mut s, "/d/f", f.ino, Vec::new(), 100, 13_000);
    let (a, _) = map(&s, "/d/f");
    assert_eq!((a.size, a.mtime), (100, t(13_000)));
}

#[test]
fn a_hard_linked_held_file_is_held_by_every_name() {
    let mut s = State::default();
    make(&mut s, "/d", NewNode::Directory);
    let f = held(&mut s, "/d/f", "mount-a", 10_000);
    let link = FileOp::Link {
        from: "/d/f".into(),
        ino: f.ino,
        to: "/d/g".into(),
        now: t(10_001),
        mount: String::new(),
    };
    apply(&mut s, link).unwrap();
    assert!(s.check_hold("/d/g", "mount-b", 10_002).is_err());
    write(&mut s, "/d/g", f.ino, vec![ext(0, 10, 7, 0)], 10, 10_003);
    s.check_hold("/d/f", "mount-b", 10_004).unwrap();
}

#[test]
fn a_slow_flush_renews_its_hold_and_no_one_else_can() {
    let mut s = State::default();
    make(&mut s, "/d", NewNode::Directory);
    let f = held(&mut s, "/d/f", "mount-a", 10_000);
    let hold = cairn_rpc::files::HOLD_MS;
    // Another mount's renewal is nothing.
    let op = FileOp::Hold {
        path: "/d/f".into(),
        ino: f.ino,
        holder: "mount-b".into(),
        now: t(10_000 + hold - 100),
    };
    apply(&mut s, op).unwrap();
    s.check_hold("/d/f", "mount-b", 10_000 + hold).unwrap();
    // Its holder's renewal, before the lapse, holds it for as long again.
    let f2 = held(&mut s, "/d/f2", "mount-a", 20_000);
    let op = FileOp::Hold {
        path: "/d/f2".into(),
        ino: f2.ino,
        holder: "mount-a".into(),
        now: t(20_000 + hold - 100),
    };
    apply(&mut s, op).unwrap();
    assert!(s.check_hold("/d/f2", "mount-b", 20_000 + hold + 1).is_err());
    s.check_hold("/d/f2", "mount-b", 20_000 + 2 * hold - 100)
        .unwrap();
}
