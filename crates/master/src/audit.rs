//! The masters' audit log (docs/security.md "Audit"): one JSON line per accepted mutating call
//! and per refused call — time, principal, address, call, target, result. Calls that only
//! send the caller to the leader are not recorded (the leader records the call). A batch
//! (the S3 gateway's and the SDK's grouped calls) is recorded op by op, each with its own
//! result.

use cairn_rpc::auth::Principal;
use cairn_rpc::pb;
use serde_json::{Value, json};

/// Refused calls recorded (in the audit log and as warnings) at most [`RefusalBudget::LINES`]
/// each [`RefusalBudget::WINDOW`]; then one record says how many were left out — a flood of
/// bad proofs must not fill the disk. (`cairn_master_calls_refused_total` counts them all.)
#[derive(Default)]
pub(crate) struct RefusalBudget {
    inner: parking_lot::Mutex<(Option<std::time::Instant>, u32, u64)>,
}

impl RefusalBudget {
    pub const LINES: u32 = 100;
    pub const WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

    /// Whether one more refusal may be recorded now.
    pub fn allow(&self, audit: &cairn_rpc::audit::Audit) -> bool {
        let mut g = self.inner.lock();
        let (since, used, dropped) = &mut *g;
        let now = std::time::Instant::now();
        if since.is_none_or(|t| now.duration_since(t) >= Self::WINDOW) {
            if *dropped > 0 {
                tracing::warn!(left_out = *dropped, "refused calls not recorded one by one");
                audit.record(json!({
                    "service": "master",
                    "call": "*",
                    "result": "refused",
                    "left_out": *dropped,
                }));
            }
            *g = (Some(now), 1, 0);
            return true;
        }
        if *used < Self::LINES {
            *used += 1;
            true
        } else {
            *dropped += 1;
            false
        }
    }
}

/// A call the audit log records when it ends: who sent it, from where, which method.
pub(crate) struct Call {
    pub principal: String,
    pub addr: Option<std::net::SocketAddr>,
    pub method: &'static str,
}

/// How the audit log names a principal.
pub(crate) fn principal_name(p: &Principal) -> String {
    match p {
        Principal::User { name, .. } => format!("user:{name}"),
        Principal::Server(who) => format!("server:{who}"),
        Principal::Service(s) => format!("service:{s}"),
        Principal::Open => "open".into(),
    }
}

/// One operation of a batch: its name, its target and the user a gateway acts for.
pub(crate) struct Op {
    name: &'static str,
    target: Value,
    on_behalf: Option<String>,
}

pub(crate) fn describe_op(op: &pb::BatchOp) -> Op {
    use pb::batch_op::Op as O;
    let (name, target, on_behalf) = match &op.op {
        Some(O::Create(r)) => ("Create", json!(r.path), None),
        Some(O::Commit(r)) => (
            "Commit",
            json!({"path": r.path, "seal": r.seal, "release": r.release}),
            None,
        ),
        Some(O::Delete(r)) => ("Delete", json!(r.path), None),
        Some(O::Object(b)) => match cairn_rpc::object::decode::<cairn_rpc::object::ObjectOp>(b) {
            Ok(o) => {
                let (name, target, user) = o.audit();
                (name, json!(target), user.map(str::to_owned))
            }
            Err(_) => ("Object", Value::Null, None),
        },
        Some(O::Fs(b)) => match cairn_rpc::files::decode::<cairn_rpc::files::FileOp>(b) {
            Ok(o) => ("File", json!(o.path()), None),
            Err(_) => ("File", Value::Null, None),
        },
        None => ("Empty", Value::Null, None),
    };
    Op {
        name,
        target,
        on_behalf,
    }
}

/// Records each op of a batch with its own result (or the batch's error).
pub(crate) fn batch(
    audit: &cairn_rpc::audit::Audit,
    call: &Call,
    ops: &[Op],
    result: &Result<pb::BatchReply, cairn_rpc::MetaError>,
) {
    use pb::batch_result::Result as Outcome;
    if !audit.is_on() {
        return;
    }
    if let Err(e) = result
        && e.kind == cairn_rpc::ErrorKind::NotLeader
    {
        return;
    }
    for (i, op) in ops.iter().enumerate() {
        let (result, error) = match result {
            Err(e) => (e.kind.name().to_owned(), Some(e.message.clone())),
            Ok(r) => match r.results.get(i).and_then(|r| r.result.as_ref()) {
                Some(Outcome::Error(f)) => (f.kind.clone(), Some(f.message.clone())),
                Some(Outcome::Object(b)) => {
                    match cairn_rpc::object::decode::<cairn_rpc::object::OpResult>(b) {
                        Ok(Err(e)) => ("refused".to_owned(), Some(e.to_string())),
                        _ => ("ok".to_owned(), None),
                    }
                }
                _ => ("ok".to_owned(), None),
            },
        };
        audit.record(json!({
            "service": "master",
            "principal": call.principal,
            "on_behalf": op.on_behalf,
            "addr": call.addr.map(|a| a.to_string()),
            "call": op.name,
            "via": call.method,
            "target": op.target,
            "result": result,
            "error": error,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_refusals_is_recorded_up_to_the_budget() {
        let b = RefusalBudget::default();
        let off = cairn_rpc::audit::Audit::off();
        let allowed = (0..1000).filter(|_| b.allow(&off)).count();
        assert_eq!(allowed, RefusalBudget::LINES as usize);
        assert_eq!(b.inner.lock().2, 1000 - u64::from(RefusalBudget::LINES));
    }
}
