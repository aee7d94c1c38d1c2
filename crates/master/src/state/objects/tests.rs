use super::*;

/// A snapshot from before the objects table (each bucket's objects inside it) loads with
/// every object in the table, and writes out in the new shape.
#[test]
fn objects_of_an_older_snapshot_move_into_the_table() {
    let old = serde_json::json!({
        "users": {}, "uploads": {}, "packs": {},
        "buckets": {
            "b1": {"owner": "u", "created_ms": 1, "objects": {
                "k1": meta("p1", vec![]), "k2": meta("p2", vec![])}},
            "b2": {"owner": "u", "created_ms": 2, "objects": {"k1": meta("p3", vec![])}},
            "b3": {"owner": "v", "created_ms": 3}
        }
    });
    let mut idx: ObjectIndex = serde_json::from_value(old).unwrap();
    idx.rebuild();
    assert_eq!(idx.totals(), (3, 3, 0));
    assert_eq!(idx.object("b1", "k2").unwrap().put_id, "p2");
    assert_eq!(idx.object("b2", "k1").unwrap().put_id, "p3");
    assert!(idx.object("b2", "k2").is_none());
    assert!(idx.holds_objects("b1") && !idx.holds_objects("b3"));
    let again: ObjectIndex = serde_json::from_slice(&serde_json::to_vec(&idx).unwrap()).unwrap();
    assert_eq!(again, idx);
    assert!(again.buckets.values().all(|b| b.objects.is_empty()));
}

/// Uploads of an older snapshot carried their parts: they move into the parts table, and
/// the upload completes from there.
#[test]
fn parts_of_an_older_snapshot_move_into_the_table() {
    let part = |n: u32, path: &str| {
        serde_json::json!({"number": n, "size": 5, "etag": format!("e{n}"), "mtime_ms": 1,
            "extent": {"path": path, "offset": 0, "len": 5, "shared": false}})
    };
    let old = serde_json::json!({
        "users": {}, "packs": {},
        "buckets": {"b": {"owner": "u", "created_ms": 1}},
        "uploads": {"up1": {"id": "up1", "bucket": "b", "key": "k", "owner": "u",
            "initiated_ms": 1, "parts": {"1": part(1, "/p/1"), "2": part(2, "/p/2")}}}
    });
    let mut idx: ObjectIndex = serde_json::from_value(old).unwrap();
    idx.rebuild();
    assert!(idx.uploads.get(&"up1".to_owned()).unwrap().parts.is_empty());
    let numbers: Vec<u32> = idx.parts_of("up1", 0).map(|p| p.number).collect();
    assert_eq!(numbers, vec![1, 2]);
    assert_eq!(idx.parts_of("up1", 2).count(), 1);
    assert_eq!(idx.parts_of("up", 0).count(), 0, "another upload's parts");
    let parts = idx.take_upload("up1");
    assert_eq!(parts.len(), 2);
    assert!(idx.uploads.is_empty() && idx.parts.is_empty());
}

/// An older version's plain secrets are found, and sealing replaces only plain ones with
/// sealed ones (never a sealed one, never with a plain one).
#[test]
fn plain_secrets_are_sealed_once() {
    let mut idx = ObjectIndex::default();
    for (name, key, secret) in [("a", "CKA", "plain-a"), ("b", "CKB", "sealed1:00")] {
        idx.users.insert(
            key.into(),
            User {
                name: name.into(),
                access_key: key.into(),
                secret_key: secret.into(),
                created_ms: 0,
                admin: false,
                certs: vec![],
            },
        );
    }
    assert_eq!(
        idx.plain_secrets(),
        vec![("CKA".to_string(), "plain-a".to_string())]
    );
    idx.seal_secrets(&[
        ("CKA".into(), "not-sealed".into()),
        ("CKB".into(), "sealed1:11".into()),
        ("CKGONE".into(), "sealed1:22".into()),
    ]);
    assert_eq!(idx.users["CKA"].secret_key, "plain-a");
    assert_eq!(idx.users["CKB"].secret_key, "sealed1:00");
    idx.seal_secrets(&[("CKA".into(), "sealed1:33".into())]);
    assert_eq!(idx.users["CKA"].secret_key, "sealed1:33");
    assert!(idx.plain_secrets().is_empty());
}

fn op(st: &mut State, op: ObjectOp) -> OpResult {
    st.apply(&Command::Object(Box::new(op)))
        .unwrap()
        .object
        .unwrap()
}

/// Bucket `bkt` of user `u`.
fn create_bucket(st: &mut State) {
    op(
        st,
        ObjectOp::CreateBucket {
            user: "u".into(),
            bucket: "bkt".into(),
            now_ms: 1,
        },
    )
    .unwrap();
}

fn file(st: &mut State, path: &str) {
    let policy = crate::state::Policy {
        replicas: 3,
        compression: false,
        min_copy: 0,
        ec: None,
    };
    st.apply(&Command::Create {
        path: path.into(),
        mode: None,
        policy,
        parents: true,
        now_ms: 1,
        lease: None,
        placements: vec![vec![1, 2, 3]],
        groups: false,
    })
    .unwrap();
}

fn meta(put_id: &str, extents: Vec<Extent>) -> ObjectMeta {
    ObjectMeta {
        size: extents.iter().map(|e| e.len).sum(),
        etag: "e".into(),
        mtime_ms: 1,
        put_id: put_id.into(),
        extents,
        ..Default::default()
    }
}

/// A multipart upload's parts live in their own table; its completion takes the listed
/// ones into the object and frees the rest; a retried completion is found applied by the
/// object it names (or, from gateways that named none, by a look at every object).
#[test]
fn a_retried_completion_finds_its_object_by_name() {
    let mut st = State::default();
    let user = || "u".to_owned();
    create_bucket(&mut st);
    start_upload(&mut st, "k");
    for n in 1..=2u32 {
        let path = format!("/p/{n}");
        file(&mut st, &path);
        let part = Part {
            number: n,
            size: 5,
            etag: format!("e{n}"),
            mtime_ms: 1,
            extent: Extent {
                path,
                offset: 0,
                len: 5,
                shared: false,
            },
            checksums: BTreeMap::new(),
        };
        op(
            &mut st,
            ObjectOp::PutPart {
                user: user(),
                upload_id: "up1".into(),
                part,
                bucket: String::new(),
                key: String::new(),
            },
        )
        .unwrap();
    }
    assert_eq!(st.objects.parts.len(), 2);
    let complete = |bucket: &str, key: &str| ObjectOp::CompleteUpload {
        user: user(),
        upload_id: "up1".into(),
        bucket: bucket.into(),
        key: key.into(),
        parts: vec![(2, "e2".into())],
        meta: meta("put-up1", Vec::new()),
        condition: None,
    };
    let Ok(OpReply::Object(o)) = op(&mut st, complete("bkt", "k")) else {
        panic!("the completion applies");
    };
    assert_eq!((o.size, o.extents[0].path.as_str()), (5, "/p/2"));
    assert!(st.objects.parts.is_empty() && st.objects.uploads.is_empty());
    assert_eq!(op(&mut st, complete("bkt", "k")), Ok(OpReply::Done));
    assert_eq!(op(&mut st, complete("", "")), Ok(OpReply::Done));
    assert_eq!(
        op(&mut st, complete("bkt", "other")),
        Err(ObjectError::NoSuchUpload)
    );
}

/// Upload `up1` of user `u` to `bkt`/`key`.
fn start_upload(st: &mut State, key: &str) {
    let upload = Upload {
        id: "up1".into(),
        bucket: "bkt".into(),
        key: key.into(),
        owner: "u".into(),
        initiated_ms: 1,
        headers: BTreeMap::new(),
        user_meta: BTreeMap::new(),
        parts: BTreeMap::new(),
        checksum_algorithm: None,
        checksum_type: None,
    };
    let create = ObjectOp::CreateUpload {
        user: "u".into(),
        upload,
    };
    op(st, create).unwrap();
}

fn put(bucket: &str, key: &str, m: ObjectMeta) -> ObjectOp {
    ObjectOp::PutObject {
        user: "u".into(),
        bucket: bucket.into(),
        key: key.into(),
        meta: m,
        condition: None,
    }
}

/// Conditional PUTs: If-None-Match refuses an existing version (`*`) or the named one,
/// If-Match needs the named version (a missing key is NoSuchKey), and a retry of the PUT
/// that applied passes although the version it made no longer meets its condition.
#[test]
fn conditional_puts_check_the_current_version() {
    let mut st = State::default();
    create_bucket(&mut st);
    let put = |st: &mut State, id: &str, etag: &str, c: Option<PutCondition>| {
        let mut m = meta(id, Vec::new());
        m.etag = etag.into();
        op(
            st,
            ObjectOp::PutObject {
                user: "u".into(),
                bucket: "bkt".into(),
                key: "k".into(),
                meta: m,
                condition: c,
            },
        )
        .map(|_| ())
    };
    let any = || Some(PutCondition::IfNoneMatch("*".into()));
    assert_eq!(
        put(&mut st, "p0", "e0", Some(PutCondition::IfMatch("*".into()))),
        Err(ObjectError::NoSuchKey)
    );
    put(&mut st, "p1", "e1", any()).unwrap();
    // The retry of p1 passes; another writer's If-None-Match: * does not.
    put(&mut st, "p1", "e1", any()).unwrap();
    assert_eq!(
        put(&mut st, "p2", "e2", any()),
        Err(ObjectError::PreconditionFailed)
    );
    assert_eq!(
        put(
            &mut st,
            "p2",
            "e2",
            Some(PutCondition::IfNoneMatch("e1".into()))
        ),
        Err(ObjectError::PreconditionFailed)
    );
    put(
        &mut st,
        "p2",
        "e2",
        Some(PutCondition::IfNoneMatch("zz".into())),
    )
    .unwrap();
    assert_eq!(
        put(
            &mut st,
            "p3",
            "e3",
            Some(PutCondition::IfMatch("e1".into()))
        ),
        Err(ObjectError::PreconditionFailed)
    );
    put(
        &mut st,
        "p3",
        "e3",
        Some(PutCondition::IfMatch("e2".into())),
    )
    .unwrap();
    put(&mut st, "p4", "e4", Some(PutCondition::IfMatch("*".into()))).unwrap();
    assert_eq!(st.objects.object("bkt", "k").unwrap().put_id, "p4");
}

/// Overwrites free the old version (own files deleted, pack bytes counted dead); a retried
/// PUT changes nothing; compaction's move is conditional; a pack named by an object is
/// never dropped.
#[test]
fn versions_free_their_data_and_packs_drop_only_when_dead() {
    let mut st = State::default();
    let shared = |offset| Extent {
        path: "/p/1".into(),
        offset,
        len: 10,
        shared: true,
    };
    let own = Extent {
        path: "/b/1".into(),
        offset: 0,
        len: 10,
        shared: false,
    };
    file(&mut st, "/p/1");
    file(&mut st, "/p/2");
    file(&mut st, "/b/1");
    create_bucket(&mut st);
    assert_eq!(
        op(
            &mut st,
            ObjectOp::CreateBucket {
                user: "v".into(),
                bucket: "bkt".into(),
                now_ms: 1
            }
        ),
        Err(ObjectError::BucketAlreadyExists)
    );
    // Missing data is refused: nothing visible without its bytes.
    let missing = Extent {
        path: "/nope".into(),
        ..own.clone()
    };
    assert!(op(&mut st, put("bkt", "k", meta("0", vec![missing]))).is_err());
    op(&mut st, put("bkt", "k", meta("1", vec![own.clone()]))).unwrap();
    op(&mut st, put("bkt", "k", meta("1", vec![own.clone()]))).unwrap(); // a retry
    assert!(
        st.lookup("/b/1").is_ok(),
        "a retried PUT freed its own data"
    );
    op(&mut st, put("bkt", "k", meta("2", vec![shared(0)]))).unwrap();
    // The replaced version's file waits in the trash (GETs may still read it).
    assert!(st.lookup("/b/1").is_ok() && st.objects.trash.contains_key(&"/b/1".to_owned()));
    let empty = |p: &str| ObjectOp::EmptyTrash {
        paths: vec![p.into()],
    };
    op(&mut st, empty("/p/2")).unwrap();
    assert!(
        st.lookup("/p/2").is_ok(),
        "emptying deleted a file not in the trash"
    );
    op(&mut st, empty("/b/1")).unwrap();
    assert!(st.lookup("/b/1").is_err(), "the trash was not emptied");
    assert_eq!(
        *st.objects.packs.get(&"/p/1".to_owned()).unwrap(),
        PackUse {
            live_bytes: 10,
            live_objects: 1
        }
    );
    let drop = |p: &str| ObjectOp::DropPack {
        path: p.into(),
        now_ms: 5,
    };
    assert!(op(&mut st, drop("/p/1")).is_err(), "a live pack is dropped");
    // Compaction moves the record; a stale move (wrong version) is refused.
    let to = Extent {
        path: "/p/2".into(),
        ..shared(40)
    };
    let mv = |put_id: &str| ObjectOp::MoveExtent {
        bucket: "bkt".into(),
        key: "k".into(),
        put_id: put_id.into(),
        from: shared(0),
        to: to.clone(),
    };
    assert_eq!(op(&mut st, mv("1")), Err(ObjectError::NoSuchKey));
    op(&mut st, mv("2")).unwrap();
    assert_eq!(
        op(&mut st, mv("2")),
        Err(ObjectError::NoSuchKey),
        "moved twice"
    );
    assert_eq!(
        st.objects
            .packs
            .get(&"/p/1".to_owned())
            .unwrap()
            .live_objects,
        0
    );
    op(&mut st, drop("/p/1")).unwrap();
    op(&mut st, empty("/p/1")).unwrap();
    assert!(st.lookup("/p/1").is_err());
    assert!(op(&mut st, drop("/p/2")).is_err());
    // Delete: the pack's bytes are dead; the bucket can go once empty.
    assert_eq!(
        op(
            &mut st,
            ObjectOp::DeleteBucket {
                user: "u".into(),
                bucket: "bkt".into()
            }
        ),
        Err(ObjectError::BucketNotEmpty)
    );
    op(
        &mut st,
        ObjectOp::DeleteObject {
            user: "u".into(),
            bucket: "bkt".into(),
            key: "k".into(),
        },
    )
    .unwrap();
    assert_eq!(
        *st.objects.packs.get(&"/p/2".to_owned()).unwrap(),
        PackUse::default()
    );
    op(
        &mut st,
        ObjectOp::DeleteBucket {
            user: "u".into(),
            bucket: "bkt".into(),
        },
    )
    .unwrap();
}

/// A pack retired by compaction (no object named it, its writer's lease lapsed) is never
/// made live again by a writer that appended after: the trash would delete the data of an
/// acknowledged PUT (seed 62, scenario 144). An own file freed by a later version is not named
/// again either. A retried part is counted once in its pack.
#[test]
fn a_retired_pack_is_never_named_again() {
    let mut st = State::default();
    let at = |path: &str, offset| Extent {
        path: path.into(),
        offset,
        len: 10,
        shared: true,
    };
    file(&mut st, "/p/1");
    file(&mut st, "/p/2");
    file(&mut st, "/b/1");
    file(&mut st, "/b/2");
    create_bucket(&mut st);
    op(&mut st, put("bkt", "k", meta("1", vec![at("/p/1", 0)]))).unwrap();
    op(&mut st, put("bkt", "k", meta("2", vec![at("/p/2", 0)]))).unwrap();
    let drop = ObjectOp::DropPack {
        path: "/p/1".into(),
        now_ms: 5,
    };
    op(&mut st, drop).unwrap();
    // The stalled writer's next record in /p/1, committed after the drop.
    let retired = Err(ObjectError::PackRetired("/p/1".into()));
    assert_eq!(
        op(&mut st, put("bkt", "k2", meta("3", vec![at("/p/1", 10)]))),
        retired
    );
    assert!(st.objects.object("bkt", "k2").is_none());
    assert!(!st.objects.packs.contains_key(&"/p/1".to_owned()));
    start_upload(&mut st, "k3");
    let part = |extent: Extent| ObjectOp::PutPart {
        user: "u".into(),
        upload_id: "up1".into(),
        part: Part {
            number: 1,
            size: 10,
            etag: "e1".into(),
            mtime_ms: 1,
            extent,
            checksums: BTreeMap::new(),
        },
        bucket: String::new(),
        key: String::new(),
    };
    assert_eq!(op(&mut st, part(at("/p/1", 20))), retired);
    // A retried part counts once: the pack's use is one object's.
    op(&mut st, part(at("/p/2", 10))).unwrap();
    op(&mut st, part(at("/p/2", 10))).unwrap();
    assert_eq!(
        *st.objects.packs.get(&"/p/2".to_owned()).unwrap(),
        PackUse {
            live_bytes: 20,
            live_objects: 2
        }
    );
    // Compaction's move into a retired pack is refused as well.
    let mv = ObjectOp::MoveExtent {
        bucket: "bkt".into(),
        key: "k".into(),
        put_id: "2".into(),
        from: at("/p/2", 0),
        to: at("/p/1", 30),
    };
    assert_eq!(op(&mut st, mv), retired);
    // An own file freed by a replacing version is not named again.
    let own = |p: &str| Extent {
        path: p.into(),
        offset: 0,
        len: 10,
        shared: false,
    };
    op(&mut st, put("bkt", "o", meta("4", vec![own("/b/1")]))).unwrap();
    op(&mut st, put("bkt", "o", meta("5", vec![own("/b/2")]))).unwrap();
    assert!(matches!(
        op(&mut st, put("bkt", "o", meta("4", vec![own("/b/1")]))),
        Err(ObjectError::InvalidArgument(_))
    ));
    assert_eq!(st.objects.object("bkt", "o").unwrap().put_id, "5");
}

/// The consistency check passes objects in packs and own files, and finds (canary) an
/// object whose data file went, a pack whose live count drifted, and a named file in the
/// trash.
#[test]
fn the_check_finds_objects_without_data_and_drifted_packs() {
    let mut st = State::default();
    create_bucket(&mut st);
    file(&mut st, "/p/pack");
    file(&mut st, "/p/own");
    let shared = |offset| Extent {
        path: "/p/pack".into(),
        offset,
        len: 0,
        shared: true,
    };
    op(&mut st, put("bkt", "a", meta("p1", vec![shared(0)]))).unwrap();
    op(&mut st, put("bkt", "b", meta("p2", vec![shared(0)]))).unwrap();
    let own = Extent {
        path: "/p/own".into(),
        offset: 0,
        len: 0,
        shared: false,
    };
    op(&mut st, put("bkt", "c", meta("p3", vec![own]))).unwrap();
    let r = st.check();
    assert_eq!((r.problems, r.objects), (0, 3), "{:?}", r.listed);

    let mut gone = st.clone();
    gone.apply(&Command::Delete {
        path: "/p/own".into(),
    })
    .unwrap();
    let r = gone.check();
    assert!(
        r.listed.iter().any(|p| p.contains("/p/own is missing")),
        "{:?}",
        r.listed
    );

    let mut drifted = st.clone();
    drifted
        .objects
        .packs
        .get_mut(&"/p/pack".to_string())
        .unwrap()
        .live_objects = 1;
    let r = drifted.check();
    assert!(
        r.listed.iter().any(|p| p.contains("pack /p/pack")),
        "{:?}",
        r.listed
    );

    let mut trashed = st.clone();
    trashed.objects.trash.insert("/p/own".into(), ());
    let r = trashed.check();
    assert!(
        r.listed.iter().any(|p| p.contains("trash")),
        "{:?}",
        r.listed
    );
}

/// A bucket placed in a shard: the root refuses its writes as misrouted, the shard holds its
/// objects and refuses data files of another partition, and deleting it closes, forgets and
/// drops in that order.
#[test]
fn a_placed_bucket_lives_in_its_shard_and_is_deleted_in_steps() {
    use super::buckets::BucketCommand as B;
    use crate::state::tests::{partition_state, unavailable};
    let bucket = |c: B| Command::Bucket(c);
    let mut root = State::default();
    root.apply(&Command::AddPartition {
        members: vec![1],
        now_ms: 1,
    })
    .unwrap();
    create_bucket(&mut root);
    file(&mut root, "/.s3/blobs/r");
    op(
        &mut root,
        put("bkt", "k", meta("p0", vec![ext("/.s3/blobs/r")])),
    )
    .unwrap();
    let assign = |shards: Vec<u32>| {
        bucket(B::Assign {
            bucket: "bkt".into(),
            shards,
        })
    };
    // No partition holds /.s3/p/1 yet; then the bucket is not empty.
    assert!(root.apply(&assign(vec![1])).is_err());
    root.apply(&Command::AssignSubtree {
        path: "/.s3/p/1".into(),
        partition: 1,
        owner: String::new(),
        mode: 0o700,
        now_ms: 1,
    })
    .unwrap();
    assert!(root.apply(&assign(vec![1])).is_err(), "not empty");
    op(
        &mut root,
        ObjectOp::DeleteObject {
            user: "u".into(),
            bucket: "bkt".into(),
            key: "k".into(),
        },
    )
    .unwrap();
    root.apply(&assign(vec![1])).unwrap();
    root.apply(&assign(vec![1])).unwrap(); // asked again
    assert!(root.apply(&assign(vec![1, 1])).is_err());
    let put_k = |path: &str, id: &str| put("bkt", "k", meta(id, vec![ext(path)]));
    let misrouted = root.apply(&Command::Object(Box::new(put_k("/.s3/blobs/r", "p1"))));
    assert!(
        unavailable(misrouted),
        "the root sends the bucket's writes to its shard"
    );
    assert_eq!(root.bucket_shards("bkt"), Some(vec![1]));

    let mut p1 = partition_state(1, "/.s3/p/1");
    let adopt = bucket(B::Adopt {
        bucket: "bkt".into(),
        owner: "u".into(),
        created_ms: 1,
    });
    p1.apply(&adopt).unwrap();
    p1.apply(&adopt).unwrap();
    let other = bucket(B::Adopt {
        bucket: "bkt".into(),
        owner: "v".into(),
        created_ms: 1,
    });
    assert!(
        p1.apply(&other).is_err(),
        "another owner's bucket of that name"
    );
    file(&mut p1, "/.s3/p/1/blobs/x");
    assert!(matches!(
        op(&mut p1, put_k("/.s3/blobs/r", "p2")),
        Err(ObjectError::Moved(_))
    ));
    op(&mut p1, put_k("/.s3/p/1/blobs/x", "p3")).unwrap();
    // Deleting: a shard holding objects refuses to close.
    let close = bucket(B::Close {
        bucket: "bkt".into(),
    });
    let refused = p1.apply(&close).unwrap().object.unwrap();
    assert_eq!(refused, Err(ObjectError::BucketNotEmpty));
    op(
        &mut p1,
        ObjectOp::DeleteObject {
            user: "u".into(),
            bucket: "bkt".into(),
            key: "k".into(),
        },
    )
    .unwrap();
    assert_eq!(p1.apply(&close).unwrap().object.unwrap(), Ok(OpReply::Done));
    file(&mut p1, "/.s3/p/1/blobs/y");
    let closed = p1.apply(&Command::Object(Box::new(put_k("/.s3/p/1/blobs/y", "p4"))));
    assert!(
        unavailable(closed),
        "writes wait while the bucket is closed"
    );
    let drop_it = bucket(B::Drop {
        bucket: "bkt".into(),
    });
    p1.apply(&bucket(B::Reopen {
        bucket: "bkt".into(),
    }))
    .unwrap();
    assert!(p1.apply(&drop_it).is_err(), "an open copy is not dropped");
    p1.apply(&close).unwrap();
    root.apply(&bucket(B::Forget {
        bucket: "bkt".into(),
    }))
    .unwrap();
    assert_eq!(root.bucket_shards("bkt"), None);
    p1.apply(&drop_it).unwrap();
    p1.apply(&drop_it).unwrap(); // asked again
    assert_eq!(
        op(&mut p1, put_k("/.s3/p/1/blobs/y", "p5")),
        Err(ObjectError::NoSuchBucket)
    );
    // The root's own buckets are not its to forget; a partition that is no shard adopts none.
    create_bucket(&mut root);
    assert!(
        root.apply(&bucket(B::Forget {
            bucket: "bkt".into()
        }))
        .is_err()
    );
    let mut p2 = partition_state(2, "/data");
    assert!(p2.apply(&adopt).is_err());
}

/// A 5-byte extent that is the whole of the file at `path`.
fn ext(path: &str) -> Extent {
    Extent {
        path: path.into(),
        offset: 0,
        len: 5,
        shared: false,
    }
}
