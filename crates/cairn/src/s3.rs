//! `cairn s3`: run an S3 gateway (`cairn s3 serve`), manage its users (`cairn s3 user create`).

use crate::cluster::ClusterArgs;
use cairn_client::Client;
use cairn_rpc::object::{ObjectOp, ObjectQuery, QueryReply};

#[derive(clap::Args)]
pub struct S3Args {
    #[command(subcommand)]
    command: S3Command,
}

#[derive(clap::Subcommand)]
enum S3Command {
    /// Serve S3 for the cluster (one gateway process; run as many as you like).
    Serve(Box<ServeArgs>),
    /// Users of the cluster and its object service (as `cairn user`).
    #[command(subcommand)]
    User(UserCommand),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Address to serve HTTP on; port 0 picks a free port. The bound address is printed on
    /// stdout as `listening on ADDR`.
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: String,
    /// The masters (`HOST:PORT,…`).
    #[arg(long, env = "CAIRN_MASTERS")]
    masters: String,
    /// Objects up to this size share append-only pack files; larger ones get files of their own.
    #[arg(long, default_value = "1m", value_parser = crate::bench::parse_size)]
    pack_max: u64,
    /// A pack (the shared log small objects go to) is closed and a new one begun past this.
    #[arg(long, default_value = "256m", value_parser = crate::bench::parse_size)]
    pack_bytes: u64,
    /// Closed packs whose live bytes are under this percentage of their length are
    /// compacted: live objects rewritten, the pack deleted.
    #[arg(long, default_value_t = 50)]
    compact_live_pct: u8,
    /// Seconds between compaction passes.
    #[arg(long, default_value_t = 60.0)]
    compact_every_secs: f64,
    /// Bytes per second compaction may read plus rewrite.
    #[arg(long, default_value = "32m", value_parser = crate::bench::parse_size)]
    compact_rate: u64,
    /// Seconds a freed file (a replaced or deleted large object, a compacted pack) is kept
    /// before it is deleted (never while this gateway's GETs read it), so that GETs another
    /// gateway has begun can start reading it (docs/object.md, "Space").
    #[arg(long, default_value_t = 5.0)]
    free_grace_secs: f64,
    /// Seconds after which a file of the gateway's blob directory that nothing names and
    /// nobody writes to (a failed upload's, a crashed gateway's) is deleted.
    #[arg(long, default_value_t = 60.0)]
    sweep_after_secs: f64,
    /// Multipart uploads older than this many hours are aborted and their parts deleted.
    #[arg(long, default_value_t = 24 * 7)]
    upload_max_age_hours: u64,
    /// The region the gateway answers with (clients sign for it).
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// `HOST:PORT` clients reach this gateway at, as `cairn status` lists it (default: the
    /// bound address).
    #[arg(long)]
    advertise: Option<String>,
    /// Milliseconds a request body may send nothing while the gateway waits for it; then the
    /// request fails and its connection closes.
    #[arg(long, default_value_t = cairn_s3::BODY_IDLE.as_millis() as u64)]
    body_idle_ms: u64,
    /// Write an access log here: one JSON line per request (user, bucket, key, status,
    /// bytes, time), a file per day (docs/security.md "Audit"). `cairn up` sets it.
    #[arg(long)]
    access_log_dir: Option<std::path::PathBuf>,
    /// Days of access log kept.
    #[arg(long, default_value_t = 30)]
    access_log_keep_days: usize,
    #[command(flatten)]
    connections: crate::limits::ConnectionArgs,
    /// Serve Prometheus metrics at http://ADDR/metrics (port 0: any free port).
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// The gateway is a server of the cluster (it reads users' keys to check S3 signatures).
    #[command(flatten)]
    service: crate::cluster::ServiceArgs,
}

#[derive(clap::Subcommand)]
pub enum UserCommand {
    /// Create a user; prints its access key and secret (shown once: the masters keep it).
    /// Only admins (and servers) may.
    Create {
        /// The new user's name.
        name: String,
        /// An admin: runs `cairn admin`, creates users, passes every permission check.
        #[arg(long)]
        admin: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Also write the keys to this new file (mode 0600; `--credentials FILE` reads it).
        #[arg(long)]
        save: Option<std::path::PathBuf>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List the users (names, access keys, admin; never secrets). Admins only.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Delete a user (refused while it owns buckets); its keys stop working at once (S3
    /// gateways within 5 s). Admins only.
    Delete {
        /// The user.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Issue a user a client certificate signed by the cluster CA (for NBD over TLS): writes
    /// `ca-cert.pem`, `client-cert.pem` and `client-key.pem` into DIR, the layout qemu's
    /// `tls-creds-x509` and libnbd's `tls-certificates=` read, and records it with the masters.
    /// Admins only, where the CA's key is (`cairn up`'s `cairn-data/tls`).
    Cert {
        /// The user.
        name: String,
        /// The directory to write the files into (made if missing).
        #[arg(long)]
        dir: std::path::PathBuf,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// The directory with the cluster CA (`ca.pem`, `ca.key`: what `cairn tls init`
        /// made); default `CAIRN_TLS_DIR` or the local cluster's (`cairn-data/tls`).
        #[arg(long)]
        ca_dir: Option<std::path::PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Revoke every client certificate issued to a user: they stop opening volumes at once
    /// (NBD servers within 5 s; connections open keep their volume until they close).
    RevokeCerts {
        /// The user.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Give a user new keys; prints them (shown once). The old keys stop working at once
    /// (S3 gateways within 5 s). Admins only.
    RotateKey {
        /// The user.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Also write the new keys to this new file (mode 0600).
        #[arg(long)]
        save: Option<std::path::PathBuf>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

/// `cairn user …` (and its alias `cairn s3 user …`).
pub fn user(c: UserCommand) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        match c {
            UserCommand::Create {
                name,
                admin,
                json,
                save,
                cluster,
            } => {
                let client = crate::cluster::client(&cluster.masters()?).await?;
                let user = cairn_s3::create_user(&client, &name, admin)
                    .await
                    .map_err(|e| anyhow::anyhow!(e))?;
                print_keys(&user, save.as_deref(), json)
            }
            UserCommand::List { json, cluster } => {
                let m = crate::cluster::masters_client(&cluster.masters()?)?;
                let users = match m.object_query(&ObjectQuery::Users).await? {
                    Ok(QueryReply::Users(u)) => u,
                    Ok(_) => {
                        anyhow::bail!("the masters answered the user list with something else")
                    }
                    Err(e) => anyhow::bail!("{e}"),
                };
                if json {
                    let v: Vec<_> = users
                        .iter()
                        .map(|u| {
                            serde_json::json!({"name": u.name, "admin": u.admin,
                                "access_key": u.access_key, "created_ms": u.created_ms})
                        })
                        .collect();
                    println!("{}", serde_json::Value::from(v));
                } else {
                    println!("{:<24} {:<22} admin", "name", "access_key");
                    for u in &users {
                        println!(
                            "{:<24} {:<22} {}",
                            crate::fs::escape(&u.name),
                            u.access_key,
                            if u.admin { "yes" } else { "no" }
                        );
                    }
                }
                Ok(())
            }
            UserCommand::Delete {
                name,
                json,
                cluster,
            } => {
                let m = crate::cluster::masters_client(&cluster.masters()?)?;
                let op = ObjectOp::DeleteUser { name: name.clone() };
                m.object_op(&op)
                    .await?
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                if json {
                    println!("{}", serde_json::json!({"name": name, "deleted": true}));
                }
                Ok(())
            }
            UserCommand::Cert {
                name,
                dir,
                days,
                ca_dir,
                json,
                cluster,
            } => {
                let m = crate::cluster::masters_client(&cluster.masters()?)?;
                let known = matches!(
                    m.object_query(&ObjectQuery::Users).await?,
                    Ok(QueryReply::Users(u)) if u.iter().any(|u| u.name == name)
                );
                anyhow::ensure!(known, "no user {name}");
                let tls_dir = ca_dir
                    .or_else(crate::cluster::tls_dir)
                    .or_else(|| {
                        let local = std::path::Path::new("./cairn-data/tls");
                        local
                            .join(cairn_rpc::tls::CA)
                            .exists()
                            .then(|| local.to_path_buf())
                    })
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "no cluster CA: pass --ca-dir (the directory `cairn tls init` made) \
                             or set CAIRN_TLS_DIR"
                        )
                    })?;
                let fingerprint = crate::tls::issue_client_cert(&tls_dir, &name, days, &dir)?;
                let op = ObjectOp::AddUserCert {
                    name: name.clone(),
                    fingerprint: fingerprint.clone(),
                };
                if let Err(e) = m
                    .object_op(&op)
                    .await
                    .map_err(anyhow::Error::from)
                    .and_then(|r| r.map_err(|e| anyhow::anyhow!("{e}")))
                {
                    // Not recorded: the files would open nothing.
                    let _ = std::fs::remove_file(dir.join(crate::tls::CLIENT_CERT));
                    let _ = std::fs::remove_file(dir.join(crate::tls::CLIENT_KEY));
                    return Err(e);
                }
                if json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "name": name,
                            "dir": dir.display().to_string(),
                            "fingerprint": fingerprint,
                            "days": days,
                        })
                    );
                } else {
                    println!(
                        "{}: {} {} {} for user {name} (sha256 {fingerprint})",
                        dir.display(),
                        crate::tls::CLIENT_CA,
                        crate::tls::CLIENT_CERT,
                        crate::tls::CLIENT_KEY
                    );
                }
                Ok(())
            }
            UserCommand::RevokeCerts {
                name,
                json,
                cluster,
            } => {
                let m = crate::cluster::masters_client(&cluster.masters()?)?;
                let op = ObjectOp::RevokeUserCerts { name: name.clone() };
                m.object_op(&op)
                    .await?
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                if json {
                    println!("{}", serde_json::json!({"name": name, "revoked": true}));
                }
                Ok(())
            }
            UserCommand::RotateKey {
                name,
                json,
                save,
                cluster,
            } => {
                let m = crate::cluster::masters_client(&cluster.masters()?)?;
                let admin = matches!(
                    m.object_query(&ObjectQuery::Users).await?,
                    Ok(QueryReply::Users(u)) if u.iter().any(|u| u.name == name && u.admin)
                );
                let fresh = cairn_s3::new_user(&name, admin);
                let op = ObjectOp::SetUserKeys {
                    name: name.clone(),
                    access_key: fresh.access_key.clone(),
                    secret_key: fresh.secret_key.clone(),
                };
                m.object_op(&op)
                    .await?
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                print_keys(&fresh, save.as_deref(), json)
            }
        }
    })
}

/// Prints a user's new keys (shown once: the masters keep them), writing them to `save` too.
fn print_keys(
    user: &cairn_rpc::object::User,
    save: Option<&std::path::Path>,
    json: bool,
) -> anyhow::Result<()> {
    if let Some(p) = save {
        cairn_rpc::auth::Credential::write_new(p, &user.name, &user.access_key, &user.secret_key)?;
    }
    if json {
        println!(
            "{}",
            serde_json::json!({
                "name": user.name,
                "admin": user.admin,
                "access_key": user.access_key,
                "secret_key": user.secret_key,
            })
        );
    } else {
        println!(
            "user        {}{}",
            user.name,
            if user.admin { " (admin)" } else { "" }
        );
        println!("access key  {}", user.access_key);
        println!("secret key  {}", user.secret_key);
    }
    Ok(())
}

pub fn run(a: S3Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("cairn-s3")
        .build()?;
    match a.command {
        S3Command::Serve(s) => rt.block_on(serve(*s)),
        S3Command::User(c) => {
            drop(rt);
            user(c)
        }
    }
}

async fn serve(s: ServeArgs) -> anyhow::Result<()> {
    let masters: Vec<String> = s.masters.split(',').map(|m| m.trim().to_owned()).collect();
    let opts = s.service.options(
        cairn_rpc::auth::Service::S3,
        format!("s3-gateway@{}", s.listen),
    )?;
    let client = Client::with_options(&masters, opts).await?;
    if let Some(m) = s.metrics_listen {
        crate::metrics::serve(m, "s3").await?;
    }
    let opts = cairn_s3::Options {
        pack_max_bytes: s.pack_max as usize,
        upload_max_age: std::time::Duration::from_secs(s.upload_max_age_hours * 3600),
        region: s.region,
        advertise: s.advertise,
        body_idle: std::time::Duration::from_millis(s.body_idle_ms.max(100)),
        access_log: match &s.access_log_dir {
            Some(d) => cairn_rpc::audit::Audit::open(d, "s3-access", s.access_log_keep_days)
                .map_err(|e| {
                    anyhow::anyhow!("cannot open the access log in {}: {e}", d.display())
                })?,
            None => cairn_rpc::audit::Audit::off(),
        },
        pack_bytes: s.pack_bytes,
        connections: s.connections.apply(cairn_s3::default_connection_limits()),
        compact: cairn_s3::compact::CompactOptions {
            live_pct: s.compact_live_pct.min(100),
            every: std::time::Duration::from_secs_f64(s.compact_every_secs.max(0.05)),
            bytes_per_sec: s.compact_rate,
            free_grace: std::time::Duration::from_secs_f64(s.free_grace_secs.max(0.0)),
            sweep_after: std::time::Duration::from_secs_f64(s.sweep_after_secs.max(1.0)),
            ..cairn_s3::compact::CompactOptions::default()
        },
        ..cairn_s3::Options::default()
    };
    let gw = cairn_s3::Gateway::start(client, &s.listen, opts).await?;
    println!("listening on {}", gw.addr);
    use std::io::Write;
    std::io::stdout().flush()?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        () = gw.wait() => {}
    }
    Ok(())
}
