//! The `Status` answer: the masters, the chunkservers and what the cluster holds.

use super::{MetaService, Rpc, ok};
use cairn_rpc::pb;
use openraft::async_runtime::WatchReceiver;
use std::collections::BTreeSet;
use std::time::Instant;

impl MetaService {
    /// The `Status` answer (also what a membership change answers with).
    pub(super) async fn status_reply(&self) -> Rpc<pb::StatusReply> {
        ok(async {
            self.inner.leader_check()?;
            let m = self.inner.raft.metrics().borrow_watched().clone();
            let membership = m.membership_config.membership();
            let voters: BTreeSet<u64> = membership.voter_ids().collect();
            let masters = membership
                .nodes()
                .map(|(id, n)| pb::MasterStatus {
                    id: *id,
                    addr: n.addr.clone(),
                    voter: voters.contains(id),
                })
                .collect();
            let now = Instant::now();
            // Over the root and every partition this master leads.
            let (missing_replicas, [files, dirs, chunks, logical_bytes]) =
                self.inner.with_view(|_, v| {
                    let mut sum = [0u64; 4];
                    for (_, s) in v.all() {
                        let t = s.totals();
                        for (x, y) in sum.iter_mut().zip([t.0, t.1, t.2, t.3]) {
                            *x += y;
                        }
                    }
                    (self.inner.registry.lock().missing_replicas(v, now), sum)
                });
            let a = self.inner.sm.lock();
            let reg = self.inner.registry.lock();
            let reporters = reg.reports.reporters(now);
            let avoided = reg.reports.avoided(a.state.servers().len(), now);
            let servers = a
                .state
                .servers()
                .values()
                .map(|s| {
                    let live = reg.live.get(&s.id);
                    pb::ServerStatus {
                        id: s.id,
                        addr: s.addr.clone(),
                        host: s.host.clone(),
                        rack: s.rack.clone(),
                        state: reg.state_of(s, now).name().into(),
                        capacity_bytes: live.map_or(0, |l| l.capacity),
                        used_bytes: live.map_or(0, |l| l.used),
                        chunk_count: live.map_or(0, |l| l.chunk_count),
                        load: live.map_or(0, |l| l.load),
                        last_heartbeat_ms_ago: live
                            .map_or(u64::MAX, |l| now.duration_since(l.last).as_millis() as u64),
                        pid: live.map_or(0, |l| l.pid),
                        reported_by: reporters.get(&s.id).copied().unwrap_or(0),
                        avoided: avoided.contains(&s.id),
                        scrub_bytes: live.map_or(0, |l| l.scrub[0]),
                        scrub_passes: live.map_or(0, |l| l.scrub[1]),
                        scrub_corrupt: live.map_or(0, |l| l.scrub[2]),
                        scrub_pass_done: live.map_or(0, |l| l.scrub_pass.done),
                        scrub_pass_total: live.map_or(0, |l| l.scrub_pass.total),
                        scrub_pass_due_ms: live.map_or(0, |l| l.scrub_pass.due_ms),
                        scrub_rate: live.map_or(0, |l| l.scrub_pass.rate),
                        scrub_behind: live.is_some_and(|l| l.scrub_pass.behind),
                        corrupt_now: live.map_or(0, |l| l.corrupt.len() as u64),
                        convert_user_bytes: live.map_or(0, |l| l.traffic[0]),
                        convert_network_bytes: live.map_or(0, |l| l.traffic[1]),
                        convert_device_bytes: live.map_or(0, |l| l.traffic[2]),
                        repair_network_bytes: live.map_or(0, |l| l.traffic[3]),
                        repair_device_bytes: live.map_or(0, |l| l.traffic[4]),
                    }
                })
                .collect();
            Ok(pb::StatusReply {
                leader_id: self.inner.id,
                term: m.current_term,
                last_applied: m.last_applied.as_ref().map_or(0, |l| l.index),
                masters,
                servers,
                files,
                dirs,
                chunks,
                logical_bytes,
                missing_replicas,
                pending_deletes: reg.pending_deletes(),
                under_replicated: reg.repairs.under_replicated,
                under_replicated_bytes: reg.repairs.under_replicated_bytes,
                repairs_running: reg.repairs.running() as u64,
                repairs_done: reg.repairs.done,
                repairs_failed: reg.repairs.failed,
                repaired_bytes: reg.repairs.bytes,
                repair_rate: reg.repairs.rate(now),
                repair_bytes_per_sec: a.state.config().repair_bytes_per_sec,
                lost_chunks: reg.repairs.lost,
                reporting_clients: reg.reports.active(now) as u32,
                conversions_running: reg.repairs.conversions_running() as u64,
                conversions_done: reg.repairs.conversions_done,
                conversions_failed: reg.repairs.conversions_failed,
                converted_bytes: reg.repairs.converted_bytes,
                conversions_waiting: reg.repairs.conversions_waiting,
                convert_after_secs: a.state.config().convert_after_secs,
                background_bytes_per_sec: a.state.config().background_bytes_per_sec,
                partitions: {
                    drop((a, reg));
                    self.inner.partition_status()
                },
            })
        }
        .await)
    }
}
