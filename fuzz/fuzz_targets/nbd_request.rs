//! The NBD server's parsers of what clients send (`cairn_block::nbd::proto`): a transmission
//! request header, an option header, and NBD_OPT_INFO/GO's payload. Never panic; whatever
//! parses encodes back to the same bytes.
#![no_main]
use cairn_block::nbd::proto::{REQUEST_BYTES, Request, info_request, option_header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(h) = data.get(..REQUEST_BYTES) {
        let h: &[u8; REQUEST_BYTES] = h.try_into().unwrap();
        if let Ok(r) = Request::decode(h) {
            assert_eq!(&r.encode(), h, "a request did not round-trip");
        }
    }
    if let Some(h) = data.get(..16) {
        let _ = option_header(h.try_into().unwrap());
    }
    if let Ok((name, infos)) = info_request(data) {
        let mut again = (name.len() as u32).to_be_bytes().to_vec();
        again.extend_from_slice(name.as_bytes());
        again.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for i in &infos {
            again.extend_from_slice(&i.to_be_bytes());
        }
        assert_eq!(again, data, "an info request did not round-trip");
    }
});
