#![no_main]
//! Checkpoint decoding never panics and never yields an extent out of range.
use cairn_chunkstore::format::checkpoint::Checkpoint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Checkpoint::decode_header(3, data);
    if let Ok(c) = Checkpoint::decode(3, data, 1000) {
        assert!(c.chunks.iter().all(|r| r.extents.iter().all(|&e| e < 1000)));
    }
});
