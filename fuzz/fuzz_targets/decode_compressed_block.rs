#![no_main]
//! A compressed block (docs/formats/compressed-block.md) from arbitrary bytes: decoding never
//! panics and never allocates past the header's bound; a block that decodes re-encodes to a
//! block that decodes to the same bytes; the original length and CRC it claims hold.
use cairn_ec::block::{Header, MAX_BLOCK, crc32c, decode, encode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut out = vec![1u8, 2, 3];
    match decode(data, &mut out) {
        Ok(n) => {
            let h = Header::decode(data).expect("a decoded block has a valid header");
            assert_eq!(n, h.block_len());
            let got = &out[3..];
            assert!(got.len() <= MAX_BLOCK);
            assert_eq!(got.len(), h.original_len as usize);
            assert_eq!(crc32c(got), h.crc);
            let mut again = Vec::new();
            encode(got, &mut again);
            let mut back = Vec::new();
            assert_eq!(decode(&again, &mut back), Ok(again.len()));
            assert_eq!(back, got);
        }
        Err(_) => assert_eq!(out, [1, 2, 3], "a refused block appended bytes"),
    }
});
