//! Every control-plane request a client or chunkserver can send, from arbitrary bytes: the
//! protobuf decode, the validation in `cairn_master::convert`, and — for what validates — the
//! state machine applying it. Also the masters' Raft messages (JSON bodies of `Raft.Call`).
//! Never panics; a state machine stays consistent.
#![no_main]
use cairn_master::convert;
use cairn_master::state::{Actor, Command, Lease, State};
use cairn_master::store::TypeConfig;
use cairn_rpc::pb;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    let mut st = State::default();
    match kind % 13 {
        0 => {
            if let Ok(r) = pb::CreateRequest::decode(body)
                && let (Ok(path), Ok(policy), Ok(n)) =
                    (convert::path(&r.path), convert::policy(r.policy.as_ref()), convert::chunk_count(r.chunks))
            {
                // An EC policy gets chunk groups, a server per member.
                let groups = policy.direct_ec().is_some();
                let width = policy.direct_ec().map_or(3, |e| u64::from(e.k) + u64::from(e.m));
                let cmd = Command::Create {
                    path,
                    policy,
                    parents: r.parents,
                    now_ms: 1,
                    lease: convert::client_id(&r.client_id).ok().map(|holder| Lease { holder, expires_ms: 2 }),
                    placements: vec![(1..=width).collect(); n],
                    groups,
                    mode: convert::mode(r.mode).ok().flatten(),
                };
                if let Ok(reply) = st.apply(&cmd) {
                    let ino = reply.inode.expect("create returns the inode");
                    let _ = convert::file_reply(&st, &ino);
                }
            }
        }
        1 => {
            if let Ok(r) = pb::CommitRequest::decode(body)
                && let (Ok(path), Ok(holder), Ok(updates), Ok(drops), Ok(remove)) = (
                    convert::path(&r.path),
                    convert::client_id(&r.client_id),
                    convert::updates(&r.updates),
                    convert::drops(&r.drops),
                    convert::remove(&r.remove),
                )
            {
                // Against a file this writer holds, with chunks 1 and 2 on servers 1..=3.
                let _ = st.apply(&Command::Create {
                    path: path.clone(),
                    policy: convert::policy(None).expect("default policy"),
                    parents: true,
                    now_ms: 1,
                    lease: Some(Lease { holder: holder.clone(), expires_ms: 10 }),
                    placements: vec![vec![1, 2, 3]; 2],
                    groups: false,
                    mode: None,
                });
                let _ = st.apply(&Command::Commit {
                    path,
                    holder,
                    now_ms: 2,
                    updates,
                    trim: r.trim,
                    release: r.release,
                    seal: r.seal,
                    lease_until_ms: 5,
                    drops,
                    remove,
                });
                for c in st.chunks() {
                    assert!(!c.servers.is_empty(), "a chunk lost its last location");
                }
            }
        }
        2 => {
            if let Ok(r) = pb::RegisterRequest::decode(body)
                && let Ok(rec) = convert::server_record(&r)
            {
                st.apply(&Command::Register { server: rec }).expect("valid record registers");
            }
        }
        3 => {
            if let Ok(r) = pb::HeartbeatRequest::decode(body) {
                let _ = convert::heartbeat(&r);
            }
        }
        4 => {
            if let Ok(r) = pb::MkdirRequest::decode(body)
                && let Ok(path) = convert::path(&r.path)
            {
                let _ = st.apply(&Command::Mkdir {
                    path: path.clone(),
                    parents: r.parents,
                    now_ms: 1,
                    policy: r.policy.as_ref().and_then(|p| convert::policy(Some(p)).ok()),
                    mode: convert::mode(r.mode).ok().flatten(),
                });
                let _ = st.list(&path);
            }
        }
        5 => {
            if let Ok(r) = pb::RenameRequest::decode(body)
                && let (Ok(from), Ok(to)) = (convert::path(&r.from), convert::path(&r.to))
            {
                let _ = st.apply(&Command::Mkdir { path: from.clone(), parents: true, now_ms: 1, policy: None, mode: None });
                let _ = st.apply(&Command::Rename { from, to, now_ms: 2 });
            }
        }
        6 => {
            if let Ok(r) = pb::LocateRequest::decode(body) {
                let _ = convert::locate(&r);
            }
        }
        8 => {
            // A user's change of bits or owner, over a tree the cluster made (theirs below /u).
            if let Ok(r) = pb::SetAttrRequest::decode(body)
                && let (Ok(path), Ok(mode)) = (convert::path(&r.path), convert::mode(r.mode))
            {
                let mk = |path: &str| Command::Mkdir { path: path.into(), parents: true, now_ms: 1, policy: None, mode: None };
                st.apply(&mk("/u/d")).expect("mkdir");
                st.apply(&Command::SetAttr { path: "/u".into(), mode: None, owner: Some("u".into()) }).expect("chown");
                let _ = st.apply(&mk(&path));
                let user = Actor { user: "u".into(), admin: false };
                let chown = r.owner.is_some();
                let r2 = st.apply(&Command::As { actor: user, cmd: Box::new(Command::SetAttr { path: path.clone(), mode, owner: r.owner }) });
                // Only the owner changes bits (everything but /u is the cluster's), only an
                // admin the owner.
                if r2.is_ok() {
                    assert!(path == "/u" && !chown, "{path}: a user changed what is not theirs");
                }
            }
        }
        9 => {
            if let Ok(r) = pb::AllocateRequest::decode(body) {
                let _ = (convert::path(&r.path), convert::exclude(&r.exclude));
            }
        }
        10 => {
            if let Ok(r) = pb::ConfigRequest::decode(body)
                && let Ok(config) = convert::config(&r, st.config())
            {
                st.apply(&Command::SetConfig { config }).expect("valid config applies");
            }
        }
        11 => {
            // A batch: what validates of it goes into one Batch command, applied in order.
            if let Ok(r) = pb::BatchRequest::decode(body)
                && convert::batch_len(r.ops.len()).is_ok()
            {
                use pb::batch_op::Op;
                let cmds: Vec<Command> = r
                    .ops
                    .iter()
                    .filter_map(|op| match op.op.as_ref()? {
                        Op::Create(c) => Some(Command::Create {
                            path: convert::path(&c.path).ok()?,
                            policy: convert::policy(c.policy.as_ref()).ok()?,
                            parents: c.parents,
                            now_ms: 1,
                            lease: None,
                            placements: vec![vec![1, 2, 3]; convert::chunk_count(c.chunks).ok()?],
                            groups: false,
                            mode: convert::mode(c.mode).ok().flatten(),
                        }),
                        Op::Commit(c) => Some(Command::Commit {
                            path: convert::path(&c.path).ok()?,
                            holder: convert::client_id(&c.client_id).ok()?,
                            now_ms: 2,
                            updates: convert::updates(&c.updates).ok()?,
                            trim: c.trim,
                            release: c.release,
                            seal: c.seal,
                            lease_until_ms: 5,
                            drops: convert::drops(&c.drops).ok()?,
                            remove: convert::remove(&c.remove).ok()?,
                        }),
                        Op::Delete(d) => Some(Command::Delete { path: convert::path(&d.path).ok()? }),
                        Op::Object(b) => Some(Command::Object(Box::new(cairn_rpc::object::decode(b).ok()?))),
                        // The file service's changes (docs/files.md): any JSON that decodes,
                        // applied as the masters apply it.
                        Op::Fs(b) => Some(Command::Files(Box::new(cairn_rpc::files::decode(b).ok()?))),
                    })
                    // An odd body: every command on behalf of a user who owns nothing (checked
                    // against the permission bits as it applies).
                    .map(|c| {
                        if body.len() % 2 == 1 {
                            Command::As { actor: Actor { user: "u".into(), admin: false }, cmd: Box::new(c) }
                        } else {
                            c
                        }
                    })
                    .collect();
                let n = cmds.len();
                let reply = st.apply(&Command::Batch(cmds)).expect("a batch itself applies");
                assert_eq!(reply.batch.len(), n, "one result per command");
            }
        }
        7 => {
            let _ = serde_json::from_slice::<openraft::raft::AppendEntriesRequest<TypeConfig>>(body);
        }
        12 => {
            // A page of a directory holding a few entries: in name order, after the cursor,
            // at most the limit.
            if let Ok(r) = pb::ListRequest::decode(body)
                && let Ok(path) = convert::path(&r.path)
            {
                let _ = st.apply(&Command::Mkdir { path: path.clone(), parents: true, now_ms: 1, policy: None, mode: None });
                for name in ["a", "b", "c"] {
                    let _ = st.apply(&Command::Mkdir { path: format!("{path}/{name}"), parents: false, now_ms: 1, policy: None, mode: None });
                }
                let limit = (r.limit as usize).min(cairn_rpc::LIST_PAGE_MAX as usize);
                if let Ok((page, more)) = st.list_page(&path, &r.after, limit) {
                    assert!(page.len() <= limit);
                    assert!(page.windows(2).all(|w| w[0].name < w[1].name));
                    assert!(r.after.is_empty() || page.iter().all(|i| i.name.as_str() > r.after.as_str()));
                    assert!(!more || page.len() == limit);
                }
            }
        }
        _ => {
            let _ = serde_json::from_slice::<openraft::raft::VoteRequest<TypeConfig>>(body);
            let _ = pb::RaftMessage::decode(body);
        }
    }
});
