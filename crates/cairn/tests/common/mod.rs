//! A cluster of real `cairn master` and `cairn chunkserver` processes on loopback, for the
//! end-to-end tests. Each process can be SIGKILLed and started again on the same port and data.

#![allow(dead_code)]

pub mod nbd;

use cairn_client::{Client, ClientOptions};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The cluster secret every cluster of this test process shares (a file made once), given
/// to every process and CLI run through `CAIRN_CLUSTER_SECRET_FILE`.
pub fn secret_file() -> &'static Path {
    static FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let p = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("cluster-{}.secret", std::process::id()));
        let _ = std::fs::remove_file(&p);
        cairn_rpc::auth::ClusterSecret::generate()
            .write_new(&p)
            .unwrap();
        p
    })
}

/// What the tests' clients sign with: the cluster secret, as a server (every right).
pub fn credential() -> cairn_rpc::auth::Credential {
    cairn_rpc::auth::Credential::Server {
        secret: cairn_rpc::auth::ClusterSecret::read(secret_file()).unwrap(),
        who: "test".into(),
    }
}

/// A client of the masters `addrs` signing with [`credential`].
pub fn masters(addrs: &[String]) -> cairn_rpc::Masters {
    cairn_rpc::Masters::new(addrs)
        .unwrap()
        .credential(Some(credential()))
}

/// The `cairn` binary under test, with the tests' cluster secret.
pub fn cairn() -> Command {
    // CAIRN_BIN: a copy of the binary, so that a long run (the nemesis) is not changed
    // under it by a build.
    let bin = std::env::var("CAIRN_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_cairn").into());
    let mut c = Command::new(bin);
    c.env("CAIRN_CLUSTER_SECRET_FILE", secret_file());
    if let Some(d) = TLS_DIR.get() {
        c.env("CAIRN_TLS_DIR", d).env("CAIRN_DATA_TLS", "true");
    }
    c
}

/// Set by a test that runs every process with TLS (the nemesis with `CAIRN_NEMESIS_TLS=1`):
/// [`cairn`] gives every command `CAIRN_TLS_DIR`, which servers serve and clients check with,
/// and `CAIRN_DATA_TLS` (the gateway's and NBD server's connections to chunkservers).
pub static TLS_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Runs `cmd` to its end and returns its output, failing the test (with its stderr) unless it
/// succeeded.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub struct Proc {
    pub name: String,
    pub args: Vec<String>,
    pub addr: String,
    pub child: Option<Child>,
}

impl Proc {
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "{} already running", self.name);
        let mut child = cairn()
            .args(&self.args)
            .env(
                "CAIRN_LOG",
                std::env::var("CAIRN_TEST_LOG").unwrap_or("error".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start cairn");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let Some(bound) = line.trim().strip_prefix("listening on ") else {
            panic!("{}: unexpected first line {line:?}", self.name);
        };
        // A process started on port 0 keeps the port it got across restarts.
        if let Some(i) = self.args.iter().position(|a| a == "--listen") {
            self.args[i + 1] = bound.to_owned();
        }
        self.addr = bound.to_owned();
        self.child = Some(child);
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let status = c.wait().unwrap();
            assert!(status.success(), "{} exited with {status}", self.name);
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An S3 user's keys.
pub struct Keys {
    pub access: String,
    pub secret: String,
}

/// `cairn s3 user create NAME`.
pub fn create_user(masters: &[String], name: &str) -> Keys {
    let out = run_ok(cairn().args([
        "s3",
        "user",
        "create",
        name,
        "--json",
        "--cluster",
        &masters.join(","),
    ]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Keys {
        access: v["access_key"].as_str().unwrap().to_owned(),
        secret: v["secret_key"].as_str().unwrap().to_owned(),
    }
}

/// `cairn admin service-key SERVICE --out FILE`, and the key it wrote.
pub fn service_key(dir: &std::path::Path, masters: &[String], service: &str) -> std::path::PathBuf {
    let out = dir.join(format!("{service}.key"));
    run_ok(cairn().args([
        "admin",
        "service-key",
        service,
        "--out",
        out.to_str().unwrap(),
        "--cluster",
        &masters.join(","),
    ]));
    out
}

/// A `cairn s3 serve` process of the cluster `masters`, started.
pub fn gateway(masters: &[String], listen: &str) -> Proc {
    gateway_with(masters, listen, &[])
}

pub fn gateway_with(masters: &[String], listen: &str, extra: &[&str]) -> Proc {
    let mut p = Proc {
        name: "s3".into(),
        args: [
            "s3",
            "serve",
            "--listen",
            listen,
            "--masters",
            &masters.join(","),
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect(),
        addr: String::new(),
        child: None,
    };
    p.start();
    p
}

/// A loopback address free now and never handed out before in this test process: two
/// clusters of one test binary that got the same port once made one's masters talk Raft to
/// the other's (they share the cluster secret), and openraft stopped on the foreign leader.
pub fn free_addr() -> String {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let mut given = GIVEN.lock().unwrap();
        if !given.contains(&a.port()) {
            given.push(a.port());
            return a.to_string();
        }
    }
}

pub struct Cluster {
    pub dir: PathBuf,
    pub masters: Vec<Proc>,
    pub chunkservers: Vec<Proc>,
    /// The TLS directory the masters serve with (`--tls-dir` among the masters' arguments).
    pub tls: Option<PathBuf>,
    /// The chunkservers serve frames over TLS (`--data-tls` among their arguments).
    pub data_tls: bool,
}

impl Cluster {
    /// Starts `m` masters (one Raft group) and `c` chunkservers, and waits until every
    /// chunkserver is up at the leader.
    pub async fn start(dir: &Path, m: usize, c: usize) -> Self {
        Self::start_with(dir, m, c, &[]).await
    }

    /// [`Cluster::start`] with `extra` arguments for every chunkserver.
    pub async fn start_with(dir: &Path, m: usize, c: usize, extra: &[&str]) -> Self {
        Self::start_full(dir, m, c, &[], extra).await
    }

    /// [`Cluster::start`] with `master_extra` arguments for every master and `extra` for
    /// every chunkserver.
    pub async fn start_full(
        dir: &Path,
        m: usize,
        c: usize,
        master_extra: &[&str],
        extra: &[&str],
    ) -> Self {
        let maddrs: Vec<String> = (0..m).map(|_| free_addr()).collect();
        let peers = maddrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let masters = maddrs
            .iter()
            .enumerate()
            .map(|(i, a)| Proc {
                name: format!("master-{}", i + 1),
                args: vec![
                    "master".into(),
                    "--id".into(),
                    (i + 1).to_string(),
                    "--data-dir".into(),
                    dir.join(format!("master-{}", i + 1)).display().to_string(),
                    "--listen".into(),
                    a.clone(),
                    "--peers".into(),
                    peers.clone(),
                    "--lease-secs".into(),
                    // Unless the test sets its own.
                    master_extra
                        .iter()
                        .position(|a| *a == "--lease-secs")
                        .map_or("5", |i| master_extra[i + 1])
                        .into(),
                    "--suspect-after-ms".into(),
                    "2000".into(),
                    "--down-after-ms".into(),
                    "4000".into(),
                    "--repair-after-ms".into(),
                    "1000".into(),
                ]
                .into_iter()
                .chain(
                    master_extra
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| {
                            !(master_extra[*j] == "--lease-secs"
                                || *j > 0 && master_extra[*j - 1] == "--lease-secs")
                        })
                        .map(|(_, s)| s.to_string()),
                )
                .collect(),
                addr: a.clone(),
                child: None,
            })
            .collect();
        let chunkservers = (0..c)
            .map(|i| {
                // Port 0: the server picks a free port (no race with other tests).
                let a = "127.0.0.1:0".to_string();
                Proc {
                    name: format!("chunkserver-{}", i + 1),
                    args: vec![
                        "chunkserver".into(),
                        "--data-dir".into(),
                        dir.join(format!("cs-{}", i + 1)).display().to_string(),
                        "--listen".into(),
                        a.clone(),
                        "--masters".into(),
                        maddrs.join(","),
                        // Fast to create; the process and `up` tests cover zero-filling.
                        "--no-zero-fill".into(),
                        "--heartbeat-ms".into(),
                        "200".into(),
                        "--fault-injection".into(),
                    ]
                    .into_iter()
                    // 256 MiB each unless the caller gives a size (sparse: --no-zero-fill).
                    .chain(
                        (!extra.contains(&"--disk-size"))
                            .then(|| ["--disk-size".to_string(), "256m".to_string()])
                            .into_iter()
                            .flatten(),
                    )
                    .chain(extra.iter().map(|s| s.to_string()))
                    .collect(),
                    addr: a,
                    child: None,
                }
            })
            .collect();
        let tls = master_extra
            .iter()
            .position(|a| *a == "--tls-dir")
            .map(|i| PathBuf::from(master_extra[i + 1]));
        let mut cl = Self {
            dir: dir.to_path_buf(),
            masters,
            chunkservers,
            tls,
            data_tls: extra.contains(&"--data-tls"),
        };
        for p in cl.masters.iter_mut().chain(cl.chunkservers.iter_mut()) {
            p.start();
        }
        cl.wait_servers_up(c, Duration::from_secs(30)).await;
        cl
    }

    pub fn master_addrs(&self) -> Vec<String> {
        self.masters.iter().map(|p| p.addr.clone()).collect()
    }

    /// A client with every right (it signs with the cluster secret).
    pub async fn client(&self) -> Client {
        self.client_with(ClientOptions::default()).await
    }

    /// A client with `opts`; without a credential in them, it signs with the cluster secret.
    pub async fn client_with(&self, mut opts: ClientOptions) -> Client {
        if opts.credential.is_none() {
            opts.credential = Some(credential());
        }
        if opts.tls.is_none() {
            opts.tls = self.tls_config();
        }
        if opts.data_tls.is_none() {
            opts.data_tls = self.data_tls();
        }
        Client::with_options(&self.master_addrs(), opts)
            .await
            .unwrap()
    }

    /// A client of the masters with every right.
    pub fn masters(&self) -> cairn_rpc::Masters {
        masters(&self.master_addrs()).tls(self.tls_config())
    }

    /// What clients check the masters with, when they talk TLS.
    pub fn tls_config(&self) -> Option<cairn_rpc::tls::ClientTlsConfig> {
        self.tls
            .as_deref()
            .map(|d| cairn_rpc::tls::client_config(d).unwrap())
    }

    /// What clients dial the chunkservers with, when they serve TLS.
    pub fn data_tls(&self) -> Option<cairn_rpc::tls::data::TlsConnector> {
        let d = self.tls.as_deref().filter(|_| self.data_tls)?;
        Some(cairn_rpc::tls::data::connector(d).unwrap())
    }

    pub async fn status(&self) -> Result<cairn_rpc::pb::StatusReply, cairn_rpc::MetaError> {
        let m = self.masters().retry_for(Duration::from_secs(10));
        m.call(|mut c| async move { c.status(cairn_rpc::pb::Empty {}).await })
            .await
    }

    /// Waits until the leader sees `n` chunkservers up.
    pub async fn wait_servers_up(&self, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(s) = self.status().await
                && s.servers.iter().filter(|s| s.state == "up").count() >= n
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "chunkservers not up in {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A data-plane connection to chunkserver `i` (0-based) holding read capabilities for
    /// `chunks` (the masters sign them for the tests' server credential).
    pub async fn replica_conn(&self, i: usize, chunks: &[u64]) -> cairn_client::DataConn {
        let located = self
            .masters()
            .send(
                cairn_rpc::pb::LocateRequest {
                    chunk_ids: chunks.to_vec(),
                },
                |mut m, r| async move { m.locate(r).await },
            )
            .await
            .unwrap();
        let caps = std::sync::Arc::new(cairn_client::caps::Caps::default());
        for c in &located.chunks {
            caps.remember(&c.cap);
        }
        cairn_client::DataConn::connect_with(
            self.chunkservers[i].addr.parse().unwrap(),
            Duration::from_secs(10),
            Some(caps),
            self.data_tls().as_ref(),
        )
        .await
        .unwrap()
    }

    /// Injects faults into chunkserver `i` (0-based).
    pub async fn fault(&self, i: usize, spec: cairn_client::FaultSpec) {
        let c = cairn_client::DataConn::connect_with(
            self.chunkservers[i].addr.parse().unwrap(),
            Duration::from_secs(5),
            None,
            self.data_tls().as_ref(),
        )
        .await
        .unwrap();
        c.fault(&spec).await.unwrap();
    }

    /// Index in `chunkservers` of the server with the masters' id `id`.
    pub async fn index_of(&self, id: u64) -> usize {
        let s = self.status().await.unwrap();
        let addr = &s.servers.iter().find(|x| x.id == id).unwrap().addr;
        self.chunkservers
            .iter()
            .position(|p| &p.addr == addr)
            .unwrap()
    }

    /// The masters' id of chunkserver `i` (0-based).
    pub async fn server_id(&self, i: usize) -> u64 {
        let s = self.status().await.unwrap();
        s.servers
            .iter()
            .find(|x| x.addr == self.chunkservers[i].addr)
            .map(|x| x.id)
            .expect("registered")
    }

    /// Waits until the leader counts no chunk short of copies and no repair running.
    pub async fn wait_fully_replicated(&self, within: Duration) -> cairn_rpc::pb::StatusReply {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(s) = self.status().await
                && s.under_replicated == 0
                && s.repairs_running == 0
                && s.lost_chunks == 0
                && s.missing_replicas == 0
            {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "not fully replicated within {within:?}: {:?}",
                self.status().await.map(|s| (
                    s.under_replicated,
                    s.repairs_running,
                    s.repairs_failed,
                    s.lost_chunks,
                    s.missing_replicas
                ))
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The id of the current leader (1-based index into `masters`).
    pub async fn leader(&self) -> u64 {
        self.status().await.unwrap().leader_id
    }
}

/// The chunk list of a file, from the masters.
pub async fn chunks(c: &Client, path: &str) -> Vec<cairn_rpc::pb::ChunkMeta> {
    let req = cairn_rpc::pb::PathRequest { path: path.into() };
    c.masters()
        .send(req, |mut m, r| async move { m.stat(r).await })
        .await
        .unwrap()
        .file
        .unwrap()
        .chunks
}

/// Deterministic bytes: file `seed`, position `pos`.
pub fn byte(seed: u64, pos: u64) -> u8 {
    (pos.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xD6E8_FEB8_6659_FD93))
        .to_le_bytes()[5]
}

pub fn bytes(seed: u64, from: u64, len: usize) -> Vec<u8> {
    (from..from + len as u64).map(|p| byte(seed, p)).collect()
}

/// The audit records (JSON lines) in the `*.jsonl` files under `dir`, once `want` holds of
/// them (they are written within milliseconds, by a thread of their own); fails after 10 s.
pub fn audit_until(
    dir: &Path,
    what: &str,
    want: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut lines = Vec::new();
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "jsonl") {
                for l in std::fs::read_to_string(&p).unwrap().lines() {
                    lines.push(serde_json::from_str(l).expect("an audit line is JSON"));
                }
            }
        }
        if want(&lines) {
            return lines;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no audit record {what} in {}: {lines:#?}",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether some record has every `(field, value)` of `fields`.
pub fn has(lines: &[serde_json::Value], fields: &[(&str, serde_json::Value)]) -> bool {
    lines
        .iter()
        .any(|l| fields.iter().all(|(k, v)| &l[*k] == v))
}
