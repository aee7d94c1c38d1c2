//! `cairn admin …`: change the master group, drain chunkservers, set the repair bandwidth,
//! inject faults into chunkservers started with `--fault-injection`.

use crate::cluster::ClusterArgs;
use cairn_client::{DataConn, FaultSpec};
use cairn_rpc::{Masters, pb};
use std::collections::BTreeMap;

#[derive(clap::Args)]
pub struct AdminArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(clap::Subcommand)]
pub enum AdminCommand {
    /// Write the key of the S3 gateway's (`s3`) or the NBD server's (`block`) service to a
    /// new file (mode 0600): the service proves it instead of the cluster secret and may
    /// work only in its namespace (docs/security.md "Service credentials"). Run where the
    /// cluster secret is; no master is asked.
    ServiceKey {
        /// `s3` or `block`.
        service: String,
        /// The key file to write (never overwritten).
        #[arg(long)]
        out: std::path::PathBuf,
        /// The cluster secret (default ./cairn-data/cluster.secret).
        #[arg(long, env = "CAIRN_CLUSTER_SECRET_FILE")]
        cluster_secret_file: Option<std::path::PathBuf>,
    },
    /// Make these masters the voting group (`1=HOST:PORT,2=HOST:PORT,…`); new ones are added
    /// as learners first and caught up. Start a new master with the same --peers list.
    Masters {
        /// The new voting group, `ID=HOST:PORT,…`.
        peers: String,
    },
    /// Stop placing new chunks on a chunkserver (its chunks stay, and are read, where they
    /// are).
    Drain {
        /// The chunkserver's id, as `cairn status` shows it.
        server_id: u64,
    },
    /// Place new chunks on a drained chunkserver again.
    Undrain {
        /// The chunkserver's id, as `cairn status` shows it.
        server_id: u64,
    },
    /// Change a cluster setting: `repair-bandwidth 100m` (bytes/s all repairs share),
    /// `background-bandwidth 200m` (bytes/s of repair, conversion and scrub together, per
    /// chunkserver), `convert-after 3600` (seconds a `then:ec` file stays unchanged before
    /// its sealed chunks are converted).
    Set {
        /// repair-bandwidth, background-bandwidth or convert-after.
        setting: String,
        /// Its new value (bytes/s as 100m, or seconds).
        value: String,
    },
    /// Add a capability key (docs/security.md): it signs once every chunkserver holds it
    /// (5 s); the key before it stays valid, and capabilities signed with the one before
    /// that stop working now.
    RotateKey {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Partitions of the masters' state: Raft groups of their own (docs/partitions.md).
    #[command(subcommand)]
    Partition(PartitionCommand),
    /// Check the masters' metadata for consistency: every partition's inodes, directory
    /// entries, chunk index, counters and totals, and the object index against the files
    /// that hold the objects' data. Exits 1 when a problem is found (docs/operations.md).
    Check {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Compare the masters' copies of each partition: every master's digest of what it has
    /// applied (rows and a CRC of its tables); copies at the same log entry must be equal.
    /// Asks up to `--rounds` times, 200 ms apart, until every partition's masters stood at one
    /// entry together. Exits 1 when two copies at one entry differ (docs/operations.md).
    Digests {
        /// Rounds of asking at most.
        #[arg(long, default_value_t = 10)]
        rounds: u32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make a chunkserver (started with --fault-injection) slow, failing or frozen; `--clear`
    /// (or no fault option) removes every fault.
    Fault(FaultArgs),
}

#[derive(clap::Subcommand)]
pub enum PartitionCommand {
    /// Add a partition hosted by these masters (default: the root group's voters); it holds
    /// nothing until a subtree or bucket is moved into it.
    Create {
        /// Master ids, e.g. 1,2,3.
        #[arg(long, value_delimiter = ',')]
        members: Vec<u64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Send a subtree to a partition (a new one unless --to names one): its files and
    /// directories are then created, stored and served by that partition's Raft group. A
    /// populated directory is copied there while writes below it wait. The subtree may be in
    /// the root partition or below another partition's top (it is then taken out of that
    /// one). Partitions also split on their own (`cairn master --split-files`, `--split-load`).
    ///
    /// With --shards K (2 or more), a missing or empty directory's entries are hashed by
    /// name over K new partitions, for a directory too busy or too large for one
    /// (docs/partitions.md "Hashed directories"); a listing merges theirs.
    ///
    /// With --bucket instead of a path: an empty S3 bucket's objects are hashed by key over
    /// --shards new partitions (docs/partitions.md "Buckets"); a listing merges theirs.
    Split {
        /// The subtree's top directory, e.g. /projects/big.
        #[arg(required_unless_present = "bucket", conflicts_with = "bucket")]
        path: Option<String>,
        /// An empty bucket to place in partitions of its own.
        #[arg(long)]
        bucket: Option<String>,
        /// How many partitions the bucket's objects, or the directory's entries, are hashed
        /// over.
        #[arg(long, default_value_t = 1)]
        shards: u32,
        /// An existing partition that holds no subtree yet.
        #[arg(long, conflicts_with = "bucket")]
        to: Option<u32>,
        /// Masters that host the new partition (default: the root group's voters).
        #[arg(long, value_delimiter = ',', conflicts_with = "to")]
        members: Vec<u64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
pub struct FaultArgs {
    /// The chunkserver's id (`cairn status`).
    #[arg(long)]
    server: u64,
    /// Hold every request this long.
    #[arg(long, default_value_t = 0)]
    delay_ms: u32,
    /// Plus a random extra hold of up to this long.
    #[arg(long, default_value_t = 0)]
    jitter_ms: u32,
    /// Fail this fraction of requests (0..=1) with an I/O error.
    #[arg(long, default_value_t = 0.0)]
    error_rate: f64,
    /// Hold every request until the fault is cleared (a frozen server).
    #[arg(long)]
    stall: bool,
    /// Fail creates and appends with NO_SPACE.
    #[arg(long)]
    disk_full: bool,
    /// Only requests that reach the disk (not stat and ping): a sick disk, a healthy process.
    #[arg(long)]
    disk_only: bool,
    /// Remove every fault.
    #[arg(long)]
    clear: bool,
}

impl FaultArgs {
    fn spec(&self) -> anyhow::Result<FaultSpec> {
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.error_rate),
            "--error-rate is a fraction in 0..=1"
        );
        if self.clear {
            return Ok(FaultSpec::default());
        }
        Ok(FaultSpec {
            delay_ms: self.delay_ms,
            jitter_ms: self.jitter_ms,
            error_ppm: (self.error_rate * 1e6).round() as u32,
            stall: self.stall,
            disk_full: self.disk_full,
            disk_only: self.disk_only,
        })
    }
}

/// What `admin digests` found of one partition.
#[derive(Default)]
struct Copies {
    /// The last digests seen, by master: (term, index, rows, crc).
    last: BTreeMap<u64, (u64, u64, u64, u32)>,
    /// Every master reporting it stood at one entry in some round.
    together: bool,
    /// Two copies at one entry differed: (entry index, master, rows, crc) of each.
    diverged: Vec<String>,
}

/// `cairn admin digests`: asks every master for its digests, round after round, and
/// compares the copies standing at the same entry.
async fn digests(m: &Masters, rounds: u32, json: bool) -> anyhow::Result<()> {
    let st = m
        .call(|mut c| async move { c.status(pb::Empty {}).await })
        .await?;
    let clients: Vec<(u64, Masters)> = st
        .masters
        .iter()
        .map(|x| {
            Ok((
                x.id,
                crate::cluster::masters_client(std::slice::from_ref(&x.addr))?,
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut parts: BTreeMap<u32, Copies> = BTreeMap::new();
    let mut unreachable: BTreeMap<u64, String> = BTreeMap::new();
    for round in 0..rounds.max(1) {
        if round > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        let replies = futures::future::join_all(clients.iter().map(|(id, c)| async move {
            let r = c
                .send(
                    pb::Empty {},
                    |mut c, r| async move { c.state_digest(r).await },
                )
                .await;
            (*id, r)
        }))
        .await;
        let mut at: BTreeMap<u32, Vec<(u64, pb::GroupDigest)>> = BTreeMap::new();
        for (id, r) in replies {
            match r {
                Ok(r) => {
                    unreachable.remove(&id);
                    for g in r.groups {
                        at.entry(g.partition).or_default().push((id, g));
                    }
                }
                Err(e) => {
                    unreachable.insert(id, e.to_string());
                }
            }
        }
        for (p, copies) in at {
            let part = parts.entry(p).or_default();
            let mut by_entry: BTreeMap<(u64, u64), Vec<&(u64, pb::GroupDigest)>> = BTreeMap::new();
            for c in &copies {
                part.last
                    .insert(c.0, (c.1.term, c.1.index, c.1.rows, c.1.crc));
                by_entry.entry((c.1.term, c.1.index)).or_default().push(c);
            }
            if by_entry.len() == 1 && copies.len() > 1 {
                part.together = true;
            }
            for ((_, index), same) in by_entry {
                let first = &same[0].1;
                if same
                    .iter()
                    .any(|c| (c.1.rows, c.1.crc) != (first.rows, first.crc))
                {
                    part.diverged.push(format!(
                        "at entry {index}: {}; tables that differ: {}",
                        same.iter()
                            .map(|c| format!(
                                "master {} {} rows crc {:08x}",
                                c.0, c.1.rows, c.1.crc
                            ))
                            .collect::<Vec<_>>()
                            .join(", "),
                        differing_tables(&same)
                    ));
                }
            }
        }
        if parts.values().all(|p| p.together) && unreachable.is_empty() {
            break;
        }
    }
    let diverged = parts.values().filter(|p| !p.diverged.is_empty()).count();
    if json {
        let list: Vec<_> = parts
            .iter()
            .map(|(p, c)| {
                let masters: Vec<_> = c
                    .last
                    .iter()
                    .map(|(id, (term, index, rows, crc))| {
                        serde_json::json!({"master": id, "term": term, "index": index,
                            "rows": rows, "crc": crc})
                    })
                    .collect();
                serde_json::json!({"partition": p, "compared": c.together,
                    "diverged": c.diverged, "masters": masters})
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"diverged": diverged, "partitions": list,
                "unreachable": unreachable.iter().map(|(id, e)| serde_json::json!({"master": id, "error": e})).collect::<Vec<_>>()})
        );
    } else {
        for (p, c) in &parts {
            let state = match (c.diverged.is_empty(), c.together) {
                (false, _) => "DIVERGED",
                (true, true) => "equal",
                (true, false) => "not compared (its masters never stood at one entry together)",
            };
            println!("partition {p}: {state}");
            for (id, (term, index, rows, crc)) in &c.last {
                println!("  master {id}: entry {term}:{index}, {rows} rows, crc {crc:08x}");
            }
            for d in &c.diverged {
                println!("  {d}");
            }
        }
        for (id, e) in &unreachable {
            println!("master {id}: not answering: {e}");
        }
    }
    if diverged > 0 {
        anyhow::bail!("{diverged} partitions have copies that differ at the same entry");
    }
    Ok(())
}

/// Sends a fault spec to a chunkserver found through the masters.
pub async fn inject(m: &Masters, server: u64, spec: &FaultSpec) -> anyhow::Result<()> {
    let s = m
        .call(|mut c| async move { c.status(pb::Empty {}).await })
        .await?;
    let addr = s
        .servers
        .iter()
        .find(|x| x.id == server)
        .map(|x| x.addr.clone())
        .ok_or_else(|| anyhow::anyhow!("no chunkserver {server} (see cairn status)"))?;
    let conn = DataConn::connect(addr.parse()?, std::time::Duration::from_secs(5)).await?;
    conn.fault(spec).await?;
    Ok(())
}

pub fn run(a: AdminArgs) -> anyhow::Result<()> {
    if let AdminCommand::ServiceKey {
        service,
        out,
        cluster_secret_file,
    } = &a.command
    {
        return service_key(service, out, cluster_secret_file.as_deref());
    }
    let masters = a.cluster.masters()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let m = crate::cluster::masters_client(&masters)?;
        match a.command {
            AdminCommand::Masters { peers } => {
                let req = pb::MembershipRequest {
                    masters: crate::master::parse_peers(&peers)?
                        .into_iter()
                        .map(|(id, addr)| pb::MasterStatus {
                            id,
                            addr,
                            voter: true,
                        })
                        .collect(),
                };
                let s = m
                    .send(req, |mut c, r| async move { c.change_membership(r).await })
                    .await?;
                for x in s.masters {
                    println!(
                        "master {} {} {}",
                        x.id,
                        x.addr,
                        if x.voter { "voter" } else { "learner" }
                    );
                }
            }
            AdminCommand::Drain { server_id } | AdminCommand::Undrain { server_id } => {
                let state = if matches!(a.command, AdminCommand::Drain { .. }) {
                    "draining"
                } else {
                    "up"
                };
                let req = pb::ServerStateRequest {
                    server_id,
                    state: state.into(),
                };
                m.send(req, |mut c, r| async move { c.set_server_state(r).await })
                    .await?;
                println!("chunkserver {server_id}: {state}");
            }
            AdminCommand::Set { setting, value } => {
                let req = match setting.as_str() {
                    "repair-bandwidth" => pb::ConfigRequest {
                        repair_bytes_per_sec: crate::bench::parse_size(&value)
                            .map_err(|e| anyhow::anyhow!(e))?,
                        ..Default::default()
                    },
                    "background-bandwidth" => pb::ConfigRequest {
                        background_bytes_per_sec: Some(
                            crate::bench::parse_size(&value).map_err(|e| anyhow::anyhow!(e))?,
                        ),
                        ..Default::default()
                    },
                    "convert-after" => pb::ConfigRequest {
                        convert_after_secs: Some(value.trim_end_matches('s').parse().map_err(
                            |_| anyhow::anyhow!("convert-after: seconds, e.g. 3600, not {value:?}"),
                        )?),
                        ..Default::default()
                    },
                    other => anyhow::bail!(
                        "unknown setting {other:?} (known: repair-bandwidth, background-bandwidth, convert-after)"
                    ),
                };
                m.send(req, |mut c, r| async move { c.set_config(r).await })
                    .await?;
                println!("{setting} = {value}");
            }
            AdminCommand::RotateKey { json } => {
                let r = m
                    .send(pb::Empty {}, |mut c, r| async move { c.rotate_key(r).await })
                    .await?;
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"key_id": r.key_id, "valid": r.valid, "dropped": r.dropped})
                    );
                } else {
                    println!(
                        "capability key {} made; valid keys {:?}{}",
                        r.key_id,
                        r.valid,
                        if r.dropped == 0 {
                            String::new()
                        } else {
                            format!("; key {} dropped", r.dropped)
                        }
                    );
                }
            }
            AdminCommand::Partition(PartitionCommand::Create { members, json }) => {
                let before = m
                    .call(|mut c| async move { c.status(pb::Empty {}).await })
                    .await?;
                let s = m
                    .send(pb::PartitionRequest { members }, |mut c, r| async move {
                        c.create_partition(r).await
                    })
                    .await?;
                let new = s
                    .partitions
                    .iter()
                    .find(|p| !before.partitions.iter().any(|b| b.id == p.id))
                    .ok_or_else(|| anyhow::anyhow!("the new partition is not in the status"))?;
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"id": new.id, "members": new.members})
                    );
                } else {
                    println!("partition {} hosted by masters {:?}", new.id, new.members);
                }
            }
            AdminCommand::Partition(PartitionCommand::Split {
                bucket: Some(bucket),
                shards,
                members,
                json,
                ..
            }) => {
                let req = pb::SplitRequest {
                    bucket: bucket.clone(),
                    shards,
                    members,
                    ..Default::default()
                };
                m.send(req, |mut c, r| async move { c.split_partition(r).await })
                    .await?;
                let q = cairn_rpc::object::ObjectQuery::Layout {
                    bucket: bucket.clone(),
                };
                let shards = match m.object_query(&q).await? {
                    Ok(cairn_rpc::object::QueryReply::Layout(s)) => s,
                    Ok(_) => anyhow::bail!("the layout answered with something else"),
                    Err(e) => anyhow::bail!("bucket {bucket}: {e}"),
                };
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"bucket": bucket, "partitions": shards})
                    );
                } else {
                    println!("bucket {bucket}'s objects are hashed over partitions {shards:?}");
                }
            }
            AdminCommand::Partition(PartitionCommand::Split {
                path,
                to,
                members,
                shards,
                json,
                ..
            }) if shards > 1 => {
                anyhow::ensure!(to.is_none(), "--shards makes new partitions: no --to");
                let path = path.unwrap_or_default();
                let req = pb::SplitRequest {
                    path: path.clone(),
                    shards,
                    members,
                    ..Default::default()
                };
                let s = m
                    .send(req, |mut c, r| async move { c.split_partition(r).await })
                    .await?;
                let norm = cairn_rpc::normalize(&path).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
                let ids: Vec<u32> = s
                    .partitions
                    .iter()
                    .filter(|p| p.subtree == norm && p.id != 0)
                    .map(|p| p.id)
                    .collect();
                anyhow::ensure!(!ids.is_empty(), "{norm} is in no partition's status");
                if json {
                    println!("{}", serde_json::json!({"subtree": norm, "shards": ids}));
                } else {
                    println!("{norm}'s entries are hashed over partitions {ids:?}");
                }
            }
            AdminCommand::Partition(PartitionCommand::Split {
                path,
                to,
                members,
                json,
                ..
            }) => {
                let path = path.unwrap_or_default();
                let req = pb::SplitRequest {
                    path: path.clone(),
                    to: to.unwrap_or(0),
                    members,
                    ..Default::default()
                };
                let s = m
                    .send(req, |mut c, r| async move { c.split_partition(r).await })
                    .await?;
                let norm = cairn_rpc::normalize(&path).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
                let p = s
                    .partitions
                    .iter()
                    .find(|p| p.subtree == norm)
                    .ok_or_else(|| anyhow::anyhow!("{norm} is in no partition's status"))?;
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"id": p.id, "subtree": p.subtree, "members": p.members})
                    );
                } else {
                    println!(
                        "{} is held by partition {} (masters {:?})",
                        p.subtree, p.id, p.members
                    );
                }
            }
            AdminCommand::Check { json } => {
                let r = m
                    .send(pb::Empty {}, |mut c, r| async move { c.check_metadata(r).await })
                    .await?;
                let problems: u64 = r.partitions.iter().map(|p| p.problems).sum();
                if json {
                    let parts: Vec<_> = r
                        .partitions
                        .iter()
                        .map(|p| {
                            serde_json::json!({
                                "partition": p.partition, "inodes": p.inodes, "chunks": p.chunks,
                                "objects": p.objects, "problems": p.problems, "listed": p.listed,
                            })
                        })
                        .collect();
                    println!(
                        "{}",
                        serde_json::json!({"problems": problems, "partitions": parts})
                    );
                } else {
                    for p in &r.partitions {
                        println!(
                            "partition {}: {} inodes, {} chunks, {} objects: {}",
                            p.partition,
                            p.inodes,
                            p.chunks,
                            p.objects,
                            match p.problems {
                                0 => "consistent".to_string(),
                                n => format!("{n} problems"),
                            }
                        );
                        for l in &p.listed {
                            println!("  {l}");
                        }
                        if p.problems > p.listed.len() as u64 {
                            println!("  … and {} more", p.problems - p.listed.len() as u64);
                        }
                    }
                }
                if problems > 0 {
                    anyhow::bail!("the metadata check found {problems} problems");
                }
            }
            AdminCommand::Digests { rounds, json } => digests(&m, rounds, json).await?,
            AdminCommand::ServiceKey { .. } => unreachable!("answered without the masters"),
            AdminCommand::Fault(f) => {
                let spec = f.spec()?;
                inject(&m, f.server, &spec).await?;
                if spec.is_clear() {
                    println!("chunkserver {}: no faults", f.server);
                } else {
                    println!("chunkserver {}: {spec:?}", f.server);
                }
            }
        }
        anyhow::Ok(())
    })
}

/// `cairn admin service-key`.
fn service_key(
    service: &str,
    out: &std::path::Path,
    secret: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    use cairn_rpc::auth::{ClusterSecret, Service, ServiceKey};
    let service = Service::from_name(service)
        .ok_or_else(|| anyhow::anyhow!("{service:?}: the services are `s3` and `block`"))?;
    let default = std::path::Path::new("./cairn-data").join(crate::up::CLUSTER_SECRET);
    let secret = ClusterSecret::read(secret.unwrap_or(&default))?;
    ServiceKey::derive(&secret, service).write_new(service, out)?;
    println!(
        "{}: the {service} service's key (give it to the service with --service-key-file)",
        out.display()
    );
    Ok(())
}

/// The tables whose rows or CRC differ between copies at one entry, each copy's figures.
fn differing_tables(same: &[&(u64, pb::GroupDigest)]) -> String {
    let mut names: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    for c in same {
        for t in &c.1.tables {
            names.insert(&t.name);
        }
    }
    names
        .into_iter()
        .filter_map(|n| {
            let each: Vec<(u64, u64, u32)> = same
                .iter()
                .map(|c| {
                    let t = c.1.tables.iter().find(|t| t.name == n);
                    (c.0, t.map_or(0, |t| t.rows), t.map_or(0, |t| t.crc))
                })
                .collect();
            let first = (each[0].1, each[0].2);
            each.iter().any(|e| (e.1, e.2) != first).then(|| {
                let list: Vec<String> = each
                    .iter()
                    .map(|(m, rows, crc)| format!("master {m} {rows} rows {crc:08x}"))
                    .collect();
                format!("{n} ({})", list.join(", "))
            })
        })
        .collect::<Vec<_>>()
        .join("; ")
}
