//! Data-plane frame header + payload from arbitrary bytes: never panics; whatever decodes
//! re-encodes to the same header bytes.
#![no_main]
use cairn_proto::frame::{HEADER_BYTES, Header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((hb, payload)) = data.split_first_chunk::<HEADER_BYTES>() else {
        return;
    };
    if let Ok(h) = Header::decode(hb) {
        assert_eq!(&h.encode(), hb);
        let _ = h.op();
        let _ = h.status();
        let _ = h.check_payload(payload);
    }
});
