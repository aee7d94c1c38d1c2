#![no_main]
//! Footer decoding and unit evaluation never panic, whatever the bytes.
use cairn_chunkstore::format::footer::{self, Footer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Footer::decode(7, data);
    if data.len() >= 4096 {
        let unit = &data[..4096];
        let _ = footer::unit_state(7, unit, 1, 1, 0, 0);
        if let Ok(f) = Footer::decode(7, &unit[footer::slot_offset(4096, 0)..][..footer::FOOTER_BYTES]) {
            // A footer that decodes re-encodes to the same bytes.
            let mut b = [0u8; footer::FOOTER_BYTES];
            f.encode(7, &mut b);
            assert_eq!(&b[..], &unit[footer::slot_offset(4096, 0)..][..footer::FOOTER_BYTES]);
        }
    }
});
