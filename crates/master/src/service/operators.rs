//! The operators' calls: the master group's membership, draining a chunkserver, rotating the
//! capability key, the cluster's settings (admins only; each audited). Moved from service.rs.

use super::{MetaService, Rpc, now_ms};
use crate::convert;
use crate::state::Command;
use cairn_rpc::{ErrorKind, MetaError, pb};
use openraft::BasicNode;
use std::collections::BTreeSet;
use tonic::Request;

impl MetaService {
    pub(super) async fn membership(
        &self,
        req: Request<pb::MembershipRequest>,
    ) -> Rpc<pb::StatusReply> {
        let (who, call) = self.inner.call(&req, "ChangeMembership")?;
        let r = req.into_inner();
        let target = serde_json::json!(
            r.masters
                .iter()
                .map(|m| format!("{}={}", m.id, m.addr))
                .collect::<Vec<_>>()
        );
        let res: Result<(), MetaError> = async {
            who.require_admin("changing the masters")?;
            if r.masters.is_empty() {
                return Err(MetaError::invalid("a group needs at least one master"));
            }
            self.inner.leader_check()?;
            let known = self.inner.master_addrs();
            let map = |e: openraft::error::RaftError<_, _>| {
                MetaError::new(ErrorKind::Unavailable, e.to_string())
            };
            for m in &r.masters {
                if known.get(&m.id) != Some(&m.addr) {
                    self.inner
                        .raft
                        .add_learner(
                            m.id,
                            BasicNode {
                                addr: m.addr.clone(),
                            },
                            true,
                        )
                        .await
                        .map_err(map)?;
                }
            }
            let ids: BTreeSet<u64> = r.masters.iter().map(|m| m.id).collect();
            self.inner
                .raft
                .change_membership(ids, false)
                .await
                .map_err(map)?;
            Ok(())
        }
        .await;
        self.inner.audited(&call, target, res)?;
        self.status_reply().await
    }

    pub(super) async fn server_state(
        &self,
        req: Request<pb::ServerStateRequest>,
    ) -> Rpc<pb::Empty> {
        let (who, call) = self.inner.call(&req, "SetServerState")?;
        let r = req.into_inner();
        let target = serde_json::json!({"server_id": r.server_id, "state": r.state});
        self.inner.audited(
            &call,
            target,
            async {
                who.require_admin("draining a chunkserver")?;
                let draining = match r.state.as_str() {
                    "draining" => true,
                    "up" => false,
                    s => {
                        return Err(MetaError::invalid(format!(
                            "state must be up or draining, not {s:?}"
                        )));
                    }
                };
                self.inner
                    .write(Command::SetDraining {
                        server_id: r.server_id,
                        draining,
                    })
                    .await?;
                Ok(pb::Empty {})
            }
            .await,
        )
    }

    pub(super) async fn rotate(&self, req: Request<pb::Empty>) -> Rpc<pb::RotateKeyReply> {
        let (who, call) = self.inner.call(&req, "RotateKey")?;
        let target = serde_json::Value::Null;
        self.inner.audited(
            &call,
            target,
            async {
                who.require_admin("rotating the capability key")?;
                self.inner.read_barrier().await?;
                let before: Vec<u32> = {
                    let a = self.inner.sm.lock();
                    let keys = a.state.cap_keys();
                    let now = now_ms();
                    if let Some(last) = keys.last()
                        && now < last.created_ms + crate::caps::KEY_ACTIVATION_MS
                    {
                        // Not retried by clients: a second rotation now would drop the key that
                        // signs today before its successor has reached every chunkserver.
                        return Err(MetaError::new(
                            ErrorKind::InvalidArgument,
                            format!(
                                "key {} was made {} ms ago and is still reaching the chunkservers; \
                             rotate again in {} ms",
                                last.id,
                                now - last.created_ms,
                                last.created_ms + crate::caps::KEY_ACTIVATION_MS - now
                            ),
                        ));
                    }
                    keys.iter().map(|k| k.id).collect()
                };
                self.inner
                    .write(Command::RotateKey {
                        secret: crate::caps::new_secret(),
                        now_ms: now_ms(),
                    })
                    .await?;
                let valid: Vec<u32> = self
                    .inner
                    .sm
                    .lock()
                    .state
                    .cap_keys()
                    .iter()
                    .map(|k| k.id)
                    .collect();
                tracing::warn!(?valid, "capability key rotated");
                Ok(pb::RotateKeyReply {
                    key_id: valid.last().copied().unwrap_or(0),
                    dropped: before
                        .into_iter()
                        .find(|id| !valid.contains(id))
                        .unwrap_or(0),
                    valid,
                })
            }
            .await,
        )
    }

    pub(super) async fn settings(&self, req: Request<pb::ConfigRequest>) -> Rpc<pb::Empty> {
        let (who, call) = self.inner.call(&req, "SetConfig")?;
        let r = req.into_inner();
        let target = serde_json::json!({"repair_bytes_per_sec": r.repair_bytes_per_sec, "convert_after_secs": r.convert_after_secs, "background_bytes_per_sec": r.background_bytes_per_sec});
        self.inner.audited(
            &call,
            target,
            async {
                who.require_admin("changing cluster settings")?;
                self.inner.read_barrier().await?;
                let config = convert::config(&r, self.inner.sm.lock().state.config())?;
                self.inner.write(Command::SetConfig { config }).await?;
                Ok(pb::Empty {})
            }
            .await,
        )
    }
}
