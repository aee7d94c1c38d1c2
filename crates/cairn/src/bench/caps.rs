//! `cairn bench caps`: what capabilities cost a chunkserver's appends, A/B in one process.
//!
//! One in-process chunkserver on a real O_DIRECT store file, one loopback client. The run
//! alternates short slices: **on** — the server checks every frame's capability and the client
//! sends one (80 bytes more per frame, an HMAC-SHA256, a fence lookup and the revocation
//! lookups per request; `--revoked N` fills the revocation table first); **off** —
//! the server checks nothing and the client sends none (the floor: the same server, store,
//! disk state and connection kind a moment apart). Each slice runs 4 KiB appends at `--depth`
//! (one chunk per slot, each slot appending in turn) and then at depth 1; the report gives the
//! median of each mode's slices and their ratio.

use super::Latency;
use cairn_chunkserver::{Chunkserver, DiskSet, DiskSetOptions, ServerOptions};
use cairn_chunkstore::{FormatOptions, OpenOptions};
use cairn_client::DataConn;
use cairn_client::caps::Caps;
use cairn_proto::cap::{self, CapKey, Capability, Claims};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Where the store file goes (removed afterwards).
    #[arg(long, default_value = "./cairn-bench-caps")]
    dir: std::path::PathBuf,
    /// Appends in flight at once in the deep part of each slice.
    #[arg(long, default_value_t = 64)]
    depth: usize,
    /// Bytes per append.
    #[arg(long, default_value = "4k", value_parser = super::parse_size)]
    size: u64,
    /// Seconds of each part (deep, then depth 1) of a slice.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Slices of each mode (on, off, on, off, …).
    #[arg(long, default_value_t = 6)]
    slices: usize,
    /// Size of the store file.
    #[arg(long, default_value = "4g", value_parser = super::parse_size)]
    disk_size: u64,
    /// Chunk revocations the server holds during the run (docs/security.md, "Revocation"):
    /// the bench's own chunks (excepting its holder, so that every check passes through the
    /// whole table), then others, and as many deleted users.
    #[arg(long, default_value_t = 0)]
    revoked: u64,
}

#[derive(Serialize, Default, Clone)]
struct Slice {
    deep_appends_per_sec: f64,
    depth1_p50_us: f64,
    depth1_appends_per_sec: f64,
}

#[derive(Serialize)]
struct Report {
    op: &'static str,
    size: u64,
    depth: usize,
    slices: usize,
    on: Slice,
    off: Slice,
    /// on ÷ off of the deep appends/s (1.0 = free; the target is ≥ 0.97).
    deep_ratio: f64,
    /// on ÷ off of the depth-1 p50 (1.0 = free; the target is ≤ 1.03).
    depth1_p50_ratio: f64,
    errors: u64,
    /// An append without a capability, checks on, was refused: the "on" slices checked.
    canary_refused: bool,
    /// Revocations the server held (chunks and users).
    revoked_held: u64,
    /// With revocations held: an append with a capability of a revoked user was refused.
    revoked_canary_refused: Option<bool>,
    /// With revocations held: the revocation check alone (`Revoked::check` of a capability
    /// that passes, timed over a million calls), ns per check, against the same table and
    /// against an empty one.
    check_ns: Option<(f64, f64)>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.depth >= 1 && a.slices >= 1,
        "--depth and --slices must be at least 1"
    );
    std::fs::create_dir_all(&a.dir)?;
    let path = a.dir.join("disk0.cairn");
    let _ = std::fs::remove_file(&path);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let r = rt.block_on(measure(&a, &path));
    let _ = std::fs::remove_file(&path);
    let report = r?;
    println!("{}", serde_json::to_string(&report)?);
    if let Some((full, empty)) = report.check_ns {
        eprintln!(
            "revocation check: {full:.1} ns with {} entries held, {empty:.1} ns with none",
            report.revoked_held
        );
    }
    eprintln!(
        "caps A/B: deep {:.0} vs {:.0} appends/s ({:.3}), depth-1 p50 {:.0} vs {:.0} us ({:.3}), {} errors, canary refused: {}",
        report.on.deep_appends_per_sec,
        report.off.deep_appends_per_sec,
        report.deep_ratio,
        report.on.depth1_p50_us,
        report.off.depth1_p50_us,
        report.depth1_p50_ratio,
        report.errors,
        report.canary_refused
    );
    Ok(())
}

async fn measure(a: &Args, path: &std::path::Path) -> anyhow::Result<Report> {
    let set = DiskSet::open(&DiskSetOptions {
        paths: vec![path.to_path_buf()],
        create_bytes: a.disk_size,
        zero_fill: false,
        format: FormatOptions::default(),
        open: OpenOptions::default(),
    })?;
    let cs = Chunkserver::new(
        set,
        ServerOptions {
            // Off while the connection without capabilities is made: a connection made with
            // the checks on must prove itself within the proof deadline, and that one never
            // carries a capability.
            require_capabilities: false,
            ..ServerOptions::default()
        },
    );
    let key = CapKey {
        id: 1,
        secret: rand::random(),
    };
    cs.set_cap_keys(vec![key.clone()]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(cs.clone().serve(listener, async {
        let _ = stop_rx.await;
    }));

    // Chunks: one per slot and one for depth 1, each mode its own (created in its mode).
    let expires = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs()
        + 3600) as u32;
    let caps = Arc::new(Caps::default());
    let n = a.depth + 1;
    // Deep slots: chunks 1..=depth (on) and n+1..=n+depth (off); depth 1: a fresh chunk each
    // slice from DEPTH1 on (a chunk holds 64 MiB, less than a few seconds of appends).
    let ids = (1..=2 * n as u64).chain(DEPTH1..DEPTH1 + 2 * a.slices as u64);
    for id in ids {
        let c = Capability::sign(
            &key,
            Claims {
                rights: cap::WRITE,
                chunk_id: id,
                chunk_version: 1,
                epoch: 0,
                expires_secs: expires,
                generation: 1,
                holder: HOLDER,
            },
        );
        caps.remember(&c.encode());
    }
    let revoked_held = revoke(&cs, a.revoked, 2 * n as u64);
    let timeout = Duration::from_secs(30);
    let without = Arc::new(DataConn::connect(addr, timeout).await?);
    without.ping().await?;
    cs.set_require_capabilities(true);
    let with = Arc::new(DataConn::connect_with(addr, timeout, Some(caps), None).await?);
    let data = bytes::Bytes::from(vec![0x5a; a.size as usize]);
    // Per chunk: its length so far (each mode appends to its own chunks).
    let mut lengths = vec![0u64; 2 * n + 1];
    let mut errors = 0u64;
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for round in 0..2 * a.slices {
        let checks = round % 2 == 0;
        cs.set_require_capabilities(checks);
        let (conn, base) = if checks {
            (&with, 0)
        } else {
            (&without, n as u64)
        };
        for id in base + 1..=base + a.depth as u64 {
            if lengths[id as usize] == 0 {
                lengths[id as usize] = conn.create(id, 1, data.clone()).await?;
            }
        }
        let single = DEPTH1 + round as u64;
        conn.create(single, 1, data.clone()).await?;
        let slice = run_slice(
            a,
            conn,
            base,
            single,
            &mut lengths,
            data.clone(),
            &mut errors,
        )
        .await;
        if checks {
            on.push(slice)
        } else {
            off.push(slice)
        }
    }
    // Canary: with the checks on, the connection without capabilities is refused (so the
    // "on" slices did check).
    cs.set_require_capabilities(true);
    let id = n as u64 + 1;
    let canary_refused = matches!(
        without.append(id, lengths[id as usize], data.clone()).await,
        Err(cairn_client::DataError::Status {
            status: cairn_proto::frame::Status::Unauthorized,
            ..
        })
    );
    // Canary of the revocations: a revoked user's capability on a chunk of the run.
    let revoked_canary_refused = if a.revoked > 0 {
        let c = Capability::sign(
            &key,
            Claims {
                rights: cap::WRITE,
                chunk_id: 1,
                chunk_version: 1,
                epoch: 0,
                expires_secs: expires,
                generation: 1,
                holder: REVOKED_HOLDER,
            },
        );
        let revoked_caps = Arc::new(Caps::default());
        revoked_caps.remember(&c.encode());
        let conn = DataConn::connect_with(addr, timeout, Some(revoked_caps), None).await?;
        Some(matches!(
            conn.append(1, lengths[1], data.clone()).await,
            Err(cairn_client::DataError::Status {
                status: cairn_proto::frame::Status::Unauthorized,
                ..
            })
        ))
    } else {
        None
    };
    let _ = stop_tx.send(());
    let _ = server.await;
    let med = |v: &[Slice]| Slice {
        deep_appends_per_sec: super::median(v.iter().map(|s| s.deep_appends_per_sec).collect()),
        depth1_p50_us: super::median(v.iter().map(|s| s.depth1_p50_us).collect()),
        depth1_appends_per_sec: super::median(v.iter().map(|s| s.depth1_appends_per_sec).collect()),
    };
    let (on, off) = (med(&on), med(&off));
    Ok(Report {
        op: "caps-ab",
        size: a.size,
        depth: a.depth,
        slices: a.slices,
        deep_ratio: on.deep_appends_per_sec / off.deep_appends_per_sec.max(1e-9),
        depth1_p50_ratio: on.depth1_p50_us / off.depth1_p50_us.max(1e-9),
        on,
        off,
        errors,
        canary_refused,
        revoked_held,
        revoked_canary_refused,
        check_ns: (a.revoked > 0).then(|| check_cost(a.revoked, 2 * n as u64)),
    })
}

/// ns per `Revoked::check` of the bench's capabilities (which pass every lookup) with the
/// table [`revoke`] fills, and with an empty one.
fn check_cost(n: u64, own: u64) -> (f64, f64) {
    use cairn_proto::cap::{Revocation, Revoked};
    let now = Instant::now();
    let mut full = Revoked::default();
    for i in 1..=n {
        let chunk_id = if i <= own { i } else { (1 << 40) + i };
        full.add(
            Revocation::Chunk {
                chunk_id,
                generation: 2,
                except: HOLDER,
            },
            now,
        );
        full.add(
            Revocation::Holder {
                holder: (1 << 40) + i,
                generation: 2,
            },
            now,
        );
    }
    let time = |t: &Revoked| {
        const CALLS: u64 = 1_000_000;
        let began = Instant::now();
        for i in 0..CALLS {
            let c = Claims {
                rights: cap::WRITE,
                chunk_id: 1 + i % own.max(1),
                chunk_version: 1,
                epoch: 0,
                expires_secs: u32::MAX,
                generation: 1,
                holder: HOLDER,
            };
            assert!(std::hint::black_box(t.check(&c)).is_ok());
        }
        began.elapsed().as_nanos() as f64 / CALLS as f64
    };
    (time(&full), time(&Revoked::default()))
}

/// The holder the bench's capabilities name.
const HOLDER: u64 = 0xbe_4c;
/// A deleted user's holder (the canary's).
const REVOKED_HOLDER: u64 = 1;

/// Fills the server's revocation table with `n` chunk revocations (the bench's chunks
/// 1..=`own` first, excepting its holder; then chunks no one uses) and `n` deleted users
/// (the canary's [`REVOKED_HOLDER`] and others, none the bench's). Returns the entries held.
fn revoke(cs: &Chunkserver, n: u64, own: u64) -> u64 {
    use cairn_rpc::pb::{Revocation, revocation::Kind};
    if n == 0 {
        return 0;
    }
    let mut list: Vec<Revocation> = (1..=n)
        .map(|i| Revocation {
            kind: Kind::Chunk.into(),
            generation: 2,
            chunk_id: if i <= own { i } else { (1 << 40) + i },
            except: HOLDER,
            ..Default::default()
        })
        .collect();
    list.extend((1..=n).map(|i| Revocation {
        kind: Kind::Holder.into(),
        generation: 2,
        holder: if i == 1 {
            REVOKED_HOLDER
        } else {
            (1 << 40) + i
        },
        ..Default::default()
    }));
    cs.add_revocations(&list, 1);
    2 * n
}

/// The first chunk id of the depth-1 writers.
const DEPTH1: u64 = 1 << 20;

/// One slice: `depth` slots appending to chunks base+1..=base+depth for `seconds`, then one
/// writer appending to chunk `single` (just created) for `seconds`.
async fn run_slice(
    a: &Args,
    conn: &Arc<DataConn>,
    base: u64,
    single: u64,
    lengths: &mut [u64],
    data: bytes::Bytes,
    errors: &mut u64,
) -> Slice {
    let dur = Duration::from_secs_f64(a.seconds);
    let began = Instant::now();
    let tasks: Vec<_> = (1..=a.depth as u64)
        .map(|k| {
            let id = base + k;
            let (conn, data) = (conn.clone(), data.clone());
            let mut len = lengths[id as usize];
            tokio::spawn(async move {
                let (mut done, mut errs) = (0u64, 0u64);
                while began.elapsed() < dur {
                    match conn.append(id, len, data.clone()).await {
                        Ok(l) => {
                            len = l;
                            done += 1;
                        }
                        Err(_) => {
                            errs += 1;
                            // Where the chunk is now, to go on.
                            if let Ok(i) = conn.stat(id).await {
                                len = i.length;
                            }
                        }
                    }
                }
                (id, len, done, errs)
            })
        })
        .collect();
    let mut deep = 0u64;
    for t in tasks {
        if let Ok((id, len, done, errs)) = t.await {
            lengths[id as usize] = len;
            deep += done;
            *errors += errs;
        }
    }
    let deep_secs = began.elapsed().as_secs_f64();
    let id = single;
    let mut len = data.len() as u64;
    let mut hist = super::histogram();
    let began = Instant::now();
    let mut done = 0u64;
    while began.elapsed() < dur {
        let t = Instant::now();
        match conn.append(id, len, data.clone()).await {
            Ok(l) => {
                len = l;
                let _ = hist.record(t.elapsed().as_nanos() as u64);
                done += 1;
            }
            Err(_) => {
                *errors += 1;
                if let Ok(i) = conn.stat(id).await {
                    len = i.length;
                }
            }
        }
    }
    let lat = Latency::of(&hist);
    Slice {
        deep_appends_per_sec: deep as f64 / deep_secs,
        depth1_p50_us: lat.p50_us,
        depth1_appends_per_sec: done as f64 / began.elapsed().as_secs_f64(),
    }
}
