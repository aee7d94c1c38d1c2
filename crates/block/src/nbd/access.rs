//! Who an NBD connection acts for, and what it may open: the user a client certificate was
//! issued to (asked of the masters, remembered [`CERT_TTL`]), volumes' owners and modes,
//! open sessions checked again every [`REVALIDATE`] and cut when their rights go, and the
//! audit records of connects, refusals and opens (docs/security.md "NBD", "Audit").

use super::proto::{REP_ERR_INVALID, REP_ERR_POLICY, REP_ERR_UNKNOWN};
use super::{NbdServer, Session};
use crate::volume::Volume;
use cairn_rpc::object::{ObjectError, ObjectQuery, QueryReply, Volume as VolumeMeta, VolumeAccess};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;

/// How long the user a certificate belongs to is remembered (a revocation takes this long
/// at most to reach this server).
const CERT_TTL: std::time::Duration = std::time::Duration::from_secs(5);
/// How often an open TLS session's rights are checked again with the masters.
const REVALIDATE: std::time::Duration = std::time::Duration::from_secs(2);

/// Why a volume's record was not had.
pub(super) enum Lookup {
    /// The masters refused it to the user (no such user, or no rights on the volume).
    Denied(String),
    /// Anything else, with the NBD error to answer.
    Failed((u32, String)),
}

impl Lookup {
    /// The NBD error to answer with.
    fn into_reply(self) -> (u32, String) {
        match self {
            Self::Denied(why) => (REP_ERR_POLICY, why),
            Self::Failed(e) => e,
        }
    }
}

/// Who a connection acts for.
#[derive(Debug, Clone)]
pub(super) enum Who {
    /// Plain NBD on a server run without TLS: everything.
    Anyone,
    /// TLS required and not started yet.
    Unproven,
    /// The user a client certificate was issued to.
    User { name: String, admin: bool },
    /// A certificate that is no user's (revoked, deleted), or none.
    Refused(String),
}

impl std::fmt::Display for Who {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Anyone => f.write_str("anyone (plain NBD)"),
            Self::Unproven => f.write_str("a client without TLS"),
            Self::User { name, .. } => write!(f, "user {name}"),
            Self::Refused(_) => f.write_str("a refused certificate"),
        }
    }
}

impl Who {
    /// The user's name (`anyone` on plain NBD), for logs and the audit log.
    pub(super) fn name(&self) -> String {
        match self {
            Self::Anyone => "anyone".into(),
            Self::Unproven => "unproven".into(),
            Self::User { name, .. } => name.clone(),
            Self::Refused(_) => "refused".into(),
        }
    }

    pub(super) fn access(&self, v: &VolumeMeta) -> VolumeAccess {
        match self {
            Self::Anyone => VolumeAccess::ReadWrite,
            Self::User { name, admin } => v.access(name, *admin),
            Self::Unproven | Self::Refused(_) => VolumeAccess::None,
        }
    }
}

impl NbdServer {
    /// Who holds the client certificate a TLS connection presented: the user it was issued
    /// to, asked of the masters (and kept for [`CERT_TTL`]).
    pub(super) async fn identify(&self, tls: &tokio_rustls::server::TlsStream<TcpStream>) -> Who {
        let Some(cert) = tls.get_ref().1.peer_certificates().and_then(|c| c.first()) else {
            return Who::Refused("no client certificate".into());
        };
        let fingerprint = cairn_rpc::object::cert_fingerprint(cert);
        if let Some((who, at)) = self.certs.lock().get(&fingerprint)
            && at.elapsed() < CERT_TTL
        {
            return who.clone();
        }
        let Some(who) = self.cert_user(&fingerprint).await else {
            // Not kept: the next connection asks again.
            return Who::Refused("the masters could not say whose certificate this is".into());
        };
        let mut certs = self.certs.lock();
        if certs.len() > 10_000 {
            certs.clear();
        }
        certs.insert(fingerprint, (who.clone(), std::time::Instant::now()));
        who
    }

    /// Whose certificate `fingerprint` is, asked of the masters now (`None`: they could not
    /// answer).
    pub(super) async fn cert_user(&self, fingerprint: &str) -> Option<Who> {
        let q = ObjectQuery::CertUser {
            fingerprint: fingerprint.to_owned(),
        };
        match self.client.masters().object_query(&q).await {
            Ok(Ok(QueryReply::User(Some(u)))) => Some(Who::User {
                name: u.name,
                admin: u.admin,
            }),
            Ok(Ok(QueryReply::User(None))) => Some(Who::Refused(format!(
                "certificate {} is no user's (revoked?)",
                &fingerprint[..16.min(fingerprint.len())]
            ))),
            other => {
                tracing::warn!(answer = ?other, "asking the masters whose certificate");
                None
            }
        }
    }

    /// Resolves once the session's user may no longer use it as opened — the certificate
    /// revoked, the user deleted, the volume's owner or mode changed against them — with why.
    /// Checked every [`REVALIDATE`] with the masters (never from the cache); a master that
    /// cannot answer cuts nothing. Plain NBD sessions are never cut.
    pub(super) async fn revoked(&self, s: &Session) -> String {
        let Some(fp) = &s.fingerprint else {
            return std::future::pending().await;
        };
        let name = s.volume.meta().name.clone();
        loop {
            tokio::time::sleep(REVALIDATE).await;
            let Some(who) = self.cert_user(fp).await else {
                continue;
            };
            if let Who::Refused(why) = &who {
                return why.clone();
            }
            let meta = match self.lookup_as(&who, &name).await {
                Ok(meta) => meta,
                Err(Lookup::Denied(why)) => return why,
                Err(_) => continue,
            };
            match (who.access(&meta), s.read_only) {
                (VolumeAccess::None, _) => return format!("{who} may no longer open {name:?}"),
                (VolumeAccess::Read, false) => {
                    return format!("{who} may only read {name:?} now");
                }
                _ => {}
            }
        }
    }

    /// The volume's record from the masters, for the cluster (to open it here).
    pub(super) async fn lookup(&self, name: &str) -> Result<VolumeMeta, (u32, String)> {
        self.lookup_as(&Who::Anyone, name)
            .await
            .map_err(Lookup::into_reply)
    }

    /// The volume's record, asked of the masters on the user's behalf when a user is known
    /// (they answer only if the user may open it: docs/security.md "Service credentials").
    pub(super) async fn lookup_as(&self, who: &Who, name: &str) -> Result<VolumeMeta, Lookup> {
        let q = match who {
            Who::User { name: user, .. } => ObjectQuery::VolumeFor {
                name: name.into(),
                user: user.clone(),
            },
            _ => ObjectQuery::Volume { name: name.into() },
        };
        let failed = |code, why| Err(Lookup::Failed((code, why)));
        match self.client.masters().object_query(&q).await {
            Ok(Ok(QueryReply::Volume(v))) => Ok(v),
            Ok(Err(ObjectError::NoSuchVolume)) => {
                failed(REP_ERR_UNKNOWN, format!("no volume named {name:?}"))
            }
            Ok(Err(ObjectError::AccessDenied)) => Err(Lookup::Denied(format!(
                "{who} may not open volume {name:?}"
            ))),
            Ok(Ok(_)) => failed(REP_ERR_INVALID, "unexpected answer".into()),
            Ok(Err(e)) => failed(REP_ERR_POLICY, e.to_string()),
            Err(e) => failed(REP_ERR_POLICY, format!("the masters: {e}")),
        }
    }

    /// The volumes `who` may open: the masters' list for the user when a user is known.
    pub(super) async fn volumes_for(&self, who: &Who) -> Result<Vec<VolumeMeta>, String> {
        let q = match who {
            Who::User { name, .. } => ObjectQuery::VolumesFor { user: name.clone() },
            _ => ObjectQuery::Volumes,
        };
        match self.client.masters().object_query(&q).await {
            Ok(Ok(QueryReply::Volumes(vs))) => Ok(vs
                .into_iter()
                .filter(|v| who.access(v) != VolumeAccess::None)
                .collect()),
            other => Err(format!("listing volumes: {other:?}")),
        }
    }

    /// An audit record: a connection's `event` (connect, open) for `who` on `volume`, and
    /// how it ended (`Ok(detail)` or `Err(why)`).
    pub(super) fn record(
        &self,
        peer: SocketAddr,
        event: &str,
        who: Option<&Who>,
        volume: Option<&str>,
        result: Result<&str, &str>,
    ) {
        self.opts.audit.record(serde_json::json!({
            "service": "nbd",
            "event": event,
            "addr": peer.to_string(),
            "user": who.map(Who::name),
            "volume": volume,
            "result": if result.is_ok() { "ok" } else { "refused" },
            "mode": result.ok().filter(|d| !d.is_empty()),
            "error": result.err(),
        }));
    }

    /// The record of volume `name` if `who` may open it, and whether only for reading.
    pub(super) async fn lookup_for(
        &self,
        who: &Who,
        name: &str,
    ) -> Result<(VolumeMeta, bool), (u32, String)> {
        if let Who::Refused(why) = who {
            return Err((REP_ERR_POLICY, why.clone()));
        }
        let meta = self.lookup_as(who, name).await.map_err(|e| {
            if matches!(e, Lookup::Denied(_)) {
                metrics::counter!("cairn_nbd_refused_total", "why" => "permission").increment(1);
            }
            e.into_reply()
        })?;
        match who.access(&meta) {
            VolumeAccess::ReadWrite => Ok((meta, false)),
            VolumeAccess::Read => Ok((meta, true)),
            VolumeAccess::None => {
                metrics::counter!("cairn_nbd_refused_total", "why" => "permission").increment(1);
                Err((
                    REP_ERR_POLICY,
                    format!("{who} may not open volume {name:?}"),
                ))
            }
        }
    }

    /// Volume `name` opened for `who` (shared with the other connections to it), and whether
    /// only for reading.
    pub(super) async fn open_for(
        &self,
        who: &Who,
        name: &str,
    ) -> Result<(Arc<Volume>, bool), (u32, String)> {
        let (_, read_only) = self.lookup_for(who, name).await?;
        Ok((self.acquire(name).await?, read_only))
    }
}
