//! The masters' check of a call's proof (`cairn_rpc::auth::Verifier::check`) on arbitrary
//! metadata values, as a server's, a user's and a service's: never panics, never accepts a proof that
//! was not made with the secret (a forged MAC is 2^-256), and a proof the fuzzer makes valid
//! (the input's tail signed for real, as the call's name and its body) is refused with another
//! body, accepted once with its own and then refused as a replay.
#![no_main]
use cairn_rpc::auth::{
    AUTH_METADATA, ClusterSecret, Credential, SERVICE_AUTH_METADATA, Service, ServiceKey,
    USER_AUTH_METADATA, UserKey, Verifier, body_digest,
};
use libfuzzer_sys::fuzz_target;

fn users(k: &str) -> Option<UserKey> {
    (k == "CKFUZZ").then(|| UserKey { name: "fuzz".into(), secret_key: "fuzz-secret".into(), admin: false })
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let secret = ClusterSecret::from_bytes([7; 32]);
    let v = Verifier::new(Some(secret.clone()));
    let now = 1_800_000_000_000;
    let text = String::from_utf8_lossy(rest);
    let key = [AUTH_METADATA, USER_AUTH_METADATA, SERVICE_AUTH_METADATA][usize::from(kind % 3)];
    if let Ok(value) = text.parse() {
        let mut meta = tonic::metadata::MetadataMap::new();
        meta.insert(key, value);
        let body = body_digest(&text.to_string());
        assert!(
            v.check(&meta, ("Stat", Some(&body)), now, users).is_err(),
            "a proof from nowhere was accepted"
        );
    }
    // A real proof of a call named by the input: accepted once, then a replay.
    let method: String = text.chars().filter(char::is_ascii_alphanumeric).take(32).collect();
    let cred = match kind % 3 {
        0 => Credential::Server { secret, who: "fuzz".into() },
        1 => Credential::User { access_key: "CKFUZZ".into(), secret_key: "fuzz-secret".into() },
        _ => {
            let service = if kind & 0x80 == 0 { Service::S3 } else { Service::Block };
            Credential::Service { service, key: ServiceKey::derive(&secret, service) }
        }
    };
    let body = text.to_string();
    let r = cred.sign(body.clone(), &method);
    let (signed, other) = (body_digest(&body), body_digest(&format!("{body}!")));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let call = |d| (method.as_str(), Some(d));
    assert!(v.check(r.metadata(), call(&other), now, users).is_err(), "another body was accepted");
    assert!(v.check(r.metadata(), call(&signed), now, users).is_ok(), "a real proof was refused");
    assert!(v.check(r.metadata(), call(&signed), now, users).is_err(), "a replay was accepted");
});
