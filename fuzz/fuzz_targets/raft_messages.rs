#![no_main]
//! The bodies of the masters' Raft messages (AppendEntries with their commands, Vote,
//! TransferLeader, snapshot chunks) as a peer sends them, from arbitrary bytes: the first
//! byte picks the kind (`network.rs` constants, unknown ones included), the rest is the body.
//! Decoding never panics; what decodes encodes again.
use cairn_master::network::{Message, decode_message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    match decode_message(u32::from(kind % 8), body) {
        Ok(Message::Append(r)) => {
            serde_json::to_vec(&r).expect("encodes");
        }
        Ok(Message::Vote(r)) => {
            serde_json::to_vec(&r).expect("encodes");
        }
        Ok(Message::Transfer(r)) => {
            serde_json::to_vec(&r).expect("encodes");
        }
        Ok(Message::SnapshotChunk(h, bytes)) => {
            assert!(bytes.len() < data.len());
            serde_json::to_vec(&h).expect("encodes");
        }
        Err(_) => {}
    }
});
