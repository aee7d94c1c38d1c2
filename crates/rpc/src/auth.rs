//! Servers prove they hold the cluster secret (docs/security.md).
//!
//! Masters and chunkservers share a 32-byte secret (`cairn up` makes one, kept in
//! `cluster.secret`, mode 0600). A server's call to a master — a chunkserver's register and
//! heartbeats, a master's Raft messages — carries gRPC metadata [`AUTH_METADATA`] =
//! `WHO.TIME_MS.MAC`: who it is, when it sent the call, and HMAC-SHA256 under the secret of
//! the call's name, who and when. A master that has a secret refuses such a call without a
//! valid proof, or one sent more than [`MAX_SKEW_MS`] from its own clock, with
//! `Unauthenticated`. The secret itself never crosses the network.
//!
//! What it does not do (yet): hide the traffic (TLS), or stop a replay of a captured call
//! within the skew window — a replayed heartbeat or Raft message repeats what the server said.

use crate::{ErrorKind, MetaError};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::path::Path;

/// The metadata key of a server's proof.
pub const AUTH_METADATA: &str = "cairn-server-auth";
/// How far a proof's time may be from the checking master's clock.
pub const MAX_SKEW_MS: u64 = 300_000;
/// Bytes of a cluster secret.
pub const SECRET_BYTES: usize = 32;

/// The cluster secret. `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret([u8; SECRET_BYTES]);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

/// Why a secret file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: a cluster secret is {} hex digits on one line", SECRET_BYTES * 2)]
    Format { path: String },
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl ClusterSecret {
    pub fn from_bytes(b: [u8; SECRET_BYTES]) -> Self {
        Self(b)
    }

    /// A fresh random secret.
    pub fn generate() -> Self {
        let mut b = [0u8; SECRET_BYTES];
        rand::fill(&mut b);
        Self(b)
    }

    /// Reads a secret file: hex digits on one line.
    ///
    /// # Errors
    /// The file cannot be read or is not a secret.
    pub fn read(path: &Path) -> Result<Self, SecretError> {
        let text = std::fs::read_to_string(path).map_err(|source| SecretError::Io {
            path: path.display().to_string(),
            source,
        })?;
        unhex(text.trim())
            .and_then(|b| <[u8; SECRET_BYTES]>::try_from(b).ok())
            .map(Self)
            .ok_or_else(|| SecretError::Format {
                path: path.display().to_string(),
            })
    }

    /// Writes a new file with this secret, readable by its owner only (a file already there
    /// is an error: it is never overwritten).
    ///
    /// # Errors
    /// The file exists or cannot be written.
    pub fn write_new(&self, path: &Path) -> Result<(), SecretError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let io = |source| SecretError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        f.write_all(format!("{}\n", hex(&self.0)).as_bytes())
            .map_err(io)?;
        f.sync_all().map_err(io)
    }

    fn mac(&self, method: &str, who: &str, at_ms: u64) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .expect("HMAC takes keys of any length");
        m.update(format!("cairn-server-auth v1\n{method}\n{who}\n{at_ms}").as_bytes());
        m
    }

    /// The proof for a call of `method` by `who` at `at_ms`.
    pub fn proof(&self, method: &str, who: &str, at_ms: u64) -> String {
        let tag = self.mac(method, who, at_ms).finalize().into_bytes();
        format!("{who}.{at_ms}.{}", hex(&tag))
    }

    /// `req` with the proof for a call of `method` by `who`, now.
    pub fn sign<T>(&self, req: T, method: &str, who: &str) -> tonic::Request<T> {
        let mut r = tonic::Request::new(req);
        let proof = self.proof(method, who, now_ms());
        r.metadata_mut().insert(
            AUTH_METADATA,
            proof.parse().expect("a proof is ASCII without spaces"),
        );
        r
    }

    /// Checks the proof of a call of `method` in `meta`: returns who sent it.
    ///
    /// # Errors
    /// `Unauthenticated`: no proof, a malformed one, a wrong MAC (constant-time compare), or a
    /// time more than [`MAX_SKEW_MS`] from `now_ms`.
    pub fn check(
        &self,
        meta: &tonic::metadata::MetadataMap,
        method: &str,
        now_ms: u64,
    ) -> Result<String, MetaError> {
        let refuse = |why: &str| {
            MetaError::new(
                ErrorKind::Unauthenticated,
                format!("{method}: {why} (a server needs the cluster secret)"),
            )
        };
        let v = meta
            .get(AUTH_METADATA)
            .ok_or_else(|| refuse("no proof of the cluster secret"))?
            .to_str()
            .map_err(|_| refuse("a malformed proof"))?;
        let mut parts = v.rsplitn(3, '.');
        let (Some(tag), Some(at), Some(who)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(refuse("a malformed proof"));
        };
        let at: u64 = at.parse().map_err(|_| refuse("a malformed proof"))?;
        let tag = unhex(tag).ok_or_else(|| refuse("a malformed proof"))?;
        self.mac(method, who, at)
            .verify_slice(&tag)
            .map_err(|_| refuse("a wrong proof: another cluster's secret, or none"))?;
        if at.abs_diff(now_ms) > MAX_SKEW_MS {
            return Err(refuse(&format!(
                "a proof {} s away from this master's clock",
                at.abs_diff(now_ms) / 1000
            )));
        }
        Ok(who.to_owned())
    }
}

/// [`ClusterSecret::check`] when the master has a secret; anything goes without one.
///
/// # Errors
/// As [`ClusterSecret::check`].
pub fn check_if<T>(
    secret: Option<&ClusterSecret>,
    req: &tonic::Request<T>,
    method: &str,
) -> Result<Option<String>, MetaError> {
    secret
        .map(|s| s.check(req.metadata(), method, now_ms()))
        .transpose()
}

/// `req` signed when there is a secret, else plain.
pub fn sign_if<T>(
    secret: Option<&ClusterSecret>,
    req: T,
    method: &str,
    who: &str,
) -> tonic::Request<T> {
    match secret {
        Some(s) => s.sign(req, method, who),
        None => tonic::Request::new(req),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_check_only_under_the_same_secret_call_and_time() {
        let s = ClusterSecret::generate();
        let r = s.sign((), "heartbeat", "chunkserver-7");
        assert_eq!(
            s.check(r.metadata(), "heartbeat", now_ms()).unwrap(),
            "chunkserver-7"
        );
        let kind = |r: Result<String, MetaError>| r.unwrap_err().kind;
        // Another secret, another call, too far in time, none, garbage.
        let other = ClusterSecret::generate();
        assert_eq!(
            kind(other.check(r.metadata(), "heartbeat", now_ms())),
            ErrorKind::Unauthenticated
        );
        assert_eq!(
            kind(s.check(r.metadata(), "register", now_ms())),
            ErrorKind::Unauthenticated
        );
        assert_eq!(
            kind(s.check(r.metadata(), "heartbeat", now_ms() + MAX_SKEW_MS + 1000)),
            ErrorKind::Unauthenticated
        );
        let empty = tonic::metadata::MetadataMap::new();
        assert_eq!(
            kind(s.check(&empty, "heartbeat", now_ms())),
            ErrorKind::Unauthenticated
        );
        let mut bad = tonic::metadata::MetadataMap::new();
        for v in ["x", "a.b", "a.1.zz", "a.1.00", "...."] {
            bad.insert(AUTH_METADATA, v.parse().unwrap());
            assert_eq!(
                kind(s.check(&bad, "heartbeat", now_ms())),
                ErrorKind::Unauthenticated,
                "{v}"
            );
        }
        // Who is covered by the MAC: renaming the sender breaks it.
        let proof = r.metadata().get(AUTH_METADATA).unwrap().to_str().unwrap();
        let renamed = proof.replacen("chunkserver-7", "chunkserver-8", 1);
        bad.insert(AUTH_METADATA, renamed.parse().unwrap());
        assert_eq!(
            kind(s.check(&bad, "heartbeat", now_ms())),
            ErrorKind::Unauthenticated
        );
        assert_eq!(format!("{s:?}"), "ClusterSecret(..)");
    }

    #[test]
    fn secret_files_round_trip_and_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cluster.secret");
        let s = ClusterSecret::generate();
        s.write_new(&p).unwrap();
        assert_eq!(ClusterSecret::read(&p).unwrap(), s);
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(s.write_new(&p).is_err(), "never overwritten");
        std::fs::write(&p, "abc\n").unwrap();
        assert!(matches!(
            ClusterSecret::read(&p),
            Err(SecretError::Format { .. })
        ));
    }
}
