#![no_main]
//! Segment-header decoding never panics, and a header that decodes re-encodes to the same
//! bytes (docs/formats/chunk-store.md §3.2).
use cairn_chunkstore::format::segment::{self, SegHeader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(h) = SegHeader::decode(7, data) else {
        return;
    };
    let used = segment::HEADER_BYTES + 4 * h.slot_crcs.len();
    if data.len() >= 4096 && h.slot_crcs.len() <= segment::max_slots(4096) {
        let mut b = vec![0u8; 4096];
        h.encode(7, &mut b);
        assert_eq!(&b[..used], &data[..used]);
    }
});
