#![no_main]
//! The object index's messages from arbitrary bytes (JSON bodies of `ObjectRead` and of
//! `Batch` object operations): decoding never panics; whatever decodes is applied to (or
//! asked of) a state that has a user, a bucket, an upload, a volume with a snapshot and a
//! clone of it, and never panics.
//! A refused change leaves the state as it was.
use cairn_master::state::{Command, State};
use cairn_rpc::object::{self, ObjectOp, ObjectQuery, Parent, Snapshot, Upload, User, Volume};
use libfuzzer_sys::fuzz_target;

fn volume(name: &str, id: &str, parent: Option<Parent>) -> Volume {
    Volume {
        name: name.into(),
        id: id.into(),
        size: 1 << 20,
        block_size: 4096,
        policy: String::new(),
        created_ms: 1,
        snapshots: Vec::new(),
        parent,
        lineage: Vec::new(),
        owner: "u".into(),
        mode: 0o640,
    }
}

fn seeded() -> State {
    let mut st = State::default();
    let ops = [
        ObjectOp::CreateUser {
            user: User { name: "u".into(), access_key: "AK".into(), secret_key: "s".into(), created_ms: 0, admin: false, certs: vec!["ab".repeat(32)] },
        },
        ObjectOp::CreateBucket { user: "u".into(), bucket: "bkt".into(), now_ms: 1 },
        ObjectOp::CreateUpload {
            user: "u".into(),
            upload: Upload {
                id: "up".into(),
                bucket: "bkt".into(),
                key: "k".into(),
                owner: "u".into(),
                initiated_ms: 1,
                headers: Default::default(),
                user_meta: Default::default(),
                parts: Default::default(),
                checksum_algorithm: None,
                checksum_type: None,
            },
        },
        ObjectOp::CreateVolume { volume: volume("v", "00000000000000aa", None) },
        ObjectOp::CreateSnapshot {
            volume: "v".into(),
            snapshot: Snapshot { name: "s".into(), id: "0000000000000001".into(), size: 0, created_ms: 1, ready: false },
        },
        ObjectOp::SnapshotReady { volume: "v".into(), snapshot: "s".into() },
        ObjectOp::CreateVolume {
            volume: volume(
                "c",
                "00000000000000cc",
                Some(Parent {
                    volume: "v".into(),
                    volume_id: "00000000000000aa".into(),
                    snapshot: "s".into(),
                    snapshot_id: "0000000000000001".into(),
                }),
            ),
        },
    ];
    for op in ops {
        let r = st.apply(&Command::Object(Box::new(op))).unwrap();
        assert!(matches!(r.object, Some(Ok(_))));
    }
    st
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    let mut st = seeded();
    if kind % 2 == 0 {
        if let Ok(op) = object::decode::<ObjectOp>(body) {
            let before = st.clone();
            let r = st.apply(&Command::Object(Box::new(op))).expect("object commands answer in the reply");
            if matches!(r.object, Some(Err(_))) {
                assert_eq!(format!("{before:?}"), format!("{st:?}"), "a refused change changed the state");
            }
        }
    } else if let Ok(q) = object::decode::<ObjectQuery>(body) {
        let _ = st.objects().query(&q);
    }
});
