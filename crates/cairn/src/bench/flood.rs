//! `cairn bench flood`: a user's 4 KiB appends and reads (and S3 GETs, where the cluster has a
//! gateway) while strangers flood every server of the cluster with connections — the
//! chunkservers, the masters, the S3 gateways and the NBD servers (issue 38 §3, docs/security.md
//! "Resource limits").
//!
//! Rounds alternate a quiet phase and a flooded one of the same length, in one run; the
//! report gives each phase's latencies and the flooded p99 over the quiet p99 (the floor here
//! is the same client on the same cluster without the flood). The attacker is a child process
//! (`--attack`, one thread) that keeps trying to hold `--conns` connections spread over every
//! server, from `--from` loopback addresses (127.0.0.2, …), each connecting again
//! `--retry-ms` after it was refused or cut; it runs at nice 19, standing in for another
//! machine on this 2-core one. The bench deletes the file and bucket it wrote.

use super::{Latency, histogram, loadavg};
use crate::cluster::{ClusterArgs, ClusterFile};
use cairn_client::{Client, CreateOptions};
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Connections the attacker tries to hold, spread over every server.
    #[arg(long, default_value_t = 10_000)]
    conns: usize,
    /// Loopback addresses the attacker connects from (127.0.0.2 and up).
    #[arg(long, default_value_t = 5)]
    from: u8,
    /// Milliseconds an attacker's connection waits before it connects again, once refused or
    /// cut.
    #[arg(long, default_value_t = 1000)]
    retry_ms: u64,
    /// Seconds each phase measures (the flood starts 3 s before its phase).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Rounds of a quiet and a flooded phase; the median ratio is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Print only JSON lines.
    #[arg(long)]
    json: bool,
    /// Run as the attacker against these `HOST:PORT`s (the bench starts it).
    #[arg(long, hide = true)]
    attack: Option<String>,
}

#[derive(Serialize, Default, Clone)]
struct Phase {
    flooded: bool,
    appends: u64,
    reads: u64,
    s3_gets: u64,
    errors: u64,
    append: Option<Latency>,
    read: Option<Latency>,
    s3_get: Option<Latency>,
    /// The attacker's connections open at the end of the phase, and connects it made.
    attacker_open: u64,
    attacker_connects: u64,
}

#[derive(Serialize)]
struct Report {
    bench: &'static str,
    targets: usize,
    conns: usize,
    from: u8,
    rounds: usize,
    seconds: f64,
    phases: Vec<Phase>,
    /// Medians over rounds of the flooded p99 over the quiet p99 of the same round.
    append_p99_ratio: f64,
    read_p99_ratio: f64,
    s3_get_p99_ratio: Option<f64>,
    errors: u64,
    loadavg: f64,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if let Some(targets) = &a.attack {
        return attack(targets, a.conns, a.from, a.retry_ms);
    }
    anyhow::ensure!(
        a.rounds >= 1 && a.from >= 1,
        "--rounds and --from must be at least 1"
    );
    let masters = a.cluster.masters()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let client = rt.block_on(Client::with_options(
        &masters,
        crate::cluster::client_options()?,
    ))?;
    // Every server: chunkservers from the masters, gateways and NBD servers from this
    // directory's `cairn up`.
    let status = rt.block_on(async {
        crate::cluster::masters_client(&masters)?
            .call(|mut c| async move { c.status(cairn_rpc::pb::Empty {}).await })
            .await
            .map_err(anyhow::Error::from)
    })?;
    let local = ClusterFile::load(std::path::Path::new("./cairn-data"))?.unwrap_or_default();
    let mut targets: Vec<String> = masters.clone();
    targets.extend(status.servers.iter().map(|s| s.addr.clone()));
    targets.extend(local.s3_procs.iter().map(|p| p.addr.clone()));
    targets.extend(local.nbd_procs.iter().map(|p| p.addr.clone()));
    anyhow::ensure!(
        targets.iter().all(|t| t.starts_with("127.0.0.1:")),
        "the attacker connects from 127.0.0.2 and up: a local cluster on 127.0.0.1 only"
    );
    let s3 = match (local.s3_procs.first(), s3_keys()) {
        (Some(p), Some((key, secret))) => Some(crate::s3client::S3Bucket::new(
            &format!("http://{}", p.addr),
            &format!("bench-flood-{}", std::process::id()),
            &key,
            &secret,
            1,
        )?),
        _ => None,
    };
    let path = format!("/bench-flood-{}", std::process::id());
    let body = vec![7u8; 4096];
    let result = rt.block_on(async {
        let mut w = client.create(&path, CreateOptions::default()).await?;
        // Reads pick among the first 256 blocks.
        for _ in 0..256 {
            w.append(&body).await?;
        }
        if let Some(s3) = &s3 {
            s3.create_bucket().await?;
            s3.put("object", bytes::Bytes::from(body.clone())).await?;
        }
        let mut phases = Vec::new();
        for _ in 0..a.rounds {
            for flooded in [false, true] {
                let mut attacker = if flooded {
                    let child = Attacker::start(&targets, &a)?;
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    Some(child)
                } else {
                    None
                };
                let mut p = measure(&client, &mut w, &path, s3.as_ref(), a.seconds).await;
                p.flooded = flooded;
                if let Some(child) = attacker.as_mut() {
                    (p.attacker_open, p.attacker_connects) = child.counts();
                    child.stop().await;
                }
                if !a.json {
                    eprintln!(
                        "{} appends p99 {:.0} us, reads p99 {:.0} us, errors {}, attacker open {}",
                        if flooded { "flooded" } else { "quiet  " },
                        p.append.as_ref().map_or(0.0, |l| l.p99_us),
                        p.read.as_ref().map_or(0.0, |l| l.p99_us),
                        p.errors,
                        p.attacker_open
                    );
                }
                phases.push(p);
            }
        }
        w.close().await?;
        Ok::<_, anyhow::Error>(phases)
    });
    // Leave the cluster as it was, whatever happened.
    rt.block_on(async {
        let _ = client.delete(&path).await;
        if let Some(s3) = &s3 {
            let _ = s3.delete("object").await;
            let _ = s3.delete_bucket().await;
        }
    });
    let phases = result?;
    let ratio = |f: fn(&Phase) -> Option<&Latency>| -> Option<f64> {
        let r: Vec<f64> = phases
            .chunks(2)
            .filter_map(|q| Some(f(&q[1])?.p99_us / f(&q[0])?.p99_us.max(1.0)))
            .collect();
        (!r.is_empty()).then(|| super::median(r))
    };
    let report = Report {
        bench: "flood",
        targets: targets.len(),
        conns: a.conns,
        from: a.from,
        rounds: a.rounds,
        seconds: a.seconds,
        append_p99_ratio: ratio(|p| p.append.as_ref()).unwrap_or(0.0),
        read_p99_ratio: ratio(|p| p.read.as_ref()).unwrap_or(0.0),
        s3_get_p99_ratio: ratio(|p| p.s3_get.as_ref()),
        errors: phases.iter().map(|p| p.errors).sum(),
        phases,
        loadavg: loadavg(),
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// The admin's S3 keys of this directory's `cairn up`.
fn s3_keys() -> Option<(String, String)> {
    let creds = std::fs::read_to_string(
        std::path::Path::new("./cairn-data").join(crate::up::ADMIN_CREDENTIALS),
    )
    .ok()?;
    let field = |k: &str| {
        creds
            .lines()
            .find_map(|l| l.split_once('=').filter(|(n, _)| n.trim() == k))
            .map(|(_, v)| v.trim().to_owned())
    };
    Some((field("aws_access_key_id")?, field("aws_secret_access_key")?))
}

/// One phase: appends, reads and S3 GETs in turn, one at a time, for `seconds`.
async fn measure(
    client: &Client,
    w: &mut cairn_client::FlatLogFile,
    path: &str,
    s3: Option<&crate::s3client::S3Bucket>,
    seconds: f64,
) -> Phase {
    let (mut ha, mut hr, mut hs) = (histogram(), histogram(), histogram());
    let mut p = Phase::default();
    let body = [7u8; 4096];
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut i: u64 = 0;
    while Instant::now() < end {
        i += 1;
        let t = Instant::now();
        match w.append(&body).await {
            Ok(_) => {
                ha.saturating_record(t.elapsed().as_nanos() as u64);
                p.appends += 1;
            }
            Err(e) => {
                p.errors += 1;
                tracing::warn!(error = %e, "append failed");
            }
        }
        let t = Instant::now();
        let off = (i.wrapping_mul(2_654_435_761) % 256) * 4096;
        match client.read(path, off, 4096).await {
            Ok(d) if d.len() == 4096 => {
                hr.saturating_record(t.elapsed().as_nanos() as u64);
                p.reads += 1;
            }
            Ok(d) => {
                p.errors += 1;
                tracing::warn!(len = d.len(), "short read");
            }
            Err(e) => {
                p.errors += 1;
                tracing::warn!(error = %e, "read failed");
            }
        }
        if let Some(s3) = s3 {
            let t = Instant::now();
            match s3.get("object").await {
                Ok(d) if d.len() == 4096 => {
                    hs.saturating_record(t.elapsed().as_nanos() as u64);
                    p.s3_gets += 1;
                }
                Ok(_) => p.errors += 1,
                Err(e) => {
                    p.errors += 1;
                    tracing::warn!(error = %e, "S3 GET failed");
                }
            }
        }
    }
    let lat = |h: &hdrhistogram::Histogram<u64>| (!h.is_empty()).then(|| Latency::of(h));
    p.append = lat(&ha);
    p.read = lat(&hr);
    p.s3_get = lat(&hs);
    p
}

/// The attacker child process, and what it last said.
struct Attacker {
    child: std::process::Child,
    last: Arc<std::sync::Mutex<(u64, u64)>>,
}

impl Attacker {
    fn start(targets: &[String], a: &Args) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut child = std::process::Command::new("nice")
            .args(["-n", "19"])
            .arg(exe)
            .args(["bench", "flood", "--attack", &targets.join(",")])
            .args(["--conns", &a.conns.to_string()])
            .args(["--from", &a.from.to_string()])
            .args(["--retry-ms", &a.retry_ms.to_string()])
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let last = Arc::new(std::sync::Mutex::new((0, 0)));
        let stdout = child.stdout.take().expect("piped");
        let seen = last.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&l) {
                    *seen.lock().expect("not poisoned") = (
                        v["open"].as_u64().unwrap_or(0),
                        v["connects"].as_u64().unwrap_or(0),
                    );
                }
            }
        });
        Ok(Self { child, last })
    }

    fn counts(&self) -> (u64, u64) {
        *self.last.lock().expect("not poisoned")
    }

    async fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The attacker: `conns` tasks on one thread, each holding a connection to its target from
/// its address for as long as the server keeps it, then again after `retry_ms`. Prints its
/// open connections and connects so far each second.
fn attack(targets: &str, conns: usize, from: u8, retry_ms: u64) -> anyhow::Result<()> {
    let targets: Vec<std::net::SocketAddr> = targets
        .split(',')
        .map(|t| t.parse())
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(!targets.is_empty(), "no targets");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let open = Arc::new(AtomicU64::new(0));
        let connects = Arc::new(AtomicU64::new(0));
        for i in 0..conns {
            let target = targets[i % targets.len()];
            let local = std::net::Ipv4Addr::new(127, 0, 0, 2 + (i % from as usize) as u8);
            let (open, connects) = (open.clone(), connects.clone());
            tokio::spawn(async move {
                // Spread the first connects over a second.
                tokio::time::sleep(Duration::from_micros((i as u64 * 997) % 1_000_000)).await;
                loop {
                    if let Ok(s) = tokio::net::TcpSocket::new_v4()
                        && s.bind((local, 0).into()).is_ok()
                        && let Ok(mut c) = s.connect(target).await
                    {
                        connects.fetch_add(1, Ordering::Relaxed);
                        open.fetch_add(1, Ordering::Relaxed);
                        // Hold it, saying nothing, until the server lets go.
                        let mut b = [0u8; 1024];
                        use tokio::io::AsyncReadExt;
                        while matches!(c.read(&mut b).await, Ok(n) if n > 0) {}
                        open.fetch_sub(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(retry_ms)).await;
                }
            });
        }
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            println!(
                "{}",
                serde_json::json!({
                    "open": open.load(Ordering::Relaxed),
                    "connects": connects.load(Ordering::Relaxed),
                })
            );
        }
    })
}
