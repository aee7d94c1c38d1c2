//! Who a call comes from and what it may do: proofs checked (cairn_rpc::auth), refusals
//! audited, users' commands wrapped to be checked against permission bits as they apply,
//! services confined to their namespaces (crate::confine), and users' secret keys sealed
//! before they enter the log.

use super::{Call, Inner, Rpc, now_ms, ok};
use crate::audit::principal_name;
use crate::state::{Actor, Command, Inode};
use cairn_rpc::auth::{Principal, UserKey};
use cairn_rpc::{ErrorKind, MetaError};
use openraft::async_runtime::WatchReceiver;
use tonic::{Request, Status};

impl Inner {
    /// Who sent a call of `method` (cairn_rpc::auth), as a gRPC status when no one valid. A
    /// valid call proves its connection (cairn_rpc::admission).
    pub(super) fn who<T>(&self, req: &Request<T>, method: &str) -> Result<Principal, Status> {
        let who = self.who_unproven(req, method)?;
        prove_connection(req)?;
        Ok(who)
    }

    /// [`Inner::who`] without moving the connection among the proven ones.
    pub(super) fn who_unproven<T>(
        &self,
        req: &Request<T>,
        method: &str,
    ) -> Result<Principal, Status> {
        let body = req.extensions().get::<cairn_rpc::auth::BodyDigest>();
        let r = self
            .auth
            .check(req.metadata(), (method, body), now_ms(), |key| {
                let a = self.sm.lock();
                let u = a.state.objects().user(key)?;
                Some(UserKey {
                    name: u.name.clone(),
                    secret_key: self.open_secret(u)?,
                    admin: u.admin,
                })
            });
        r.map_err(|e| {
            // A follower may not know a user created a moment ago: send the caller to the
            // leader rather than refuse it.
            if let Err(redirect) = self.leader_check() {
                return Status::from(redirect);
            }
            metrics::counter!("cairn_master_calls_refused_total", "method" => method.to_owned())
                .increment(1);
            if !self.refusals.allow(&self.audit) {
                return Status::from(e);
            }
            tracing::warn!(error = %e, "call refused");
            self.audit.record(serde_json::json!({
                "service": "master",
                // Unproven: who it claimed to be.
                "claimed": cairn_rpc::auth::claimed(req.metadata()),
                "addr": cairn_rpc::admission::remote_addr(req).map(|a| a.to_string()),
                "call": method,
                "result": "refused",
                "error": e.to_string(),
            }));
            Status::from(e)
        })
    }

    /// [`Inner::who`] for a call the audit log records when it ends ([`Inner::audited`]).
    pub(super) fn call<T>(
        &self,
        req: &Request<T>,
        method: &'static str,
    ) -> Result<(Principal, Call), Status> {
        let who = self.who(req, method)?;
        let call = Call {
            principal: principal_name(&who),
            addr: cairn_rpc::admission::remote_addr(req),
            method,
        };
        Ok((who, call))
    }

    /// Records how `call` on `target` ended — unless it only sent the caller to the leader —
    /// and answers with `r`.
    pub(super) fn audited<T>(
        &self,
        call: &Call,
        target: serde_json::Value,
        r: Result<T, MetaError>,
    ) -> Rpc<T> {
        let redirect = matches!(&r, Err(e) if e.kind == ErrorKind::NotLeader);
        if self.audit.is_on() && !redirect {
            self.audit.record(serde_json::json!({
                "service": "master",
                "principal": call.principal,
                "addr": call.addr.map(|a| a.to_string()),
                "call": call.method,
                "target": target,
                "result": match &r {
                    Ok(_) => "ok",
                    Err(e) => e.kind.name(),
                },
                "error": r.as_ref().err().map(|e| e.message.clone()),
            }));
        }
        ok(r)
    }

    /// `u`'s secret key as the user holds it: opened when sealed; `None` (logged) when it
    /// does not open — the state was altered, or came from another cluster.
    pub(super) fn open_secret(&self, u: &cairn_rpc::object::User) -> Option<String> {
        match &self.sealer {
            Some(s) => match s.open(&u.secret_key, &u.access_key) {
                Ok(k) => Some(k),
                Err(e) => {
                    tracing::error!(user = %u.name, error = %e, "a user's secret key does not open");
                    None
                }
            },
            None if cairn_rpc::seal::Sealer::is_sealed(&u.secret_key) => {
                tracing::error!(user = %u.name, "a sealed secret key, and no cluster secret to open it");
                None
            }
            None => Some(u.secret_key.clone()),
        }
    }

    /// Seals the secret key a change to the object index carries (a user's creation, new
    /// keys), so that it enters the log sealed.
    pub(super) fn seal_op(&self, op: &mut cairn_rpc::object::ObjectOp) {
        use cairn_rpc::object::ObjectOp as O;
        let Some(s) = &self.sealer else { return };
        match op {
            O::CreateUser { user } => {
                user.secret_key = s.seal(&user.secret_key, &user.access_key);
            }
            O::SetUserKeys {
                access_key,
                secret_key,
                ..
            } => *secret_key = s.seal(secret_key, access_key),
            _ => {}
        }
    }

    /// The leader seals users' secret keys stored in plain text by an older version, then
    /// takes a snapshot so that the log entries holding them can be purged.
    pub(crate) async fn seal_plain_secrets(&self) {
        let Some(s) = &self.sealer else { return };
        if self.leader_check().is_err() {
            return;
        }
        use std::sync::atomic::Ordering;
        let term = self.raft.metrics().borrow_watched().current_term;
        if self.sealed_term.load(Ordering::Acquire) == term {
            return;
        }
        let plain = self.sm.lock().state.objects().plain_secrets();
        if plain.is_empty() {
            self.sealed_term.store(term, Ordering::Release);
            return;
        }
        let sealed = plain
            .into_iter()
            .filter(|(_, secret)| !secret.is_empty())
            .map(|(key, secret)| {
                let sealed = s.seal(&secret, &key);
                (key, sealed)
            })
            .collect::<Vec<_>>();
        let n = sealed.len();
        match self.write(Command::SealSecrets { sealed }).await {
            Ok(_) => {
                tracing::warn!(
                    users = n,
                    "sealed users' secret keys kept in plain text by an older version"
                );
                if let Err(e) = self.raft.trigger().snapshot().await {
                    tracing::warn!(error = %e, "could not take a snapshot after sealing");
                }
            }
            Err(e) => tracing::warn!(error = %e, "sealing users' secret keys failed"),
        }
    }

    /// The leader makes the first capability key when the state has none.
    pub(crate) async fn ensure_cap_key(&self) {
        if self.leader_check().is_err() || !self.sm.lock().state.cap_keys().is_empty() {
            return;
        }
        let cmd = Command::RotateKey {
            secret: crate::caps::new_secret(),
            now_ms: now_ms(),
        };
        match self.write(cmd).await {
            Ok(_) => tracing::info!("made the first capability key"),
            Err(e) => tracing::warn!(error = %e, "making the first capability key failed"),
        }
    }
}

/// `cmd` on behalf of `who` when a user sent it (checked against permission bits as it
/// applies); a service's within its namespace (checked here: [`crate::confine`]); servers'
/// commands as they are.
///
/// # Errors
/// `PermissionDenied`: a service's command outside its namespace.
pub(super) fn as_user(who: &Principal, cmd: Command) -> Result<Command, MetaError> {
    Ok(match who {
        Principal::User { name, admin } => Command::As {
            actor: Actor {
                user: name.clone(),
                admin: *admin,
            },
            cmd: Box::new(cmd),
        },
        Principal::Service(s) => {
            crate::confine::command(*s, &cmd)?;
            cmd
        }
        Principal::Server(_) | Principal::Open => cmd,
    })
}

/// Checks a read of `ino` by `who`: `want` on it and search on the way.
pub(super) fn check_read(
    st: &crate::state::State,
    who: &Principal,
    ino: &Inode,
    want: u16,
) -> Result<(), MetaError> {
    match who {
        Principal::User { name, admin: false } => st.check_inode(ino.id, name, want),
        Principal::Service(s) => crate::confine::path(*s, &st.path_of(ino.id)),
        _ => Ok(()),
    }
}

/// Moves the connection `req` came on among the proven ones (docs/security.md "Resource
/// limits"): it made a call whose proof checked. Refused when those slots are all taken.
pub(crate) fn prove_connection<T>(req: &Request<T>) -> Result<(), Status> {
    match cairn_rpc::admission::peer_of(req) {
        Some(p) if !p.slot.prove() => Err(Status::resource_exhausted(
            "every connection slot of this master is taken",
        )),
        _ => Ok(()),
    }
}
