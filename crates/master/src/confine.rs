//! What a service may do at the masters (docs/security.md "Service credentials"): the S3
//! gateway and the NBD server prove keys of their own ([`cairn_rpc::auth::ServiceKey`]), and
//! each works in its namespace only — its files below its root, its part of the object index —
//! where a holder of the cluster secret could do anything. Checked before a command is
//! proposed and before a read is answered (a service's commands are not wrapped in
//! [`crate::state::Command::As`]: within its root it acts for the cluster, as servers do).

use crate::state::Command;
use cairn_rpc::auth::{Principal, Service};
use cairn_rpc::object::{ObjectOp, ObjectQuery};
use cairn_rpc::{ErrorKind, MetaError};

fn denied(what: std::fmt::Arguments<'_>) -> MetaError {
    MetaError::new(ErrorKind::PermissionDenied, what.to_string())
}

/// Refuses a `path` outside the service's root.
///
/// # Errors
/// `PermissionDenied`.
pub fn path(s: Service, path: &str) -> Result<(), MetaError> {
    if s.owns(path) {
        return Ok(());
    }
    Err(denied(format_args!(
        "{path}: the {s} service works under {} only",
        s.root()
    )))
}

/// Refuses a command that touches anything outside the service's namespace, or that is not a
/// file or object-index change (servers' and admins' commands: registrations, membership,
/// keys, settings).
///
/// # Errors
/// `PermissionDenied`.
pub fn command(s: Service, cmd: &Command) -> Result<(), MetaError> {
    match cmd {
        Command::Mkdir { path: p, .. }
        | Command::Create { path: p, .. }
        | Command::OpenWrite { path: p, .. }
        | Command::Allocate { path: p, .. }
        | Command::Commit { path: p, .. }
        | Command::Delete { path: p } => path(s, p),
        Command::SetAttr { path: p, owner, .. } => {
            path(s, p)?;
            match owner {
                Some(_) => Err(denied(format_args!(
                    "{p}: the {s} service changes no owner"
                ))),
                None => Ok(()),
            }
        }
        Command::Rename { from, to, .. } => {
            path(s, from)?;
            path(s, to)
        }
        Command::Batch(cmds) => cmds.iter().try_for_each(|c| command(s, c)),
        Command::Object(op) => object_op(&Principal::Service(s), op),
        other => Err(denied(format_args!("{other}: not for the {s} service"))),
    }
}

/// Refuses a change to the object index that `who` may not make: a service's outside its
/// part, a user's unless an admin.
///
/// # Errors
/// `PermissionDenied`.
pub fn object_op(who: &Principal, op: &ObjectOp) -> Result<(), MetaError> {
    use ObjectOp as O;
    let allowed = match who {
        Principal::Service(Service::S3) => matches!(
            op,
            O::CreateBucket { .. }
                | O::DeleteBucket { .. }
                | O::PutObject { .. }
                | O::DeleteObject { .. }
                | O::CreateUpload { .. }
                | O::PutPart { .. }
                | O::CompleteUpload { .. }
                | O::AbortUpload { .. }
                | O::GatewaySeen { .. }
                | O::MoveExtent { .. }
                | O::DropPack { .. }
                | O::EmptyTrash { .. }
        ),
        Principal::Service(Service::Block) => {
            matches!(op, O::GatewaySeen { .. } | O::SnapshotReady { .. })
        }
        _ => return who.require_admin("the object index (the S3 gateway's)"),
    };
    if allowed {
        return Ok(());
    }
    Err(denied(format_args!(
        "{}: not for the {} service",
        op_name(op),
        crate::audit::principal_name(who)
    )))
}

/// Refuses a service's change made on behalf of a user the masters do not know (`known`
/// says whether a user by that name exists). A service names the user it acts for in the
/// operation itself, which its proof signs with the rest of the body; the masters then apply
/// that user's rights as the operation applies (a bucket's owner, an upload's).
///
/// # Errors
/// `PermissionDenied`.
pub fn on_behalf(
    who: &Principal,
    op: &ObjectOp,
    known: impl FnOnce(&str) -> bool,
) -> Result<(), MetaError> {
    let (Principal::Service(s), (name, _, Some(user))) = (who, op.audit()) else {
        return Ok(());
    };
    if known(user) {
        return Ok(());
    }
    Err(denied(format_args!(
        "{name}: the {s} service acts for user {user:?}, whom the masters do not know"
    )))
}

/// Refuses a read of the object index that `who` may not make: it holds users' secret keys
/// (for the gateway's signature checks) and certificates (for the NBD server).
///
/// # Errors
/// `PermissionDenied`.
pub fn object_query(who: &Principal, q: &ObjectQuery) -> Result<(), MetaError> {
    use ObjectQuery as Q;
    let allowed = match who {
        Principal::Service(Service::S3) => matches!(
            q,
            Q::User { .. }
                | Q::ListBuckets { .. }
                | Q::HeadBucket { .. }
                | Q::HeadObject { .. }
                | Q::ListObjects { .. }
                | Q::ListUploads { .. }
                | Q::ListParts { .. }
                | Q::StaleUploads { .. }
                | Q::Unnamed { .. }
                | Q::Trash { .. }
                | Q::Locate { .. }
                | Q::CompactionCandidates { .. }
                | Q::Layout { .. }
        ),
        Principal::Service(Service::Block) => {
            matches!(
                q,
                Q::CertUser { .. }
                    | Q::Volume { .. }
                    | Q::Volumes
                    | Q::VolumeFor { .. }
                    | Q::VolumesFor { .. }
            )
        }
        _ => return who.require_admin("the object index (the S3 gateway's)"),
    };
    if allowed {
        return Ok(());
    }
    Err(denied(format_args!(
        "this read of the object index is not for the {} service",
        crate::audit::principal_name(who)
    )))
}

/// An object-index change's name, for refusals.
fn op_name(op: &ObjectOp) -> String {
    // The serialized form is `{"Name":{…}}`: its first key.
    serde_json::to_value(op)
        .ok()
        .and_then(|v| v.as_object().and_then(|m| m.keys().next().cloned()))
        .unwrap_or_else(|| "this change".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_stay_in_their_namespace() {
        let mkdir = |p: &str| Command::Mkdir {
            path: p.into(),
            parents: true,
            now_ms: 0,
            policy: None,
            mode: None,
        };
        assert!(command(Service::S3, &mkdir("/.s3/packs")).is_ok());
        assert!(command(Service::S3, &mkdir("/.block/1")).is_err());
        assert!(command(Service::Block, &mkdir("/home")).is_err());
        let rename = Command::Rename {
            from: "/.s3/a".into(),
            to: "/elsewhere".into(),
            now_ms: 0,
        };
        assert!(command(Service::S3, &rename).is_err());
        let chown = Command::SetAttr {
            path: "/.s3".into(),
            mode: None,
            owner: Some("mallory".into()),
        };
        assert!(command(Service::S3, &chown).is_err());
        let batch = Command::Batch(vec![
            mkdir("/.s3/x"),
            Command::Delete {
                path: "/etc".into(),
            },
        ]);
        assert!(
            command(Service::S3, &batch).is_err(),
            "one bad op refuses the batch"
        );
        let s3 = Principal::Service(Service::S3);
        let nbd = Principal::Service(Service::Block);
        let user_q = ObjectQuery::User {
            access_key: "K".into(),
        };
        assert!(object_query(&s3, &user_q).is_ok());
        assert!(
            object_query(&nbd, &user_q).is_err(),
            "no secrets for the NBD server"
        );
        assert!(object_query(&s3, &ObjectQuery::Users).is_err());
        assert!(object_query(&nbd, &ObjectQuery::Volumes).is_ok());
        let drop_user = ObjectOp::DeleteUser {
            name: "alice".into(),
        };
        assert!(object_op(&s3, &drop_user).is_err());
        assert!(object_op(&nbd, &drop_user).is_err());
        let put = ObjectOp::DeleteBucket {
            user: "alice".into(),
            bucket: "b".into(),
        };
        assert!(on_behalf(&s3, &put, |u| u == "alice").is_ok());
        assert!(
            on_behalf(&s3, &put, |_| false).is_err(),
            "no acting for a user the masters do not know"
        );
        let admin = Principal::User {
            name: "root".into(),
            admin: true,
        };
        assert!(
            on_behalf(&admin, &put, |_| false).is_ok(),
            "users act for themselves"
        );
    }
}
