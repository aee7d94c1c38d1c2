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

/// The first 8 bytes of the MAC of every proof accepted whose time is still inside
/// [`MAX_SKEW_MS`] of now, grouped by that time in buckets of [`REPLAY_BUCKET_MS`]. A replay
/// carries the same time as the original (the time is signed), so it finds its bucket; a
/// bucket whose every time is out of the window is dropped whole (such proofs are refused by
/// their time). A bucket whose times are past keeps its tags in a sorted array (8 bytes a
/// call, against ~20 in a hash set at its usual load) and only the proofs that arrive late
/// for it in a set. Memory is the rate of calls times about one window with clocks in step
/// (two at most, when the callers' clocks run ahead).
#[derive(Default)]
struct Replay {
    buckets: std::collections::BTreeMap<u64, Bucket>,
    /// The buckets below this one were packed when the master's clock left them.
    packed_below: u64,
}

#[derive(Default)]
struct Bucket {
    /// Sorted.
    packed: Vec<u64>,
    fresh: std::collections::HashSet<u64>,
}

/// How finely [`Replay`] groups proofs by their time.
const REPLAY_BUCKET_MS: u64 = 5_000;
/// A past bucket's fresh tags are packed once this many have gathered.
const REPLAY_PACK_AT: usize = 1_024;

impl Bucket {
    fn contains(&self, k: u64) -> bool {
        self.fresh.contains(&k) || self.packed.binary_search(&k).is_ok()
    }

    fn pack(&mut self) {
        self.packed.extend(self.fresh.drain());
        self.packed.sort_unstable();
        self.packed.shrink_to_fit();
        self.fresh = std::collections::HashSet::new();
    }
}

impl Replay {
    /// Whether `tag` of a proof made at `at_ms` (already checked to be within
    /// [`MAX_SKEW_MS`] of `now_ms`) is new, and remembers it.
    fn first_use(&mut self, tag: &[u8], at_ms: u64, now_ms: u64) -> bool {
        // Bucket b holds times [b·B, (b+1)·B): all refused by time once (b+1)·B is below
        // now − MAX_SKEW_MS.
        let oldest_kept = now_ms.saturating_sub(MAX_SKEW_MS) / REPLAY_BUCKET_MS;
        while let Some(e) = self.buckets.first_entry() {
            if *e.key() >= oldest_kept {
                break;
            }
            e.remove();
        }
        let mut k = [0u8; 8];
        k.copy_from_slice(&tag[..8]);
        let k = u64::from_le_bytes(k);
        let b = at_ms / REPLAY_BUCKET_MS;
        let bucket = self.buckets.entry(b).or_default();
        if bucket.contains(k) {
            return false;
        }
        bucket.fresh.insert(k);
        // A bucket the master's clock has left gets few new tags: pack it then, and again
        // when its late arrivals gather.
        let current = now_ms / REPLAY_BUCKET_MS;
        if b < current && bucket.fresh.len() >= REPLAY_PACK_AT {
            bucket.pack();
        }
        if self.packed_below < current {
            for (_, left) in self.buckets.range_mut(self.packed_below..current) {
                if left.fresh.len() >= REPLAY_PACK_AT {
                    left.pack();
                }
            }
            self.packed_below = current;
        }
        true
    }

    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.buckets
            .values()
            .map(|b| b.packed.len() + b.fresh.len())
            .sum()
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
        if !self.seen.lock().first_use(&p.tag, p.at_ms, now_ms) {
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
        let at = 10 * MAX_SKEW_MS;
        assert!(r.first_use(&tag, at, at));
        // Replayed while its time is still accepted, from either side of the window.
        assert!(!r.first_use(&tag, at, at + MAX_SKEW_MS));
        assert!(!r.first_use(&tag, at, at - MAX_SKEW_MS));
        // A proof made ahead of the master's clock is kept until its time is out of the
        // window too.
        let ahead = at + MAX_SKEW_MS;
        assert!(r.first_use(&[9u8; 32], ahead, at));
        assert!(!r.first_use(&[9u8; 32], ahead, ahead + MAX_SKEW_MS));
        // Past the window (refused by time before this is asked) the old times are dropped.
        assert!(r.first_use(&[8u8; 32], at + 3 * MAX_SKEW_MS, at + 3 * MAX_SKEW_MS));
        assert_eq!(r.remembered(), 1);
    }

    #[test]
    fn packed_buckets_still_find_replays() {
        let mut r = Replay::default();
        let at = 10 * MAX_SKEW_MS;
        let tag = |i: u64| {
            let mut t = [0u8; 32];
            t[..8].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
            t
        };
        for i in 0..3 * REPLAY_PACK_AT as u64 {
            assert!(r.first_use(&tag(i), at, at));
        }
        // The master's clock moves two buckets on: a call packs the bucket of `at`.
        let later = at + 2 * REPLAY_BUCKET_MS;
        assert!(r.first_use(&tag(u64::MAX), later, later));
        let b = &r.buckets[&(at / REPLAY_BUCKET_MS)];
        assert!(b.fresh.len() < REPLAY_PACK_AT && !b.packed.is_empty());
        for i in 0..3 * REPLAY_PACK_AT as u64 {
            assert!(
                !r.first_use(&tag(i), at, later),
                "replay {i} accepted after packing"
            );
        }
        // Late arrivals for a packed bucket are new, then replays.
        for i in 3 * REPLAY_PACK_AT as u64..5 * REPLAY_PACK_AT as u64 {
            assert!(r.first_use(&tag(i), at, later));
        }
        for i in 0..5 * REPLAY_PACK_AT as u64 {
            assert!(!r.first_use(&tag(i), at, later));
        }
        assert_eq!(r.remembered(), 5 * REPLAY_PACK_AT + 1);
    }

    #[test]
    fn memory_is_about_one_window_of_calls() {
        let mut r = Replay::default();
        // 1 000 calls a second for 10 windows, clocks in step.
        let mut most = 0;
        for ms in 0..10 * MAX_SKEW_MS {
            let mut tag = [0u8; 32];
            tag[..8].copy_from_slice(&ms.to_le_bytes());
            assert!(r.first_use(&tag, ms, ms));
            most = most.max(r.remembered());
        }
        let window = usize::try_from(MAX_SKEW_MS + REPLAY_BUCKET_MS).unwrap();
        assert!(most <= window, "{most} remembered, one window is {window}");
    }
}
