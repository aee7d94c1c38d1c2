//! `cairn bench tls`: what TLS on the data plane costs, A/B in one process.
//!
//! One in-process chunkserver on a real O_DIRECT store file, served on two loopback
//! listeners at once: one speaks TLS (rustls, ring; a certificate from a throwaway cluster CA
//! made for the run), the other plain TCP — the floor: the same server, store and disk a
//! moment apart. The run alternates short slices, **tls** then **plain**; each slice runs
//! `--size` appends at `--depth` (every slot appends to its own chunk, a new one when it is
//! full, deleting the full one so the store never fills), then reads of the same size at the
//! same depth. The report gives the median bandwidth of each mode and their ratio.
//! Capabilities are off on both: this measures TLS alone (`cairn bench caps` measures them).

use cairn_chunkserver::{Chunkserver, DiskSet, DiskSetOptions, ServerOptions};
use cairn_chunkstore::{FormatOptions, OpenOptions};
use cairn_client::DataConn;
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Where the store file and the throwaway TLS directory go (removed afterwards).
    #[arg(long, default_value = "./cairn-bench-tls")]
    dir: std::path::PathBuf,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 8)]
    depth: usize,
    /// Bytes per append and per read.
    #[arg(long, default_value = "1m", value_parser = super::parse_size)]
    size: u64,
    /// Seconds of each part (appends, then reads) of a slice.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Slices of each mode (tls, plain, tls, plain, …).
    #[arg(long, default_value_t = 5)]
    slices: usize,
    /// Size of the store file.
    #[arg(long, default_value = "4g", value_parser = super::parse_size)]
    disk_size: u64,
}

#[derive(Serialize, Default, Clone)]
struct Slice {
    append_mib_per_sec: f64,
    read_mib_per_sec: f64,
    /// CPU time of the whole process (client and server) per GiB appended: unlike the
    /// bandwidth it does not move with what other tenants of the machine run.
    append_cpu_s_per_gib: f64,
    read_cpu_s_per_gib: f64,
}

#[derive(Serialize)]
struct Report {
    op: &'static str,
    size: u64,
    depth: usize,
    slices: usize,
    tls: Slice,
    plain: Slice,
    /// tls ÷ plain of the append bandwidth (the target is ≥ 0.80).
    append_ratio: f64,
    /// tls ÷ plain of the read bandwidth.
    read_ratio: f64,
    /// plain ÷ tls of the CPU per GiB appended: the bandwidth ratio a box whose client and
    /// server share its cores would reach if the CPU were the only limit.
    append_cpu_ratio: f64,
    read_cpu_ratio: f64,
    errors: u64,
    /// The floor of TLS's own work: CPU seconds to seal and open one GiB with AES-128-GCM
    /// (ring, 16 KiB records, one core, in this run) — what each appended byte costs the two
    /// ends of a TLS connection at least.
    aead_floor_cpu_s_per_gib: f64,
    /// What TLS added to the CPU per GiB appended (tls − plain) ÷ that floor: 1.0 = TLS costs
    /// its cipher and nothing more.
    append_tls_cpu_vs_floor: f64,
    /// A plain-TCP connection to the TLS listener could not append: the "tls" slices spoke
    /// TLS.
    canary_refused: bool,
}

/// CPU seconds per GiB to seal and then open it in 16 KiB records with AES-128-GCM.
fn aead_floor() -> anyhow::Result<f64> {
    use ring::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
    let key = LessSafeKey::new(
        UnboundKey::new(&AES_128_GCM, &[7u8; 16]).map_err(|_| anyhow::anyhow!("AES key"))?,
    );
    const RECORD: usize = 16 << 10;
    const TOTAL: usize = 256 << 20;
    let mut buf = vec![0x5au8; RECORD];
    let cpu = super::cpu_seconds();
    for i in 0..(TOTAL / RECORD) as u64 {
        let nonce = |i: u64| {
            let mut n = [0u8; 12];
            n[4..].copy_from_slice(&i.to_le_bytes());
            Nonce::assume_unique_for_key(n)
        };
        let tag = key
            .seal_in_place_separate_tag(nonce(i), Aad::empty(), &mut buf)
            .map_err(|_| anyhow::anyhow!("seal"))?;
        buf.extend_from_slice(tag.as_ref());
        let n = key
            .open_in_place(nonce(i), Aad::empty(), &mut buf)
            .map_err(|_| anyhow::anyhow!("open"))?
            .len();
        buf.truncate(n);
    }
    Ok((super::cpu_seconds() - cpu) * ((1u64 << 30) as f64 / TOTAL as f64))
}

/// A chunk's bytes; past them a slot starts a new chunk.
const CHUNK: u64 = 64 << 20;

pub fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.depth >= 1 && a.slices >= 1 && a.size >= 1 && a.size <= CHUNK,
        "--depth and --slices must be at least 1, --size within 1..=64m"
    );
    std::fs::create_dir_all(&a.dir)?;
    let path = a.dir.join("disk0.cairn");
    let tls_dir = a.dir.join("tls");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir_all(&tls_dir);
    crate::tls::init(&tls_dir, &["127.0.0.1".into()])?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let floor = aead_floor()?;
    let r = rt.block_on(measure(&a, &path, &tls_dir, floor));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir_all(&tls_dir);
    let report = r?;
    println!("{}", serde_json::to_string(&report)?);
    eprintln!(
        "tls A/B ({} B, depth {}): appends {:.0} vs {:.0} MiB/s ({:.3}; CPU {:.2} vs {:.2} s/GiB, {:.3}), reads {:.0} vs {:.0} MiB/s ({:.3}; CPU {:.2} vs {:.2} s/GiB, {:.3}), AES-GCM floor {:.2} s/GiB, TLS added {:.2}× it; {} errors, canary refused: {}",
        report.size,
        report.depth,
        report.tls.append_mib_per_sec,
        report.plain.append_mib_per_sec,
        report.append_ratio,
        report.tls.append_cpu_s_per_gib,
        report.plain.append_cpu_s_per_gib,
        report.append_cpu_ratio,
        report.tls.read_mib_per_sec,
        report.plain.read_mib_per_sec,
        report.read_ratio,
        report.tls.read_cpu_s_per_gib,
        report.plain.read_cpu_s_per_gib,
        report.read_cpu_ratio,
        report.aead_floor_cpu_s_per_gib,
        report.append_tls_cpu_vs_floor,
        report.errors,
        report.canary_refused
    );
    Ok(())
}

async fn measure(
    a: &Args,
    path: &std::path::Path,
    tls_dir: &std::path::Path,
    floor: f64,
) -> anyhow::Result<Report> {
    let set = DiskSet::open(&DiskSetOptions {
        paths: vec![path.to_path_buf()],
        create_bytes: a.disk_size,
        zero_fill: false,
        format: FormatOptions::default(),
        open: OpenOptions::default(),
    })?;
    let cs = Chunkserver::new(set, ServerOptions::default());
    let acceptor = cairn_rpc::tls::data::acceptor(tls_dir)?;
    let connector = cairn_rpc::tls::data::connector(tls_dir)?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut servers = Vec::new();
    let mut addrs = Vec::new();
    for tls in [Some(acceptor), None] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        addrs.push(listener.local_addr()?);
        let mut rx = stop_rx.clone();
        servers.push(tokio::spawn(cs.clone().serve_with(
            listener,
            tls,
            async move {
                let _ = rx.wait_for(|s| *s).await;
            },
        )));
    }
    let timeout = Duration::from_secs(30);
    let secure = Arc::new(DataConn::connect_with(addrs[0], timeout, None, Some(&connector)).await?);
    let clear = Arc::new(DataConn::connect(addrs[1], timeout).await?);
    let data = bytes::Bytes::from(vec![0x5a; a.size as usize]);
    let next_id = Arc::new(AtomicU64::new(1));
    let mut errors = 0u64;
    let (mut tls, mut plain) = (Vec::new(), Vec::new());
    for round in 0..2 * a.slices {
        let conn = if round % 2 == 0 { &secure } else { &clear };
        let slice = run_slice(a, conn, &next_id, data.clone(), &mut errors).await;
        if round % 2 == 0 {
            tls.push(slice)
        } else {
            plain.push(slice)
        }
    }
    // Canary: a plain connection to the TLS listener appends nothing.
    let canary_refused = match DataConn::connect(addrs[0], Duration::from_secs(5)).await {
        Err(_) => true,
        Ok(c) => c
            .create(next_id.fetch_add(1, Ordering::Relaxed), 1, data.clone())
            .await
            .is_err(),
    };
    let _ = stop_tx.send(true);
    for s in servers {
        let _ = s.await;
    }
    let med = |v: &[Slice]| Slice {
        append_mib_per_sec: super::median(v.iter().map(|s| s.append_mib_per_sec).collect()),
        read_mib_per_sec: super::median(v.iter().map(|s| s.read_mib_per_sec).collect()),
        append_cpu_s_per_gib: super::median(v.iter().map(|s| s.append_cpu_s_per_gib).collect()),
        read_cpu_s_per_gib: super::median(v.iter().map(|s| s.read_cpu_s_per_gib).collect()),
    };
    let (tls, plain) = (med(&tls), med(&plain));
    Ok(Report {
        op: "tls-ab",
        size: a.size,
        depth: a.depth,
        slices: a.slices,
        append_ratio: tls.append_mib_per_sec / plain.append_mib_per_sec.max(1e-9),
        read_ratio: tls.read_mib_per_sec / plain.read_mib_per_sec.max(1e-9),
        append_cpu_ratio: plain.append_cpu_s_per_gib / tls.append_cpu_s_per_gib.max(1e-9),
        read_cpu_ratio: plain.read_cpu_s_per_gib / tls.read_cpu_s_per_gib.max(1e-9),
        aead_floor_cpu_s_per_gib: floor,
        append_tls_cpu_vs_floor: (tls.append_cpu_s_per_gib - plain.append_cpu_s_per_gib)
            / floor.max(1e-9),
        tls,
        plain,
        errors,
        canary_refused,
    })
}

/// One slice on `conn`: `depth` slots appending for `seconds`, then reading back what they
/// wrote for `seconds`; every chunk is deleted at the end.
async fn run_slice(
    a: &Args,
    conn: &Arc<DataConn>,
    next_id: &Arc<AtomicU64>,
    data: bytes::Bytes,
    errors: &mut u64,
) -> Slice {
    let dur = Duration::from_secs_f64(a.seconds);
    let size = a.size;
    let cpu = super::cpu_seconds();
    let began = Instant::now();
    let tasks: Vec<_> = (0..a.depth)
        .map(|_| {
            let (conn, data, next_id) = (conn.clone(), data.clone(), next_id.clone());
            tokio::spawn(async move {
                let (mut done, mut errs) = (0u64, 0u64);
                let mut chunk: Option<(u64, u64)> = None;
                while began.elapsed() < dur {
                    let r = match chunk {
                        Some((id, len)) if len + size <= CHUNK => {
                            conn.append(id, len, data.clone()).await.map(|l| (id, l))
                        }
                        full => {
                            if let Some((id, _)) = full {
                                let _ = conn.delete(id).await;
                            }
                            let id = next_id.fetch_add(1, Ordering::Relaxed);
                            conn.create(id, 1, data.clone()).await.map(|l| (id, l))
                        }
                    };
                    match r {
                        Ok(c) => {
                            chunk = Some(c);
                            done += 1;
                        }
                        Err(_) => {
                            errs += 1;
                            chunk = None;
                        }
                    }
                }
                (chunk, done, errs)
            })
        })
        .collect();
    let mut written = 0u64;
    let mut chunks = Vec::new();
    for t in tasks {
        if let Ok((chunk, done, errs)) = t.await {
            written += done;
            *errors += errs;
            chunks.extend(chunk);
        }
    }
    let append_secs = began.elapsed().as_secs_f64();
    let append_cpu = super::cpu_seconds() - cpu;
    let cpu = super::cpu_seconds();
    let began = Instant::now();
    let tasks: Vec<_> = chunks
        .iter()
        .cycle()
        .take(a.depth)
        .enumerate()
        .map(|(slot, &(id, len))| {
            let conn = conn.clone();
            tokio::spawn(async move {
                let (mut done, mut errs) = (0u64, 0u64);
                let blocks = (len / size).max(1);
                let mut i = slot as u64;
                while began.elapsed() < dur {
                    match conn.read(id, (i % blocks) * size, size as usize).await {
                        Ok(_) => done += 1,
                        Err(_) => errs += 1,
                    }
                    i += 1;
                }
                (done, errs)
            })
        })
        .collect();
    let mut read = 0u64;
    for t in tasks {
        if let Ok((done, errs)) = t.await {
            read += done;
            *errors += errs;
        }
    }
    let read_secs = began.elapsed().as_secs_f64();
    let read_cpu = super::cpu_seconds() - cpu;
    for (id, _) in chunks {
        let _ = conn.delete(id).await;
    }
    let mib = |n: u64, secs: f64| (n * size) as f64 / (1u64 << 20) as f64 / secs.max(1e-9);
    let per_gib = |cpu: f64, n: u64| cpu / ((n * size) as f64 / (1u64 << 30) as f64).max(1e-9);
    Slice {
        append_mib_per_sec: mib(written, append_secs),
        read_mib_per_sec: mib(read, read_secs),
        append_cpu_s_per_gib: per_gib(append_cpu, written),
        read_cpu_s_per_gib: per_gib(read_cpu, read),
    }
}
