//! The state machine's store: snapshots as the tables, installs, commits, restarts.

use super::*;
use crate::state::Command;

fn mkdir(sm: &StateMachine, i: u64) {
    let mut a = sm.inner.lock();
    a.state
        .apply(&Command::Mkdir {
            path: format!("/d{i:04}"),
            parents: false,
            now_ms: 0,
            policy: None,
            mode: None,
        })
        .unwrap();
    a.last_applied = Some(openraft::testing::log_id::<TypeConfig>(1, 1, i));
}

fn dirs(sm: &StateMachine) -> usize {
    sm.inner.lock().state.list("/").unwrap().len()
}

/// Entries applied one at a time (a serial workload's) wait in the overlays, where reads
/// see them, until [`COMMIT_EVERY`] of them are committed together; a master reopened
/// meanwhile resumes at the last commit (openraft applies the rest again from its log),
/// and a snapshot commits everything first.
#[tokio::test]
async fn entries_are_committed_every_commit_every() {
    use futures::stream;
    use openraft::entry::RaftEntry;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.redb");
    let mut sm = StateMachine::open(open_db(&path).unwrap(), dir.path(), 4).unwrap();
    let n = COMMIT_EVERY + COMMIT_EVERY / 2;
    for i in 1..=n {
        let entry = <openraft::type_config::alias::EntryOf<TypeConfig> as RaftEntry>::new_normal(
            openraft::testing::log_id::<TypeConfig>(1, 1, i),
            Command::Mkdir {
                path: format!("/d{i:04}"),
                parents: false,
                now_ms: 0,
                policy: None,
                mode: None,
            },
        );
        sm.apply(stream::iter([Ok((entry, None))])).await.unwrap();
        assert_eq!(dirs(&sm), i as usize, "read before the commit");
    }
    let committed = |db: &Database| {
        get_json::<Position>(db, APPLIED, "last")
            .unwrap()
            .and_then(|p| p.0)
            .map(|l| l.index)
    };
    assert_eq!(committed(&sm.db), Some(COMMIT_EVERY));
    assert_eq!(sm.inner.lock().uncommitted, n - COMMIT_EVERY);
    let db = sm.db.clone();
    drop(sm);
    let mut sm = StateMachine::open(db, dir.path(), 4).unwrap();
    assert_eq!(
        sm.applied_state().await.unwrap().0.unwrap().index,
        COMMIT_EVERY
    );
    assert_eq!(dirs(&sm), COMMIT_EVERY as usize);
    for i in COMMIT_EVERY + 1..=n {
        mkdir(&sm, i);
        sm.inner.lock().uncommitted += 1;
    }
    let meta = sm.build_snapshot().await.unwrap().meta;
    assert_eq!(meta.last_log_id.unwrap().index, n);
    assert_eq!(committed(&sm.db), Some(n));
    assert_eq!(sm.inner.lock().uncommitted, 0);
}

/// The snapshot's rows as a file at `path` (what a master receiving it writes).
async fn snapshot_file(sm: &mut StateMachine, path: &Path) -> SnapshotMetaOf<TypeConfig> {
    let snap = sm.get_current_snapshot().await.unwrap().expect("current");
    let SnapshotData::Tables(rx) = snap.snapshot else {
        panic!("a built snapshot is the tables")
    };
    let header = serde_json::to_vec(&snap.meta).unwrap();
    snapshot::write(path, &header, &rx, crate::state::disk::TABLES).unwrap();
    snap.meta
}

/// Building a snapshot copies nothing: the tables are committed durably and named the
/// current snapshot; asking for it then gives the tables as they are at that moment.
#[tokio::test]
async fn a_snapshot_is_the_tables() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.redb");
    let mut sm = StateMachine::open(open_db(&path).unwrap(), dir.path(), 4).unwrap();
    assert!(
        sm.get_current_snapshot().await.unwrap().is_none(),
        "none before a build"
    );
    for i in 1..=30 {
        mkdir(&sm, i);
    }
    let built = sm.build_snapshot().await.unwrap();
    assert_eq!(built.meta.last_log_id.unwrap().index, 30);
    assert_eq!(
        std::fs::read_dir(snapshot_dir(dir.path())).unwrap().count(),
        0
    );
    for i in 31..=40 {
        mkdir(&sm, i);
    }
    let now = sm.get_current_snapshot().await.unwrap().expect("current");
    assert_eq!(
        now.meta.last_log_id.unwrap().index,
        40,
        "the state when asked"
    );
    // What a far-behind master receives and installs holds all 40.
    let dir2 = tempfile::tempdir().unwrap();
    let mut sm2 = StateMachine::open(
        open_db(&dir2.path().join("master.redb")).unwrap(),
        dir2.path(),
        4,
    )
    .unwrap();
    sm2.install_snapshot(&now.meta, now.snapshot).await.unwrap();
    assert_eq!(dirs(&sm2), 40);
    assert_eq!(
        std::fs::read_dir(snapshot_dir(dir2.path()))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(
        std::fs::read_dir(incoming_dir(dir2.path()))
            .unwrap()
            .count(),
        0
    );
    // Both are current at 40 after a restart.
    drop(sm2);
    let mut sm2 = StateMachine::open(
        open_db(&dir2.path().join("master.redb")).unwrap(),
        dir2.path(),
        4,
    )
    .unwrap();
    assert_eq!(sm2.applied_state().await.unwrap().0.unwrap().index, 40);
    let cur = sm2.get_current_snapshot().await.unwrap().expect("current");
    assert!(matches!(cur.snapshot, SnapshotData::Tables(_)));
}

/// A master that wrote a file of every snapshot it built (session 36's masters) keeps
/// none after its first start: the tables are named the current snapshot.
#[tokio::test]
async fn an_older_masters_snapshot_file_is_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.redb");
    let mut sm = StateMachine::open(open_db(&path).unwrap(), dir.path(), 4).unwrap();
    for i in 1..=20 {
        mkdir(&sm, i);
    }
    sm.build_snapshot().await.unwrap();
    let meta = snapshot_file(&mut sm, &dir.path().join("old.snap")).await;
    let name = snapshot_name(&meta);
    std::fs::rename(
        dir.path().join("old.snap"),
        snapshot_dir(dir.path()).join(&name),
    )
    .unwrap();
    {
        let tx = sm.db.begin_write().unwrap();
        put_current(&mut tx.open_table(SNAPSHOT).unwrap(), &meta, true).unwrap();
        tx.commit().unwrap();
    }
    let db = sm.db.clone();
    drop(sm);
    let mut sm = StateMachine::open(db, dir.path(), 4).unwrap();
    assert_eq!(
        std::fs::read_dir(snapshot_dir(dir.path())).unwrap().count(),
        0
    );
    assert_eq!(dirs(&sm), 20);
    let cur = sm.get_current_snapshot().await.unwrap().expect("current");
    assert!(matches!(cur.snapshot, SnapshotData::Tables(_)));
    assert_eq!(cur.meta.last_log_id.unwrap().index, 20);
}

/// A master stopped at any point of installing a snapshot (after naming it current and
/// dropping the position; rows half loaded) starts from an empty state, and openraft's
/// start-up installs the current snapshot again: the state is whole.
#[tokio::test]
async fn an_interrupted_install_is_done_again_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.redb");
    let mut sm = StateMachine::open(open_db(&path).unwrap(), dir.path(), 4).unwrap();
    for i in 1..=300 {
        mkdir(&sm, i);
    }
    sm.build_snapshot().await.unwrap();
    // An install interrupted: its file named current, position gone, half the inodes gone.
    let meta = snapshot_file(&mut sm, &dir.path().join("received.snap")).await;
    assert_eq!(meta.last_log_id.unwrap().index, 300);
    std::fs::rename(
        dir.path().join("received.snap"),
        snapshot_dir(dir.path()).join(snapshot_name(&meta)),
    )
    .unwrap();
    let db = sm.db.clone();
    drop(sm);
    {
        let tx = db.begin_write().unwrap();
        put_current(&mut tx.open_table(SNAPSHOT).unwrap(), &meta, true).unwrap();
        tx.open_table(APPLIED).unwrap().remove("last").unwrap();
        let mut t = tx
            .open_table(TableDefinition::<&[u8], &[u8]>::new("inodes"))
            .unwrap();
        t.retain(|k, _| k[7] % 2 == 0).unwrap();
        drop(t);
        tx.commit().unwrap();
    }
    let mut sm = StateMachine::open(db, dir.path(), 4).unwrap();
    assert_eq!(sm.applied_state().await.unwrap().0, None);
    assert_eq!(dirs(&sm), 0, "an empty state, not the half-loaded one");
    // What openraft does at start with a snapshot newer than the state:
    let current = sm.get_current_snapshot().await.unwrap().expect("current");
    assert!(matches!(current.snapshot, SnapshotData::File(_)));
    sm.install_snapshot(&current.meta, current.snapshot)
        .await
        .unwrap();
    assert_eq!(dirs(&sm), 300);
    assert_eq!(sm.applied_state().await.unwrap().0.unwrap().index, 300);
    // Installed: the tables hold it, the file is gone.
    assert_eq!(
        std::fs::read_dir(snapshot_dir(dir.path())).unwrap().count(),
        0
    );
}

/// A damaged snapshot file is refused before anything of the state changes.
#[tokio::test]
async fn a_damaged_snapshot_is_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = StateMachine::open(
        open_db(&dir.path().join("master.redb")).unwrap(),
        dir.path(),
        4,
    )
    .unwrap();
    for i in 1..=50 {
        mkdir(&sm, i);
    }
    sm.build_snapshot().await.unwrap();
    let good = dir.path().join("good.snap");
    let meta = snapshot_file(&mut sm, &good).await;
    for i in 51..=60 {
        mkdir(&sm, i);
    }
    let mut bytes = std::fs::read(&good).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 1;
    let bad = incoming_dir(dir.path()).join("bad.part");
    std::fs::write(&bad, &bytes).unwrap();
    let e = sm
        .install_snapshot(&meta, SnapshotData::File(SnapshotFile::open(bad).unwrap()))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    assert_eq!(dirs(&sm), 60);
    assert_eq!(sm.applied_state().await.unwrap().0.unwrap().index, 60);
}
