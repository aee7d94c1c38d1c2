#![no_main]
//! The file service's segment records (docs/formats/fs-segment.md): walking any bytes as a
//! run of records never panics and never reads past them, and every header that decodes
//! re-encodes to the same 32 bytes.
use bytes::BytesMut;
use cairn_files::segment::{self, HEADER_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut at = 0usize;
    while at < data.len() {
        let Ok(h) = segment::decode(&data[at..]) else {
            return;
        };
        let body = at + HEADER_BYTES;
        let Some(end) = body.checked_add(h.len as usize).filter(|&e| e <= data.len()) else {
            return;
        };
        if h.len as usize <= segment::MAX_RECORD {
            let mut out = BytesMut::new();
            let start = segment::encode(&mut out, h.ino, h.offset, &data[body..end]);
            assert_eq!(start, HEADER_BYTES);
            assert_eq!(&out[..HEADER_BYTES], &data[at..body]);
            assert_eq!(segment::decode(&out), Ok(h));
        }
        at = end;
    }
});
