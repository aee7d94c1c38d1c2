//! Renames across partitions (txn.rs): the two-phase commit applied to states in
//! memory, step by step, as the driver runs it; and the encodings of its commands.

use super::*;
use crate::state::Command;
use crate::state::tests::{repaired, unavailable};
use crate::view::{StateView, View};

fn create(st: &mut State, path: &str) -> InodeId {
    crate::state::tests::create_file(st, path, 2).id
}

fn setup() -> (State, State) {
    let mut root = State::default();
    root.apply(&Command::AddPartition {
        members: vec![1],
        now_ms: 1,
    })
    .unwrap();
    let p1 = crate::state::tests::partition_state(1, "/p");
    root.apply(&Command::AssignSubtree {
        path: "/p".into(),
        partition: 1,
        owner: String::new(),
        mode: 0o755,
        now_ms: 1,
    })
    .unwrap();
    (root, p1)
}

/// What the driver does for a rename from `src` to `dst` (states by partition number;
/// the root is `states[0]`), up to and including the decision. `None`: a prepare failed.
fn prepare(
    states: &mut [&mut State],
    from: &str,
    to: &str,
    src: usize,
    dst: usize,
) -> (u64, Option<Inode>) {
    let txid = states[0]
        .apply(&Command::TxBegin {
            from: from.into(),
            to: to.into(),
            src: src as u32,
            dst: dst as u32,
            now_ms: 1,
        })
        .unwrap()
        .txid
        .unwrap();
    let lock = states[src].apply(&Command::TxLockSource {
        txid,
        path: from.into(),
    });
    let record = match lock {
        Ok(r) => {
            let d = states[dst].apply(&Command::TxLockDest {
                txid,
                path: to.into(),
                dir: false,
            });
            d.ok().and(r.inode)
        }
        Err(_) => None,
    };
    let decided = states[0]
        .apply(&Command::TxDecide { txid, record })
        .unwrap()
        .inode;
    (txid, decided)
}

fn finish(states: &mut [&mut State], txid: u64, decided: Option<Inode>, src: usize, dst: usize) {
    match decided {
        Some(inode) => {
            states[dst]
                .apply(&Command::TxInstall {
                    txid,
                    inode: inode.clone(),
                })
                .unwrap();
            let chunks: Vec<u64> = inode.file().unwrap().chunks.iter().map(|c| c.id).collect();
            for st in states.iter_mut() {
                st.apply(&Command::TxForward {
                    chunks: chunks.clone(),
                    to: dst as u32,
                })
                .unwrap();
            }
            states[src].apply(&Command::TxRemove { txid }).unwrap();
            states[dst].apply(&Command::TxUnlock { txid }).unwrap();
        }
        None => {
            states[src].apply(&Command::TxUnlock { txid }).unwrap();
            states[dst].apply(&Command::TxUnlock { txid }).unwrap();
        }
    }
    states[0].apply(&Command::TxEnd { txid }).unwrap();
}

/// A whole rename from partition `src` to `dst` (0: the root, 1: `p1`); what was decided.
fn rename(
    root: &mut State,
    p1: &mut State,
    from: &str,
    to: &str,
    src: usize,
    dst: usize,
) -> Option<Inode> {
    let mut states = [root, p1];
    let (txid, decided) = prepare(&mut states, from, to, src, dst);
    finish(&mut states, txid, decided.clone(), src, dst);
    decided
}

fn clean(states: &[&State]) {
    for st in states {
        let r = st.check();
        assert_eq!(r.problems, 0, "{:?}", r.listed);
        assert!(st.locks().is_empty());
    }
    assert!(states[0].txns().open.is_empty());
}

#[test]
fn a_file_renamed_across_partitions_keeps_its_ids_and_its_chunks_resolve() {
    let (mut root, mut p1) = setup();
    let f = create(&mut root, "/a/f");
    let g = create(&mut p1, "/p/x/g");
    let chunk = root.inode(f).unwrap().file().unwrap().chunks[0].id;
    // Root → partition 1, with the locks seen while it is prepared.
    let (txid, decided) = {
        let mut states = [&mut root, &mut p1];
        prepare(&mut states, "/a/f", "/p/x/f", 0, 1)
    };
    assert!(decided.is_some());
    assert!(unavailable(root.apply(&Command::Delete {
        path: "/a/f".into()
    })));
    assert!(unavailable(root.apply(&repaired(chunk))));
    assert!(unavailable(p1.apply(&Command::Mkdir {
        path: "/p/x/f".into(),
        parents: false,
        now_ms: 2,
        policy: None,
        mode: None,
    })));
    assert!(root.lookup("/a/f").is_ok(), "reads go on");
    create(&mut root, "/a/other");
    {
        let mut states = [&mut root, &mut p1];
        finish(&mut states, txid, decided, 0, 1);
    }
    assert!(root.lookup("/a/f").is_err());
    let moved = p1.lookup("/p/x/f").unwrap();
    assert_eq!(moved.id, f);
    assert_eq!(root.chunk_partition(chunk), 1);
    let view = View {
        root: &root,
        parts: std::collections::BTreeMap::from([(1, &p1)]),
    };
    assert_eq!(view.chunk(chunk).unwrap().0.id, f);
    assert!(view.knows(chunk));
    clean(&[&root, &p1]);

    // Back to the root elsewhere: the root's forward goes (the chunk is home again).
    root.apply(&Command::Mkdir {
        path: "/b".into(),
        parents: false,
        now_ms: 1,
        policy: None,
        mode: None,
    })
    .unwrap();
    rename(&mut root, &mut p1, "/p/x/f", "/b/f", 1, 0);
    assert_eq!(root.lookup("/b/f").unwrap().id, f);
    assert_eq!(root.chunk_partition(chunk), 0);
    assert!(root.forwards().next().is_none());
    clean(&[&root, &p1]);

    // A file the partition allocated moves to the root: the partition forwards it.
    let pchunk = p1.inode(g).unwrap().file().unwrap().chunks[0].id;
    rename(&mut root, &mut p1, "/p/x/g", "/g", 1, 0);
    assert_eq!(p1.chunk_partition(pchunk), 0);
    let view = View {
        root: &root,
        parts: std::collections::BTreeMap::from([(1, &p1)]),
    };
    assert_eq!(view.chunk(pchunk).unwrap().0.id, g);
    let alone = View {
        root: &root,
        parts: std::collections::BTreeMap::new(),
    };
    assert!(!alone.knows(pchunk), "its forward is not in the view: kept");
    clean(&[&root, &p1]);
}

#[test]
fn a_refused_prepare_aborts_and_unlocks_and_a_decision_stands() {
    let (mut root, mut p1) = setup();
    let f = create(&mut root, "/a/f");
    p1.apply(&Command::Mkdir {
        path: "/p/dir".into(),
        parents: true,
        now_ms: 1,
        policy: None,
        mode: None,
    })
    .unwrap();
    // The destination is a directory: aborted, the source unlocked and unchanged.
    let (txid, decided) = {
        let mut states = [&mut root, &mut p1];
        prepare(&mut states, "/a/f", "/p/dir", 0, 1)
    };
    assert!(decided.is_none());
    assert!(!root.locks().is_empty(), "the source was locked");
    {
        let mut states = [&mut root, &mut p1];
        finish(&mut states, txid, decided, 0, 1);
    }
    assert_eq!(root.lookup("/a/f").unwrap().id, f);
    clean(&[&root, &p1]);
    // A directory holding another partition's subtree does not move across partitions.
    let (txid, decided) = {
        let mut states = [&mut root, &mut p1];
        prepare(&mut states, "/", "/p/a", 0, 1)
    };
    assert!(decided.is_none());
    {
        let mut states = [&mut root, &mut p1];
        finish(&mut states, txid, decided, 0, 1);
    }
    // An abort decided first stands against a later commit.
    let txid = root
        .apply(&Command::TxBegin {
            from: "/a/f".into(),
            to: "/p/f".into(),
            src: 0,
            dst: 1,
            now_ms: 1,
        })
        .unwrap()
        .txid
        .unwrap();
    root.apply(&Command::TxDecide { txid, record: None })
        .unwrap();
    let record = root.inode(f).map(|i| (*i).clone());
    let r = root.apply(&Command::TxDecide { txid, record }).unwrap();
    assert!(r.inode.is_none());
    root.apply(&Command::TxEnd { txid }).unwrap();
    clean(&[&root, &p1]);
}

/// A move waits for renames holding paths below it (their install would land behind the
/// copy: the long nemesis lost a file that way), and a frozen subtree takes no new lock.
#[test]
fn a_move_and_a_rename_across_partitions_exclude_each_other() {
    let (mut root, mut p1) = setup();
    root.apply(&Command::AddPartition {
        members: vec![1],
        now_ms: 1,
    })
    .unwrap();
    create(&mut root, "/m/f");
    create(&mut p1, "/p/g");
    let (txid, decided) = {
        let mut states = [&mut root, &mut p1];
        prepare(&mut states, "/p/g", "/m/g", 1, 0)
    };
    let begin = Command::BeginMove {
        path: "/m".into(),
        to: 2,
        now_ms: 2,
    };
    assert!(unavailable(root.apply(&begin)));
    {
        let mut states = [&mut root, &mut p1];
        finish(&mut states, txid, decided, 1, 0);
    }
    root.apply(&begin).unwrap();
    let txid = root
        .apply(&Command::TxBegin {
            from: "/p/x".into(),
            to: "/m/x".into(),
            src: 1,
            dst: 0,
            now_ms: 3,
        })
        .unwrap()
        .txid
        .unwrap();
    assert!(unavailable(root.apply(&Command::TxLockDest {
        txid,
        path: "/m/x".into(),
        dir: false,
    })));
}

/// What the driver does for the rename of directory `from` (in `states[src]`) to `to`
/// (in `states[dst]`), `batches` at a time before stopping (`None`: to the end). The
/// transaction id.
fn rename_dir(
    states: &mut [&mut State],
    from: &str,
    to: &str,
    src: usize,
    dst: usize,
) -> Result<(), MetaError> {
    let txid = states[0]
        .apply(&Command::TxBegin {
            from: from.into(),
            to: to.into(),
            src: src as u32,
            dst: dst as u32,
            now_ms: 1,
        })?
        .txid
        .unwrap();
    let record = states[src]
        .apply(&Command::TxLockSource {
            txid,
            path: from.into(),
        })?
        .inode
        .unwrap();
    states[dst].apply(&Command::TxLockDest {
        txid,
        path: to.into(),
        dir: true,
    })?;
    let record = states[0]
        .apply(&Command::TxDecide {
            txid,
            record: Some(record),
        })?
        .inode
        .unwrap();
    let mut cursor = super::super::moves::RowsCursor::for_rename(states[src], from)?;
    let mut chunks = Vec::new();
    let mut first = true;
    loop {
        let batch = states[src].rows_batch(&mut cursor);
        let Some((inodes, mut policies)) = batch.or_else(|| first.then(Default::default)) else {
            break;
        };
        if first {
            policies.extend(states[src].dir_policy(record.id).map(|p| (record.id, p)));
            first = false;
        }
        for i in &inodes {
            chunks.extend(i.file().iter().flat_map(|f| f.chunks.iter().map(|c| c.id)));
        }
        states[dst].apply(&Command::TxLoad {
            txid,
            top: record.id,
            inodes,
            policies,
        })?;
    }
    states[dst].apply(&Command::TxInstall {
        txid,
        inode: record.clone(),
    })?;
    // Loading is closed once installed.
    assert!(
        states[dst]
            .apply(&Command::TxLoad {
                txid,
                top: record.id,
                inodes: vec![],
                policies: vec![],
            })
            .is_err()
    );
    for st in states.iter_mut() {
        st.apply(&Command::TxForward {
            chunks: chunks.clone(),
            to: dst as u32,
        })?;
    }
    states[src].apply(&Command::TxRemove { txid })?;
    states[dst].apply(&Command::TxUnlock { txid })?;
    states[0].apply(&Command::TxEnd { txid })?;
    Ok(())
}

#[test]
fn a_directory_renamed_across_partitions_moves_whole_with_its_ids_policies_and_chunks() {
    let (mut root, mut p1) = setup();
    let ec = crate::state::Policy {
        replicas: 2,
        compression: true,
        min_copy: 0,
        ec: None,
    };
    root.apply(&Command::Mkdir {
        path: "/a/d/sub".into(),
        parents: true,
        now_ms: 1,
        policy: Some(ec),
        mode: None,
    })
    .unwrap();
    let f = create(&mut root, "/a/d/f");
    let g = create(&mut root, "/a/d/sub/g");
    // A file partition 1 allocated, renamed into the directory before.
    let h = create(&mut p1, "/p/h");
    rename(&mut root, &mut p1, "/p/h", "/a/d/h", 1, 0);
    let d = root.lookup("/a/d").unwrap().id;
    let sub = root.lookup("/a/d/sub").unwrap().id;
    let chunk = |st: &State, id| st.inode(id).unwrap().file().unwrap().chunks[0].id;
    let (cf, cg, ch) = (chunk(&root, f), chunk(&root, g), chunk(&root, h));

    // Locked: writes below the directory and repairs of its files' chunks wait.
    let txid = root
        .apply(&Command::TxBegin {
            from: "/a/d".into(),
            to: "/p/e".into(),
            src: 0,
            dst: 1,
            now_ms: 1,
        })
        .unwrap()
        .txid
        .unwrap();
    root.apply(&Command::TxLockSource {
        txid,
        path: "/a/d".into(),
    })
    .unwrap();
    assert!(unavailable(root.apply(&repaired(cg))));
    assert!(unavailable(crate::state::tests::create(
        &mut root,
        "/a/d/sub/new",
        None,
        1
    )));
    root.apply(&Command::AddPartition {
        members: vec![1],
        now_ms: 1,
    })
    .unwrap();
    assert!(unavailable(root.apply(&Command::BeginMove {
        path: "/a/d/sub".into(),
        to: 2,
        now_ms: 2,
    })));
    // An existing destination is refused: the rename aborts and unlocks.
    create(&mut p1, "/p/taken");
    assert_eq!(
        p1.apply(&Command::TxLockDest {
            txid,
            path: "/p/taken".into(),
            dir: true,
        })
        .unwrap_err()
        .kind,
        ErrorKind::AlreadyExists
    );
    root.apply(&Command::TxDecide { txid, record: None })
        .unwrap();
    root.apply(&Command::TxUnlock { txid }).unwrap();
    root.apply(&Command::TxEnd { txid }).unwrap();
    clean(&[&root, &p1]);

    {
        let mut states = [&mut root, &mut p1];
        rename_dir(&mut states, "/a/d", "/p/e", 0, 1).unwrap();
    }
    assert!(root.lookup("/a/d").is_err());
    assert_eq!(p1.lookup("/p/e").unwrap().id, d);
    assert_eq!(p1.lookup("/p/e/sub").unwrap().id, sub);
    assert_eq!(p1.lookup("/p/e/f").unwrap().id, f);
    assert_eq!(p1.lookup("/p/e/sub/g").unwrap().id, g);
    assert_eq!(p1.lookup("/p/e/h").unwrap().id, h);
    assert_eq!(p1.dir_policy(sub), Some(ec), "policies go along");
    assert_eq!(root.chunk_partition(cf), 1);
    assert_eq!(
        p1.chunk_partition(ch),
        1,
        "partition 1's own chunk came home"
    );
    let view = View {
        root: &root,
        parts: std::collections::BTreeMap::from([(1, &p1)]),
    };
    for (c, owner) in [(cf, f), (cg, g), (ch, h)] {
        assert_eq!(view.chunk(c).unwrap().0.id, owner);
    }
    clean(&[&root, &p1]);
    // New files below it inherit the moved policy where they are now.
    assert_eq!(p1.inherited_policy("/p/e/sub/new"), Some(ec));
    let new = create(&mut p1, "/p/e/sub/new");

    // And back to the root.
    {
        let mut states = [&mut root, &mut p1];
        rename_dir(&mut states, "/p/e", "/back", 1, 0).unwrap();
    }
    assert_eq!(root.lookup("/back/sub/new").unwrap().id, new);
    assert!(p1.lookup("/p/e").is_err());
    clean(&[&root, &p1]);
}

#[test]
fn a_rename_across_partitions_replaces_a_file() {
    let (mut root, mut p1) = setup();
    let f = create(&mut root, "/a/f");
    let old = create(&mut p1, "/p/f");
    let old_chunk = p1.inode(old).unwrap().file().unwrap().chunks[0].id;
    rename(&mut root, &mut p1, "/a/f", "/p/f", 0, 1);
    assert_eq!(p1.lookup("/p/f").unwrap().id, f);
    assert!(p1.inode(old).is_none());
    assert!(
        p1.chunk(old_chunk).is_none(),
        "the replaced file's chunks are orphans"
    );
    clean(&[&root, &p1]);
}

/// Nemesis seed 56: a rename into partition 1 installed its file, then its driver
/// stalled before the forwards; a move of the file's directory out of partition 1 began,
/// forwarded the chunk to the new partition, and the rename's takeover then forwarded it
/// back to partition 1, which no longer held it: the replicas were deleted as orphans.
/// The destination's lock now stays until the forwards and the removal are written, so
/// the move waits for them.
#[test]
fn a_move_waits_for_a_rename_installed_into_it_to_finish() {
    let (mut root, mut p1) = setup();
    let f = create(&mut root, "/a/f");
    create(&mut p1, "/p/x/g");
    let chunk = root.inode(f).unwrap().file().unwrap().chunks[0].id;
    let (txid, decided) = {
        let mut states = [&mut root, &mut p1];
        prepare(&mut states, "/a/f", "/p/x/f", 0, 1)
    };
    let inode = decided.unwrap();
    let install = Command::TxInstall {
        txid,
        inode: inode.clone(),
    };
    p1.apply(&install).unwrap();
    // Installed twice (a takeover) changes nothing.
    p1.apply(&install).unwrap();
    assert_eq!(p1.lookup("/p/x/f").unwrap().id, f);
    let begin = Command::BeginMove {
        path: "/p/x".into(),
        to: 2,
        now_ms: 3,
    };
    assert!(
        unavailable(p1.apply(&begin)),
        "the installed file is still locked"
    );
    assert!(unavailable(crate::state::tests::create(
        &mut p1,
        "/p/x/f",
        Some("w"),
        1
    )));
    root.apply(&Command::TxForward {
        chunks: vec![chunk],
        to: 1,
    })
    .unwrap();
    root.apply(&Command::TxRemove { txid }).unwrap();
    p1.apply(&Command::TxUnlock { txid }).unwrap();
    root.apply(&Command::TxEnd { txid }).unwrap();
    p1.apply(&begin).unwrap();
    assert_eq!(root.chunk_partition(chunk), 1);
    clean(&[&root]);
}

/// A file renamed from a partition into the root keeps its chunks' forwards in the
/// partition that allocated them; when the root's directory holding it is then split
/// into another partition, those forwards must follow (else the chunks resolve to the
/// root, which no longer has them, and their replicas are deleted as orphans).
#[test]
fn a_split_carries_the_forwards_of_chunks_renamed_in_from_other_partitions() {
    let (mut root, mut p1) = setup();
    let g = create(&mut p1, "/p/g");
    let pchunk = p1.inode(g).unwrap().file().unwrap().chunks[0].id;
    create(&mut root, "/b/own");
    rename(&mut root, &mut p1, "/p/g", "/b/g", 1, 0);
    assert_eq!(p1.chunk_partition(pchunk), 0);
    // Split /b into partition 2, as the driver does.
    root.apply(&Command::AddPartition {
        members: vec![1],
        now_ms: 1,
    })
    .unwrap();
    let mut p2 = crate::state::tests::partition_state(2, "/b");
    root.apply(&Command::BeginMove {
        path: "/b".into(),
        to: 2,
        now_ms: 2,
    })
    .unwrap();
    let mut cursor = crate::state::moves::RowsCursor::new(&root, "/b").unwrap();
    let mut moved_chunks = Vec::new();
    while let Some((inodes, policies)) = root.rows_batch(&mut cursor) {
        for i in &inodes {
            moved_chunks.extend(
                i.file()
                    .into_iter()
                    .flat_map(|f| f.chunks.iter().map(|c| c.id)),
            );
        }
        p2.apply(&Command::LoadRows {
            top: "/b".into(),
            inodes,
            policies,
        })
        .unwrap();
    }
    p2.apply(&Command::SealLoad { top: "/b".into() }).unwrap();
    for st in [&mut p1, &mut p2] {
        st.apply(&Command::TxForward {
            chunks: moved_chunks.clone(),
            to: 2,
        })
        .unwrap();
    }
    root.apply(&Command::FinishMove {
        path: "/b".into(),
        to: 2,
    })
    .unwrap();
    let view = View {
        root: &root,
        parts: std::collections::BTreeMap::from([(1, &p1), (2, &p2)]),
    };
    assert_eq!(view.chunk(pchunk).map(|(i, _)| i.id), Some(g));
    assert_eq!(p1.chunk_partition(pchunk), 2);
    clean(&[&root, &p1, &p2]);
}

mod roundtrip {
    use super::*;
    use crate::state::Command;

    #[test]
    fn commands_and_intents_survive_their_encodings() {
        let mut st = State::default();
        let ino = crate::state::tests::create_file(&mut st, "/a/f", 2);
        let cmd = Command::TxDecide {
            txid: 1,
            record: Some(ino.clone()),
        };
        let json = serde_json::to_vec(&cmd).unwrap();
        let back: Command = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, cmd, "{}", String::from_utf8_lossy(&json));
        let mut a = State::default();
        let mut b = State::default();
        for st in [&mut a, &mut b] {
            st.apply(&Command::TxBegin {
                from: "/a/f".into(),
                to: "/p/f".into(),
                src: 0,
                dst: 1,
                now_ms: 5,
            })
            .unwrap();
        }
        a.apply(&cmd).unwrap();
        b.apply(&back).unwrap();
        let enc = |s: &State| crate::kv::codec::encode_record(1, &*s.txns);
        assert_eq!(enc(&a), enc(&b));
        let dec: Txns = crate::kv::codec::decode_record("txns", 1, &enc(&a)).unwrap();
        assert_eq!(dec, *a.txns);
    }
}
