//! `cairn up`: a whole cluster on this machine, one OS process per master and chunkserver,
//! supervised (a process that dies is restarted after a back-off).

mod down;
mod lock;
mod spawn;
mod store;
mod welcome;

use down::down_flag;
pub use down::{DownArgs, down};
use spawn::{Ports, spawn};
use store::{free_bytes, store_size};
use welcome::{admin_credentials, admin_nbd_cert, cli_name, print_nbd, print_s3};

use crate::cluster::{ClusterFile, Proc};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct UpArgs {
    /// Where every process keeps its data, logs and cluster.toml.
    #[arg(long, default_value = "./cairn-data")]
    data_dir: PathBuf,
    /// Chunkservers (each its own process and store file; ec:K+M needs K+M of them).
    #[arg(long, default_value_t = 3)]
    chunkservers: usize,
    /// Masters in the Raft group (1, 3 or 5).
    #[arg(long, default_value_t = 1)]
    masters: usize,
    /// Size of each new chunkserver store file (default: a quarter of the data directory's
    /// free space shared by the chunkservers, 1–8 GiB each; existing store files keep theirs).
    #[arg(long, value_parser = crate::bench::parse_size)]
    disk_size: Option<u64>,
    /// Do not restart processes that die.
    #[arg(long)]
    no_restart: bool,
    /// Chunkserver durability: sync (default) or none (benchmarks only).
    #[arg(long, default_value = "sync", value_parser = ["sync", "none"])]
    durability: String,
    /// Start the chunkservers with --fault-injection (`cairn admin fault`).
    #[arg(long)]
    fault_injection: bool,
    /// Create the chunkservers' store files without writing zeros over them (faster first
    /// start, slower appends until every block has been written once).
    #[arg(long)]
    no_zero_fill: bool,
    /// Do not run an S3 gateway.
    #[arg(long)]
    no_s3: bool,
    /// Do not run an NBD server (block volumes).
    #[arg(long)]
    no_nbd: bool,
    /// Mount the cluster's file system at this directory (`cairn mount`, as the admin user),
    /// supervised like the servers; unmounted when the cluster stops.
    #[arg(long, value_name = "DIR")]
    mount: Option<std::path::PathBuf>,
    /// Port of the NBD server on 127.0.0.1 (default: 10809 if free, else any free port; kept
    /// in cluster.toml across restarts).
    #[arg(long)]
    nbd_port: Option<u16>,
    /// Serve plain NBD (no TLS, no client certificates: every local client opens every
    /// volume). By default NBD needs TLS and a certificate (`cairn user cert`; the admin's is
    /// made in DATA_DIR/nbd-admin).
    #[arg(long)]
    nbd_insecure: bool,
    /// The control plane in plain TCP. By default it runs over TLS: DATA_DIR/tls (a cluster
    /// CA and a certificate for 127.0.0.1, made on the first start) serves every master and
    /// the CLI checks them with it.
    #[arg(long, conflicts_with = "data_tls")]
    no_tls: bool,
    /// The control plane over TLS: the default (kept for scripts that pass it).
    #[arg(long, hide = true)]
    tls: bool,
    /// The data plane (chunkserver frames) over TLS too (measured cost: BENCHMARKS.md).
    #[arg(long)]
    data_tls: bool,
    /// Port of the S3 gateway on 127.0.0.1 (default: 9000 if free, else any free port; kept
    /// in cluster.toml across restarts).
    #[arg(long)]
    s3_port: Option<u16>,
}

struct Managed {
    name: String,
    kind: Kind,
    index: usize,
    args: Vec<String>,
    child: Option<Child>,
    started: Instant,
    restart_at: Option<Instant>,
    backoff: Duration,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Master,
    Chunkserver,
    S3,
    Nbd,
    Mount,
}

/// Where `cairn up` keeps the admin user's credentials it made (an aws CLI credentials file,
/// which the cairn CLI reads too).
pub const ADMIN_CREDENTIALS: &str = crate::cluster::ADMIN_CREDENTIALS;
/// The cluster secret `cairn up` makes on the first start (mode 0600).
pub const CLUSTER_SECRET: &str = "cluster.secret";
/// The S3 gateway's and the NBD server's service keys `cairn up` derives from the secret.
pub const S3_KEY: &str = "s3.key";
pub const NBD_KEY: &str = "nbd.key";

pub fn run(a: UpArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.masters >= 1 && a.masters <= 7, "--masters must be 1..=7");
    anyhow::ensure!(a.chunkservers >= 1, "--chunkservers must be at least 1");
    let dir = a.data_dir.clone();
    std::fs::create_dir_all(&dir).map_err(|e| crate::local::path_error(&dir, e))?;
    // Before anything is read or written: one supervisor per directory.
    let _lock = match lock::try_lock(&dir)? {
        lock::Held::Ours(l) => l,
        lock::Held::Theirs(pid) => anyhow::bail!(
            "{}: a cluster is already running on this data directory (cairn up, pid {pid}); \
             stop it with Ctrl-C in its terminal or `cairn down{}`, or pass another --data-dir",
            dir.display(),
            down_flag(&dir)
        ),
    };
    cairn_rpc::private::close_data_dir(&dir);
    let disk_size = match a.disk_size {
        Some(s) => s,
        None => store_size(free_bytes(&dir)?, a.chunkservers)?,
    };
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    // Every master and chunkserver proves it holds this secret on every call between them.
    let secret = dir.join(CLUSTER_SECRET);
    if !secret.exists() {
        cairn_rpc::auth::ClusterSecret::generate().write_new(&secret)?;
    }
    // The S3 gateway and the NBD server prove keys of their own, limited to their
    // namespaces (docs/security.md "Service credentials"), not the cluster secret.
    let cluster_secret = cairn_rpc::auth::ClusterSecret::read(&secret)?;
    let service_key = |service: cairn_rpc::auth::Service, name: &str| {
        let p = dir.join(name);
        if !p.exists() {
            cairn_rpc::auth::ServiceKey::derive(&cluster_secret, service).write_new(service, &p)?;
        }
        Ok::<_, anyhow::Error>(p.display().to_string())
    };
    let s3_key = service_key(cairn_rpc::auth::Service::S3, S3_KEY)?;
    let nbd_key = service_key(cairn_rpc::auth::Service::Block, NBD_KEY)?;
    let secret = secret.display().to_string();
    let tls_dir = dir.join("tls");
    let tls = !a.no_tls || a.data_tls;
    // The CA is made always: NBD is served over TLS with client certificates it signs.
    if !tls_dir.join(cairn_rpc::tls::CA).exists() {
        crate::tls::init(&tls_dir, &["127.0.0.1".into(), "localhost".into()])?;
    }
    // Every process is given the directory: its flag, and for the supervisor's own clients.
    let tls_args: Vec<String> = if tls {
        vec!["--tls-dir".into(), tls_dir.display().to_string()]
    } else {
        Vec::new()
    };
    let client_tls = if tls {
        Some(cairn_rpc::tls::client_config(&tls_dir)?)
    } else {
        None
    };
    let exe = std::env::current_exe()?;
    // The same directory brings back the same cluster: same ports, same data.
    let old = ClusterFile::load(&dir)?.unwrap_or_default();
    // Same ids keep their ports from cluster.toml; new ones get a free port.
    let ports = Ports::new(
        [
            &old.master_procs,
            &old.chunkserver_procs,
            &old.s3_procs,
            &old.nbd_procs,
        ]
        .into_iter()
        .flatten()
        .flat_map(|p| [p.addr.clone(), p.metrics.clone()]),
    );
    let free_port = || ports.pick();
    let procs_of = |n: usize, old: &[Proc], name: &str| -> anyhow::Result<Vec<Proc>> {
        (1..=n as u64)
            .map(|id| {
                let (addr, metrics) = match old.iter().find(|p| p.id == id) {
                    Some(p) if !p.metrics.is_empty() => (p.addr.clone(), p.metrics.clone()),
                    Some(p) => (p.addr.clone(), free_port()?),
                    None => (free_port()?, free_port()?),
                };
                Ok(Proc {
                    id,
                    addr,
                    pid: 0,
                    data_dir: dir.join(format!("{name}-{id}")),
                    metrics,
                })
            })
            .collect()
    };
    let mut file = ClusterFile {
        master_procs: procs_of(a.masters, &old.master_procs, "master")?,
        chunkserver_procs: procs_of(a.chunkservers, &old.chunkserver_procs, "chunkserver")?,
        tls,
        data_tls: a.data_tls,
        ..ClusterFile::default()
    };
    if !a.no_s3 {
        let mut p = procs_of(1, &old.s3_procs, "s3")?.remove(0);
        p.addr = match (a.s3_port, old.s3_procs.first()) {
            (Some(port), _) => format!("127.0.0.1:{port}"),
            (None, Some(o)) => o.addr.clone(),
            (None, None) => std::net::TcpListener::bind("127.0.0.1:9000")
                .map(|_| "127.0.0.1:9000".to_string())
                .or_else(|_| free_port())?,
        };
        file.s3_procs.push(p);
    }
    if !a.no_nbd {
        let mut p = procs_of(1, &old.nbd_procs, "nbd")?.remove(0);
        p.addr = match (a.nbd_port, old.nbd_procs.first()) {
            (Some(port), _) => format!("127.0.0.1:{port}"),
            (None, Some(o)) => o.addr.clone(),
            (None, None) => std::net::TcpListener::bind("127.0.0.1:10809")
                .map(|_| "127.0.0.1:10809".to_string())
                .or_else(|_| free_port())?,
        };
        file.nbd_procs.push(p);
    }
    file.masters = file.master_procs.iter().map(|p| p.addr.clone()).collect();
    let peers = file
        .master_procs
        .iter()
        .map(|p| format!("{}={}", p.id, p.addr))
        .collect::<Vec<_>>()
        .join(",");
    let masters_list = file.masters.join(",");
    let mut procs = Vec::new();
    for (i, p) in file.master_procs.iter().enumerate() {
        procs.push(Managed {
            name: format!("master-{}", p.id),
            kind: Kind::Master,
            index: i,
            args: vec![
                "master".into(),
                "--id".into(),
                p.id.to_string(),
                "--data-dir".into(),
                p.data_dir.display().to_string(),
                "--listen".into(),
                p.addr.clone(),
                "--peers".into(),
                peers.clone(),
                "--metrics-listen".into(),
                p.metrics.clone(),
                "--cluster-secret-file".into(),
                secret.clone(),
                "--audit-dir".into(),
                dir.join("audit")
                    .join(format!("master-{}", p.id))
                    .display()
                    .to_string(),
            ]
            .into_iter()
            .chain(tls_args.iter().cloned())
            .collect(),
            child: None,
            started: Instant::now(),
            restart_at: Some(Instant::now()),
            backoff: Duration::from_millis(500),
        });
    }
    for (i, p) in file.chunkserver_procs.iter().enumerate() {
        // A new chunkserver is numbered as `cairn up` numbers it, so `cairn status` and
        // `cairn admin drain` use the same id (one made before that keeps its own).
        let numbered = (!p.data_dir.join("server-id").exists())
            .then(|| ["--server-id".to_string(), p.id.to_string()]);
        procs.push(Managed {
            name: format!("chunkserver-{}", p.id),
            kind: Kind::Chunkserver,
            index: i,
            args: vec![
                "chunkserver".into(),
                "--data-dir".into(),
                p.data_dir.display().to_string(),
                "--listen".into(),
                p.addr.clone(),
                "--masters".into(),
                masters_list.clone(),
                "--disk-size".into(),
                disk_size.to_string(),
                "--durability".into(),
                a.durability.clone(),
                "--host".into(),
                format!("local-{}", p.id),
                "--metrics-listen".into(),
                p.metrics.clone(),
                "--cluster-secret-file".into(),
                secret.clone(),
            ]
            .into_iter()
            .chain(tls_args.iter().cloned())
            .chain(a.data_tls.then(|| "--data-tls".to_string()))
            .chain(a.fault_injection.then(|| "--fault-injection".to_string()))
            .chain(a.no_zero_fill.then(|| "--no-zero-fill".to_string()))
            .chain(numbered.into_iter().flatten())
            .collect(),
            child: None,
            started: Instant::now(),
            restart_at: Some(Instant::now()),
            backoff: Duration::from_millis(500),
        });
    }
    for (i, p) in file.s3_procs.iter().enumerate() {
        procs.push(Managed {
            name: format!("s3-{}", p.id),
            kind: Kind::S3,
            index: i,
            args: vec![
                "s3".into(),
                "serve".into(),
                "--listen".into(),
                p.addr.clone(),
                "--masters".into(),
                masters_list.clone(),
                "--metrics-listen".into(),
                p.metrics.clone(),
                "--service-key-file".into(),
                s3_key.clone(),
                "--access-log-dir".into(),
                dir.join("audit")
                    .join(format!("s3-{}", p.id))
                    .display()
                    .to_string(),
            ]
            .into_iter()
            .chain(tls_args.iter().cloned())
            .chain(a.data_tls.then(|| "--data-tls".to_string()))
            .collect(),
            child: None,
            started: Instant::now(),
            // Started once the cluster is ready: its connections then take their ephemeral
            // ports after every chunkserver has bound its own (cluster.toml keeps ports across
            // restarts, so a port taken once would be taken for good).
            restart_at: None,
            backoff: Duration::from_millis(500),
        });
    }

    for (i, p) in file.nbd_procs.iter().enumerate() {
        procs.push(Managed {
            name: format!("nbd-{}", p.id),
            kind: Kind::Nbd,
            index: i,
            args: vec![
                "nbd".into(),
                "--listen".into(),
                p.addr.clone(),
                "--masters".into(),
                masters_list.clone(),
                "--metrics-listen".into(),
                p.metrics.clone(),
                "--service-key-file".into(),
                nbd_key.clone(),
                "--audit-dir".into(),
                dir.join("audit")
                    .join(format!("nbd-{}", p.id))
                    .display()
                    .to_string(),
            ]
            .into_iter()
            .chain(tls_args.iter().cloned())
            .chain(a.data_tls.then(|| "--data-tls".to_string()))
            .chain(if a.nbd_insecure {
                vec!["--nbd-insecure".to_string()]
            } else {
                vec!["--nbd-tls-dir".to_string(), tls_dir.display().to_string()]
            })
            .collect(),
            child: None,
            started: Instant::now(),
            // Started once the cluster is ready, like the gateway.
            restart_at: None,
            backoff: Duration::from_millis(500),
        });
    }

    if let Some(mnt) = &a.mount {
        std::fs::create_dir_all(mnt)?;
        let mnt = std::fs::canonicalize(mnt)?;
        procs.push(Managed {
            name: "mount".into(),
            kind: Kind::Mount,
            index: 0,
            args: vec![
                "mount".into(),
                "--cluster".into(),
                masters_list.clone(),
                "--credentials".into(),
                dir.join(ADMIN_CREDENTIALS).display().to_string(),
            ]
            .into_iter()
            .chain(tls_args.iter().cloned())
            .chain([mnt.display().to_string()])
            .collect(),
            child: None,
            started: Instant::now(),
            // Started once the cluster is ready (the admin's credentials are made then).
            restart_at: None,
            backoff: Duration::from_millis(500),
        });
    }

    let fresh = file
        .chunkserver_procs
        .iter()
        .filter(|p| !p.data_dir.join("disk0.cairn").exists())
        .count();
    if fresh > 0 && !a.no_zero_fill {
        println!(
            "cairn up: making {fresh} new store file(s) of {} MiB{}, written with zeros once \
             (--no-zero-fill skips it; docs/operations.md)",
            disk_size >> 20,
            if a.disk_size.is_none() {
                " (a quarter of the free space, 1-8 GiB each; --disk-size sets it)"
            } else {
                ""
            }
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGINT, libc::SIGTERM] {
        signal_flag(sig, stop.clone())?;
    }

    let mut announced = false;
    let began = Instant::now();
    // Ready means what a first command needs: a leader, and every chunkserver of this cluster
    // registered and heartbeating (a new store file is zero-filled first, which takes seconds).
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Readiness>();
    {
        let masters = file.masters.clone();
        let servers: Vec<String> = file
            .chunkserver_procs
            .iter()
            .map(|p| p.addr.clone())
            .collect();
        let stop = stop.clone();
        let cred = cairn_rpc::auth::Credential::Server {
            secret: cairn_rpc::auth::ClusterSecret::read(Path::new(&secret))?,
            who: "cairn-up".into(),
        };
        std::thread::Builder::new().name("up-ready".into()).spawn({
            let tls = client_tls.clone();
            move || watch_ready(&masters, &servers, cred, tls, &stop, &ready_tx)
        })?;
    }
    while !stop.load(Ordering::Relaxed) {
        let mut changed = false;
        for m in &mut procs {
            if let Some(c) = &mut m.child
                && let Some(status) = c.try_wait()?
            {
                m.child = None;
                changed = true;
                if a.no_restart {
                    eprintln!(
                        "cairn up: {} exited ({status}); not restarting (--no-restart)",
                        m.name
                    );
                } else {
                    // Back off harder when it keeps dying young.
                    if m.started.elapsed() > Duration::from_secs(30) {
                        m.backoff = Duration::from_millis(500);
                    }
                    eprintln!(
                        "cairn up: {} exited ({status}); restarting in {:?} (log: {})",
                        m.name,
                        m.backoff,
                        logs.join(format!("{}.log", m.name)).display()
                    );
                    m.restart_at = Some(Instant::now() + m.backoff);
                    m.backoff = (m.backoff * 2).min(Duration::from_secs(10));
                }
            }
            if m.child.is_none()
                && let Some(at) = m.restart_at
                && Instant::now() >= at
            {
                m.restart_at = None;
                m.child = Some(spawn(&exe, m, &logs)?);
                m.started = Instant::now();
                changed = true;
            }
        }
        if changed {
            for m in &procs {
                let pid = m.child.as_ref().map_or(0, Child::id);
                match m.kind {
                    Kind::Master => file.master_procs[m.index].pid = pid,
                    Kind::Chunkserver => file.chunkserver_procs[m.index].pid = pid,
                    Kind::S3 => file.s3_procs[m.index].pid = pid,
                    Kind::Nbd => file.nbd_procs[m.index].pid = pid,
                    Kind::Mount => {}
                }
            }
            file.store(&dir)?;
        }
        if !announced && began.elapsed() > Duration::from_millis(300) {
            announced = true;
            println!(
                "cairn up: {} master(s), {} chunkserver(s); data in {}",
                a.masters,
                a.chunkservers,
                dir.display()
            );
            for p in &file.master_procs {
                println!(
                    "  master {}       {}  pid {}  metrics http://{}/metrics",
                    p.id, p.addr, p.pid, p.metrics
                );
            }
            for p in &file.chunkserver_procs {
                println!(
                    "  chunkserver {}  {}  pid {}  metrics http://{}/metrics",
                    chunkserver_id(p),
                    p.addr,
                    p.pid,
                    p.metrics
                );
            }
            for p in &file.s3_procs {
                println!(
                    "  s3 gateway     http://{}  (starts once the chunkservers are up)  metrics http://{}/metrics",
                    p.addr, p.metrics
                );
            }
            for p in &file.nbd_procs {
                println!(
                    "  nbd server     nbd://{}/VOLUME  (starts once the chunkservers are up)  metrics http://{}/metrics",
                    p.addr, p.metrics
                );
            }
            println!("  cluster file   {}", ClusterFile::path(&dir).display());
            println!("  logs           {}", logs.display());
            println!(
                "cairn up: waiting for the chunkservers to register (Ctrl-C stops the cluster)"
            );
            use std::io::Write;
            std::io::stdout().flush()?;
        }
        if announced && let Ok(r) = ready_rx.try_recv() {
            match r {
                Readiness::Ready { up } => {
                    // The admin credentials first: the first command after "ready" uses them.
                    let keys = admin_credentials(
                        &dir,
                        &masters_list,
                        Path::new(&secret),
                        client_tls.clone(),
                        a.data_tls.then_some(&tls_dir),
                    );
                    let cli = cli_name();
                    println!(
                        "cairn up: ready: {up} of {} chunkserver(s) up after {:.1} s; the CLI signs \
                         as the admin user ({})\n\
                         try: {cli} status; {cli} fs put README.md /readme; {cli} fs cat /readme",
                        a.chunkservers,
                        began.elapsed().as_secs_f64(),
                        dir.join(ADMIN_CREDENTIALS).display()
                    );
                    for m in procs
                        .iter_mut()
                        .filter(|m| matches!(m.kind, Kind::S3 | Kind::Nbd | Kind::Mount))
                    {
                        m.restart_at = Some(Instant::now());
                    }
                    match keys {
                        Ok(keys) => {
                            if let Some(p) = file.s3_procs.first() {
                                print_s3(&p.addr, &dir, &keys);
                            }
                        }
                        Err(e) => eprintln!("cairn up: no admin credentials: {e:#}"),
                    }
                    if let Some(mnt) = &a.mount {
                        println!(
                            "  file system    {} (cairn mount; log {})",
                            mnt.display(),
                            logs.join("mount.log").display()
                        );
                    }
                    if let Some(p) = file.nbd_procs.first() {
                        print_nbd(&p.addr, a.nbd_insecure, || {
                            admin_nbd_cert(
                                &dir,
                                &masters_list,
                                Path::new(&secret),
                                client_tls.clone(),
                                &tls_dir,
                            )
                        });
                    }
                }
                Readiness::Slow { up, why } => println!(
                    "cairn up: still waiting after {:.0} s: {up} of {} chunkserver(s) up{} \
                     (logs: {})",
                    began.elapsed().as_secs_f64(),
                    a.chunkservers,
                    why.map(|w| format!("; masters: {w}")).unwrap_or_default(),
                    logs.display()
                ),
            }
            use std::io::Write;
            std::io::stdout().flush()?;
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    eprintln!("cairn up: stopping");
    // The mount first (it flushes its files), gateways and chunkservers next (chunkservers
    // checkpoint their stores), then the masters.
    for kind in [
        Kind::Mount,
        Kind::Nbd,
        Kind::S3,
        Kind::Chunkserver,
        Kind::Master,
    ] {
        for m in procs.iter().filter(|m| m.kind == kind) {
            if let Some(c) = &m.child {
                // SAFETY: kill(2) on our own child's pid.
                unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for m in procs.iter_mut().filter(|m| m.kind == kind) {
            if let Some(c) = &mut m.child {
                loop {
                    if c.try_wait()?.is_some() {
                        break;
                    }
                    if Instant::now() >= deadline {
                        eprintln!("cairn up: {} did not stop in 10 s; killing it", m.name);
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            m.child = None;
        }
    }
    for p in file
        .master_procs
        .iter_mut()
        .chain(file.chunkserver_procs.iter_mut())
        .chain(file.s3_procs.iter_mut())
        .chain(file.nbd_procs.iter_mut())
    {
        p.pid = 0;
    }
    file.store(&dir)?;
    eprintln!("cairn up: stopped");
    Ok(())
}

/// What the readiness watcher tells the supervisor loop.
enum Readiness {
    /// A leader answers and every chunkserver of the cluster file is up.
    Ready { up: usize },
    /// Not yet, long after the start (said once; the watcher keeps watching).
    Slow { up: usize, why: Option<String> },
}

/// Asks the masters' status until a leader answers and every address in `servers` is an up
/// chunkserver that heartbeated within the last 3 s (a cluster started again on the same
/// directory is remembered by the masters: an old registration alone is not readiness).
fn watch_ready(
    masters: &[String],
    servers: &[String],
    cred: cairn_rpc::auth::Credential,
    tls: Option<cairn_rpc::tls::ClientTlsConfig>,
    stop: &AtomicBool,
    tx: &std::sync::mpsc::Sender<Readiness>,
) {
    use cairn_rpc::pb;
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    let Ok(m) = rt.block_on(async {
        cairn_rpc::Masters::new(masters).map(|m| m.credential(Some(cred)).tls(tls))
    }) else {
        return;
    };
    let began = Instant::now();
    let mut warned = false;
    while !stop.load(Ordering::Relaxed) {
        let r: anyhow::Result<pb::StatusReply> = rt.block_on(async {
            let call = m.call(|mut c| async move { c.status(pb::Empty {}).await });
            Ok(tokio::time::timeout(Duration::from_secs(2), call).await??)
        });
        let (up, why) = match r {
            Ok(s) => {
                let up = servers
                    .iter()
                    .filter(|a| {
                        s.servers.iter().any(|c| {
                            &&c.addr == a && c.state == "up" && c.last_heartbeat_ms_ago < 3_000
                        })
                    })
                    .count();
                (up, (s.leader_id == 0).then(|| "no leader yet".to_string()))
            }
            Err(e) => (0, Some(e.to_string())),
        };
        if up == servers.len() && why.is_none() {
            let _ = tx.send(Readiness::Ready { up });
            return;
        }
        if !warned && began.elapsed() > Duration::from_secs(30) {
            warned = true;
            let _ = tx.send(Readiness::Slow { up, why });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The id the masters know chunkserver `p` by: its data directory's `server-id` (the number
/// `cairn up` gave it, or a random one from before it did).
fn chunkserver_id(p: &Proc) -> u64 {
    std::fs::read_to_string(p.data_dir.join("server-id"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(p.id)
}

/// Sets `flag` when signal `sig` arrives.
fn signal_flag(sig: i32, flag: Arc<AtomicBool>) -> anyhow::Result<()> {
    // A small tokio runtime would do too; a thread blocked in sigwait is simpler here.
    static FLAGS: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();
    let f = FLAGS.get_or_init(|| flag.clone()).clone();
    extern "C" fn on_signal(_: i32) {
        if let Some(f) = FLAGS.get() {
            f.store(true, Ordering::Relaxed);
        }
    }
    let _ = f;
    // SAFETY: installing an async-signal-safe handler (one atomic store).
    let r = unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    anyhow::ensure!(
        r != libc::SIG_ERR,
        "cannot install a handler for signal {sig}"
    );
    Ok(())
}
