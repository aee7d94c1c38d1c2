//! Service credentials (docs/security.md "Service credentials"): the S3 gateway and the NBD
//! server prove a key of their own, not the cluster secret, and the masters let each work only
//! in its namespace — `/.s3` and the object index's buckets for the gateway, `/.block` and the
//! volumes for the NBD server.
//!
//! A service key is HMAC-SHA256 under the cluster secret of `cairn service key v1\n` and the
//! service's name: the masters derive it to check a proof, nothing stores it at the masters,
//! and it does not give the cluster secret back. Its file holds one line, `SERVICE HEX`
//! (mode 0600; `cairn admin service-key SERVICE --out FILE`, and `cairn up` writes `s3.key`
//! and `nbd.key`).

use super::{ClusterSecret, SECRET_BYTES, SecretError, hex, unhex, write_private};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::path::Path;

/// The metadata key of a service's proof.
pub const SERVICE_AUTH_METADATA: &str = "cairn-service-auth";

/// A service that runs on the cluster with a key of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// The S3 gateway.
    S3,
    /// The NBD server.
    Block,
}

impl Service {
    pub const ALL: [Service; 2] = [Service::S3, Service::Block];

    /// Its name in key files, proofs and audit records (`service:NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Self::S3 => "s3",
            Self::Block => "block",
        }
    }

    /// The directory it keeps its files in; it touches no file elsewhere.
    pub fn root(self) -> &'static str {
        match self {
            Self::S3 => "/.s3",
            Self::Block => "/.block",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.name() == s)
    }

    /// Whether `path` (normalized: absolute, no `.` or `..`) is within its root.
    pub fn owns(self, path: &str) -> bool {
        let root = self.root();
        path == root
            || path
                .strip_prefix(root)
                .is_some_and(|rest| rest.starts_with('/'))
    }
}

impl std::fmt::Display for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A service's key. `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct ServiceKey([u8; SECRET_BYTES]);

impl std::fmt::Debug for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServiceKey(..)")
    }
}

impl ServiceKey {
    /// The key of `service` in the cluster of `secret`.
    pub fn derive(secret: &ClusterSecret, service: Service) -> Self {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.bytes())
            .expect("HMAC takes keys of any length");
        m.update(format!("cairn service key v1\n{}", service.name()).as_bytes());
        Self(m.finalize().into_bytes().into())
    }

    pub(super) fn key(&self) -> &[u8] {
        &self.0
    }

    /// Reads a service key file: `SERVICE HEX` on one line.
    ///
    /// # Errors
    /// The file cannot be read or is not a service key.
    pub fn read(path: &Path) -> Result<(Service, Self), SecretError> {
        let text = std::fs::read_to_string(path).map_err(|source| SecretError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let bad = || SecretError::ServiceKey {
            path: path.display().to_string(),
        };
        let (name, key) = text.trim().split_once(' ').ok_or_else(bad)?;
        let service = Service::from_name(name.trim()).ok_or_else(bad)?;
        let key = unhex(key.trim())
            .and_then(|b| <[u8; SECRET_BYTES]>::try_from(b).ok())
            .ok_or_else(bad)?;
        Ok((service, Self(key)))
    }

    /// Writes a new key file for `service`, readable by its owner only; never overwrites.
    ///
    /// # Errors
    /// The file exists or cannot be written.
    pub fn write_new(&self, service: Service, path: &Path) -> Result<(), SecretError> {
        write_private(
            path,
            format!("{} {}\n", service.name(), hex(&self.0)).as_bytes(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_by_service_and_cluster_and_round_trip_through_files() {
        let (a, b) = (ClusterSecret::generate(), ClusterSecret::generate());
        let s3 = ServiceKey::derive(&a, Service::S3);
        assert_eq!(s3, ServiceKey::derive(&a, Service::S3));
        assert_ne!(s3, ServiceKey::derive(&a, Service::Block));
        assert_ne!(s3, ServiceKey::derive(&b, Service::S3));
        assert_ne!(s3.key(), a.bytes(), "the key is not the secret");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s3.key");
        s3.write_new(Service::S3, &p).unwrap();
        assert_eq!(ServiceKey::read(&p).unwrap(), (Service::S3, s3.clone()));
        assert!(s3.write_new(Service::S3, &p).is_err(), "never overwritten");
        std::fs::write(&p, "nfs 00").unwrap();
        assert!(ServiceKey::read(&p).is_err());
    }

    #[test]
    fn a_service_owns_its_root_and_what_is_below_it_only() {
        assert!(Service::S3.owns("/.s3"));
        assert!(Service::S3.owns("/.s3/packs/p1"));
        assert!(!Service::S3.owns("/.s3x"));
        assert!(!Service::S3.owns("/.block/v"));
        assert!(!Service::S3.owns("/"));
        assert!(!Service::Block.owns("/home/alice"));
        assert!(Service::Block.owns("/.block/7/seg-1"));
    }
}
