#![no_main]
//! Users' sealed secret keys as the masters read them back from their state
//! (`cairn_rpc::seal`): opening arbitrary text never panics; a secret sealed opens to itself
//! for its user only, and a sealed secret with one hex digit changed never opens.
use cairn_rpc::auth::ClusterSecret;
use cairn_rpc::seal::{SEALED_PREFIX, Sealer};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn sealer() -> &'static Sealer {
    static S: OnceLock<Sealer> = OnceLock::new();
    S.get_or_init(|| Sealer::new(&ClusterSecret::from_bytes([7u8; 32])))
}

fuzz_target!(|data: &[u8]| {
    let s = sealer();
    let text = String::from_utf8_lossy(data);
    let (key, body) = text.split_once('\n').unwrap_or(("CKFUZZ", &text));
    // Whatever a state holds: opened or refused, never a panic.
    let _ = s.open(body, key);
    let _ = s.open(&format!("{SEALED_PREFIX}{body}"), key);
    let sealed = s.seal(body, key);
    assert_eq!(s.open(&sealed, key).as_deref(), Ok(body), "a sealed secret did not open");
    assert!(s.open(&sealed, &format!("{key}x")).is_err(), "opened for another user");
    if let Some(&b0) = data.first() {
        let hex = sealed.len() - SEALED_PREFIX.len();
        let i = SEALED_PREFIX.len() + usize::from(b0) % hex;
        let mut b = sealed.into_bytes();
        b[i] = if b[i] == b'0' { b'1' } else { b'0' };
        let changed = String::from_utf8(b).unwrap();
        assert!(s.open(&changed, key).is_err(), "an altered sealed secret opened");
    }
});
