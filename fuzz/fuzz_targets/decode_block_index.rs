#![no_main]
//! A compressed group's block index (docs/formats/compressed-block.md, "Compressed chunk
//! groups") from arbitrary bytes: decoding never panics; an index that decodes has offsets in
//! order, each block between a header and a header plus MAX_BLOCK long, ending at the end of
//! the blocks; it re-encodes to the same bytes.
use cairn_ec::block::{HEADER, INDEX_TRAILER, MAX_BLOCK, decode_index, encode_index, index_len};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let buf = &data[16..];
    // Mostly the block count the buffer's length implies (else the decoder stops at once).
    let implied = buf.len().saturating_sub(INDEX_TRAILER) / 8;
    let blocks = match data[0] {
        0 => u32::from_le_bytes(data[..4].try_into().unwrap()) % 4096,
        _ => implied as u32,
    };
    let block = u32::from_le_bytes(data[4..8].try_into().unwrap());
    let end = u64::from_le_bytes(data[8..16].try_into().unwrap());
    if let Ok(offsets) = decode_index(buf, blocks, block, end) {
        assert_eq!(buf.len(), index_len(blocks as usize));
        assert_eq!(offsets.len(), blocks as usize + 1);
        assert_eq!(*offsets.last().unwrap(), end);
        for w in offsets.windows(2) {
            let n = w[1] - w[0];
            assert!(n >= HEADER as u64 && n <= (HEADER + MAX_BLOCK) as u64);
        }
        let mut again = Vec::new();
        encode_index(&offsets[..blocks as usize], block, &mut again);
        assert_eq!(again, buf);
    }
});
