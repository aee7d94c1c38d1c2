//! The nemesis's S3 workload: writers PUT and DELETE keys they own through the gateway,
//! readers GET them, and each key is checked against its log at the end.

use super::*;

/// S3 keys per S3 writer in a scenario; each writer owns its keys, so each key sees one request
/// at a time.
pub(super) const S3_KEYS: usize = 6;
pub(super) const S3_WRITERS: usize = 2;
/// A request that has not answered in this time counts as failed (its outcome unknown).
pub(super) const S3_TIMEOUT: Duration = Duration::from_secs(10);

/// The body of S3 version `v`: mostly small (packed into shared logs), one in eight over
/// 1 MiB (a file of its own), with bytes that name the version.
pub(super) fn s3_body(v: u64) -> Bytes {
    let mut rng = StdRng::seed_from_u64(v);
    let len = if rng.random_range(0..8) == 0 {
        rng.random_range((1 << 20) + 1..=2 << 20)
    } else {
        rng.random_range(1..=64 << 10)
    };
    Bytes::from(bytes(v ^ 0x5353_5353, 0, len))
}

/// What one S3 key went through, in the order its (single) writer issued it: `Some(v)` a PUT
/// of version `v`, `None` a DELETE.
#[derive(Debug, Default)]
pub(super) struct KeyLog {
    pub(super) ops: Vec<Option<u64>>,
    /// Index in `ops` of the last acknowledged request.
    pub(super) acked: Option<usize>,
    /// Indices of requests that failed: they may or may not have taken effect.
    pub(super) failed: Vec<usize>,
}

impl KeyLog {
    /// May a GET sent when `floor` was the last acknowledged request return `got` (`None`:
    /// no such key)? Yes if it is a request at or after the floor, or a failed one (which may
    /// land late); with nothing acknowledged yet, the key may also not exist at all.
    pub(super) fn allows(&self, floor: Option<usize>, got: Option<&[u8]>) -> bool {
        if floor.is_none() && got.is_none() {
            return true;
        }
        self.ops.iter().enumerate().any(|(i, op)| {
            let in_range = floor.is_none_or(|f| i >= f) || self.failed.contains(&i);
            in_range
                && match (op, got) {
                    (None, None) => true,
                    (Some(v), Some(b)) => s3_body(*v) == b,
                    _ => false,
                }
        })
    }
}

pub(super) type S3Log = Arc<Mutex<BTreeMap<String, KeyLog>>>;

#[derive(Debug, Default)]
pub(super) struct S3Seen {
    pub(super) puts: u64,
    pub(super) deletes: u64,
    pub(super) errors: u64,
    pub(super) gets: u64,
    pub(super) get_errors: u64,
    /// GETs that returned something no request of that key wrote, or an older version than
    /// the one acknowledged before the GET was sent.
    pub(super) bad_gets: u64,
}

pub(super) async fn s3_writer(
    s3: Arc<S3Bucket>,
    keys: Vec<String>,
    log: S3Log,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> S3Seen {
    let mut out = S3Seen::default();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let key = &keys[rng.random_range(0..keys.len())];
        let op = (rng.random_range(0..10) != 0).then(|| {
            n += 1;
            seed << 20 | n
        });
        let i = {
            let mut l = log.lock().unwrap();
            let k = l.entry(key.clone()).or_default();
            k.ops.push(op);
            k.ops.len() - 1
        };
        let res = match op {
            Some(v) => tokio::time::timeout(S3_TIMEOUT, s3.put(key, s3_body(v))).await,
            None => tokio::time::timeout(S3_TIMEOUT, s3.delete(key)).await,
        };
        let failed = !matches!(res, Ok(Ok(())));
        {
            let mut l = log.lock().unwrap();
            let k = l.get_mut(key).unwrap();
            match res {
                Ok(Ok(())) => {
                    k.acked = Some(i);
                    if op.is_some() {
                        out.puts += 1;
                    } else {
                        out.deletes += 1;
                    }
                }
                Ok(Err(e)) => {
                    eprintln!(
                        "  s3 {key}: {} failed: {e:#}",
                        if op.is_some() { "PUT" } else { "DELETE" }
                    );
                    k.failed.push(i);
                    out.errors += 1;
                }
                Err(_) => {
                    eprintln!("  s3 {key}: request timed out");
                    k.failed.push(i);
                    out.errors += 1;
                }
            }
        }
        if failed {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    out
}

/// GETs random keys and checks each answer against the key's log.
pub(super) async fn s3_reader(
    s3: Arc<S3Bucket>,
    keys: Vec<String>,
    log: S3Log,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> S3Seen {
    let mut out = S3Seen::default();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6e7);
    while !stop.load(Ordering::Relaxed) {
        let key = &keys[rng.random_range(0..keys.len())];
        let floor = log.lock().unwrap().get(key).and_then(|k| k.acked);
        match tokio::time::timeout(S3_TIMEOUT, s3.get_opt(key)).await {
            Ok(Ok(got)) => {
                out.gets += 1;
                let l = log.lock().unwrap();
                let ok = match l.get(key) {
                    Some(k) => k.allows(floor, got.as_deref()),
                    None => got.is_none(),
                };
                if !ok {
                    eprintln!(
                        "  BAD s3 GET of {key}: {:?} bytes, not a version at or after the floor {floor:?}",
                        got.map(|b| b.len())
                    );
                    out.bad_gets += 1;
                }
            }
            Ok(Err(e)) => {
                eprintln!("  s3 GET {key} failed: {e:#}");
                out.get_errors += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => {
                eprintln!("  s3 GET {key} timed out");
                out.get_errors += 1;
            }
        }
    }
    out
}

/// After the run: every key reads back as its log allows (the last acknowledged request, or
/// one that failed), then is deleted (so that the runs do not fill the cluster). Returns the
/// keys that did not read back right; retries requests that fail (the cluster has healed by
/// now, the gateway may be restarting).
pub(super) async fn s3_verify_and_delete(s3: &S3Bucket, log: &S3Log) -> u64 {
    let log = std::mem::take(&mut *log.lock().unwrap());
    let mut lost = 0;
    for (key, k) in &log {
        let mut tries = 0;
        let got = loop {
            match s3.get_opt(key).await {
                Ok(got) => break got,
                Err(e) if tries < 50 => {
                    tries += 1;
                    eprintln!("  s3 verify {key}: {e:#}; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("s3 verify {key}: GET keeps failing: {e:#}"),
            }
        };
        // Only the last acknowledged request or failed ones: the floor is the last ack.
        let ok = match k.acked {
            Some(a) => k.allows(Some(a), got.as_deref()),
            None => k.allows(None, got.as_deref()),
        };
        if !ok {
            eprintln!(
                "  LOSS s3 {key}: read {:?} bytes; log {k:?}",
                got.map(|b| b.len())
            );
            lost += 1;
        }
        let mut tries = 0;
        while let Err(e) = s3.delete(key).await {
            tries += 1;
            assert!(tries < 50, "s3 delete {key} keeps failing: {e:#}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    lost
}

/// The S3 side of the cluster: a gateway process and a client of its bucket.
pub(super) struct Gateway {
    pub(super) proc: Proc,
    pub(super) s3: Arc<S3Bucket>,
}

impl Gateway {
    /// A gateway with its service key, small packs and frequent compaction passes (so that
    /// pack rotation and compaction run under the faults too), and the bucket `nemesis`, whose
    /// objects are hashed over two partitions of their own (docs/partitions.md "Buckets"):
    /// every PUT, GET, listing and compaction of the run goes through them.
    pub(super) async fn start(dir: &std::path::Path, masters: &[String]) -> Self {
        let s3_key = common::service_key(dir, masters, "s3");
        let proc = common::gateway_with(
            masters,
            "127.0.0.1:0",
            &[
                "--service-key-file",
                s3_key.to_str().unwrap(),
                "--pack-bytes",
                "4m",
                "--compact-every-secs",
                "2",
                "--free-grace-secs",
                "5",
            ],
        );
        let keys = common::create_user(masters, "nemesis");
        let s3 = S3Bucket::new(
            &format!("http://{}", proc.addr),
            "nemesis",
            &keys.access,
            &keys.secret,
            8,
        )
        .unwrap();
        s3.create_bucket().await.unwrap();
        common::run_ok(common::cairn().args([
            "admin",
            "--cluster",
            &masters.join(","),
            "partition",
            "split",
            "--bucket",
            "nemesis",
            "--shards",
            "2",
        ]));
        Self {
            proc,
            s3: Arc::new(s3),
        }
    }
}
