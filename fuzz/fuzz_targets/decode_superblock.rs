#![no_main]
//! Superblock decoding never panics, and what decodes is geometrically consistent.
use cairn_chunkstore::format::superblock::Superblock;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(sb) = Superblock::decode(data) {
        assert!(sb.validate().is_ok());
        assert_eq!(Superblock::decode(&sb.encode()), Ok(sb));
    }
});
