//! Checking a call's proof at the masters: who sent it (a server, a user, a service), that
//! its body is the one signed, that its time is near, and that it was not seen before.

use super::{
    AUTH_METADATA, BodyDigest, Call, ClusterSecret, MAX_SKEW_MS, Proof, SERVICE_AUTH_METADATA,
    Service, ServiceKey, USER_AUTH_METADATA, now_ms,
};
use crate::{ErrorKind, MetaError};

/// Who a checked call came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// A holder of the cluster secret, by the name it gave.
    Server(String),
    /// A user of the cluster.
    User { name: String, admin: bool },
    /// A service with its own key: its namespace only.
    Service(Service),
    /// Anyone: the master runs without a cluster secret (`--insecure`).
    Open,
}

impl Principal {
    /// Servers, admins and everyone on an open cluster pass every permission check.
    pub fn is_superuser(&self) -> bool {
        match self {
            Self::Server(_) | Self::Open => true,
            Self::User { admin, .. } => *admin,
            Self::Service(_) => false,
        }
    }

    /// The user's name; `None` for servers and open clusters.
    pub fn user(&self) -> Option<&str> {
        match self {
            Self::User { name, .. } => Some(name),
            _ => None,
        }
    }

    /// Refuses anyone but servers and admins.
    ///
    /// # Errors
    /// `PermissionDenied` for other users.
    pub fn require_admin(&self, what: &str) -> Result<(), MetaError> {
        if self.is_superuser() {
            return Ok(());
        }
        Err(MetaError::new(
            ErrorKind::PermissionDenied,
            format!("{what} needs an admin user"),
        ))
    }

    /// Refuses anyone but servers.
    ///
    /// # Errors
    /// `PermissionDenied` for users (an open cluster lets anyone through).
    pub fn require_server(&self, what: &str) -> Result<(), MetaError> {
        match self {
            Self::Server(_) | Self::Open => Ok(()),
            Self::User { .. } | Self::Service(_) => Err(MetaError::new(
                ErrorKind::PermissionDenied,
                format!("{what} is for servers (holders of the cluster secret)"),
            )),
        }
    }
}

/// A user as the masters know it, for checking a user's proof.
pub struct UserKey {
    pub name: String,
    pub secret_key: String,
    pub admin: bool,
}

/// Checks proofs: the cluster secret for servers, users' keys for users, and that no proof
/// is accepted twice by this master (a replay of a captured call within the skew window).
pub struct Verifier {
    secret: Option<ClusterSecret>,
    seen: parking_lot::Mutex<Replay>,
}

/// MAC prefixes of proofs accepted in the last two windows of [`MAX_SKEW_MS`] (any proof older
/// than that is refused by its time, so forgetting older ones is safe).
#[derive(Default)]
struct Replay {
    current: std::collections::HashSet<[u8; 16]>,
    previous: std::collections::HashSet<[u8; 16]>,
    since_ms: u64,
}

impl Replay {
    /// Whether `tag` is new (and remembers it).
    fn first_use(&mut self, tag: &[u8], now_ms: u64) -> bool {
        if now_ms.saturating_sub(self.since_ms) > 2 * MAX_SKEW_MS {
            self.previous = std::mem::take(&mut self.current);
            self.since_ms = now_ms;
        }
        let mut k = [0u8; 16];
        k.copy_from_slice(&tag[..16]);
        !self.previous.contains(&k) && self.current.insert(k)
    }
}

impl Verifier {
    /// Without a secret every call is let through as [`Principal::Open`].
    pub fn new(secret: Option<ClusterSecret>) -> Self {
        Self {
            secret,
            seen: parking_lot::Mutex::new(Replay::default()),
        }
    }

    pub fn secret(&self) -> Option<&ClusterSecret> {
        self.secret.as_ref()
    }

    /// Who sent a call of `method` with `meta` and a body of digest `body` (the
    /// [`DigestLayer`]'s; `None`: it did not run); `user` finds a user by access key.
    ///
    /// # Errors
    /// `Unauthenticated`: no proof, a malformed or wrong one (another body than the one
    /// signed among the reasons), an unknown access key, a time more than [`MAX_SKEW_MS`] from
    /// `now_ms`, or a proof seen before.
    pub fn check(
        &self,
        meta: &tonic::metadata::MetadataMap,
        call: (&str, Option<&BodyDigest>),
        now_ms: u64,
        user: impl FnOnce(&str) -> Option<UserKey>,
    ) -> Result<Principal, MetaError> {
        let Some(secret) = &self.secret else {
            return Ok(Principal::Open);
        };
        let (method, body) = call;
        let refuse =
            |why: &str| MetaError::new(ErrorKind::Unauthenticated, format!("{method}: {why}"));
        let body = body.ok_or_else(|| refuse("the call's body was not read (no digest layer)"))?;
        let call = Call { method, body };
        let get = |k: &str| -> Result<Option<&str>, MetaError> {
            meta.get(k)
                .map(|v| v.to_str().map_err(|_| refuse("a malformed proof")))
                .transpose()
        };
        let (principal, p) = if let Some(v) = get(AUTH_METADATA)? {
            let p = Proof::parse(v).ok_or_else(|| refuse("a malformed proof"))?;
            if !p.verify(secret.key(), "server", call) {
                return Err(refuse(
                    "a wrong proof of the cluster secret: another cluster's secret or none, or a body changed on the way",
                ));
            }
            (Principal::Server(p.who.to_owned()), p)
        } else if let Some(v) = get(USER_AUTH_METADATA)? {
            let p = Proof::parse(v).ok_or_else(|| refuse("a malformed proof"))?;
            let u = user(p.who).ok_or_else(|| refuse("an unknown access key"))?;
            if !p.verify(u.secret_key.as_bytes(), "user", call) {
                return Err(refuse(
                    "a wrong signature: check the secret key (or a body changed on the way)",
                ));
            }
            (
                Principal::User {
                    name: u.name,
                    admin: u.admin,
                },
                p,
            )
        } else if let Some(v) = get(SERVICE_AUTH_METADATA)? {
            let p = Proof::parse(v).ok_or_else(|| refuse("a malformed proof"))?;
            let service = Service::from_name(p.who).ok_or_else(|| refuse("an unknown service"))?;
            if !p.verify(ServiceKey::derive(secret, service).key(), "service", call) {
                return Err(refuse(
                    "a wrong proof of the service key: another cluster's key, or a body changed on the way",
                ));
            }
            (Principal::Service(service), p)
        } else {
            return Err(refuse(
                "no credentials: pass --credentials FILE (or CAIRN_CREDENTIALS), as `cairn up` and `cairn user create` write them",
            ));
        };
        if p.at_ms.abs_diff(now_ms) > MAX_SKEW_MS {
            return Err(refuse(&format!(
                "a proof {} s away from this master's clock",
                p.at_ms.abs_diff(now_ms) / 1000
            )));
        }
        if !self.seen.lock().first_use(&p.tag, now_ms) {
            return Err(refuse("a replayed call (this proof was used before)"));
        }
        Ok(principal)
    }

    /// [`Verifier::check`] for calls only servers make (no users).
    ///
    /// # Errors
    /// As [`Verifier::check`]; a user's proof is `PermissionDenied`.
    pub fn check_server<T>(
        &self,
        req: &tonic::Request<T>,
        method: &str,
    ) -> Result<Principal, MetaError> {
        let body = req.extensions().get::<BodyDigest>();
        let p = self.check(req.metadata(), (method, body), now_ms(), |_| None)?;
        p.require_server(method)?;
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_are_remembered_for_the_whole_window() {
        let mut r = Replay::default();
        let tag = [7u8; 32];
        assert!(r.first_use(&tag, 1_000));
        assert!(!r.first_use(&tag, 1_000 + MAX_SKEW_MS));
        // One rotation keeps it (in `previous`); a proof two windows old is refused by time.
        assert!(!r.first_use(&tag, 1_000 + 2 * MAX_SKEW_MS + 1));
        assert!(r.first_use(&[8u8; 32], 1_000 + 2 * MAX_SKEW_MS + 1));
    }
}
