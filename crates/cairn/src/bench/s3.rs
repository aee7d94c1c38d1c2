//! `cairn bench s3`: S3 PUT, GET and ListObjectsV2 through a running gateway, next to the
//! same-run floor — the SDK doing what the gateway has to do underneath (appends, or reads, of
//! the same size by as many writers as there are clients: `cairn bench append|read`).
//!
//! Requests go through `crate::s3client` (rusty-s3 presigns, hyper sends), one keep-alive
//! connection per client.

use super::{Latency, histogram, loadavg, parse_size};
use crate::cluster::{ClusterArgs, ClusterFile};
use crate::s3client::S3Bucket;
use bytes::Bytes;
use cairn_client::CreateOptions;
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The gateway (default: the one in ./cairn-data/cluster.toml).
    #[arg(long)]
    endpoint: Option<String>,
    /// Credentials (default: ./cairn-data/admin.credentials, written by `cairn up`).
    #[arg(long, env = "AWS_ACCESS_KEY_ID")]
    access_key: Option<String>,
    /// The secret key of --access-key.
    #[arg(long, env = "AWS_SECRET_ACCESS_KEY")]
    secret_key: Option<String>,
    /// put, get or list.
    #[arg(long, default_value = "put", value_parser = ["put", "get", "list"])]
    op: String,
    /// Bytes per object (put, get).
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    size: u64,
    /// Concurrent clients, each with its own connection and one request at a time.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Seconds each run measures.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// list: objects in the bucket listed.
    #[arg(long, default_value_t = 100_000)]
    objects: usize,
    /// Skip the SDK floor.
    #[arg(long)]
    no_floor: bool,
    /// Place the bench's bucket in this many partitions of its own before the run
    /// (docs/partitions.md "Buckets"; 0: the root partition's, as any new bucket).
    #[arg(long, default_value_t = 0)]
    shards: u32,
}

#[derive(Serialize)]
struct Report {
    op: String,
    size: u64,
    clients: usize,
    /// Partitions the bucket's objects were hashed over (0: the root's).
    shards: u32,
    seconds: f64,
    ops: u64,
    errors: u64,
    ops_per_s: f64,
    mib_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
    /// list: keys listed per second (pages of 1000).
    #[serde(skip_serializing_if = "Option::is_none")]
    keys_per_s: Option<f64>,
    floor: &'static str,
    floor_size: u64,
    floor_ops_per_s: f64,
    floor_mib_per_s: f64,
    floor_p50_us: f64,
    /// ops/s over the floor's ops/s (4 KiB), or MiB/s over the floor's MiB/s (larger sizes).
    ratio: f64,
    loadavg: f64,
}

/// The gateway of this directory's `cairn up` and its admin's credentials.
pub(super) fn local_gateway() -> anyhow::Result<(String, String, String)> {
    gateway_and_keys(None, None, None)
}

/// The gateway and credentials given, else the local `cairn up`'s.
fn gateway_and_keys(
    endpoint: Option<&str>,
    access_key: Option<&str>,
    secret_key: Option<&str>,
) -> anyhow::Result<(String, String, String)> {
    let dir = Path::new("./cairn-data");
    let endpoint = match endpoint {
        Some(e) => e.to_owned(),
        None => ClusterFile::load(dir)?
            .and_then(|f| f.s3_procs.first().map(|p| format!("http://{}", p.addr)))
            .ok_or_else(|| anyhow::anyhow!("no gateway: pass --endpoint or run `cairn up` here"))?,
    };
    let creds = std::fs::read_to_string(dir.join(crate::up::ADMIN_CREDENTIALS)).unwrap_or_default();
    let field = |k: &str| {
        creds
            .lines()
            .find_map(|l| l.split_once('=').filter(|(n, _)| n.trim() == k))
            .map(|(_, v)| v.trim().to_owned())
    };
    let key = access_key
        .map(str::to_owned)
        .or_else(|| field("aws_access_key_id"));
    let secret = secret_key
        .map(str::to_owned)
        .or_else(|| field("aws_secret_access_key"));
    match (key, secret) {
        (Some(k), Some(s)) => Ok((endpoint, k, s)),
        _ => anyhow::bail!("no credentials: pass --access-key/--secret-key or run `cairn up` here"),
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(a.clients >= 1, "--clients must be at least 1");
    let (endpoint, key, secret) = gateway_and_keys(
        a.endpoint.as_deref(),
        a.access_key.as_deref(),
        a.secret_key.as_deref(),
    )?;
    let masters = a.cluster.masters()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let name = format!(
            "bench-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        );
        let target = Arc::new(S3Bucket::new(
            &endpoint,
            &name,
            &key,
            &secret,
            a.clients * 2,
        )?);
        target.create_bucket().await?;
        if a.shards > 0 {
            let req = cairn_rpc::pb::SplitRequest {
                bucket: name.clone(),
                shards: a.shards,
                ..Default::default()
            };
            let status = crate::cluster::masters_client(&masters)?
                .send(req, |mut c, r| async move { c.split_partition(r).await })
                .await?;
            let shards: Vec<u32> = status
                .partitions
                .iter()
                .filter(|p| p.subtree.starts_with("/.s3/p/"))
                .map(|p| p.id)
                .collect();
            // Partitions are not removed yet (docs/partitions.md): the run leaves them.
            eprintln!(
                "bench s3: the bucket's {} partitions stay after the run, empty (partitions \
                 with /.s3/p/N now: {shards:?})",
                a.shards
            );
        }
        let size = a.size as usize;
        let body = Bytes::from((0..size).map(|i| (i * 31 % 251) as u8).collect::<Vec<u8>>());
        let (ops, errors, secs, lat, keys_per_s) = match a.op.as_str() {
            "put" => {
                // Each client overwrites its own key: large versions are freed as they are
                // replaced, so long runs do not fill the cluster.
                let body = body.clone();
                let (o, e, s, l) = drive(&target, a.clients, a.seconds, move |t, c, _| {
                    let body = body.clone();
                    async move { t.put(&format!("c{c}"), body).await }
                })
                .await;
                (o, e, s, l, None)
            }
            "get" => {
                for c in 0..a.clients {
                    target.put(&format!("c{c}"), body.clone()).await?;
                }
                let (o, e, s, l) =
                    drive(&target, a.clients, a.seconds, move |t, c, _| async move {
                        let got = t.get(&format!("c{c}")).await?;
                        anyhow::ensure!(got.len() == size, "GET returned {} bytes", got.len());
                        Ok(())
                    })
                    .await;
                (o, e, s, l, None)
            }
            _ => {
                fill(&target, a.objects).await?;
                let mut best = Vec::new();
                let mut h = histogram();
                for _ in 0..3 {
                    let t0 = Instant::now();
                    let n = target.list_all().await?;
                    let dt = t0.elapsed();
                    anyhow::ensure!(n == a.objects, "listed {n} of {} keys", a.objects);
                    h.record(dt.as_nanos() as u64).ok();
                    best.push(n as f64 / dt.as_secs_f64());
                }
                best.sort_by(f64::total_cmp);
                // Three whole listings; latency is per listing, keys/s the median's.
                let secs = h.mean() * 3.0 / 1e9;
                (3, 0, secs, Latency::of(&h), Some(best[1]))
            }
        };
        // What the run wrote goes, and its bucket (a placed one's shards stay, empty).
        let written: Vec<String> = if a.op == "list" {
            (0..a.objects).map(|i| format!("k/{i:08}")).collect()
        } else {
            (0..a.clients).map(|c| format!("c{c}")).collect()
        };
        empty(&target, written).await?;
        target.delete_bucket().await?;
        // The floor: the SDK appending (or reading) the same sizes with as many writers.
        let floor_size = a.size.min(1 << 20);
        let fl = if a.no_floor {
            None
        } else {
            Some(
                sdk_floor(
                    &masters,
                    a.op == "get",
                    floor_size as usize,
                    a.clients,
                    a.seconds,
                )
                .await?,
            )
        };
        let mib = |ops: u64, s: f64, sz: u64| ops as f64 * sz as f64 / s / f64::from(1 << 20);
        let ops_per_s = ops as f64 / secs;
        let (f_ops, f_secs, f_lat) = fl.unwrap_or((0, 1.0, Latency::default()));
        let floor_ops_per_s = f_ops as f64 / f_secs;
        let floor_mib = mib(f_ops, f_secs, floor_size);
        let r = Report {
            op: a.op.clone(),
            size: a.size,
            clients: a.clients,
            shards: a.shards,
            seconds: secs,
            ops,
            errors,
            ops_per_s,
            mib_per_s: if a.op == "list" {
                0.0
            } else {
                mib(ops, secs, a.size)
            },
            p50_us: lat.p50_us,
            p99_us: lat.p99_us,
            p999_us: lat.p999_us,
            max_us: lat.max_us,
            keys_per_s,
            floor: if a.op == "get" {
                "SDK reads of the same size (cairn bench read), as many readers"
            } else {
                "SDK appends of the same size, 1 MiB at most (cairn bench append), as many writers"
            },
            floor_size,
            floor_ops_per_s,
            floor_mib_per_s: floor_mib,
            floor_p50_us: f_lat.p50_us,
            ratio: match a.op.as_str() {
                "list" => 0.0,
                _ if a.size <= 64 << 10 => ops_per_s / floor_ops_per_s,
                _ => mib(ops, secs, a.size) / floor_mib,
            },
            loadavg: loadavg(),
        };
        println!("{}", serde_json::to_string(&r)?);
        anyhow::Ok(())
    })
}

/// `clients` tasks each running `op` back to back for `seconds`.
async fn drive<F, Fut>(
    target: &Arc<S3Bucket>,
    clients: usize,
    seconds: f64,
    op: F,
) -> (u64, u64, f64, Latency)
where
    F: Fn(Arc<S3Bucket>, usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (target, op) = (target.clone(), op.clone());
            tokio::spawn(async move {
                let (mut h, mut ops, mut errors) = (histogram(), 0u64, 0u64);
                let mut i = 0;
                while Instant::now() < deadline {
                    let s = Instant::now();
                    match op(target.clone(), c, i).await {
                        Ok(()) => {
                            h.record(s.elapsed().as_nanos() as u64).ok();
                            ops += 1;
                        }
                        Err(e) => {
                            errors += 1;
                            if errors <= 3 {
                                eprintln!("bench s3: {e:#}");
                            }
                        }
                    }
                    i += 1;
                }
                (h, ops, errors)
            })
        })
        .collect();
    let (mut h, mut ops, mut errors) = (histogram(), 0, 0);
    for t in tasks {
        let (th, o, e) = t.await.expect("bench task");
        h.add(&th).ok();
        ops += o;
        errors += e;
    }
    (ops, errors, t0.elapsed().as_secs_f64(), Latency::of(&h))
}

/// Fills the bucket with `n` 16-byte objects (32 at a time).
async fn fill(target: &Arc<S3Bucket>, n: usize) -> anyhow::Result<()> {
    use futures::StreamExt;
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..n)
        .map(|i| {
            let t = target.clone();
            async move {
                t.put(
                    &format!("k/{i:08}"),
                    Bytes::from_static(b"sixteen bytes!!!"),
                )
                .await
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Deletes `keys` of the bench's bucket, 32 at a time.
async fn empty(target: &Arc<S3Bucket>, keys: Vec<String>) -> anyhow::Result<()> {
    use futures::StreamExt;
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(keys)
        .map(|k| {
            let t = target.clone();
            async move { t.delete(&k).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect()
}

/// The SDK floor: `depth` writers appending `size` bytes to files of their own (or readers of
/// such a file) for `seconds`: (ops, seconds, latency).
async fn sdk_floor(
    masters: &[String],
    read: bool,
    size: usize,
    depth: usize,
    seconds: f64,
) -> anyhow::Result<(u64, f64, Latency)> {
    let client = crate::cluster::client(masters).await?;
    let dir = format!("/bench-s3-floor-{}", std::process::id());
    let buf = cairn_client::Bytes::from(vec![0x5Au8; size]);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for d in 0..depth {
        let (client, buf, path) = (client.clone(), buf.clone(), format!("{dir}/f{d}"));
        tasks.push(tokio::spawn(async move {
            let mut h = histogram();
            let mut ops = 0u64;
            let mut w = client.create(&path, CreateOptions::default()).await?;
            if read {
                for _ in 0..16 {
                    w.append_bytes(buf.clone()).await?;
                }
                w.seal().await?;
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let s = Instant::now();
                    client.read(&path, (i % 16) * size as u64, size).await?;
                    h.record(s.elapsed().as_nanos() as u64).ok();
                    ops += 1;
                    i += 1;
                }
            } else {
                while Instant::now() < deadline {
                    let s = Instant::now();
                    w.append_bytes(buf.clone()).await?;
                    h.record(s.elapsed().as_nanos() as u64).ok();
                    ops += 1;
                }
                w.close().await?;
            }
            anyhow::Ok((h, ops))
        }));
    }
    let (mut h, mut ops) = (histogram(), 0);
    for t in tasks {
        let (th, o) = t.await??;
        h.add(&th).ok();
        ops += o;
    }
    let secs = t0.elapsed().as_secs_f64();
    for d in 0..depth {
        let _ = client.delete(&format!("{dir}/f{d}")).await;
    }
    let _ = client.delete(&dir).await;
    Ok((ops, secs, Latency::of(&h)))
}
