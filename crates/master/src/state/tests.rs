use super::*;

/// A partition's new state holding the subtree at `top` (for tests across partitions).
pub(crate) fn partition_state(id: u32, top: &str) -> State {
    let mut st = State::default();
    st.apply(&Command::InitPartition {
        partition: id,
        path: top.into(),
        owner: String::new(),
        mode: 0o755,
        now_ms: 1,
    })
    .unwrap();
    st
}

/// A file of `chunks` replicated chunks at `path`, its directories made; its inode.
pub(crate) fn create_file(s: &mut State, path: &str, chunks: usize) -> Inode {
    let mut cmd = create_cmd(path, None, chunks);
    if let Command::Create { parents, .. } = &mut cmd {
        *parents = true;
    }
    s.apply(&cmd).unwrap().inode.unwrap()
}

/// Whether a command was refused with `unavailable` (frozen by a move or locked by a rename).
pub(crate) fn unavailable(r: Response) -> bool {
    matches!(r, Err(e) if e.kind == ErrorKind::Unavailable)
}

/// A repair of `chunk` recorded (server 9, nothing removed): what a frozen or locked file's
/// chunk must refuse.
pub(crate) fn repaired(chunk: ChunkId) -> Command {
    Command::Repaired {
        chunk_id: chunk,
        length: 0,
        server: 9,
        remove: vec![],
        member: None,
    }
}

pub(super) fn create(s: &mut State, path: &str, holder: Option<&str>, chunks: usize) -> Response {
    s.apply(&create_cmd(path, holder, chunks))
}

fn create_cmd(path: &str, holder: Option<&str>, chunks: usize) -> Command {
    Command::Create {
        path: path.into(),
        mode: None,
        policy: Policy {
            replicas: 3,
            compression: false,
            min_copy: 0,
            ec: None,
        },
        parents: false,
        now_ms: 1000,
        lease: holder.map(|h| Lease {
            holder: h.into(),
            expires_ms: 11_000,
        }),
        placements: vec![vec![1, 2, 3]; chunks],
        groups: false,
    }
}

fn kind(r: Response) -> ErrorKind {
    r.unwrap_err().kind
}

#[test]
fn ec_files_get_chunk_groups_and_only_their_tails_are_removed() {
    let mut s = State::default();
    let ec = Policy {
        replicas: 3,
        compression: false,
        min_copy: 3,
        ec: Some(Ec {
            k: 4,
            m: 2,
            then: false,
        }),
    };
    let lease = Lease {
        holder: "w".into(),
        expires_ms: 11_000,
    };
    let create = |placements: Vec<Vec<ServerId>>, groups| Command::Create {
        path: "/e".into(),
        mode: None,
        policy: ec,
        parents: false,
        now_ms: 1000,
        lease: Some(lease.clone()),
        placements,
        groups,
    };
    // A group needs a server per member.
    assert_eq!(
        kind(s.apply(&create(vec![vec![1, 2, 3]], true))),
        ErrorKind::InvalidArgument
    );
    let f = s
        .apply(&create(vec![vec![1, 2, 3, 4, 5, 6]], true))
        .unwrap();
    let group = f.inode.unwrap().file().unwrap().chunks[0].clone();
    assert_eq!(
        group.ec,
        Some(Group {
            k: 4,
            m: 2,
            cell: DEFAULT_CELL,
            lz4: None,
        })
    );
    s.apply(&Command::Allocate {
        path: "/e".into(),
        holder: "w".into(),
        now_ms: 1000,
        placements: vec![vec![1, 2, 3]],
        groups: false,
    })
    .unwrap();
    let tail = s.lookup("/e").unwrap().file().unwrap().chunks[1].clone();
    assert_eq!(tail.ec, None);
    let commit = |remove: Vec<ChunkId>, length| Command::Commit {
        path: "/e".into(),
        holder: "w".into(),
        now_ms: 1000,
        updates: vec![ChunkUpdate {
            chunk_id: group.id,
            length,
            sealed: false,
        }],
        trim: false,
        release: false,
        seal: false,
        lease_until_ms: 0,
        drops: vec![],
        remove,
    };
    // A group is never removed; a refused commit changes nothing.
    assert_eq!(
        kind(s.apply(&commit(vec![group.id], 1 << 18))),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        s.lookup("/e").unwrap().file().unwrap().committed_length(),
        0
    );
    // The fold: the group's stripes and the tail's removal in one step.
    let f = s.apply(&commit(vec![tail.id], 1 << 18)).unwrap();
    let ino = f.inode.unwrap();
    let chunks = &ino.file().unwrap().chunks;
    assert_eq!(chunks.len(), 1);
    assert_eq!((chunks[0].id, chunks[0].length), (group.id, 1 << 18));
    assert_eq!(chunks[0].stored_length(), 1 << 16);
    assert!(!s.owns_chunk(tail.id));
    // The same commit again (a retry after a lost answer) changes nothing and succeeds.
    let again = s.apply(&commit(vec![tail.id], 1 << 18)).unwrap();
    assert_eq!(again.inode.unwrap().file().unwrap().chunks.len(), 1);

    // A rebuilt member takes its position, only from the server the repair replaced and
    // never onto another member's server; a replica's repair record changes no group.
    let mut seal = commit(vec![], 1 << 18);
    if let Command::Commit { updates, .. } = &mut seal {
        updates[0].sealed = true;
    }
    s.apply(&seal).unwrap();
    let rebuilt = |server, index, from| Command::Repaired {
        chunk_id: group.id,
        length: 1 << 18,
        server,
        remove: vec![],
        member: Some(MemberMove { index, from }),
    };
    let servers = |s: &State| s.chunk(group.id).unwrap().1.servers.clone();
    s.apply(&rebuilt(7, 2, 3)).unwrap();
    assert_eq!(servers(&s), vec![1, 2, 7, 4, 5, 6]);
    s.apply(&rebuilt(8, 2, 3)).unwrap(); // stale: position 2 moved already
    s.apply(&rebuilt(1, 3, 4)).unwrap(); // 1 holds member 0
    s.apply(&Command::Repaired {
        chunk_id: group.id,
        length: 1 << 18,
        server: 9,
        remove: vec![1],
        member: None,
    })
    .unwrap();
    assert_eq!(servers(&s), vec![1, 2, 7, 4, 5, 6]);
    s.apply(&rebuilt(4, 3, 4)).unwrap(); // in place
    assert_eq!(servers(&s), vec![1, 2, 7, 4, 5, 6]);
}

/// A conversion: begin allocates the group and records it, end switches the chunk in one
/// step (once), and a chunk that changed meanwhile keeps its replicas.
#[test]
fn a_conversion_switches_a_sealed_chunk_to_its_group_in_one_step() {
    let mut s = State::default();
    let policy = Policy {
        replicas: 3,
        compression: true,
        min_copy: 2,
        ec: Some(Ec {
            k: 2,
            m: 1,
            then: true,
        }),
    };
    s.apply(&Command::Create {
        path: "/t".into(),
        mode: None,
        policy,
        parents: false,
        now_ms: 1,
        lease: Some(Lease {
            holder: "w".into(),
            expires_ms: 10_000,
        }),
        placements: vec![vec![1, 2, 3]],
        groups: false,
    })
    .unwrap();
    let chunk = s.lookup("/t").unwrap().file().unwrap().chunks[0].id;
    let begin = |servers: Vec<ServerId>| Command::ConvertBegin {
        chunk_id: chunk,
        servers,
        now_ms: 5,
    };
    // Open chunks are not converted.
    assert_eq!(
        kind(s.apply(&begin(vec![4, 5, 6]))),
        ErrorKind::InvalidArgument
    );
    s.apply(&Command::Commit {
        path: "/t".into(),
        holder: "w".into(),
        now_ms: 2,
        updates: vec![ChunkUpdate {
            chunk_id: chunk,
            length: 300_000,
            sealed: true,
        }],
        trim: false,
        release: false,
        seal: true,
        lease_until_ms: 0,
        drops: vec![],
        remove: vec![],
    })
    .unwrap();
    assert_eq!(
        kind(s.apply(&begin(vec![4, 5]))),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(s.apply(&begin(vec![4, 4, 5]))),
        ErrorKind::InvalidArgument
    );
    let group = s.apply(&begin(vec![4, 5, 6])).unwrap().chunk.unwrap();
    assert!(s.converting_on(group, 5) && !s.converting_on(group, 1));
    assert_eq!(
        kind(s.apply(&begin(vec![4, 5, 6]))),
        ErrorKind::AlreadyExists
    );
    // A stream too short for the chunk's blocks and index: no switch.
    s.apply(&Command::ConvertEnd {
        group_id: group,
        switch: true,
        stream: 10,
    })
    .unwrap();
    assert!(s.conversions().is_empty());
    assert_eq!(s.chunk(chunk).unwrap().1.servers, vec![1, 2, 3]);
    let group = s.apply(&begin(vec![4, 5, 6])).unwrap().chunk.unwrap();
    s.apply(&Command::ConvertEnd {
        group_id: group,
        switch: true,
        stream: 100_000,
    })
    .unwrap();
    assert!(!s.owns_chunk(chunk));
    let (_, g) = s.chunk(group).unwrap();
    assert_eq!((g.length, g.sealed), (300_000, true));
    assert_eq!(g.servers, vec![4, 5, 6]);
    let lz4 = g.ec.unwrap().lz4.unwrap();
    assert_eq!((lz4.stream, lz4.block), (100_000, LZ4_BLOCK));
    // Members hold the stream's stripes: 100 000 bytes in stripes of 128 KiB.
    assert_eq!(g.stored_length(), 64 << 10);
    // Once only.
    s.apply(&Command::ConvertEnd {
        group_id: group,
        switch: true,
        stream: 100_000,
    })
    .unwrap();
    assert_eq!(s.lookup("/t").unwrap().file().unwrap().chunks.len(), 1);
}

#[test]
fn namespace_operations() {
    let mut s = State::default();
    assert_eq!(
        kind(create(&mut s, "/a/f", None, 0)),
        ErrorKind::NotFound,
        "parent missing"
    );
    s.apply(&Command::Mkdir {
        path: "/a/b".into(),
        mode: None,
        parents: true,
        now_ms: 1,
        policy: None,
    })
    .unwrap();
    create(&mut s, "/a/f", Some("c1"), 2).unwrap();
    assert_eq!(
        kind(create(&mut s, "/a/f", None, 0)),
        ErrorKind::AlreadyExists
    );
    // The same writer's second create of a path it holds open is refused too: the masters
    // cannot tell it from a retry (they do not see appends to an open chunk, so "nothing
    // written yet" is not theirs to judge), and answering the file handed a second writer a
    // file the first was writing (RELIABILITY.md, session 48: an S3 pack removed while named).
    assert_eq!(
        kind(create(&mut s, "/a/f", Some("c1"), 2)),
        ErrorKind::AlreadyExists
    );
    assert_eq!(
        kind(create(&mut s, "/a/f/x", None, 0)),
        ErrorKind::NotADirectory
    );
    let names: Vec<_> = s
        .list("/a")
        .unwrap()
        .iter()
        .map(|i| i.name.clone())
        .collect();
    assert_eq!(names, ["b", "f"]);
    assert_eq!(
        kind(Ok(Reply::default()).and(s.list("/a/f").map(|_| Reply::default()))),
        ErrorKind::NotADirectory
    );
    // Rename a directory; the file moves with it. Not into itself.
    s.apply(&Command::Rename {
        from: "/a".into(),
        to: "/z".into(),
        now_ms: 2,
    })
    .unwrap();
    assert!(s.lookup("/z/f").is_ok());
    assert_eq!(
        kind(s.lookup("/a/f").map(|_| Reply::default())),
        ErrorKind::NotFound
    );
    assert_eq!(
        kind(s.apply(&Command::Rename {
            from: "/z".into(),
            to: "/z/b/c".into(),
            now_ms: 3
        })),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(s.apply(&Command::Delete { path: "/z".into() })),
        ErrorKind::DirectoryNotEmpty
    );
    let f = s.lookup("/z/f").unwrap().file().unwrap().clone();
    assert!(s.owns_chunk(f.chunks[0].id));
    s.apply(&Command::Delete {
        path: "/z/f".into(),
    })
    .unwrap();
    assert!(
        !s.owns_chunk(f.chunks[0].id),
        "deleted file's chunks are garbage"
    );
    // Snapshot round trip rebuilds the indexes.
    let mut back: State = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
    back.rebuild();
    assert_eq!(back.list("/z").unwrap().len(), 1);
    assert_eq!(back.dentries, s.dentries);
    assert_eq!(back.chunk_owner, s.chunk_owner);
    // A snapshot from before the inode table wrote the inodes as a map by id.
    let mut old = serde_json::to_value(&s).unwrap();
    let rows = old["inodes"].as_array().unwrap().clone();
    old["inodes"] = rows
        .iter()
        .map(|r| (r[0].to_string(), r[1].clone()))
        .collect::<serde_json::Map<_, _>>()
        .into();
    let mut older: State = serde_json::from_value(old).unwrap();
    older.rebuild();
    assert_eq!(older.inodes, s.inodes);
    assert_eq!(older.dentries, s.dentries);
}

/// A batch applies its commands in order, each alone: a failing one changes nothing and
/// does not stop the ones after it, and the result equals applying them one by one.
#[test]
fn batch_applies_each_command_on_its_own() {
    let mk = |path: &str| create_cmd(path, None, 1);
    let cmds = vec![
        mk("/a"),
        mk("/a"),
        mk("/missing/b"),
        Command::Delete { path: "/a".into() },
        mk("/c"),
        Command::Batch(vec![mk("/d")]),
        Command::Delete { path: "/zz".into() },
    ];
    let mut batched = State::default();
    let reply = batched.apply(&Command::Batch(cmds.clone())).unwrap();
    assert_eq!(reply.inode, None);
    let kinds: Vec<_> = reply
        .batch
        .iter()
        .map(|r| r.as_ref().err().map(|e| e.kind))
        .collect();
    assert_eq!(
        kinds,
        vec![
            None,
            Some(ErrorKind::AlreadyExists),
            Some(ErrorKind::NotFound),
            None,
            None,
            Some(ErrorKind::InvalidArgument),
            Some(ErrorKind::NotFound),
        ]
    );
    let mut one_by_one = State::default();
    let singles: Vec<Response> = cmds
        .iter()
        .filter(|c| !matches!(c, Command::Batch(_)))
        .map(|c| one_by_one.apply(c))
        .collect();
    let batched_singles: Vec<Response> = reply
        .batch
        .iter()
        .zip(&cmds)
        .filter(|(_, c)| !matches!(c, Command::Batch(_)))
        .map(|(r, _)| r.clone())
        .collect();
    assert_eq!(batched_singles, singles);
    assert_eq!(
        serde_json::to_string(&batched).unwrap(),
        serde_json::to_string(&one_by_one).unwrap(),
        "same state either way"
    );
    assert!(batched.lookup("/c").is_ok() && batched.lookup("/a").is_err());
}

#[test]
fn leases_and_commits() {
    let mut s = State::default();
    let f = create(&mut s, "/f", Some("w1"), 2).unwrap().inode.unwrap();
    let chunks = f.file().unwrap().chunks.clone();
    assert_eq!(chunks.len(), 2);
    assert_ne!(chunks[0].id, chunks[1].id);
    let open = |s: &mut State, who: &str, now| {
        s.apply(&Command::OpenWrite {
            path: "/f".into(),
            now_ms: now,
            lease: Lease {
                holder: who.into(),
                expires_ms: now + 10_000,
            },
            placements: vec![],
            groups: false,
            continue_below: 0,
        })
    };
    assert_eq!(kind(open(&mut s, "w2", 5_000)), ErrorKind::LeaseHeld);
    let commit = |s: &mut State, who: &str, len, sealed, trim, release| {
        s.apply(&Command::Commit {
            path: "/f".into(),
            holder: who.into(),
            now_ms: 6_000,
            updates: vec![ChunkUpdate {
                chunk_id: chunks[0].id,
                length: len,
                sealed,
            }],
            trim,
            release,
            seal: false,
            lease_until_ms: 16_000,
            drops: vec![],
            remove: Vec::new(),
        })
    };
    assert_eq!(
        kind(commit(&mut s, "w2", 10, false, false, false)),
        ErrorKind::LeaseLost
    );
    commit(&mut s, "w1", 100, false, false, false).unwrap();
    assert_eq!(
        kind(commit(&mut s, "w1", 50, false, false, false)),
        ErrorKind::InvalidArgument,
        "no shrinking"
    );
    let r = commit(&mut s, "w1", 100, true, true, true)
        .unwrap()
        .inode
        .unwrap();
    let fm = r.file().unwrap();
    assert_eq!(fm.chunks.len(), 1, "trim drops the unused spare");
    assert!(!s.owns_chunk(chunks[1].id));
    assert_eq!(fm.committed_length(), 100);
    assert!(fm.lease.is_none());
    // Lease released: another writer may open; an expired lease may be taken too.
    open(&mut s, "w2", 7_000).unwrap();
    open(&mut s, "w3", 20_000).unwrap();
    assert_eq!(
        kind(commit(&mut s, "w2", 100, true, false, false)),
        ErrorKind::LeaseLost
    );
}

#[test]
fn a_directory_lists_in_pages_after_a_name() {
    let mut s = State::default();
    s.apply(&Command::Mkdir {
        path: "/d".into(),
        parents: true,
        now_ms: 1,
        policy: None,
        mode: None,
    })
    .unwrap();
    for i in 0..5 {
        create(&mut s, &format!("/d/f{i}"), None, 0).unwrap();
    }
    let names = |page: &[Arc<Inode>]| page.iter().map(|i| i.name.clone()).collect::<Vec<_>>();
    let (p, more) = s.list_page("/d", "", 2).unwrap();
    assert_eq!((names(&p), more), (vec!["f0".into(), "f1".into()], true));
    let (p, more) = s.list_page("/d", "f1", 2).unwrap();
    assert_eq!((names(&p), more), (vec!["f2".into(), "f3".into()], true));
    // After a name that is not there: the names after it.
    let (p, more) = s.list_page("/d", "f35", 5).unwrap();
    assert_eq!((names(&p), more), (vec!["f4".into()], false));
    let (p, more) = s.list_page("/d", "f4", 5).unwrap();
    assert!(p.is_empty() && !more);
    // Exactly the limit left: no more.
    let (p, more) = s.list_page("/d", "f2", 2).unwrap();
    assert_eq!((p.len(), more), (2, false));
    assert_eq!(
        kind(Err(s.list_page("/d/f0", "", 1).unwrap_err())),
        ErrorKind::NotADirectory
    );
}
