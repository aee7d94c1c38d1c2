//! Capabilities from arbitrary bytes (docs/security.md): decoding and checking never panic;
//! whatever decodes re-encodes to the same bytes; nothing the fuzzer makes without the key
//! verifies, except a capability the key really signed.
#![no_main]
use cairn_proto::cap::{CAP_BYTES, CapKey, Capability, Revocation, Revoked};
use libfuzzer_sys::fuzz_target;

const KEY: CapKey = CapKey {
    id: 1,
    secret: [0x5a; 32],
};

fuzz_target!(|data: &[u8]| {
    let Ok(cap) = Capability::decode(data) else {
        return;
    };
    let b: [u8; CAP_BYTES] = data.try_into().expect("a decoded capability is CAP_BYTES");
    assert_eq!(cap.encode(), b);
    let c = cap.claims;
    if cap.verify(&[KEY], c.chunk_id, c.rights, 0).is_ok() {
        // Only if it is byte for byte what the key signs for these claims.
        assert_eq!(Capability::sign(&KEY, c).encode(), b);
    }
    let _ = cap.check_chunk(c.chunk_version, c.epoch);
    // Revocations below and at its generation: only the ones above it refuse, and never a
    // server's (holder 0).
    let mut r = Revoked::default();
    let now = std::time::Instant::now();
    r.add(
        Revocation::Chunk {
            chunk_id: c.chunk_id,
            generation: c.generation,
            except: 0,
        },
        now,
    );
    assert!(r.check(&c).is_ok());
    r.add(
        Revocation::Holder {
            holder: c.holder,
            generation: c.generation.saturating_add(1),
        },
        now,
    );
    assert_eq!(
        r.check(&c).is_ok(),
        c.holder == 0 || c.generation == u64::MAX
    );
});
