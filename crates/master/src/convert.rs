//! Protobuf ⇄ state conversions. Everything a client or chunkserver sends is validated here
//! (and fuzzed: fuzz/fuzz_targets/meta_requests.rs) before it reaches the state machine.

use crate::registry::{Heartbeat, RepairResult, Reported};
use crate::state::{Chunk, ChunkUpdate, Config, Ec, Inode, Kind, Policy, ServerRecord, State};
use cairn_rpc::{MAX_ALLOCATE, MAX_REPLICAS, MetaError, normalize, pb};
use std::collections::BTreeSet;

/// Replicas of a file whose create names none.
pub const DEFAULT_REPLICAS: u8 = 3;
const MAX_CLIENT_ID: usize = 128;
const MAX_LABEL: usize = 255;
/// Most chunk updates in one commit.
const MAX_UPDATES: usize = 1024;
/// Most chunks in one heartbeat (a full report of a large server is ~a million).
const MAX_REPORT: usize = 16 << 20;
const MAX_LOCATE: usize = 4096;
const MAX_EXCLUDE: usize = 1024;
/// The least repair bandwidth cap (1 MiB/s): repair must make progress.
const MIN_REPAIR_BYTES_PER_SEC: u64 = 1 << 20;

pub fn path(p: &str) -> Result<String, MetaError> {
    Ok(normalize(p)?)
}

pub fn client_id(s: &str) -> Result<String, MetaError> {
    if s.is_empty() || s.len() > MAX_CLIENT_ID || s.chars().any(char::is_control) {
        return Err(MetaError::invalid(format!(
            "client id must be 1..={MAX_CLIENT_ID} printable bytes"
        )));
    }
    Ok(s.to_owned())
}

pub fn chunk_count(n: u32) -> Result<usize, MetaError> {
    if n > MAX_ALLOCATE {
        return Err(MetaError::invalid(format!(
            "at most {MAX_ALLOCATE} chunks per call, asked for {n}"
        )));
    }
    Ok(n as usize)
}

/// A batch holds 1..=`MAX_BATCH_OPS` operations.
pub fn batch_len(n: usize) -> Result<(), MetaError> {
    if n == 0 || n > cairn_rpc::MAX_BATCH_OPS {
        return Err(MetaError::invalid(format!(
            "a batch holds 1..={} operations, not {n}",
            cairn_rpc::MAX_BATCH_OPS
        )));
    }
    Ok(())
}

/// A policy a client sent; `None` (nothing sent) is the default, replicas:3.
pub fn policy(p: Option<&pb::Policy>) -> Result<Policy, MetaError> {
    let p = p.cloned().unwrap_or_default();
    let ec = match (p.ec_data, p.ec_parity) {
        (0, 0) if p.then_ec => {
            return Err(MetaError::invalid("then_ec without ec_data and ec_parity"));
        }
        (0, 0) => None,
        (k, m) => Some(Ec {
            k: u8::try_from(k).map_err(|_| MetaError::invalid(format!("ec_data {k}")))?,
            m: u8::try_from(m).map_err(|_| MetaError::invalid(format!("ec_parity {m}")))?,
            then: p.then_ec,
        }),
    };
    if let Some(e) = ec.filter(|e| !e.then) {
        // Written as EC: the tail of a partial stripe has M+1 copies, all durable before an
        // append is acknowledged, so it survives the M losses the stripes survive.
        let policy = Policy {
            replicas: e.m.saturating_add(1),
            compression: p.compression,
            min_copy: e.m.saturating_add(1),
            ec,
        };
        policy.check()?;
        return Ok(policy);
    }
    let replicas = match p.replicas {
        0 => DEFAULT_REPLICAS,
        r if r <= MAX_REPLICAS => r as u8,
        r => {
            return Err(MetaError::invalid(format!(
                "replicas must be 1..={MAX_REPLICAS}, not {r}"
            )));
        }
    };
    let min_copy = match p.min_copy {
        0 => Policy::majority(replicas),
        m if m <= u32::from(replicas) && 2 * m > u32::from(replicas) => m as u8,
        m => {
            return Err(MetaError::invalid(format!(
                "min_copy must be a majority of the {replicas} replicas (2 * min_copy > replicas, \
                 min_copy <= replicas), not {m}"
            )));
        }
    };
    let policy = Policy {
        replicas,
        compression: p.compression,
        min_copy,
        ec,
    };
    policy.check()?;
    Ok(policy)
}

/// A policy as the wire carries it.
pub fn policy_pb(p: &Policy) -> pb::Policy {
    pb::Policy {
        replicas: u32::from(p.replicas),
        compression: p.compression,
        min_copy: u32::from(p.min_copy()),
        ec_data: p.ec.map_or(0, |e| u32::from(e.k)),
        ec_parity: p.ec.map_or(0, |e| u32::from(e.m)),
        then_ec: p.ec.is_some_and(|e| e.then),
    }
}

pub fn remove(v: &[u64]) -> Result<Vec<u64>, MetaError> {
    if v.len() > MAX_UPDATES {
        return Err(MetaError::invalid(format!(
            "at most {MAX_UPDATES} chunks removed per commit"
        )));
    }
    Ok(v.to_vec())
}

pub fn drops(v: &[pb::ReplicaDrop]) -> Result<Vec<(u64, u64)>, MetaError> {
    if v.len() > MAX_UPDATES {
        return Err(MetaError::invalid(format!(
            "at most {MAX_UPDATES} replica drops per commit"
        )));
    }
    Ok(v.iter().map(|d| (d.chunk_id, d.server_id)).collect())
}

pub fn exclude(v: &[u64]) -> Result<BTreeSet<u64>, MetaError> {
    if v.len() > MAX_EXCLUDE {
        return Err(MetaError::invalid(format!(
            "at most {MAX_EXCLUDE} excluded chunkservers"
        )));
    }
    Ok(v.iter().copied().collect())
}

pub fn config(r: &pb::ConfigRequest, current: &Config) -> Result<Config, MetaError> {
    let mut c = current.clone();
    if r.repair_bytes_per_sec != 0 {
        if r.repair_bytes_per_sec < MIN_REPAIR_BYTES_PER_SEC {
            return Err(MetaError::invalid(format!(
                "repair bandwidth must be at least {MIN_REPAIR_BYTES_PER_SEC} bytes/s"
            )));
        }
        c.repair_bytes_per_sec = r.repair_bytes_per_sec;
    }
    if let Some(secs) = r.convert_after_secs {
        c.convert_after_secs = secs;
    }
    if let Some(b) = r.background_bytes_per_sec {
        if b < MIN_REPAIR_BYTES_PER_SEC {
            return Err(MetaError::invalid(format!(
                "background bandwidth must be at least {MIN_REPAIR_BYTES_PER_SEC} bytes/s"
            )));
        }
        c.background_bytes_per_sec = b;
    }
    Ok(c)
}

pub fn updates(v: &[pb::ChunkUpdate]) -> Result<Vec<ChunkUpdate>, MetaError> {
    if v.len() > MAX_UPDATES {
        return Err(MetaError::invalid(format!(
            "at most {MAX_UPDATES} chunk updates per commit"
        )));
    }
    let mut seen = BTreeSet::new();
    v.iter()
        .map(|u| {
            if !seen.insert(u.chunk_id) {
                return Err(MetaError::invalid(format!(
                    "chunk {} updated twice",
                    u.chunk_id
                )));
            }
            Ok(ChunkUpdate {
                chunk_id: u.chunk_id,
                length: u.length,
                sealed: u.sealed,
            })
        })
        .collect()
}

fn label(s: &str, what: &str) -> Result<String, MetaError> {
    if s.len() > MAX_LABEL || s.chars().any(char::is_control) {
        return Err(MetaError::invalid(format!(
            "{what} must be at most {MAX_LABEL} printable bytes"
        )));
    }
    Ok(s.to_owned())
}

pub fn server_record(r: &pb::RegisterRequest) -> Result<ServerRecord, MetaError> {
    if r.server_id == 0 {
        return Err(MetaError::invalid("server id 0 is reserved"));
    }
    if r.addr.parse::<std::net::SocketAddr>().is_err() {
        return Err(MetaError::invalid(format!(
            "{:?} is not an ip:port address",
            r.addr
        )));
    }
    Ok(ServerRecord {
        id: r.server_id,
        addr: r.addr.clone(),
        host: label(&r.host, "host")?,
        rack: label(&r.rack, "rack")?,
        draining: false,
    })
}

pub fn heartbeat(r: &pb::HeartbeatRequest) -> Result<Heartbeat, MetaError> {
    if r.chunks.len() > MAX_REPORT
        || r.deleted.len() > MAX_REPORT
        || r.repaired.len() > MAX_REPORT
        || r.repairing.len() > MAX_REPORT
    {
        return Err(MetaError::invalid("chunk report too large"));
    }
    Ok(Heartbeat {
        server_id: r.server_id,
        capacity: r.capacity_bytes,
        used: r.used_bytes,
        chunk_count: r.chunk_count,
        load: r.load,
        healthy: r.healthy,
        pid: r.pid,
        full_report: r.full_report,
        chunks: r
            .chunks
            .iter()
            .map(|c| {
                (
                    c.id,
                    Reported {
                        length: c.length,
                        sealed: c.sealed,
                    },
                )
            })
            .collect(),
        deleted: r.deleted.clone(),
        repaired: r
            .repaired
            .iter()
            .map(|d| RepairResult {
                chunk_id: d.chunk_id,
                ok: d.ok,
                length: d.length,
                stream_length: d.stream_length,
                error: d.error.chars().take(512).collect(),
            })
            .collect(),
        repairing: r.repairing.clone(),
        corrupt: r.corrupt.iter().copied().take(MAX_UPDATES).collect(),
        scrub: [r.scrub_bytes, r.scrub_passes, r.scrub_corrupt],
        scrub_pass: crate::registry::ScrubPass {
            done: r.scrub_pass_done,
            total: r.scrub_pass_total,
            due_ms: r.scrub_pass_due_ms,
            rate: r.scrub_rate,
            behind: r.scrub_behind,
        },
        traffic: [
            r.convert_user_bytes,
            r.convert_network_bytes,
            r.convert_device_bytes,
            r.repair_network_bytes,
            r.repair_device_bytes,
        ],
    })
}

pub fn locate(r: &pb::LocateRequest) -> Result<&[u64], MetaError> {
    if r.chunk_ids.len() > MAX_LOCATE {
        return Err(MetaError::invalid(format!(
            "at most {MAX_LOCATE} chunks per locate"
        )));
    }
    Ok(&r.chunk_ids)
}

pub fn chunk(c: &Chunk) -> pb::ChunkMeta {
    pb::ChunkMeta {
        id: c.id,
        length: c.length,
        sealed: c.sealed,
        version: c.version,
        servers: c.servers.clone(),
        ec_data: c.ec.map_or(0, |g| u32::from(g.k)),
        ec_parity: c.ec.map_or(0, |g| u32::from(g.m)),
        ec_cell: c.ec.map_or(0, |g| g.cell),
        lz4_stream: c.ec.and_then(|g| g.lz4).map_or(0, |z| z.stream),
        lz4_block: c.ec.and_then(|g| g.lz4).map_or(0, |z| z.block),
        cap: Vec::new(),
    }
}

pub fn file(ino: &Inode) -> Option<pb::FileMeta> {
    let Kind::File(f) = &ino.kind else {
        return None;
    };
    Some(pb::FileMeta {
        inode: ino.id,
        policy: Some(policy_pb(&f.policy)),
        sealed: f.sealed,
        ctime_ms: ino.ctime_ms,
        mtime_ms: ino.mtime_ms,
        chunks: f.chunks.iter().map(chunk).collect(),
        lease: f.lease.as_ref().map(|l| pb::Lease {
            holder: l.holder.clone(),
            expires_ms: l.expires_ms,
        }),
        committed_length: f.committed_length(),
    })
}

/// Addresses of the servers named by some chunks.
pub fn server_addrs<'a>(
    st: &State,
    chunks: impl IntoIterator<Item = &'a pb::ChunkMeta>,
) -> Vec<pb::ServerAddr> {
    let ids: BTreeSet<u64> = chunks
        .into_iter()
        .flat_map(|c| c.servers.iter().copied())
        .collect();
    ids.into_iter()
        .filter_map(|id| {
            st.servers().get(&id).map(|s| pb::ServerAddr {
                id,
                addr: s.addr.clone(),
            })
        })
        .collect()
}

pub fn file_reply(st: &State, ino: &Inode) -> pb::FileReply {
    let f = file(ino);
    let servers = f
        .as_ref()
        .map(|f| server_addrs(st, &f.chunks))
        .unwrap_or_default();
    pb::FileReply {
        file: f,
        servers,
        continued_chunk: 0,
    }
}

/// A node's reply: `st` is its partition's state, `root` the root partition's (where the
/// chunkservers are).
pub fn node_reply(st: &State, root: &State, path: &str, ino: &Inode) -> pb::NodeReply {
    let r = file_reply(root, ino);
    pb::NodeReply {
        path: path.to_owned(),
        is_dir: matches!(ino.kind, Kind::Dir),
        inode: st.public_id(ino.id),
        ctime_ms: ino.ctime_ms,
        mtime_ms: ino.mtime_ms,
        file: r.file,
        servers: r.servers,
        dir_policy: match ino.kind {
            Kind::Dir => st.inherited_policy(path).as_ref().map(policy_pb),
            Kind::File(_) => None,
        },
        owner: ino.owner.clone(),
        mode: u32::from(ino.mode),
    }
}

/// A listing's entry: the entry's name, the rest its node's (another for a hard link's
/// entry: `State::linked`).
pub fn dir_entry(entry: &Inode, ino: &Inode) -> pb::DirEntry {
    let f = ino.file();
    pb::DirEntry {
        name: entry.name.clone(),
        is_dir: f.is_none(),
        inode: ino.id,
        // A file a mount wrote: its size (its bytes are in segments, docs/files.md).
        length: match ino.posix.as_ref().filter(|p| p.extents.is_some()) {
            Some(p) => p.size,
            None => f.map_or(0, |f| f.committed_length()),
        },
        chunks: f.map_or(0, |f| f.chunks.len() as u32),
        sealed: f.is_some_and(|f| f.sealed),
        mtime_ms: ino.mtime_ms,
        owner: ino.owner.clone(),
        mode: u32::from(ino.mode),
    }
}

/// Permission bits from a request (unset: the default).
///
/// # Errors
/// Bits past 0o7777.
pub fn mode(m: Option<u32>) -> Result<Option<u16>, MetaError> {
    m.map(|m| {
        u16::try_from(m)
            .ok()
            .filter(|m| *m <= crate::state::perm::MAX_MODE)
            .ok_or_else(|| {
                MetaError::invalid(format!(
                    "mode {m:o}: permission bits are at most 7777 (octal)"
                ))
            })
    })
    .transpose()
}
