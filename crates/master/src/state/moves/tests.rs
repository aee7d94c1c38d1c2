//! Moves of subtrees (moves.rs): the commands applied to states in memory as the driver
//! runs them, out of the root and out of other partitions.

use super::*;
use crate::state::tests::{repaired, unavailable};
use crate::state::{ChunkUpdate, Kind};
use crate::view::{StateView, View};
use std::collections::BTreeMap;

fn mkdir(st: &mut State, path: &str, policy: Option<Policy>) -> Response {
    st.apply(&Command::Mkdir {
        path: path.into(),
        parents: true,
        now_ms: 1,
        policy,
        mode: None,
    })
}

fn create(st: &mut State, path: &str) -> Response {
    let dir = &path[..path.rfind('/').unwrap()];
    if !dir.is_empty() && st.lookup(dir).is_err() {
        mkdir(st, dir, None).unwrap();
    }
    crate::state::tests::create(st, path, Some("w"), 1)
}

/// A subtree below a partition's top moves out of that partition into another: the
/// source freezes and gives the rows away, chunks allocated elsewhere (the root's, here:
/// /a moved from the root) are forwarded by their allocator before, the source refuses
/// the subtree's paths afterwards and the root's map sends them to the new partition.
#[test]
fn a_subtree_moves_out_of_a_partition_other_than_the_root() {
    let (mut root, mut p1) = setup(20);
    root.apply(&Command::BeginMove {
        path: "/a".into(),
        to: 1,
        now_ms: 5,
    })
    .unwrap();
    copy_and_finish(&mut root, &mut p1);
    // A file p1 allocates itself, in the subtree that moves on.
    create(&mut p1, "/a/x3/own").unwrap();
    let own_chunk = p1.lookup("/a/x3/own").unwrap().file().unwrap().chunks[0].id;
    let root_chunk = p1.lookup("/a/x3/f3").unwrap().file().unwrap().chunks[0].id;
    assert_eq!(partition_of(own_chunk), 1);
    assert_eq!(partition_of(root_chunk), ROOT_PARTITION);
    root.apply(&Command::AddPartition {
        members: vec![1],
        now_ms: 1,
    })
    .unwrap();
    let mut p2 = crate::state::tests::partition_state(2, "/a/x3");
    // Its top, and a path outside p1, cannot move from p1.
    for bad in ["/a", "/b/f"] {
        assert!(
            p1.apply(&Command::BeginMove {
                path: bad.into(),
                to: 2,
                now_ms: 6
            })
            .is_err(),
            "{bad}"
        );
    }
    p1.apply(&Command::BeginMove {
        path: "/a/x3".into(),
        to: 2,
        now_ms: 6,
    })
    .unwrap();
    assert!(unavailable(crate::state::tests::create(
        &mut p1,
        "/a/x3/late",
        Some("w"),
        1
    )));
    create(&mut p1, "/a/x4/fine").unwrap();
    let mut cursor = RowsCursor::new(&p1, "/a/x3").unwrap();
    let mut foreign = Vec::new();
    while let Some((inodes, policies)) = p1.rows_batch(&mut cursor) {
        for i in &inodes {
            foreign.extend(
                i.file()
                    .into_iter()
                    .flat_map(|f| f.chunks.iter().map(|c| c.id))
                    .filter(|c| partition_of(*c) != 1),
            );
        }
        p2.apply(&Command::LoadRows {
            top: "/a/x3".into(),
            inodes,
            policies,
        })
        .unwrap();
    }
    p2.apply(&Command::SealLoad {
        top: "/a/x3".into(),
    })
    .unwrap();
    assert!(foreign.contains(&root_chunk) && !foreign.contains(&own_chunk));
    root.apply(&Command::TxForward {
        chunks: foreign.clone(),
        to: 2,
    })
    .unwrap();
    p1.apply(&Command::FinishMove {
        path: "/a/x3".into(),
        to: 2,
    })
    .unwrap();
    // Between the source's finish and the root's map: the source refuses, retried.
    assert!(unavailable(crate::state::tests::create(
        &mut p1,
        "/a/x3/late",
        Some("w"),
        1
    )));
    assert!(unavailable(
        p1.lookup("/a/x3/f3")
            .map(|_| crate::state::Reply::default())
    ));
    // The map: only a subtree routed to the source, and only once.
    assert!(
        root.apply(&Command::DelegateSubtree {
            path: "/b".into(),
            from: 1,
            to: 2
        })
        .is_err()
    );
    for _ in 0..2 {
        root.apply(&Command::DelegateSubtree {
            path: "/a/x3".into(),
            from: 1,
            to: 2,
        })
        .unwrap();
    }
    assert_eq!(root.route("/a/x3/f3").partition, 2);
    assert_eq!(root.route("/a/x4/fine").partition, 1);
    assert_eq!(
        p2.lookup("/a/x3/own").unwrap().file().unwrap().chunks[0].id,
        own_chunk
    );
    create(&mut p2, "/a/x3/new").unwrap();
    // A directory above the subtree p1 gave away cannot be renamed in p1.
    assert!(
        p1.apply(&Command::Rename {
            from: "/a/x3".into(),
            to: "/a/y".into(),
            now_ms: 7
        })
        .is_err()
    );
    let view = View {
        root: &root,
        parts: BTreeMap::from([(1, &p1), (2, &p2)]),
    };
    assert_eq!(view.chunk(own_chunk).unwrap().0.name, "own");
    assert_eq!(view.chunk(root_chunk).unwrap().0.name, "f3");
    for st in [&root, &p1, &p2] {
        let r = st.check();
        assert_eq!(r.problems, 0, "{:?}", r.listed);
    }
}

/// The root with partition 1 and files in /a (some in a directory with a policy) and /b;
/// partition 1 initialized to hold /a.
fn setup(files: usize) -> (State, State) {
    let mut root = State::default();
    root.apply(&Command::AddPartition {
        members: vec![1],
        now_ms: 1,
    })
    .unwrap();
    let ec = Policy {
        replicas: 2,
        compression: true,
        min_copy: 2,
        ec: None,
    };
    mkdir(&mut root, "/a/d", Some(ec)).unwrap();
    for i in 0..files {
        create(&mut root, &format!("/a/x{}/f{i}", i % 7)).unwrap();
    }
    create(&mut root, "/a/d/g").unwrap();
    create(&mut root, "/a/top").unwrap();
    create(&mut root, "/b/f").unwrap();
    (root, crate::state::tests::partition_state(1, "/a"))
}

/// Steps 2 and 3 as the driver runs them; the number of `LoadRows` batches.
fn copy_and_finish(root: &mut State, p1: &mut State) -> usize {
    let mut cursor = RowsCursor::new(root, "/a").unwrap();
    let mut batches = 0;
    while let Some((inodes, policies)) = root.rows_batch(&mut cursor) {
        batches += 1;
        let load = Command::LoadRows {
            top: "/a".into(),
            inodes,
            policies,
        };
        p1.apply(&load).unwrap();
        // A batch loaded twice changes nothing.
        p1.apply(&load).unwrap();
    }
    p1.apply(&Command::SealLoad { top: "/a".into() }).unwrap();
    root.apply(&Command::FinishMove {
        path: "/a".into(),
        to: 1,
    })
    .unwrap();
    batches
}

#[test]
fn a_populated_subtree_moves_with_its_ids_and_its_chunks_forwarded() {
    let (mut root, mut p1) = setup(20);
    let f = root.lookup("/a/x3/f3").unwrap();
    let chunk = f.file().unwrap().chunks[0].id;
    let (files_before, dirs_before, _, _) = root.totals();
    root.apply(&Command::BeginMove {
        path: "/a".into(),
        to: 1,
        now_ms: 3,
    })
    .unwrap();
    // Frozen: every write at or below /a waits; reads and writes elsewhere go on.
    assert!(unavailable(create(&mut root, "/a/new")));
    assert!(unavailable(root.apply(&Command::Delete {
        path: "/a/top".into()
    })));
    assert!(unavailable(root.apply(&Command::Rename {
        from: "/b/f".into(),
        to: "/a/f".into(),
        now_ms: 4
    })));
    assert!(unavailable(root.apply(&Command::Commit {
        path: "/a/x3/f3".into(),
        holder: "w".into(),
        now_ms: 4,
        updates: vec![ChunkUpdate {
            chunk_id: chunk,
            length: 10,
            sealed: false
        }],
        trim: false,
        release: false,
        seal: false,
        lease_until_ms: 0,
        drops: vec![],
        remove: vec![],
    })));
    assert!(unavailable(root.apply(&repaired(chunk))));
    // Renaming a directory above it is refused outright, as for any partition's subtree.
    assert!(mkdir(&mut root, "/up/a2", None).is_ok());
    assert!(
        root.apply(&Command::Rename {
            from: "/a".into(),
            to: "/c".into(),
            now_ms: 4
        })
        .is_err()
    );
    assert!(root.lookup("/a/x3/f3").is_ok());
    create(&mut root, "/b/g").unwrap();
    // One move at a time; the same one again is a no-op.
    root.apply(&Command::AddPartition {
        members: vec![1],
        now_ms: 1,
    })
    .unwrap();
    assert!(unavailable(root.apply(&Command::BeginMove {
        path: "/b".into(),
        to: 2,
        now_ms: 3
    })));
    root.apply(&Command::BeginMove {
        path: "/a".into(),
        to: 1,
        now_ms: 5,
    })
    .unwrap();

    copy_and_finish(&mut root, &mut p1);
    // A late load (a driver that lost the root's leadership) is refused.
    assert!(
        p1.apply(&Command::LoadRows {
            top: "/a".into(),
            inodes: vec![(*f).clone()],
            policies: vec![],
        })
        .is_err()
    );
    assert!(root.moving().is_none());
    assert_eq!(root.route("/a/x3/f3").partition, 1);
    assert!(unavailable(
        root.lookup("/a/x3/f3").map(|_| Default::default())
    ));
    let moved = p1.lookup("/a/x3/f3").unwrap();
    assert_eq!((moved.id, moved.file()), (f.id, f.file()));
    // Counts moved: /a's files and its directories below the top.
    let (files, dirs, _, _) = p1.totals();
    let (root_files, root_dirs, _, _) = root.totals();
    assert_eq!(files, 22);
    assert_eq!(
        root_files + files,
        files_before + 1,
        "/b/g was created meanwhile"
    );
    assert_eq!(
        root_dirs + dirs,
        dirs_before + 2 + 1,
        "/up, /up/a2 and p1's top"
    );
    // The policy went with its directory.
    assert_eq!(p1.inherited_policy("/a/d/new").unwrap().replicas, 2);
    // Chunks: forwarded by the root, owned by the partition.
    assert_eq!(root.chunk_partition(chunk), 1);
    assert!(root.chunk(chunk).is_none() && p1.chunk(chunk).is_some());
    let view = View {
        root: &root,
        parts: BTreeMap::from([(1, &p1)]),
    };
    assert!(view.knows(chunk));
    assert_eq!(view.chunk(chunk).unwrap().0.id, f.id);
    assert!(chunk < view.next_chunk_of(chunk));
    let mut seen = 0;
    let mut cursor = None;
    loop {
        let (got, next) = view.inodes_after(cursor, 5);
        seen += got
            .iter()
            .filter(|i| matches!(i.kind, Kind::File(_)))
            .count();
        match next {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, 24, "the scans' walk meets the moved files");
    let without = View {
        root: &root,
        parts: BTreeMap::new(),
    };
    assert!(
        !without.knows(chunk),
        "outside the view: kept, not an orphan"
    );
    // Both states check clean.
    for st in [&root, &p1] {
        let r = st.check();
        assert_eq!(r.problems, 0, "{:?}", r.listed);
    }
    // The files go on in the partition.
    p1.apply(&Command::Delete {
        path: "/a/top".into(),
    })
    .unwrap();
    create(&mut p1, "/a/x3/new").unwrap();
    assert_eq!(p1.check().problems, 0);
}

#[test]
fn a_large_subtree_loads_in_bounded_batches() {
    let (mut root, mut p1) = setup(1500);
    // Some files a mount wrote: their extents in segment 9 move with them, and so do the
    // segments' tallies (checked by `check` below too).
    for i in [3usize, 700, 1400] {
        let path = format!("/a/x{}/f{i}", i % 7);
        let ino = root.lookup(&path).unwrap().id;
        let write = cairn_rpc::files::FileOp::Write {
            path,
            ino,
            extents: vec![cairn_rpc::files::Extent {
                offset: 0,
                len: 10 + i as u64,
                seg: 9,
                seg_offset: 0,
            }],
            size: 0,
            then: None,
            now: cairn_rpc::files::Time::from_ms(2),
        };
        root.apply(&Command::Files(Box::new(write))).unwrap();
    }
    assert_eq!(root.inodes.tally(9), [2133, 3]);
    root.apply(&Command::BeginMove {
        path: "/a".into(),
        to: 1,
        now_ms: 3,
    })
    .unwrap();
    let batches = copy_and_finish(&mut root, &mut p1);
    assert!(batches > 1, "{batches} batch(es)");
    assert_eq!(p1.totals().0, 1502);
    assert_eq!(p1.inodes.tally(9), [2133, 3]);
    // Each load counts (twice here: every batch is loaded again, which changes nothing else).
    assert_eq!(
        p1.segment_use(&[9]).0,
        2 * batches as u64,
        "each load is an arrival"
    );
    assert_eq!(root.inodes.tally(9), [0, 0], "the subtree left the root");
    assert_eq!(p1.check().problems, 0, "{:?}", p1.check().listed);
    assert_eq!(root.check().problems, 0, "{:?}", root.check().listed);
}

#[test]
fn loads_are_checked() {
    let (root, mut p1) = setup(2);
    let f = root.lookup("/a/x1/f1").unwrap();
    let load = |inodes: Vec<Inode>, policies| Command::LoadRows {
        top: "/a".into(),
        inodes,
        policies,
    };
    // Its parent (/a/x1) is not loaded.
    assert!(p1.apply(&load(vec![(*f).clone()], vec![])).is_err());
    // Another subtree's rows.
    let mut other = load(vec![], vec![]);
    if let Command::LoadRows { top, .. } = &mut other {
        *top = "/b".into();
    }
    assert!(p1.apply(&other).is_err());
    // An id of the partition's own range that it never allocated.
    let mut own = (*root.lookup("/a/x1").unwrap()).clone();
    own.id = p1.next_inode_id();
    own.parent = ROOT;
    assert!(p1.apply(&load(vec![own], vec![])).is_err());
    // A policy for a file.
    assert!(
        p1.apply(&load(vec![], vec![(f.id, Policy::default())]))
            .is_err()
    );
    assert_eq!(p1.totals(), (0, 1, 0, 0), "nothing loaded");
}
