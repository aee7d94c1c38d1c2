#![no_main]
//! A small-object pack record (docs/object.md §3) from arbitrary bytes: decoding never panics,
//! a decoded record's names and data offset lie inside the input's claims, and encoding the
//! decoded record again gives back the same header and names.
use cairn_s3::pack::{HEADER_BYTES, decode, encode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = decode(data) {
        assert!(r.data_offset >= HEADER_BYTES && r.data_offset <= data.len());
        assert_eq!(r.data_offset, HEADER_BYTES + r.bucket.len() + r.key.len());
        let mut again = bytes::BytesMut::new();
        let body = &data[r.data_offset..];
        if body.len() as u64 == r.data_len && crc32c::crc32c(body) == r.data_crc {
            encode(&mut again, &r.bucket, &r.key, body);
            assert_eq!(&again[..], data);
        }
    }
});
