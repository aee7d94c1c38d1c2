//! Records of older versions of `inodes` and `txns` (docs/formats/master-state.md, "Changing
//! a record type"): their types, kept to decode what older masters wrote, and their
//! conversion to the current version.

use super::{INODES, TXNS};
use crate::state::{Inode, InodeId};

/// The fields every version of `inodes` starts with; version 1 is only these.
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct Head {
    id: InodeId,
    parent: InodeId,
    name: String,
    ctime_ms: u64,
    mtime_ms: u64,
    kind: crate::state::Kind,
    owner: String,
    mode: u16,
}

impl Head {
    fn with(self, posix: Option<Box<crate::state::Posix>>) -> Inode {
        Inode {
            id: self.id,
            parent: self.parent,
            name: self.name,
            ctime_ms: self.ctime_ms,
            mtime_ms: self.mtime_ms,
            kind: self.kind,
            owner: self.owner,
            mode: self.mode,
            posix,
        }
    }
}

/// [`Inode`] as version 1 of `inodes` stored it: the same fields but `posix`.
type InodeV1 = Head;

impl From<InodeV1> for Inode {
    fn from(i: InodeV1) -> Self {
        i.with(None)
    }
}

/// [`Inode`] as version 2 stored it: `posix` without `xattrs` (postcard writes a tuple
/// struct's fields in order, as a struct's: the same bytes as the fields in one struct).
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct InodeV2(Head, Option<Box<PosixV2>>);

/// [`crate::state::Posix`] as version 2 of `inodes` stored it: the same fields but `xattrs`.
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct PosixV2 {
    kind: cairn_rpc::files::NodeType,
    uid: u32,
    gid: u32,
    nlink: u32,
    size: u64,
    atime: cairn_rpc::files::Time,
    mtime: cairn_rpc::files::Time,
    ctime: cairn_rpc::files::Time,
    rdev: u32,
    target: String,
    extents: Option<Vec<cairn_rpc::files::Extent>>,
}

impl From<InodeV2> for Inode {
    fn from(InodeV2(head, posix): InodeV2) -> Self {
        InodeV3(
            head,
            posix.map(|p| {
                Box::new(PosixV3 {
                    kind: p.kind,
                    uid: p.uid,
                    gid: p.gid,
                    nlink: p.nlink,
                    size: p.size,
                    atime: p.atime,
                    mtime: p.mtime,
                    ctime: p.ctime,
                    rdev: p.rdev,
                    target: p.target,
                    extents: p.extents,
                    xattrs: Default::default(),
                })
            }),
        )
        .into()
    }
}

/// [`Inode`] as version 3 stored it: `posix` without `link` and `links` (hard links).
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct InodeV3(Head, Option<Box<PosixV3>>);

/// [`crate::state::Posix`] as version 3 of `inodes` stored it: the same fields but `link`
/// and `links`.
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct PosixV3 {
    kind: cairn_rpc::files::NodeType,
    uid: u32,
    gid: u32,
    nlink: u32,
    size: u64,
    atime: cairn_rpc::files::Time,
    mtime: cairn_rpc::files::Time,
    ctime: cairn_rpc::files::Time,
    rdev: u32,
    target: String,
    extents: Option<Vec<cairn_rpc::files::Extent>>,
    xattrs: std::collections::BTreeMap<String, Vec<u8>>,
}

impl From<InodeV3> for Inode {
    fn from(InodeV3(head, posix): InodeV3) -> Self {
        head.with(posix.map(|p| {
            Box::new(crate::state::Posix {
                kind: p.kind,
                uid: p.uid,
                gid: p.gid,
                nlink: p.nlink,
                size: p.size,
                atime: p.atime,
                mtime: p.mtime,
                ctime: p.ctime,
                rdev: p.rdev,
                target: p.target,
                extents: p.extents,
                xattrs: p.xattrs,
                link: 0,
                links: Vec::new(),
                hold: None,
            })
        }))
    }
}

/// [`Inode`] as version 4 stored it: `posix` without `hold` (a directory's).
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct InodeV4(Head, Option<Box<PosixV4>>);

/// [`crate::state::Posix`] as version 4 of `inodes` stored it: the same fields but `hold`.
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct PosixV4 {
    kind: cairn_rpc::files::NodeType,
    uid: u32,
    gid: u32,
    nlink: u32,
    size: u64,
    atime: cairn_rpc::files::Time,
    mtime: cairn_rpc::files::Time,
    ctime: cairn_rpc::files::Time,
    rdev: u32,
    target: String,
    extents: Option<Vec<cairn_rpc::files::Extent>>,
    xattrs: std::collections::BTreeMap<String, Vec<u8>>,
    link: InodeId,
    links: Vec<InodeId>,
}

impl From<InodeV4> for Inode {
    fn from(InodeV4(head, posix): InodeV4) -> Self {
        head.with(posix.map(|p| {
            Box::new(crate::state::Posix {
                kind: p.kind,
                uid: p.uid,
                gid: p.gid,
                nlink: p.nlink,
                size: p.size,
                atime: p.atime,
                mtime: p.mtime,
                ctime: p.ctime,
                rdev: p.rdev,
                target: p.target,
                extents: p.extents,
                xattrs: p.xattrs,
                link: p.link,
                links: p.links,
                hold: None,
            })
        }))
    }
}

/// An inode record of an older version (1 to 4), as a current one.
fn old_inode(bytes: &[u8]) -> Result<Inode, crate::kv::RecordError> {
    use crate::kv::codec::decode_record;
    Ok(match bytes.first() {
        Some(1) => decode_record::<InodeV1>(INODES.name, 1, bytes)?.into(),
        Some(2) => decode_record::<InodeV2>(INODES.name, 2, bytes)?.into(),
        Some(3) => decode_record::<InodeV3>(INODES.name, 3, bytes)?.into(),
        _ => decode_record::<InodeV4>(INODES.name, 4, bytes)?.into(),
    })
}

/// A record of `inodes` of versions 1 to 4 as the current version (see
/// [`crate::kv::upgrade`]).
///
/// # Errors
/// The bytes are not a record of versions 1 to 4.
pub fn inode_from_old(bytes: &[u8]) -> Result<Vec<u8>, crate::kv::RecordError> {
    Ok(crate::kv::codec::encode_record(
        INODES.version,
        &old_inode(bytes)?,
    ))
}

/// The `txns` cell as versions 1 to 4 stored it: decisions carry inodes of that version.
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct TxnsOld<I> {
    next: u64,
    open: std::collections::BTreeMap<u64, IntentOld<I>>,
}

#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct IntentOld<I> {
    from: String,
    to: String,
    src: crate::state::partitions::PartitionId,
    dst: crate::state::partitions::PartitionId,
    started_ms: u64,
    decision: Option<DecisionOld<I>>,
}

#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
enum DecisionOld<I> {
    Commit(Box<I>),
    Abort,
}

impl<I: Into<Inode>> TxnsOld<I> {
    fn current(self) -> crate::state::txn::Txns {
        use crate::state::txn::{Decision, Intent, Txns};
        Txns {
            next: self.next,
            open: self
                .open
                .into_iter()
                .map(|(id, i)| {
                    let decision = i.decision.map(|d| match d {
                        DecisionOld::Commit(ino) => Decision::Commit(Box::new((*ino).into())),
                        DecisionOld::Abort => Decision::Abort,
                    });
                    let intent = Intent {
                        from: i.from,
                        to: i.to,
                        src: i.src,
                        dst: i.dst,
                        started_ms: i.started_ms,
                        decision,
                    };
                    (id, intent)
                })
                .collect(),
        }
    }
}

/// A `txns` cell of versions 1 to 4 as the current version.
///
/// # Errors
/// The bytes are not a record of versions 1 to 4.
pub fn txns_from_old(bytes: &[u8]) -> Result<Vec<u8>, crate::kv::RecordError> {
    use crate::kv::codec::decode_record;
    let txns = match bytes.first() {
        Some(1) => decode_record::<TxnsOld<InodeV1>>(TXNS.name, 1, bytes)?.current(),
        Some(2) => decode_record::<TxnsOld<InodeV2>>(TXNS.name, 2, bytes)?.current(),
        Some(3) => decode_record::<TxnsOld<InodeV3>>(TXNS.name, 3, bytes)?.current(),
        _ => decode_record::<TxnsOld<InodeV4>>(TXNS.name, 4, bytes)?.current(),
    };
    Ok(crate::kv::codec::encode_record(TXNS.version, &txns))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Version 1 inodes and `txns` (from before the file service), version 2 ones (before
    /// xattrs), version 3 ones (before hard links) and version 4 ones (before directory
    /// holds) convert to version 5 with the fields they lack empty and the rest the same;
    /// version 5 bytes are not converted.
    #[test]
    fn inodes_and_txns_of_versions_1_to_4_convert_to_version_5() {
        use crate::kv::codec::{decode_record, encode_record};
        use cairn_rpc::files::{Extent, NodeType, Time};
        let v1 = || InodeV1 {
            id: 42,
            parent: 1,
            name: "f".into(),
            ctime_ms: 3,
            mtime_ms: 4,
            kind: crate::state::Kind::Dir,
            owner: "alice".into(),
            mode: 0o750,
        };
        let bytes = inode_from_old(&encode_record(1, &v1())).unwrap();
        assert_eq!(bytes[0], 5);
        let ino: Inode = decode_record("inodes", 5, &bytes).unwrap();
        assert_eq!(ino, Inode::from(v1()));
        assert_eq!((ino.id, ino.owner.as_str(), ino.mode), (42, "alice", 0o750));
        assert!(ino.posix.is_none());
        assert!(
            inode_from_old(&bytes).is_err(),
            "version 5 is not converted"
        );
        let v2 = || {
            let head = Head {
                id: 43,
                parent: 1,
                name: "g".into(),
                ctime_ms: 5,
                mtime_ms: 6,
                kind: crate::state::Kind::Dir,
                owner: "bob".into(),
                mode: 0o640,
            };
            InodeV2(
                head,
                Some(Box::new(PosixV2 {
                    kind: NodeType::Regular,
                    uid: 7,
                    gid: 8,
                    nlink: 1,
                    size: 9,
                    atime: Time { secs: 1, nanos: 2 },
                    mtime: Time { secs: 3, nanos: 4 },
                    ctime: Time { secs: 5, nanos: 6 },
                    rdev: 0,
                    target: String::new(),
                    extents: Some(vec![Extent {
                        offset: 0,
                        len: 9,
                        seg: 11,
                        seg_offset: 32,
                    }]),
                })),
            )
        };
        let v3 = || {
            let InodeV2(head, p) = v2();
            let p = p.unwrap();
            InodeV3(
                head,
                Some(Box::new(PosixV3 {
                    kind: p.kind,
                    uid: p.uid,
                    gid: p.gid,
                    nlink: p.nlink,
                    size: p.size,
                    atime: p.atime,
                    mtime: p.mtime,
                    ctime: p.ctime,
                    rdev: p.rdev,
                    target: p.target,
                    extents: p.extents,
                    xattrs: [("user.a".to_owned(), b"v".to_vec())].into(),
                })),
            )
        };
        let v4 = || {
            let InodeV3(head, p) = v3();
            let p = p.unwrap();
            InodeV4(
                head,
                Some(Box::new(PosixV4 {
                    kind: p.kind,
                    uid: p.uid,
                    gid: p.gid,
                    nlink: 2,
                    size: p.size,
                    atime: p.atime,
                    mtime: p.mtime,
                    ctime: p.ctime,
                    rdev: p.rdev,
                    target: p.target,
                    extents: p.extents,
                    xattrs: p.xattrs,
                    link: 0,
                    links: vec![44],
                })),
            )
        };
        // The old layouts are today's without the fields added since, each the last: a
        // version 1 record is a version 5 one without `posix` (`00`: none), a version 2
        // record one without `xattrs`, `link`, `links` and `hold` (`00 00 00 00`: empty, 0,
        // empty, none), a version 3 one without `link`, `links` and `hold`, a version 4 one
        // without `hold` — so these types read what older masters wrote, not only what they
        // themselves write.
        let now = |i: Inode| encode_record(5, &i);
        let (old1, new1) = (encode_record(1, &v1()), now(Inode::from(v1())));
        assert_eq!(
            (&old1[1..], new1.last()),
            (&new1[1..new1.len() - 1], Some(&0))
        );
        let (old2, new2) = (encode_record(2, &v2()), now(Inode::from(v2())));
        assert_eq!(
            (&old2[1..], &new2[new2.len() - 4..]),
            (&new2[1..new2.len() - 4], &[0u8, 0, 0, 0][..])
        );
        let (old3, new3) = (encode_record(3, &v3()), now(Inode::from(v3())));
        assert_eq!(
            (&old3[1..], &new3[new3.len() - 3..]),
            (&new3[1..new3.len() - 3], &[0u8, 0, 0][..])
        );
        let (old4, new4) = (encode_record(4, &v4()), now(Inode::from(v4())));
        assert_eq!(
            (&old4[1..], new4.last()),
            (&new4[1..new4.len() - 1], Some(&0))
        );
        let ino: Inode = decode_record("inodes", 5, &inode_from_old(&old4).unwrap()).unwrap();
        let p = ino.posix.as_ref().unwrap();
        assert_eq!(
            (p.nlink, p.links.as_slice(), p.hold.is_none()),
            (2, &[44][..], true)
        );
        let ino: Inode = decode_record("inodes", 5, &inode_from_old(&old3).unwrap()).unwrap();
        let p = ino.posix.as_ref().unwrap();
        assert_eq!((p.xattrs.len(), p.link, p.links.len()), (1, 0, 0));
        let bytes = inode_from_old(&encode_record(2, &v2())).unwrap();
        let ino: Inode = decode_record("inodes", 5, &bytes).unwrap();
        assert_eq!(ino, Inode::from(v2()));
        let p = ino.posix.as_ref().unwrap();
        assert_eq!((p.uid, p.gid, p.size, p.mtime.nanos), (7, 8, 9, 4));
        assert_eq!(p.extents.as_ref().unwrap()[0].seg, 11);
        assert!(p.xattrs.is_empty());
        fn txns<I>(ino: I) -> TxnsOld<I> {
            TxnsOld {
                next: 9,
                open: [(
                    8,
                    IntentOld {
                        from: "/a".into(),
                        to: "/p/a".into(),
                        src: 0,
                        dst: 1,
                        started_ms: 5,
                        decision: Some(DecisionOld::Commit(Box::new(ino))),
                    },
                )]
                .into(),
            }
        }
        let decided = |bytes: &[u8]| {
            let t: crate::state::txn::Txns = decode_record("txns", 5, bytes).unwrap();
            assert_eq!(t.next, 9);
            match &t.open[&8].decision {
                Some(crate::state::txn::Decision::Commit(i)) => (**i).clone(),
                other => panic!("{other:?}"),
            }
        };
        let from_1 = txns_from_old(&encode_record(1, &txns(v1()))).unwrap();
        assert_eq!(decided(&from_1), Inode::from(v1()));
        let from_2 = txns_from_old(&encode_record(2, &txns(v2()))).unwrap();
        assert_eq!(decided(&from_2), Inode::from(v2()));
        let from_3 = txns_from_old(&encode_record(3, &txns(v3()))).unwrap();
        assert_eq!(decided(&from_3), Inode::from(v3()));
        assert!(
            txns_from_old(&from_3).is_err(),
            "version 5 is not converted"
        );
    }
}
