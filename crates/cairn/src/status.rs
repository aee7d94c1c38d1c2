//! `cairn status`: the masters, services and chunkservers, and the cluster's totals.

use crate::cluster::ClusterArgs;
use crate::fs::human;
use cairn_rpc::object::{ObjectQuery, QueryReply};
use cairn_rpc::pb;

#[derive(clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Whether process `pid` runs (signal 0 delivers nothing; EPERM: it runs as someone else).
fn alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as i32, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

pub fn run(a: StatusArgs) -> anyhow::Result<()> {
    let masters = a.cluster.masters()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (s, objects) = rt.block_on(async {
        let m =
            crate::cluster::masters_client(&masters)?.retry_for(std::time::Duration::from_secs(5));
        let s: pb::StatusReply = m
            .call(|mut c| async move { c.status(pb::Empty {}).await })
            .await?;
        // Masters from before the object service answer without gateways.
        let objects = match m.object_query(&ObjectQuery::Gateways).await {
            Ok(Ok(QueryReply::Gateways {
                gateways,
                buckets,
                objects,
                uploads,
                trash,
            })) => Some((gateways, buckets, objects, uploads, trash)),
            _ => None,
        };
        Ok::<_, anyhow::Error>((s, objects))
    })?;
    // Processes of this machine's `cairn up` show their pids (the masters do not know them).
    let local = crate::cluster::ClusterFile::load(std::path::Path::new("./cairn-data"))
        .ok()
        .flatten()
        .unwrap_or_default();
    let master_pid = |addr: &str| {
        local
            .master_procs
            .iter()
            .find(|p| p.addr == addr && p.pid != 0)
            .map(|p| p.pid)
    };
    // A process of this machine's `cairn up` that has exited is down now, whatever the
    // masters last heard (the supervisor writes 0 for its pid at once).
    let exited = |procs: &[crate::cluster::Proc], addr: &str| {
        procs
            .iter()
            .find(|p| p.addr == addr)
            .is_some_and(|p| !alive(p.pid))
    };
    let master_state = |addr: &str| {
        if exited(&local.master_procs, addr) {
            "down"
        } else {
            "up"
        }
    };
    // A chunkserver of this machine's `cairn up` whose reported process is gone is down,
    // before the masters miss its heartbeats.
    let mut s = s;
    for c in &mut s.servers {
        let ours = local.chunkserver_procs.iter().any(|p| p.addr == c.addr);
        if ours && c.pid != 0 && !alive(c.pid) {
            c.state = "down".into();
        }
    }
    let this_host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let now = cairn_s3::now_ms();
    // S3 gateways and NBD servers share the masters' table; the endpoint's scheme tells them
    // apart.
    let all: &[cairn_rpc::object::Gateway] = objects
        .as_ref()
        .map(|(g, ..)| g.as_slice())
        .unwrap_or_default();
    // One entry per service: its address under `key` (S3's "endpoint", NBD's "uri").
    let listed = |nbd: bool, key: &str| -> Vec<serde_json::Value> {
        all.iter()
            .filter(|g| g.endpoint.starts_with("nbd://") == nbd)
            .map(|g| {
                let up = now.saturating_sub(g.seen_ms) < cairn_rpc::object::GATEWAY_DOWN_MS;
                let mut v = serde_json::json!({
                    "host": g.host,
                    "pid": (g.host == this_host).then_some(g.pid),
                    "state": if up { "up" } else { "down" },
                    "last_seen_ms_ago": now.saturating_sub(g.seen_ms),
                });
                v[key] = g.endpoint.clone().into();
                v
            })
            .collect()
    };
    let nbd = listed(true, "uri");
    let gateways = listed(false, "endpoint");
    let t = Traffic::of(&s);
    if a.json {
        let v = serde_json::json!({
            "leader": s.leader_id,
            "term": s.term,
            "last_applied": s.last_applied,
            "masters": s.masters.iter().map(|m| serde_json::json!({"id": m.id, "addr": m.addr, "voter": m.voter, "leader": m.id == s.leader_id, "pid": master_pid(&m.addr), "state": master_state(&m.addr)})).collect::<Vec<_>>(),
            "partitions": s.partitions.iter().map(|p| serde_json::json!({
                "id": p.id, "members": p.members, "hosted": p.hosted,
                "leader": (p.leader_id != 0).then_some(p.leader_id), "term": p.term,
                "last_applied": p.last_applied, "files": p.files, "dirs": p.dirs,
                "objects": p.objects,
                "subtree": (!p.subtree.is_empty()).then_some(&p.subtree),
            })).collect::<Vec<_>>(),
            "s3": gateways,
            "nbd": nbd,
            "objects": objects.as_ref().map(|(_, b, o, u, t)| serde_json::json!({"buckets": b, "objects": o, "uploads": u, "trash_files": t})),
            "chunkservers": s.servers.iter().map(|c| serde_json::json!({
                "id": c.id, "addr": c.addr, "host": c.host, "rack": c.rack, "state": c.state,
                "pid": c.pid, "capacity_bytes": c.capacity_bytes, "used_bytes": c.used_bytes,
                "chunks": c.chunk_count, "load": c.load,
                "reported_by_clients": c.reported_by, "avoided": c.avoided,
                "scrub": {"bytes": c.scrub_bytes, "passes": c.scrub_passes, "corrupt_found": c.scrub_corrupt, "corrupt_now": c.corrupt_now,
                    "pass": {"done_bytes": c.scrub_pass_done, "total_bytes": c.scrub_pass_total,
                             "due_unix_ms": (c.scrub_pass_due_ms > 0).then_some(c.scrub_pass_due_ms),
                             "rate_bytes_per_sec": c.scrub_rate, "behind": c.scrub_behind}},
                "last_heartbeat_ms_ago": if c.last_heartbeat_ms_ago == u64::MAX { None } else { Some(c.last_heartbeat_ms_ago) },
            })).collect::<Vec<_>>(),
            "files": s.files, "dirs": s.dirs, "chunks": s.chunks, "logical_bytes": s.logical_bytes,
            "missing_replicas": s.missing_replicas, "pending_deletes": s.pending_deletes,
            "reporting_clients": s.reporting_clients,
            "repair": {
                "under_replicated_chunks": s.under_replicated,
                "under_replicated_bytes": s.under_replicated_bytes,
                "lost_chunks": s.lost_chunks,
                "running": s.repairs_running, "done": s.repairs_done, "failed": s.repairs_failed,
                "repaired_bytes": s.repaired_bytes,
                "rate_bytes_per_sec": s.repair_rate,
                "bandwidth_cap_bytes_per_sec": s.repair_bytes_per_sec,
            },
            "conversion": {
                "waiting_chunks": s.conversions_waiting,
                "running": s.conversions_running, "done": s.conversions_done,
                "failed": s.conversions_failed, "converted_bytes": s.converted_bytes,
                "convert_after_secs": s.convert_after_secs,
            },
            "background_bytes_per_sec_per_server": s.background_bytes_per_sec,
            "background_traffic": {
                "conversion": {
                    "user_bytes": t.convert_user, "network_bytes": t.convert_network,
                    "device_bytes": t.convert_device,
                    "network_per_user_byte": ratio(t.convert_network, t.convert_user),
                    "device_per_user_byte": ratio(t.convert_device, t.convert_user),
                },
                "repair": {"network_bytes": t.repair_network, "device_bytes": t.repair_device},
                "scrub": {"device_read_bytes": t.scrub_read},
            },
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "masters (term {}, last applied {}):",
        s.term, s.last_applied
    );
    println!(
        "  {:>3}  {:<22} {:>7} {:<5} role",
        "id", "addr", "pid", "state"
    );
    for m in &s.masters {
        println!(
            "  {:>3}  {:<22} {:>7} {:<5} {}{}",
            m.id,
            m.addr,
            master_pid(&m.addr).map_or_else(|| "-".to_string(), |p| p.to_string()),
            master_state(&m.addr),
            if m.id == s.leader_id {
                "leader"
            } else {
                "follower"
            },
            if m.voter { "" } else { " (learner)" }
        );
    }
    // One partition (the root) is every cluster's start: shown only once there are more.
    if s.partitions.len() > 1 {
        println!("partitions (docs/partitions.md):");
        println!(
            "  {:>4}  {:<12} {:>6} {:>12} {:>10} {:>8} {:>10}  subtree",
            "id", "members", "leader", "last applied", "files", "dirs", "objects"
        );
        for p in &s.partitions {
            let members = p
                .members
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(",");
            if p.hosted {
                println!(
                    "  {:>4}  {:<12} {:>6} {:>12} {:>10} {:>8} {:>10}  {}",
                    p.id,
                    members,
                    if p.leader_id == 0 {
                        "-".to_string()
                    } else {
                        p.leader_id.to_string()
                    },
                    p.last_applied,
                    p.files,
                    p.dirs,
                    p.objects,
                    if p.subtree.is_empty() {
                        "-"
                    } else {
                        &p.subtree
                    },
                );
            } else {
                println!(
                    "  {:>4}  {:<12} (not hosted by the root's leader)",
                    p.id, members
                );
            }
        }
    }
    if let Some((_, buckets, objects, uploads, _)) = &objects
        && (!gateways.is_empty() || *buckets > 0)
    {
        println!(
            "s3 gateways ({buckets} buckets, {objects} objects, {uploads} uploads in progress):"
        );
        for g in &gateways {
            println!(
                "  {:<28} {:<5} {}{}",
                g["endpoint"].as_str().unwrap_or_default(),
                g["state"].as_str().unwrap_or_default(),
                g["host"].as_str().unwrap_or_default(),
                g["pid"]
                    .as_u64()
                    .map(|p| format!("  pid {p}"))
                    .unwrap_or_default(),
            );
        }
    }
    if !nbd.is_empty() {
        println!("nbd servers:");
        for g in &nbd {
            println!(
                "  {:<28} {:<5} {}{}",
                g["uri"].as_str().unwrap_or_default(),
                g["state"].as_str().unwrap_or_default(),
                g["host"].as_str().unwrap_or_default(),
                g["pid"]
                    .as_u64()
                    .map(|p| format!("  pid {p}"))
                    .unwrap_or_default(),
            );
        }
    }
    println!("chunkservers:");
    println!(
        "  {:>16}  {:<22} {:>7} {:<9} {:>10} {:>10} {:>7}  blacklisted by",
        "id", "addr", "pid", "state", "capacity", "used", "chunks"
    );
    for c in &s.servers {
        println!(
            "  {:>16}  {:<22} {:>7} {:<9} {:>10} {:>10} {:>7}  {}",
            c.id,
            c.addr,
            c.pid,
            c.state,
            human(c.capacity_bytes),
            human(c.used_bytes),
            c.chunk_count,
            match (c.reported_by, c.avoided) {
                (0, _) => String::from("-"),
                (n, false) => format!("{n}/{}", s.reporting_clients),
                (n, true) => format!("{n}/{} (no new chunks)", s.reporting_clients),
            }
        );
    }
    println!(
        "totals: {} files, {} dirs, {} chunks, {} logical; {} missing replicas",
        s.files,
        s.dirs,
        s.chunks,
        human(s.logical_bytes),
        s.missing_replicas,
    );
    println!(
        "awaiting reclamation: {} chunks pending delete on their servers{}",
        s.pending_deletes,
        objects
            .as_ref()
            .map(|o| format!(", {} S3 files in the trash", o.4))
            .unwrap_or_default()
    );
    println!(
        "scrub: {} read, {} passes, {} bad copies found, {} waiting for repair (all servers)",
        human(s.servers.iter().map(|c| c.scrub_bytes).sum()),
        s.servers.iter().map(|c| c.scrub_passes).sum::<u64>(),
        s.servers.iter().map(|c| c.scrub_corrupt).sum::<u64>(),
        s.servers.iter().map(|c| c.corrupt_now).sum::<u64>(),
    );
    for c in s.servers.iter().filter(|c| c.scrub_pass_due_ms > 0) {
        println!("  {:>16}  {}", c.id, scrub_pass(c, now));
    }
    println!(
        "repair: {} chunks ({}) under-replicated, {} lost; {} running, {} done, {} failed, \
         {} copied; rate {}/s of a {}/s cap",
        s.under_replicated,
        human(s.under_replicated_bytes),
        s.lost_chunks,
        s.repairs_running,
        s.repairs_done,
        s.repairs_failed,
        human(s.repaired_bytes),
        human(s.repair_rate),
        human(s.repair_bytes_per_sec)
    );
    println!(
        "background traffic: conversion {} of user bytes sent {} to other servers ({:.2}×) and \
         wrote {} ({:.2}×); repair read {} over the network and wrote {}; scrub read {}",
        human(t.convert_user),
        human(t.convert_network),
        ratio(t.convert_network, t.convert_user),
        human(t.convert_device),
        ratio(t.convert_device, t.convert_user),
        human(t.repair_network),
        human(t.repair_device),
        human(t.scrub_read),
    );
    println!(
        "conversion to EC: {} chunks waiting (sealed, unchanged for {} s), {} running, {} done, \
         {} failed, {} converted; background bandwidth {}/s per chunkserver",
        s.conversions_waiting,
        s.convert_after_secs,
        s.conversions_running,
        s.conversions_done,
        s.conversions_failed,
        human(s.converted_bytes),
        human(s.background_bytes_per_sec)
    );
    Ok(())
}

/// The chunkservers' background traffic, summed (docs/efficiency.md).
struct Traffic {
    convert_user: u64,
    convert_network: u64,
    convert_device: u64,
    repair_network: u64,
    repair_device: u64,
    scrub_read: u64,
}

impl Traffic {
    fn of(s: &pb::StatusReply) -> Self {
        let sum = |f: fn(&pb::ServerStatus) -> u64| s.servers.iter().map(f).sum();
        Self {
            convert_user: sum(|c| c.convert_user_bytes),
            convert_network: sum(|c| c.convert_network_bytes),
            convert_device: sum(|c| c.convert_device_bytes),
            repair_network: sum(|c| c.repair_network_bytes),
            repair_device: sum(|c| c.repair_device_bytes),
            scrub_read: sum(|c| c.scrub_bytes),
        }
    }
}

/// `a / b`, 0 when nothing was counted.
fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// A chunkserver's scrub pass in words: how far, when due, how fast.
fn scrub_pass(c: &pb::ServerStatus, now_ms: u64) -> String {
    let pct = if c.scrub_pass_total == 0 {
        100.0
    } else {
        (c.scrub_pass_done as f64 * 100.0 / c.scrub_pass_total as f64).min(100.0)
    };
    let due = c.scrub_pass_due_ms.saturating_sub(now_ms) / 1000;
    let running = c.scrub_pass_done < c.scrub_pass_total;
    format!(
        "scrub pass {pct:.0} % of {}, {} in {}d {}h {}m{}{}",
        human(c.scrub_pass_total),
        if running { "due" } else { "next" },
        due / 86_400,
        due % 86_400 / 3600,
        due % 3600 / 60,
        if running {
            format!(", reading {}/s", human(c.scrub_rate))
        } else {
            String::new()
        },
        if c.scrub_behind {
            " — behind: needs more than the background bandwidth"
        } else {
            ""
        }
    )
}
