#![no_main]
//! Snapshot files of the masters' state (docs/formats/master-state.md § Snapshot files), as
//! received from a peer or read back from disk, from arbitrary bytes: reading never panics
//! nor allocates more than the input holds. The first byte's low bit asks for the checksum
//! to be made right (appended), so the fuzzer explores the frames behind it. The same bytes
//! go to the parser of a snapshot chunk's call (header length, JSON header, bytes).
use cairn_master::snapshot::Reader;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The call that carries a chunk of one between masters.
    let _ = cairn_master::network::parse_chunk(data);
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    if mode & 1 == 1 {
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
    }
    let Ok(mut r) = Reader::new(bytes.as_slice(), cairn_master::state::TABLES) else {
        return;
    };
    let mut frames = 0usize;
    while let Ok(Some(_)) = r.frame() {
        frames += 1;
        assert!(frames <= bytes.len(), "more frames than bytes");
    }
});
