#![no_main]
//! The object index's messages from arbitrary bytes (JSON bodies of `ObjectRead` and of
//! `Batch` object operations): decoding never panics; whatever decodes is applied to (or
//! asked of) a state that has a user, a bucket, an object and an upload, and never panics.
//! A refused change leaves the state as it was.
use cairn_master::state::{Command, State};
use cairn_rpc::object::{self, ObjectOp, ObjectQuery, Upload, User};
use libfuzzer_sys::fuzz_target;

fn seeded() -> State {
    let mut st = State::default();
    let ops = [
        ObjectOp::CreateUser {
            user: User { name: "u".into(), access_key: "AK".into(), secret_key: "s".into(), created_ms: 0, admin: false },
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
            },
        },
    ];
    for op in ops {
        let r = st.apply(&Command::Object(op)).unwrap();
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
            let r = st.apply(&Command::Object(op)).expect("object commands answer in the reply");
            if matches!(r.object, Some(Err(_))) {
                assert_eq!(format!("{before:?}"), format!("{st:?}"), "a refused change changed the state");
            }
        }
    } else if let Ok(q) = object::decode::<ObjectQuery>(body) {
        let _ = st.objects().query(&q);
    }
});
