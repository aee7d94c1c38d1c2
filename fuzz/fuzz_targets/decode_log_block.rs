#![no_main]
//! Operation-log block decoding never panics; what decodes re-encodes identically.
use cairn_chunkstore::format::log;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let lsn = u64::from_le_bytes(data[..8].try_into().unwrap());
    let block = &data[8..];
    if let Ok(entries) = log::decode_block(3, lsn, block) {
        let again = log::encode_block(3, lsn, &entries, block.len());
        assert_eq!(log::decode_block(3, lsn, &again).as_ref(), Ok(&entries));
    }
});
