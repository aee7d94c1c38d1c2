//! Typed failures of the control plane, and how they cross gRPC.
//!
//! A [`MetaError`] becomes a `tonic::Status` with a gRPC code that fits and the error's kind in
//! the `cairn-error` metadata entry, so the other end gets the same typed error back (not a
//! string to parse). "Not the leader" is UNAVAILABLE with the leader's address in
//! `cairn-leader`.

use serde::{Deserialize, Serialize};
use tonic::{Code, Status};

/// Metadata entry holding the leader's address on a redirect.
pub const LEADER_METADATA: &str = "cairn-leader";
const KIND_METADATA: &str = "cairn-error";

/// What went wrong, without the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    NotFound,
    AlreadyExists,
    NotADirectory,
    IsADirectory,
    DirectoryNotEmpty,
    InvalidArgument,
    /// Another client holds the file's write lease.
    LeaseHeld,
    /// The caller's lease expired or was never granted.
    LeaseLost,
    Sealed,
    /// Not enough chunkservers up to place a chunk.
    NoServers,
    /// Not enough chunkservers with free space to place a chunk: the cluster is full.
    NoSpace,
    /// The cluster is full, but space freed moments ago (deleted files, overwritten or
    /// deleted objects) is being given back: the call is retried.
    Reclaiming,
    /// This master is not the leader (the leader's address, if known, is in the metadata).
    NotLeader,
    Unavailable,
    /// A server's call without a valid proof of the cluster secret (docs/security.md).
    Unauthenticated,
    /// An authenticated caller without the right: the permission bits of a file or
    /// directory, or an operators' call by a user who is not an admin.
    PermissionDenied,
    /// The master does not know this call (it runs an older version).
    Unsupported,
    /// The change would tie two partitions together (a hard link to a file in another
    /// partition, or a rename that would carry a hard link away from its other names):
    /// `EXDEV` to a mount, on which `mv` copies instead (docs/files.md "Hard links").
    CrossDevice,
    /// A node has as many names as it may (`EMLINK`).
    TooManyLinks,
    Internal,
}

impl ErrorKind {
    const ALL: [(ErrorKind, &'static str, Code); 20] = [
        (ErrorKind::NotFound, "not-found", Code::NotFound),
        (
            ErrorKind::AlreadyExists,
            "already-exists",
            Code::AlreadyExists,
        ),
        (
            ErrorKind::NotADirectory,
            "not-a-directory",
            Code::FailedPrecondition,
        ),
        (
            ErrorKind::IsADirectory,
            "is-a-directory",
            Code::FailedPrecondition,
        ),
        (
            ErrorKind::DirectoryNotEmpty,
            "directory-not-empty",
            Code::FailedPrecondition,
        ),
        (
            ErrorKind::InvalidArgument,
            "invalid-argument",
            Code::InvalidArgument,
        ),
        (ErrorKind::LeaseHeld, "lease-held", Code::Aborted),
        (ErrorKind::LeaseLost, "lease-lost", Code::Aborted),
        (ErrorKind::Sealed, "sealed", Code::FailedPrecondition),
        (ErrorKind::NoServers, "no-servers", Code::ResourceExhausted),
        (ErrorKind::NoSpace, "no-space", Code::ResourceExhausted),
        (ErrorKind::Reclaiming, "reclaiming", Code::ResourceExhausted),
        (ErrorKind::NotLeader, "not-leader", Code::Unavailable),
        (ErrorKind::Unavailable, "unavailable", Code::Unavailable),
        (
            ErrorKind::Unauthenticated,
            "unauthenticated",
            Code::Unauthenticated,
        ),
        (
            ErrorKind::PermissionDenied,
            "permission-denied",
            Code::PermissionDenied,
        ),
        (ErrorKind::Unsupported, "unsupported", Code::Unimplemented),
        (
            ErrorKind::CrossDevice,
            "cross-device",
            Code::FailedPrecondition,
        ),
        (
            ErrorKind::TooManyLinks,
            "too-many-links",
            Code::FailedPrecondition,
        ),
        (ErrorKind::Internal, "internal", Code::Internal),
    ];

    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|e| e.0 == self)
            .map_or("internal", |e| e.1)
    }

    fn code(self) -> Code {
        Self::ALL
            .iter()
            .find(|e| e.0 == self)
            .map_or(Code::Internal, |e| e.2)
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().find(|e| e.1 == name).map(|e| e.0)
    }
}

/// A typed control-plane failure with a message for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct MetaError {
    pub kind: ErrorKind,
    pub message: String,
    /// With [`ErrorKind::NotLeader`]: where the leader is, when known.
    pub leader: Option<String>,
}

impl MetaError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            leader: None,
        }
    }

    pub fn not_found(what: impl std::fmt::Display) -> Self {
        Self::new(
            ErrorKind::NotFound,
            format!("{what}: no such file or directory"),
        )
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    pub fn not_leader(leader: Option<String>) -> Self {
        Self {
            kind: ErrorKind::NotLeader,
            message: match &leader {
                Some(l) => format!("not the leader; the leader is {l}"),
                None => "not the leader; no leader is known yet".into(),
            },
            leader,
        }
    }

    /// Reads an error back from a gRPC status. A status without Cairn's metadata (a transport
    /// failure, a proxy) becomes `Unavailable` for transport codes (retried by [`crate::Masters`])
    /// and `Internal` otherwise.
    pub fn from_status(s: &Status) -> Self {
        let kind = s
            .metadata()
            .get(KIND_METADATA)
            .and_then(|v| v.to_str().ok())
            .and_then(ErrorKind::from_name)
            .unwrap_or(match s.code() {
                // Unknown without Cairn's metadata: the connection broke mid-call (a master
                // killed while answering); the call may or may not have been applied.
                Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                    ErrorKind::Unavailable
                }
                Code::NotFound => ErrorKind::NotFound,
                // tonic's answer for a method the server does not implement.
                Code::Unimplemented => ErrorKind::Unsupported,
                Code::InvalidArgument => ErrorKind::InvalidArgument,
                _ => ErrorKind::Internal,
            });
        let leader = s
            .metadata()
            .get(LEADER_METADATA)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Self {
            kind,
            message: s.message().to_owned(),
            leader,
        }
    }
}

/// Whether a master answered the call with `s` (Cairn's error kind is in its metadata), as
/// opposed to the transport failing before any master could (refused, cut, timed out).
pub(crate) fn answered(s: &Status) -> bool {
    s.metadata().get(KIND_METADATA).is_some()
}

impl From<&MetaError> for crate::pb::Failure {
    fn from(e: &MetaError) -> Self {
        Self {
            kind: e.kind.name().into(),
            message: e.message.clone(),
        }
    }
}

impl From<&crate::pb::Failure> for MetaError {
    /// An unknown kind (a newer master) reads as `Internal`, keeping the message.
    fn from(f: &crate::pb::Failure) -> Self {
        Self::new(
            ErrorKind::from_name(&f.kind).unwrap_or(ErrorKind::Internal),
            f.message.clone(),
        )
    }
}

impl From<MetaError> for Status {
    fn from(e: MetaError) -> Status {
        let mut s = Status::new(e.kind.code(), e.message);
        let md = s.metadata_mut();
        md.insert(KIND_METADATA, e.kind.name().parse().expect("ascii"));
        if let Some(l) = e.leader
            && let Ok(v) = l.parse()
        {
            md.insert(LEADER_METADATA, v);
        }
        s
    }
}

impl From<crate::PathError> for MetaError {
    fn from(e: crate::PathError) -> Self {
        Self::invalid(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_masters_unavailable_is_an_answer_and_a_broken_connection_is_not() {
        let busy: Status =
            MetaError::new(ErrorKind::Unavailable, "/d is being moved (retry)").into();
        assert!(answered(&busy));
        assert_eq!(MetaError::from_status(&busy).kind, ErrorKind::Unavailable);
        let refused = Status::unavailable("tcp connect error: Connection refused");
        assert!(!answered(&refused));
        assert_eq!(
            MetaError::from_status(&refused).kind,
            ErrorKind::Unavailable
        );
        assert!(!answered(&Status::deadline_exceeded("timeout")));
    }

    #[test]
    fn every_kind_survives_a_status() {
        for (kind, _, _) in ErrorKind::ALL {
            let e = MetaError {
                kind,
                message: format!("{kind:?} happened"),
                leader: Some("127.0.0.1:7000".into()),
            };
            let back = MetaError::from_status(&Status::from(e.clone()));
            assert_eq!(back, e);
        }
        for (kind, _, _) in ErrorKind::ALL {
            let e = MetaError::new(kind, format!("{kind:?} in a batch"));
            assert_eq!(MetaError::from(&crate::pb::Failure::from(&e)), e);
        }
        let odd = crate::pb::Failure {
            kind: "from-the-future".into(),
            message: "m".into(),
        };
        assert_eq!(MetaError::from(&odd).kind, ErrorKind::Internal);
        let plain = MetaError::from_status(&Status::unavailable("connection refused"));
        assert_eq!(plain.kind, ErrorKind::Unavailable);
        // What an older master answers for `Batch`: the batcher then sends calls one by one.
        let old = MetaError::from_status(&Status::unimplemented("unknown method Batch"));
        assert_eq!(old.kind, ErrorKind::Unsupported);
    }
}
