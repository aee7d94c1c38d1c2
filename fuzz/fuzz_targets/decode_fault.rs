//! The FAULT request payload from arbitrary bytes: never panics; whatever decodes re-encodes
//! to the same bytes (the empty payload aside, which means "no fault").
#![no_main]
use cairn_proto::fault::FaultSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = FaultSpec::decode(data)
        && !data.is_empty()
    {
        assert_eq!(&f.encode()[..], data);
    }
});
