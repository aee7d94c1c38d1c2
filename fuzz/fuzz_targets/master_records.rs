#![no_main]
//! The masters' on-disk keys and records (docs/formats/master-state.md) from arbitrary bytes:
//! decoding never panics; a key that decodes encodes back to the same bytes (the encoding is
//! canonical, so two byte strings never name one key); a record that decodes encodes to
//! bytes that decode to the same record; an `objects` record of version 1 converts to one of
//! version 2 that decodes, or is refused; an `inodes` record of versions 1 to 4 (and a `txns`
//! cell of those versions, whose decisions carry inodes) converts to version 5, or is refused.
//! A segments' tally (`tallies`) that decodes encodes back to the same bytes; the condemned
//! segments' records (`u64`). Cells too: the partition map, homes, moves, renames'
//! intents and locks, subtrees and hashed directories, bucket placements.
use cairn_master::kv::codec::{Key, decode_record, encode_record};
use cairn_master::state::moves::Move;
use cairn_master::state::objects::buckets::Placement;
use cairn_master::state::objects::stored::object_from_v1;
use cairn_master::state::partitions::{Home, PartitionMap};
use cairn_master::state::txn::{Lock, Txns};
use cairn_master::state::{Inode, inode_from_old, txns_from_old};
use cairn_rpc::object::ObjectMeta;
use libfuzzer_sys::fuzz_target;

fn key<K: Key>(data: &[u8]) {
    if let Ok(k) = K::decode(data) {
        assert_eq!(k.to_bytes(), data, "{k:?}");
    }
}

fn record<V>(data: &[u8])
where
    V: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if let Ok(v) = decode_record::<V>("fuzz", 1, data) {
        let again = encode_record(1, &v);
        assert_eq!(decode_record::<V>("fuzz", 1, &again).as_ref(), Ok(&v));
    }
}

fuzz_target!(|data: &[u8]| {
    key::<u64>(data);
    key::<String>(data);
    key::<(u64, String)>(data);
    key::<(String, String)>(data);
    key::<(String, u32)>(data);
    key::<()>(data);
    record::<ObjectMeta>(data);
    if let Ok(v2) = object_from_v1(data) {
        decode_record::<ObjectMeta>("fuzz", 2, &v2).expect("a converted record decodes");
    }
    record::<Inode>(data);
    if let Ok(v5) = inode_from_old(data) {
        decode_record::<Inode>("fuzz", 5, &v5).expect("a converted inode decodes");
    }
    if let Ok(v5) = txns_from_old(data) {
        decode_record::<Txns>("fuzz", 5, &v5).expect("converted txns decode");
    }
    record::<PartitionMap>(data);
    record::<Home>(data);
    record::<Option<Move>>(data);
    record::<Txns>(data);
    record::<std::collections::BTreeMap<u64, Lock>>(data);
    record::<u32>(data);
    record::<u64>(data);
    if let Some(t) = cairn_master::kv::tally_from(data) {
        assert_eq!(cairn_master::kv::tally_bytes(&t), data);
    }
    // The file service's names of any bytes: one string each, and back (rpc files.rs).
    let name = cairn_rpc::files::name_from_bytes(data);
    assert_eq!(&*cairn_rpc::files::name_bytes(&name), data);
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = cairn_rpc::files::check_name(s);
        let _ = cairn_rpc::components(s);
    }
    record::<bool>(data);
    record::<std::collections::BTreeMap<String, u32>>(data);
    record::<std::collections::BTreeMap<String, Vec<u32>>>(data);
    record::<std::collections::BTreeMap<String, Placement>>(data);
});
