//! The chunkserver's side of the control plane: register with the masters, heartbeat every
//! second with capacity, load and health, report chunks (all of them when the leader asks,
//! the changes otherwise), and delete the orphans the leader names.

use crate::Chunkserver;
use crate::repair::Repairer;
use cairn_rpc::{ErrorKind, Masters, pb};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ControlOptions {
    pub masters: Vec<String>,
    pub server_id: u64,
    /// The data-plane address clients reach this server at.
    pub advertise: String,
    pub host: String,
    pub rack: String,
    pub interval: Duration,
    pub scrub: crate::scrub::ScrubOptions,
    /// Proved to the masters with every register and heartbeat (cairn_rpc::auth).
    pub cluster_secret: Option<cairn_rpc::auth::ClusterSecret>,
    /// TLS to the masters (cairn_rpc::tls); `None`: plain TCP.
    pub tls: Option<cairn_rpc::tls::ClientTlsConfig>,
}

/// This server's id: read from `DIR/server-id`, or made and stored there on the first start —
/// `wanted` if given (an operator's numbering, `cairn up`'s 1, 2, 3…), else random and
/// non-zero.
///
/// # Errors
/// The file cannot be read or written, or does not hold a number, or holds another id than
/// `wanted` (a data directory keeps the id it was first given).
pub fn server_id(dir: &Path, wanted: Option<u64>) -> std::io::Result<u64> {
    let path = dir.join("server-id");
    match std::fs::read_to_string(&path) {
        Ok(s) => {
            let id: u64 = s.trim().parse().map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            })?;
            match wanted {
                Some(w) if w != id => Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{}: this data directory belongs to chunkserver {id}, not {w}",
                        path.display()
                    ),
                )),
                _ => Ok(id),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)?;
            let id = match wanted {
                Some(0) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "a chunkserver id is not 0",
                    ));
                }
                Some(w) => w,
                None => loop {
                    let id = rand::random::<u64>() >> 12; // fits in a JSON number exactly
                    if id != 0 {
                        break id;
                    }
                },
            };
            let tmp = dir.join("server-id.tmp");
            std::fs::write(&tmp, format!("{id}\n"))?;
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(dir)?.sync_all()?;
            Ok(id)
        }
        Err(e) => Err(e),
    }
}

/// Runs until `shutdown` resolves.
pub async fn run(
    cs: Arc<Chunkserver>,
    opts: ControlOptions,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let repairer = Repairer::new(cs.clone());
    repairer.set_server_id(opts.server_id);
    let scrubber = crate::scrub::Scrubber::spawn(cs.clone(), opts.scrub);
    tokio::pin!(shutdown);
    let mut known = opts.masters.clone();
    let cred = opts
        .cluster_secret
        .as_ref()
        .map(|s| cairn_rpc::auth::Credential::Server {
            secret: s.clone(),
            who: format!("chunkserver-{}", opts.server_id),
        });
    let mut masters = match Masters::new(&opts.masters) {
        Ok(m) => m
            .retry_for(Duration::from_secs(2))
            .credential(cred.clone())
            .tls(opts.tls.clone()),
        Err(e) => {
            tracing::error!(error = %e, "no usable master address; not reporting");
            return;
        }
    };
    let mut registered = false;
    let mut full = true;
    let mut last: HashMap<u64, (u64, bool)> = HashMap::new();
    loop {
        let step = async {
            if !registered {
                masters
                    .call(|mut c| {
                        let r = pb::RegisterRequest {
                            server_id: opts.server_id,
                            addr: opts.advertise.clone(),
                            host: opts.host.clone(),
                            rack: opts.rack.clone(),
                        };
                        async move { c.register(r).await }
                    })
                    .await?;
                registered = true;
                full = true;
                tracing::info!(id = opts.server_id, "registered with the masters");
            }
            let disks = cs.disks();
            let now = disks.chunks();
            let (capacity, used) = disks.space();
            metrics::gauge!("cairn_chunkserver_capacity_bytes").set(capacity as f64);
            metrics::gauge!("cairn_chunkserver_used_bytes").set(used as f64);
            export_store_stats(disks);
            let report = |id: &u64, (length, sealed): &(u64, bool)| pb::ChunkReport {
                id: *id,
                length: *length,
                sealed: *sealed,
            };
            let (chunks, deleted): (Vec<_>, Vec<_>) = if full {
                (now.iter().map(|(i, v)| report(i, v)).collect(), Vec::new())
            } else {
                (
                    now.iter()
                        .filter(|(i, v)| last.get(i) != Some(v))
                        .map(|(i, v)| report(i, v))
                        .collect(),
                    last.keys()
                        .filter(|i| !now.contains_key(i))
                        .copied()
                        .collect(),
                )
            };
            let traffic = repairer.traffic();
            let progress = scrubber.stats.progress();
            let req = pb::HeartbeatRequest {
                server_id: opts.server_id,
                capacity_bytes: capacity,
                used_bytes: used,
                chunk_count: {
                    metrics::gauge!("cairn_chunkserver_chunks").set(now.len() as f64);
                    now.len() as u64
                },
                load: cs.load(),
                healthy: disks.healthy(),
                full_report: full,
                chunks,
                deleted,
                pid: std::process::id(),
                repaired: repairer.take_done(),
                repairing: repairer.running(),
                corrupt: scrubber.bad(),
                scrub_bytes: scrubber.stats.bytes.load(Ordering::Relaxed),
                scrub_passes: scrubber.stats.passes.load(Ordering::Relaxed),
                scrub_corrupt: scrubber.stats.corrupt.load(Ordering::Relaxed),
                scrub_pass_done: progress.done,
                scrub_pass_total: progress.total,
                scrub_pass_due_ms: progress.due_ms,
                scrub_rate: progress.rate,
                scrub_behind: progress.behind,
                convert_user_bytes: traffic[crate::repair::TRAFFIC_CONVERT_USER],
                convert_network_bytes: traffic[crate::repair::TRAFFIC_CONVERT_NETWORK],
                convert_device_bytes: traffic[crate::repair::TRAFFIC_CONVERT_DEVICE],
                repair_network_bytes: traffic[crate::repair::TRAFFIC_REPAIR_NETWORK],
                repair_device_bytes: traffic[crate::repair::TRAFFIC_REPAIR_DEVICE],
                revocations_seen: cs.revocations_seen(),
            };
            let repaired = req.repaired.clone();
            let reply = match masters
                .send(req, |mut c, r| async move { c.heartbeat(r).await })
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    repairer.put_back(repaired);
                    return Err(e);
                }
            };
            repairer.set_rate(reply.repair_bytes_per_sec);
            cs.set_background_rate(reply.background_bytes_per_sec);
            cs.set_cap_keys(
                reply
                    .cap_keys
                    .iter()
                    .filter_map(|k| {
                        Some(cairn_proto::cap::CapKey {
                            id: k.id,
                            secret: k.secret.as_slice().try_into().ok()?,
                        })
                    })
                    .collect(),
            );
            cs.add_revocations(&reply.revocations, reply.revocations_upto);
            repairer.log_slow();
            for task in reply.repairs {
                repairer.start(task);
            }
            last = now;
            full = reply.send_full_report;
            // Follow changes of the master group (`cairn admin masters`).
            if !reply.masters.is_empty() && reply.masters != known {
                match Masters::new(&reply.masters) {
                    Ok(m) => {
                        tracing::info!(masters = ?reply.masters, "master group changed");
                        masters = m
                            .retry_for(Duration::from_secs(2))
                            .credential(cred.clone())
                            .tls(opts.tls.clone());
                        known = reply.masters.clone();
                    }
                    Err(e) => tracing::warn!(error = %e, "bad master list from the leader"),
                }
            }
            // All at once: the store puts deletes that arrive together in one batch, with one
            // log block and one flush (one at a time, each cost a flush, and a long list held
            // up the next heartbeat and so the reclaiming of space).
            let deletes = reply.delete_chunks.iter().map(|&id| {
                let disks = &disks;
                async move {
                    let r = match disks.find(id) {
                        Ok(store) => store.delete_async(id).await,
                        Err(e) => Err(e),
                    };
                    (id, r)
                }
            });
            let mut deleted = 0usize;
            for (id, r) in futures::future::join_all(deletes).await {
                match r {
                    Ok(()) => {
                        disks.unplace(id);
                        deleted += 1;
                        tracing::debug!(chunk = id, "deleted orphan chunk");
                    }
                    Err(e) => tracing::warn!(chunk = id, error = %e, "orphan delete failed"),
                }
            }
            if deleted > 0 {
                tracing::info!(chunks = deleted, "deleted orphan chunks");
            }
            Ok::<bool, cairn_rpc::MetaError>(full)
        };
        let again_now = match step.await {
            Ok(again) => again,
            Err(e) => {
                if e.kind == ErrorKind::NotFound {
                    registered = false; // a master that lost us (new group): register again
                }
                full = true;
                tracing::warn!(error = %e, "heartbeat failed");
                false
            }
        };
        if !again_now {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(opts.interval) => {}
            }
        }
    }
}

/// Each chunk store's counters as metrics, labelled by disk (its position in `--disks`):
/// appends, bytes, flushes (group commit: appends ÷ flushes), and where the appends' time went.
fn export_store_stats(disks: &crate::disks::DiskSet) {
    use std::sync::atomic::Ordering::Relaxed;
    for (i, store) in disks.stores().iter().enumerate() {
        let s = store.stats();
        let disk = i.to_string();
        metrics::counter!("cairn_chunkstore_appends_total", "disk" => disk.clone())
            .absolute(s.appends.load(Relaxed));
        metrics::counter!("cairn_chunkstore_append_bytes_total", "disk" => disk.clone())
            .absolute(s.append_bytes.load(Relaxed));
        metrics::counter!("cairn_chunkstore_flushes_total", "disk" => disk.clone())
            .absolute(s.flushes.load(Relaxed));
        for (phase, ns) in [
            ("queue", &s.append_queue_ns),
            ("write", &s.append_write_ns),
            ("flush", &s.append_flush_ns),
        ] {
            // Whole microseconds: a counter is an integer.
            metrics::counter!("cairn_chunkstore_append_micros_total", "disk" => disk.clone(), "phase" => phase)
                .absolute(ns.load(Relaxed) / 1000);
        }
    }
}
