//! Keys and records of the masters' on-disk store (docs/formats/master-state.md).
//!
//! A key encodes so that comparing the bytes (what redb does) orders keys as Rust's `Ord` does:
//! integers big-endian, a string that ends the key as its UTF-8 bytes, a string followed by
//! more key as its bytes with `00` escaped to `00 FF` and a `00 00` terminator. A record is one
//! version byte and the record's postcard encoding (postcard 1.x wire format).

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why bytes read from the store are not a key or record of the expected kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("empty record")]
    Empty,
    #[error("record version {found}, this master reads version {expected} ({table})")]
    Version {
        table: &'static str,
        found: u8,
        expected: u8,
    },
    #[error("record body does not decode ({table}): {reason}")]
    Body { table: &'static str, reason: String },
    #[error("key does not decode: {0}")]
    Key(&'static str),
}

/// A table key: encodes to bytes whose order is the key's order.
pub trait Key: Ord + std::hash::Hash + Clone + Send + Sync + std::fmt::Debug + 'static {
    fn encode(&self, out: &mut Vec<u8>);
    fn decode(bytes: &[u8]) -> Result<Self, RecordError>;

    fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(24);
        self.encode(&mut v);
        v
    }
}

// Keys are big-endian so that byte order is numeric order (redb compares `&[u8]` keys as
// bytes); every other integer on disk is little-endian.
#[allow(clippy::big_endian_bytes)]
impl Key for u64 {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_be_bytes());
    }

    fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let b: [u8; 8] = bytes
            .try_into()
            .map_err(|_| RecordError::Key("u64 is 8 bytes"))?;
        Ok(u64::from_be_bytes(b))
    }
}

impl Key for String {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }

    fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        String::from_utf8(bytes.to_vec()).map_err(|_| RecordError::Key("string is not UTF-8"))
    }
}

/// `(u64, String)`: the number, then the string's bytes.
impl Key for (u64, String) {
    fn encode(&self, out: &mut Vec<u8>) {
        self.0.encode(out);
        self.1.encode(out);
    }

    fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        if bytes.len() < 8 {
            return Err(RecordError::Key("(u64, string) is at least 8 bytes"));
        }
        Ok((u64::decode(&bytes[..8])?, String::decode(&bytes[8..])?))
    }
}

/// A string that is not last in a key: every `00` written `00 FF`, then `00 00`.
fn encode_escaped(s: &str, out: &mut Vec<u8>) {
    for &b in s.as_bytes() {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&[0, 0]);
}

/// The escaped string at the start of `bytes`, and the bytes after its terminator.
fn decode_escaped(bytes: &[u8]) -> Result<(String, &[u8]), RecordError> {
    let mut first = Vec::new();
    let mut i = 0;
    loop {
        match (bytes.get(i), bytes.get(i + 1)) {
            (Some(0), Some(0)) => break,
            (Some(0), Some(0xFF)) => {
                first.push(0);
                i += 2;
            }
            (Some(0), _) => return Err(RecordError::Key("bad escape in a key string")),
            (Some(&b), _) => {
                first.push(b);
                i += 1;
            }
            (None, _) => return Err(RecordError::Key("key string is not terminated")),
        }
    }
    let first = String::from_utf8(first).map_err(|_| RecordError::Key("not UTF-8"))?;
    Ok((first, &bytes[i + 2..]))
}

/// `(String, String)`: the first string escaped and terminated, then the second's bytes.
impl Key for (String, String) {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_escaped(&self.0, out);
        self.1.encode(out);
    }

    fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let (first, rest) = decode_escaped(bytes)?;
        Ok((first, String::decode(rest)?))
    }
}

/// `(String, u32)`: the string escaped and terminated, then the number big-endian (4 bytes).
#[allow(clippy::big_endian_bytes)]
impl Key for (String, u32) {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_escaped(&self.0, out);
        out.extend_from_slice(&self.1.to_be_bytes());
    }

    fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let (first, rest) = decode_escaped(bytes)?;
        let n: [u8; 4] = rest
            .try_into()
            .map_err(|_| RecordError::Key("u32 is 4 bytes"))?;
        Ok((first, u32::from_be_bytes(n)))
    }
}

/// The unit key: tables of one row.
impl Key for () {
    fn encode(&self, _: &mut Vec<u8>) {}

    fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        bytes
            .is_empty()
            .then_some(())
            .ok_or(RecordError::Key("the unit key is empty"))
    }
}

/// A record: serde-derived, stored as `version byte ‖ postcard`.
pub trait Record: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {}
impl<T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static> Record for T {}

pub fn encode_record<V: Serialize>(version: u8, v: &V) -> Vec<u8> {
    let mut out = vec![version];
    // Serializing into a Vec cannot fail for the types stored here (no maps with non-string
    // keys that postcard refuses, no `skip_serializing_if`): a failure is a bug, not data.
    postcard::to_io(v, &mut out).expect("a record serializes");
    out
}

pub fn decode_record<V: DeserializeOwned>(
    table: &'static str,
    version: u8,
    bytes: &[u8],
) -> Result<V, RecordError> {
    let (&found, body) = bytes.split_first().ok_or(RecordError::Empty)?;
    if found != version {
        return Err(RecordError::Version {
            table,
            found,
            expected: version,
        });
    }
    let (v, rest) = postcard::take_from_bytes(body).map_err(|e| RecordError::Body {
        table,
        reason: e.to_string(),
    })?;
    if !rest.is_empty() {
        return Err(RecordError::Body {
            table,
            reason: format!("{} bytes after the record", rest.len()),
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip<K: Key>(k: K) -> Vec<u8> {
        let b = k.to_bytes();
        assert_eq!(K::decode(&b).unwrap(), k);
        b
    }

    /// The keys' byte strings sort as the keys do.
    fn assert_byte_order<K: Key + Ord + Clone + std::fmt::Debug>(keys: Vec<K>) {
        let mut by_bytes: Vec<_> = keys.iter().map(|k| (roundtrip(k.clone()), k)).collect();
        by_bytes.sort();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(
            by_bytes.iter().map(|(_, k)| *k).collect::<Vec<_>>(),
            sorted.iter().collect::<Vec<_>>()
        );
    }

    #[test]
    fn key_bytes_order_as_keys_do() {
        let mut keys: Vec<(String, String)> = Vec::new();
        for a in ["", "a", "a\0", "a\0b", "ab", "b", "\u{ff}"] {
            for b in ["", "\0", "x", "x\0y", "y"] {
                keys.push((a.to_owned(), b.to_owned()));
            }
        }
        assert_byte_order(keys);
        let mut pairs: Vec<(u64, String)> = Vec::new();
        for n in [0u64, 1, 255, 256, u64::MAX - 1, u64::MAX] {
            for s in ["", "a", "ab", "b"] {
                pairs.push((n, s.to_owned()));
            }
        }
        assert_byte_order(pairs);
        let mut parts: Vec<(String, u32)> = Vec::new();
        for s in ["", "a", "a\0", "ab"] {
            for n in [0u32, 1, 255, 256, 10_000, u32::MAX] {
                parts.push((s.to_owned(), n));
            }
        }
        assert_byte_order(parts);
    }

    /// Records round-trip whatever their fields hold: a `skip_serializing_if` on a stored type
    /// would drop a field postcard's decoder still expects (it has no field names).
    #[test]
    fn stored_types_round_trip_with_empty_and_full_fields() {
        use cairn_rpc::object::{Extent, ObjectMeta};
        fn rt<V: Record + PartialEq + std::fmt::Debug>(v: V) {
            let b = encode_record(1, &v);
            assert_eq!(decode_record::<V>("t", 1, &b).unwrap(), v);
        }
        rt(ObjectMeta::default());
        rt(ObjectMeta {
            size: 5,
            etag: "e".into(),
            mtime_ms: 9,
            put_id: "p".into(),
            headers: [("content-type".into(), "x".into())].into(),
            user_meta: [("a".into(), "b".into())].into(),
            checksums: [("CRC32C".into(), "AAAA".into())].into(),
            extents: vec![Extent {
                path: "/.s3/x".into(),
                offset: 1,
                len: 5,
                shared: true,
            }],
            part_sizes: vec![5],
            checksum_type: Some("COMPOSITE".into()),
            part_checksums: vec!["q".into()],
        });
        use crate::state::objects::buckets::Placement;
        rt(Placement::default());
        rt(Placement {
            shards: vec![1, 7],
            closing: true,
        });
        // An inode without and with the file service's attributes.
        use crate::state::{Inode, Kind, Posix};
        use cairn_rpc::files::{Extent as FsExtent, NodeType, Time};
        let ino = |posix| Inode {
            id: 9,
            parent: 1,
            name: "f".into(),
            ctime_ms: 1,
            mtime_ms: 2,
            kind: Kind::Dir,
            owner: String::new(),
            mode: 0o755,
            posix,
        };
        rt(ino(None));
        rt(ino(Some(Box::new(Posix {
            kind: NodeType::Symlink,
            uid: 1,
            gid: 2,
            nlink: 3,
            size: 4,
            atime: Time { secs: -1, nanos: 1 },
            mtime: Time { secs: 5, nanos: 6 },
            ctime: Time { secs: 7, nanos: 8 },
            rdev: 9,
            target: "t".into(),
            extents: Some(vec![FsExtent {
                offset: 1,
                len: 2,
                seg: 3,
                seg_offset: 4,
            }]),
            xattrs: [("user.a".to_string(), vec![0, 1, 2])].into(),
            link: 10,
            links: vec![11, 12],
            hold: Some(crate::state::Lease {
                holder: "m".into(),
                expires_ms: 13,
            }),
        }))));
        // The tails docs/formats/master-state.md shows: no links and not held; a link entry
        // 42; a directory held for `m1` until 10 000 ms.
        let tail = |link, links: Vec<u64>, hold: Option<crate::state::Lease>| {
            let p = Posix {
                kind: NodeType::Directory,
                uid: 0,
                gid: 0,
                nlink: 2,
                size: 0,
                atime: Time { secs: 0, nanos: 0 },
                mtime: Time { secs: 0, nanos: 0 },
                ctime: Time { secs: 0, nanos: 0 },
                rdev: 0,
                target: String::new(),
                extents: None,
                xattrs: Default::default(),
                link,
                links,
                hold,
            };
            postcard::to_allocvec(&ino(Some(Box::new(p)))).unwrap()
        };
        assert!(tail(0, vec![], None).ends_with(&[0, 0, 0, 0]));
        assert!(tail(0, vec![42], None).ends_with(&[0, 0, 1, 0x2a, 0]));
        let held = Some(crate::state::Lease {
            holder: "m1".into(),
            expires_ms: 10_000,
        });
        assert!(tail(0, vec![], held).ends_with(&[0, 0, 0, 1, 2, 0x6d, 0x31, 0x90, 0x4e]));
    }

    /// The examples of docs/formats/master-state.md.
    #[test]
    fn doc_examples() {
        let k = ("b1".to_owned(), "a/x".to_owned()).to_bytes();
        assert_eq!(k, [0x62, 0x31, 0, 0, 0x61, 0x2f, 0x78]);
        let k = ("a\0".to_owned(), String::new()).to_bytes();
        assert_eq!(k, [0x61, 0, 0xff, 0, 0]);
        // A 1-byte PUT into a pack, as the gateway makes it.
        let o = cairn_rpc::object::ObjectMeta {
            size: 1,
            etag: "0cc175b9c0f1b6a831c399e269772661".into(),
            mtime_ms: 1_795_000_000_000,
            put_id: "0123456789abcdef01234567".into(),
            extents: vec![cairn_rpc::object::Extent {
                path: "/.s3/packs/10.0.0.1:9000-000000000042".into(),
                offset: 123_456,
                len: 1,
                shared: true,
            }],
            ..Default::default()
        };
        let rec = encode_record(2, &o).len();
        let json = serde_json::to_vec(&o).unwrap().len();
        assert_eq!((rec, json), (90, 312), "update the doc's figures");
    }

    #[test]
    fn records_carry_a_version_and_refuse_others() {
        let b = encode_record(3, &(7u64, "x".to_owned()));
        assert_eq!(b[0], 3);
        assert_eq!(
            decode_record::<(u64, String)>("t", 3, &b).unwrap(),
            (7, "x".to_owned())
        );
        assert!(matches!(
            decode_record::<(u64, String)>("t", 4, &b),
            Err(RecordError::Version { found: 3, .. })
        ));
        let mut long = b.clone();
        long.push(0);
        assert!(matches!(
            decode_record::<(u64, String)>("t", 3, &long),
            Err(RecordError::Body { .. })
        ));
        assert_eq!(decode_record::<u64>("t", 3, &[]), Err(RecordError::Empty));
        assert!(<(String, String)>::decode(b"ab\0").is_err());
        assert!(<(String, String)>::decode(b"ab\0\x01").is_err());
    }
}
