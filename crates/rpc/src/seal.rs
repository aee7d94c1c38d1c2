//! Users' secret keys at rest: sealed (AES-256-GCM) under a key derived from the cluster
//! secret, so the masters' Raft log, snapshots and database never hold them in plain text
//! (docs/security.md, "At rest"). SigV4 and the control-plane proofs need the secret itself, so
//! a hash would not do: the masters open a sealed secret when they check a proof or answer the
//! S3 gateway.
//!
//! A sealed secret is the text `sealed1:` and the hex digits of a 12-byte random nonce, then the
//! ciphertext and its 16-byte tag. The additional data is the user's access key, so a sealed
//! secret moved to another user does not open.

use crate::auth::{ClusterSecret, hex, unhex};
use hmac::{Hmac, KeyInit, Mac};
use ring::aead;
use sha2::Sha256;

/// The prefix of a sealed secret.
pub const SEALED_PREFIX: &str = "sealed1:";
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;

/// Why a sealed secret would not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    #[error("a sealed secret is {SEALED_PREFIX} and hex digits")]
    Malformed,
    #[error(
        "the sealed secret does not open with this cluster's key (another cluster's, or altered)"
    )]
    Open,
}

/// Seals and opens users' secrets. `Debug` never prints the key.
pub struct Sealer {
    key: aead::LessSafeKey,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

impl Sealer {
    /// The sealer of a cluster: its key is HMAC-SHA256 under the cluster secret of a fixed
    /// label (a key of its own: the secret itself also signs servers' proofs).
    pub fn new(secret: &ClusterSecret) -> Self {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.bytes())
            .expect("HMAC takes keys of any length");
        m.update(b"cairn-seal v1 user secrets");
        let k = m.finalize().into_bytes();
        let unbound = aead::UnboundKey::new(&aead::AES_256_GCM, &k).expect("a 32-byte key");
        Self {
            key: aead::LessSafeKey::new(unbound),
        }
    }

    /// Whether `s` is a sealed secret (anything else is a plain one, from before sealing).
    pub fn is_sealed(s: &str) -> bool {
        s.starts_with(SEALED_PREFIX)
    }

    /// `secret` sealed for the user of `access_key`.
    pub fn seal(&self, secret: &str, access_key: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        rand::fill(&mut nonce);
        let mut buf = secret.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::from(access_key.as_bytes()),
                &mut buf,
            )
            .expect("sealing a short secret cannot fail");
        format!("{SEALED_PREFIX}{}{}", hex(&nonce), hex(&buf))
    }

    /// The secret `sealed` holds for the user of `access_key`; a secret that is not sealed
    /// (from before sealing) as it is.
    ///
    /// # Errors
    /// `sealed` is malformed, another cluster's, another user's or altered.
    pub fn open(&self, sealed: &str, access_key: &str) -> Result<String, SealError> {
        let Some(body) = sealed.strip_prefix(SEALED_PREFIX) else {
            return Ok(sealed.to_owned());
        };
        let bytes = unhex(body).ok_or(SealError::Malformed)?;
        if bytes.len() < NONCE_LEN + TAG_LEN {
            return Err(SealError::Malformed);
        }
        let (nonce, ct) = bytes.split_at(NONCE_LEN);
        let nonce =
            aead::Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Malformed)?;
        let mut buf = ct.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, aead::Aad::from(access_key.as_bytes()), &mut buf)
            .map_err(|_| SealError::Open)?;
        String::from_utf8(plain.to_vec()).map_err(|_| SealError::Open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_secret_opens_only_for_its_user_and_cluster() {
        let s = Sealer::new(&ClusterSecret::generate());
        let sealed = s.seal("very-secret-key", "CKAAAA");
        assert!(Sealer::is_sealed(&sealed));
        assert!(!sealed.contains("very-secret-key"));
        assert_eq!(s.open(&sealed, "CKAAAA").unwrap(), "very-secret-key");
        // Two seals of one secret differ (a fresh nonce each).
        assert_ne!(s.seal("very-secret-key", "CKAAAA"), sealed);
        assert_eq!(s.open(&sealed, "CKBBBB"), Err(SealError::Open));
        let other = Sealer::new(&ClusterSecret::generate());
        assert_eq!(other.open(&sealed, "CKAAAA"), Err(SealError::Open));
        // One bit changed anywhere is refused.
        let mut b = sealed.clone().into_bytes();
        let last = b.len() - 1;
        b[last] = if b[last] == b'0' { b'1' } else { b'0' };
        assert_eq!(
            s.open(std::str::from_utf8(&b).unwrap(), "CKAAAA"),
            Err(SealError::Open)
        );
        assert_eq!(s.open("sealed1:zz", "CKAAAA"), Err(SealError::Malformed));
        assert_eq!(s.open("sealed1:00", "CKAAAA"), Err(SealError::Malformed));
        // A plain secret from before sealing passes as it is.
        assert_eq!(s.open("plain", "CKAAAA").unwrap(), "plain");
    }
}
