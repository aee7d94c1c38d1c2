//! Every control-plane call proves who sends it (docs/security.md).
//!
//! Servers — chunkservers, gateways, masters to each other — hold the cluster's 32-byte
//! secret (`cairn up` makes one, kept in `cluster.secret`, mode 0600); users hold an access key
//! and a secret key (the same keys the S3 gateway checks), kept by the masters. Each call
//! carries gRPC metadata — [`AUTH_METADATA`] for servers, [`USER_AUTH_METADATA`] for users —
//! `WHO.TIME_MS.NONCE.MAC`: who it is, when it sent the call, a random nonce, and
//! HMAC-SHA256 under the secret of the call's name, who, when, the nonce and the SHA-256 of
//! the call's body (its gRPC frame as sent: [`body_digest`]). A master with a secret refuses a
//! call without a valid proof, one sent more than [`MAX_SKEW_MS`] from its own clock, one
//! whose body is not the one signed, or one it accepted before (a replay), with
//! `Unauthenticated`. Secrets never cross the network.
//!
//! The client's [`Signed`] channel reads each call's body before it sends it, to sign it; the
//! masters' [`DigestLayer`] reads it before the call is decoded and leaves its digest in the
//! request's extensions ([`BodyDigest`]), at most [`MAX_BODY`] bytes.
//!
//! What it does not do: hide the traffic — TLS is the answer to that.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::path::Path;

mod body;
pub use body::{BodyDigest, DigestLayer, Digested, MAX_BODY, Signed, body_digest};
mod service;
pub use service::{SERVICE_AUTH_METADATA, Service, ServiceKey};
mod verify;
pub use verify::{Principal, UserKey, Verifier};

type HttpRequest = http::Request<tonic::body::Body>;

/// The metadata key of a server's proof.
pub const AUTH_METADATA: &str = "cairn-server-auth";
/// The metadata key of a user's proof.
pub const USER_AUTH_METADATA: &str = "cairn-user-auth";
/// How far a proof's time may be from the checking master's clock.
pub const MAX_SKEW_MS: u64 = 120_000;
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
    #[error("{path}: a credentials file has the lines access_key = \"…\" and secret_key = \"…\"")]
    Credentials { path: String },
    #[error("{path}: a service key file is one line, `s3` or `block`, a space and {} hex digits", SECRET_BYTES * 2)]
    ServiceKey { path: String },
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
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
        write_private(path, format!("{}\n", hex(&self.0)).as_bytes())
    }

    fn key(&self) -> &[u8] {
        &self.0
    }

    /// The secret's bytes, for deriving keys of other uses from it.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// What a proof signs besides its key: the call's name and body.
#[derive(Clone, Copy)]
struct Call<'a> {
    method: &'a str,
    body: &'a BodyDigest,
}

/// The MAC of a call's proof: HMAC-SHA256 under `key` of the proof's kind, the call's name,
/// who sends it, when, its nonce and its body's digest.
fn mac(key: &[u8], kind: &str, call: Call<'_>, who: &str, at_ms: u64, nonce: u64) -> Hmac<Sha256> {
    let mut m =
        <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(
        format!(
            "cairn-auth v3\n{kind}\n{}\n{who}\n{at_ms}\n{nonce:016x}\n{}",
            call.method,
            hex(&call.body.0)
        )
        .as_bytes(),
    );
    m
}

/// A proof: `WHO.TIME_MS.NONCE.MAC`, NONCE 16 and MAC 64 hex digits.
fn proof(key: &[u8], kind: &str, call: Call<'_>, who: &str, at_ms: u64, nonce: u64) -> String {
    let tag = mac(key, kind, call, who, at_ms, nonce)
        .finalize()
        .into_bytes();
    format!("{who}.{at_ms}.{nonce:016x}.{}", hex(&tag))
}

/// Who a call's metadata claims to be, proven or not (`server:NAME` or `user:ACCESS_KEY`,
/// at most 64 characters of it): for audit records of refused calls.
pub fn claimed(meta: &tonic::metadata::MetadataMap) -> Option<String> {
    [
        (AUTH_METADATA, "server"),
        (USER_AUTH_METADATA, "user"),
        (SERVICE_AUTH_METADATA, "service"),
    ]
    .into_iter()
    .find_map(|(key, kind)| {
        let v = meta.get(key)?.to_str().ok()?;
        let who = Proof::parse(v)?.who;
        Some(format!(
            "{kind}:{}",
            who.chars().take(64).collect::<String>()
        ))
    })
}

/// A proof taken apart (not yet checked).
struct Proof<'a> {
    who: &'a str,
    at_ms: u64,
    nonce: u64,
    tag: Vec<u8>,
}

impl<'a> Proof<'a> {
    fn parse(v: &'a str) -> Option<Self> {
        let mut parts = v.rsplitn(4, '.');
        let tag = unhex(parts.next()?)?;
        let nonce = parts.next()?;
        let at_ms = parts.next()?.parse().ok()?;
        let who = parts.next()?;
        if nonce.len() != 16 || tag.len() != 32 || who.is_empty() {
            return None;
        }
        Some(Self {
            who,
            at_ms,
            nonce: u64::from_str_radix(nonce, 16).ok()?,
            tag,
        })
    }

    fn verify(&self, key: &[u8], kind: &str, call: Call<'_>) -> bool {
        mac(key, kind, call, self.who, self.at_ms, self.nonce)
            .verify_slice(&self.tag)
            .is_ok()
    }
}

/// What a client proves itself with on every control-plane call.
#[derive(Clone)]
pub enum Credential {
    /// A server (chunkserver, gateway, master, an operator on a server machine): the cluster
    /// secret. Masters let servers do anything.
    Server { secret: ClusterSecret, who: String },
    /// A user's access key and secret key (the same keys the S3 gateway checks).
    User {
        access_key: String,
        secret_key: String,
    },
    /// A service's key ([`ServiceKey`]): the masters let it work in its namespace only.
    Service { service: Service, key: ServiceKey },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Server { who, .. } => write!(f, "Credential::Server({who})"),
            Self::User { access_key, .. } => write!(f, "Credential::User({access_key})"),
            Self::Service { service, .. } => write!(f, "Credential::Service({service})"),
        }
    }
}

impl Credential {
    /// The metadata entry proving this credential for a call of `method` with a body of
    /// digest `body`, now.
    pub fn header(&self, method: &str, body: &BodyDigest) -> (&'static str, String) {
        let nonce = rand::random::<u64>();
        let call = Call { method, body };
        match self {
            Self::Server { secret, who } => (
                AUTH_METADATA,
                proof(secret.key(), "server", call, who, now_ms(), nonce),
            ),
            Self::User {
                access_key,
                secret_key,
            } => (
                USER_AUTH_METADATA,
                proof(
                    secret_key.as_bytes(),
                    "user",
                    call,
                    access_key,
                    now_ms(),
                    nonce,
                ),
            ),
            Self::Service { service, key } => (
                SERVICE_AUTH_METADATA,
                proof(key.key(), "service", call, service.name(), now_ms(), nonce),
            ),
        }
    }

    /// `req` with this credential's proof for `method` (and `req` as its body).
    pub fn sign<T: prost::Message>(&self, req: T, method: &str) -> tonic::Request<T> {
        let (k, v) = self.header(method, &body_digest(&req));
        let mut r = tonic::Request::new(req);
        r.metadata_mut()
            .insert(k, v.parse().expect("a proof is ASCII without spaces"));
        r
    }

    /// Reads a credentials file: lines `access_key = "…"` and `secret_key = "…"`, or an aws
    /// CLI credentials file's `aws_access_key_id = …` and `aws_secret_access_key = …` (its
    /// first profile).
    ///
    /// # Errors
    /// The file cannot be read or lacks either key.
    pub fn read(path: &Path) -> Result<Self, SecretError> {
        let text = std::fs::read_to_string(path).map_err(|source| SecretError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let field = |names: [&str; 2]| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once('=')?;
                names
                    .contains(&k.trim())
                    .then(|| v.trim().trim_matches('"').to_owned())
            })
        };
        match (
            field(["access_key", "aws_access_key_id"]),
            field(["secret_key", "aws_secret_access_key"]),
        ) {
            (Some(access_key), Some(secret_key))
                if !access_key.is_empty() && !secret_key.is_empty() =>
            {
                Ok(Self::User {
                    access_key,
                    secret_key,
                })
            }
            _ => Err(SecretError::Credentials {
                path: path.display().to_string(),
            }),
        }
    }

    /// Writes a user's credentials file, readable by its owner only; never overwrites.
    ///
    /// # Errors
    /// The file exists or cannot be written.
    pub fn write_new(
        path: &Path,
        user: &str,
        access_key: &str,
        secret_key: &str,
    ) -> Result<(), SecretError> {
        let body = format!(
            "# Cairn credentials of user {user:?}: keep this file private.\n\
             user = \"{user}\"\naccess_key = \"{access_key}\"\nsecret_key = \"{secret_key}\"\n"
        );
        write_private(path, body.as_bytes())
    }
}

/// Writes a new file readable by its owner only (mode 0600), synced; a file already there is
/// an error (secrets and credentials are never overwritten).
///
/// # Errors
/// The file exists or cannot be written.
pub fn write_private(path: &Path, body: &[u8]) -> Result<(), SecretError> {
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
    f.write_all(body).map_err(io)?;
    f.sync_all().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorKind, MetaError};

    fn server(s: &ClusterSecret) -> Credential {
        Credential::Server {
            secret: s.clone(),
            who: "chunkserver-7".into(),
        }
    }

    fn alice() -> Credential {
        Credential::User {
            access_key: "CKALICE".into(),
            secret_key: "alice-secret".into(),
        }
    }

    fn users(k: &str) -> Option<UserKey> {
        (k == "CKALICE").then(|| UserKey {
            name: "alice".into(),
            secret_key: "alice-secret".into(),
            admin: false,
        })
    }

    #[test]
    fn proofs_check_only_under_the_same_secret_call_and_time() {
        let s = ClusterSecret::generate();
        let v = Verifier::new(Some(s.clone()));
        let check = |v: &Verifier, r: &tonic::Request<()>, m: &str, at: u64| {
            v.check(r.metadata(), (m, Some(&body_digest(&()))), at, users)
        };
        let kind = |r: Result<Principal, MetaError>| r.unwrap_err().kind;
        let r = server(&s).sign((), "Heartbeat");
        assert_eq!(
            check(&v, &r, "Heartbeat", now_ms()).unwrap(),
            Principal::Server("chunkserver-7".into())
        );
        // Once only: the same proof again is a replay.
        let e = check(&v, &r, "Heartbeat", now_ms()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unauthenticated);
        assert!(e.message.contains("replayed"), "{e}");
        // Another secret, another call, too far in time, none, garbage.
        let other = Verifier::new(Some(ClusterSecret::generate()));
        let r = server(&s).sign((), "Heartbeat");
        assert_eq!(
            kind(check(&other, &r, "Heartbeat", now_ms())),
            ErrorKind::Unauthenticated
        );
        assert_eq!(
            kind(check(&v, &r, "Register", now_ms())),
            ErrorKind::Unauthenticated
        );
        assert_eq!(
            kind(check(&v, &r, "Heartbeat", now_ms() + MAX_SKEW_MS + 1000)),
            ErrorKind::Unauthenticated
        );
        let empty = tonic::Request::new(());
        assert_eq!(
            kind(check(&v, &empty, "Heartbeat", now_ms())),
            ErrorKind::Unauthenticated
        );
        // A service's key: that service, never a server; not the same key for another
        // service, nor the cluster secret itself.
        let svc = |service, key| Credential::Service { service, key };
        let r = svc(Service::Block, ServiceKey::derive(&s, Service::Block)).sign((), "Stat");
        assert_eq!(
            check(&v, &r, "Stat", now_ms()).unwrap(),
            Principal::Service(Service::Block)
        );
        assert!(!Principal::Service(Service::Block).is_superuser());
        assert!(
            Principal::Service(Service::S3)
                .require_server("Register")
                .is_err()
        );
        let r = svc(Service::S3, ServiceKey::derive(&s, Service::Block)).sign((), "Stat");
        assert_eq!(
            kind(check(&v, &r, "Stat", now_ms())),
            ErrorKind::Unauthenticated
        );
        let r = svc(
            Service::S3,
            ServiceKey::derive(&ClusterSecret::generate(), Service::S3),
        )
        .sign((), "Stat");
        assert_eq!(
            kind(check(&v, &r, "Stat", now_ms())),
            ErrorKind::Unauthenticated
        );
        for key in [AUTH_METADATA, USER_AUTH_METADATA, SERVICE_AUTH_METADATA] {
            for bad in [
                "x",
                "a.b",
                "a.1.zz",
                "a.1.00.00",
                "....",
                ".1.0000000000000000.00",
            ] {
                let mut r = tonic::Request::new(());
                r.metadata_mut().insert(key, bad.parse().unwrap());
                assert_eq!(
                    kind(check(&v, &r, "Heartbeat", now_ms())),
                    ErrorKind::Unauthenticated,
                    "{bad}"
                );
            }
        }
        // Who is covered by the MAC: renaming the sender breaks it.
        let r = server(&s).sign((), "Heartbeat");
        let proof = r.metadata().get(AUTH_METADATA).unwrap().to_str().unwrap();
        let mut renamed = tonic::Request::new(());
        renamed.metadata_mut().insert(
            AUTH_METADATA,
            proof
                .replacen("chunkserver-7", "chunkserver-8", 1)
                .parse()
                .unwrap(),
        );
        assert_eq!(
            kind(check(&v, &renamed, "Heartbeat", now_ms())),
            ErrorKind::Unauthenticated
        );
        // The body is covered: another body, or none read, is refused.
        let r = server(&s).sign(7u32, "Heartbeat");
        let e = v
            .check(
                r.metadata(),
                ("Heartbeat", Some(&body_digest(&8u32))),
                now_ms(),
                users,
            )
            .unwrap_err();
        assert!(e.message.contains("body changed"), "{e}");
        assert_eq!(
            kind(v.check(r.metadata(), ("Heartbeat", None), now_ms(), users)),
            ErrorKind::Unauthenticated
        );
        assert!(
            v.check(
                r.metadata(),
                ("Heartbeat", Some(&body_digest(&7u32))),
                now_ms(),
                users
            )
            .is_ok()
        );
        assert_eq!(format!("{s:?}"), "ClusterSecret(..)");
        // Without a secret the master is open.
        assert_eq!(
            check(&Verifier::new(None), &empty, "Stat", now_ms()).unwrap(),
            Principal::Open
        );
    }

    #[test]
    fn users_prove_their_secret_key() {
        let v = Verifier::new(Some(ClusterSecret::generate()));
        let r = alice().sign((), "Stat");
        let p = v
            .check(
                r.metadata(),
                ("Stat", Some(&body_digest(&()))),
                now_ms(),
                users,
            )
            .unwrap();
        assert_eq!(
            p,
            Principal::User {
                name: "alice".into(),
                admin: false
            }
        );
        assert!(!p.is_superuser());
        assert_eq!(
            p.require_admin("rotate-key").unwrap_err().kind,
            ErrorKind::PermissionDenied
        );
        assert_eq!(
            p.require_server("Heartbeat").unwrap_err().kind,
            ErrorKind::PermissionDenied
        );
        // A wrong secret key, an unknown access key.
        for c in [
            Credential::User {
                access_key: "CKALICE".into(),
                secret_key: "guess".into(),
            },
            Credential::User {
                access_key: "CKMALLORY".into(),
                secret_key: "alice-secret".into(),
            },
        ] {
            let r = c.sign((), "Stat");
            assert_eq!(
                v.check(
                    r.metadata(),
                    ("Stat", Some(&body_digest(&()))),
                    now_ms(),
                    users
                )
                .unwrap_err()
                .kind,
                ErrorKind::Unauthenticated
            );
        }
        // A user's proof is not a server's.
        let r = alice().sign((), "Heartbeat");
        let proof = r.metadata().get(USER_AUTH_METADATA).unwrap().clone();
        let mut as_server = tonic::Request::new(());
        as_server.metadata_mut().insert(AUTH_METADATA, proof);
        assert_eq!(
            v.check(
                as_server.metadata(),
                ("Heartbeat", Some(&body_digest(&()))),
                now_ms(),
                users
            )
            .unwrap_err()
            .kind,
            ErrorKind::Unauthenticated
        );
    }

    #[test]
    fn credentials_files_round_trip_and_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("admin.credentials");
        Credential::write_new(&p, "admin", "CKA", "sekrit").unwrap();
        match Credential::read(&p).unwrap() {
            Credential::User {
                access_key,
                secret_key,
            } => assert_eq!(
                (access_key.as_str(), secret_key.as_str()),
                ("CKA", "sekrit")
            ),
            c => panic!("{c:?}"),
        }
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(
            Credential::write_new(&p, "admin", "CKA", "x").is_err(),
            "never overwritten"
        );
        std::fs::write(
            &p,
            "[default]\naws_access_key_id = AK\naws_secret_access_key = S\n",
        )
        .unwrap();
        assert!(
            matches!(Credential::read(&p).unwrap(), Credential::User { access_key, .. } if access_key == "AK")
        );
        std::fs::write(&p, "user = \"x\"\n").unwrap();
        assert!(matches!(
            Credential::read(&p),
            Err(SecretError::Credentials { .. })
        ));
        assert!(!format!("{:?}", alice()).contains("alice-secret"));
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
