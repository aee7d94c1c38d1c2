//! Where the cluster is: `--cluster`, `CAIRN_CLUSTER`, or `./cairn-data/cluster.toml`; and
//! who the CLI is to it: `--credentials`, `CAIRN_CREDENTIALS`, `./cairn-data/admin.credentials`
//! (written by `cairn up`), or the cluster secret in `CAIRN_CLUSTER_SECRET_FILE` (an operator
//! on a server machine).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `DIR/cluster.toml`, written by `cairn up`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClusterFile {
    /// Master addresses, for clients.
    pub masters: Vec<String>,
    #[serde(default, rename = "master")]
    pub master_procs: Vec<Proc>,
    #[serde(default, rename = "chunkserver")]
    pub chunkserver_procs: Vec<Proc>,
    /// S3 gateways (`addr` is the HTTP endpoint's HOST:PORT).
    #[serde(default, rename = "s3")]
    pub s3_procs: Vec<Proc>,
    /// NBD servers (`addr` is what `nbd://ADDR/VOLUME` names).
    #[serde(default, rename = "nbd")]
    pub nbd_procs: Vec<Proc>,
    /// The cluster talks TLS (`cairn up --tls`); the certificates are in DIR/tls.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls: bool,
    /// The data plane too (`cairn up --data-tls`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub data_tls: bool,
}

/// One process `cairn up` runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Proc {
    pub id: u64,
    pub addr: String,
    /// 0 when not running.
    pub pid: u32,
    pub data_dir: PathBuf,
    /// Its Prometheus endpoint (`http://ADDR/metrics`); empty in files from before metrics.
    #[serde(default)]
    pub metrics: String,
}

impl ClusterFile {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join("cluster.toml")
    }

    pub fn load(dir: &Path) -> anyhow::Result<Option<Self>> {
        let p = Self::path(dir);
        match std::fs::read_to_string(&p) {
            Ok(s) => Ok(Some(
                toml::from_str(&s).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(anyhow::anyhow!("{}: {e}", p.display())),
        }
    }

    /// Written to a temporary file and renamed, so a reader never sees half of it.
    pub fn store(&self, dir: &Path) -> anyhow::Result<()> {
        let p = Self::path(dir);
        let tmp = dir.join("cluster.toml.tmp");
        let body = format!(
            "# Written by `cairn up`; clients read `masters`.\n{}",
            toml::to_string(self)?
        );
        std::fs::write(&tmp, body)?;
        std::fs::rename(&tmp, &p)?;
        Ok(())
    }
}

#[derive(clap::Args, Clone)]
pub struct ClusterArgs {
    /// Master addresses (`HOST:PORT,…`); default: env CAIRN_CLUSTER, then
    /// ./cairn-data/cluster.toml.
    #[arg(long, global = true)]
    pub cluster: Option<String>,
    /// A user's credentials file (`access_key = …`, `secret_key = …`, or an aws CLI
    /// credentials file); default: ./cairn-data/admin.credentials, written by `cairn up`.
    #[arg(long, global = true, env = "CAIRN_CREDENTIALS")]
    pub credentials: Option<PathBuf>,
    /// The cluster's TLS directory (its ca.pem checks the masters); default: env
    /// CAIRN_TLS_DIR, then ./cairn-data/tls when ./cairn-data/cluster.toml says TLS.
    #[arg(long, global = true)]
    pub tls_dir: Option<PathBuf>,
}

static TLS_DIR: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();

/// Where `cairn up` writes the admin user's credentials (an aws CLI credentials file that
/// the cairn CLI reads too).
pub const ADMIN_CREDENTIALS: &str = "admin.credentials";

static CREDENTIALS: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();

/// The credential this CLI process signs its calls with (see the module's doc).
///
/// # Errors
/// A credentials or secret file named but unreadable.
pub fn credential() -> anyhow::Result<Option<cairn_rpc::auth::Credential>> {
    use cairn_rpc::auth::{ClusterSecret, Credential};
    if let Some(Some(p)) = CREDENTIALS.get() {
        return Ok(Some(Credential::read(p)?));
    }
    if let Some(p) = std::env::var_os("CAIRN_CREDENTIALS") {
        return Ok(Some(Credential::read(Path::new(&p))?));
    }
    let local = Path::new("./cairn-data").join(ADMIN_CREDENTIALS);
    if local.exists() {
        return Ok(Some(Credential::read(&local)?));
    }
    if let Some(p) = std::env::var_os("CAIRN_CLUSTER_SECRET_FILE") {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        return Ok(Some(Credential::Server {
            secret: ClusterSecret::read(Path::new(&p))?,
            who: format!("cli@{}", host.trim()),
        }));
    }
    Ok(None)
}

/// The TLS directory the CLI checks masters with: `--tls-dir`, `CAIRN_TLS_DIR`, else `./cairn-data/tls`
/// when `./cairn-data/cluster.toml` says the cluster talks TLS; `None`: plain TCP.
pub fn tls_dir() -> Option<PathBuf> {
    if let Some(Some(d)) = TLS_DIR.get() {
        return Some(d.clone());
    }
    if let Some(d) = std::env::var_os("CAIRN_TLS_DIR") {
        return Some(PathBuf::from(d));
    }
    let local = Path::new("./cairn-data");
    match ClusterFile::load(local) {
        Ok(Some(f)) if f.tls => Some(local.join("tls")),
        _ => None,
    }
}

/// [`tls_dir`]'s client configuration.
///
/// # Errors
/// Its `ca.pem` is missing or unreadable.
pub fn tls() -> anyhow::Result<Option<cairn_rpc::tls::ClientTlsConfig>> {
    Ok(tls_dir()
        .as_deref()
        .map(cairn_rpc::tls::client_config)
        .transpose()?)
}

/// The TLS the CLI dials chunkservers with: when `CAIRN_DATA_TLS` is set (not `0`/`false`),
/// or `./cairn-data/cluster.toml` says the data plane talks TLS, a connector with
/// [`tls_dir`]'s CA; `None`: plain TCP.
///
/// # Errors
/// Data TLS asked for without a TLS directory, or its `ca.pem` unusable.
pub fn data_tls() -> anyhow::Result<Option<cairn_rpc::tls::data::TlsConnector>> {
    let wanted = match std::env::var("CAIRN_DATA_TLS") {
        Ok(v) => !matches!(v.trim(), "" | "0" | "false" | "no" | "off"),
        Err(_) => matches!(ClusterFile::load(Path::new("./cairn-data")), Ok(Some(f)) if f.data_tls),
    };
    if !wanted {
        return Ok(None);
    }
    let dir = tls_dir().ok_or_else(|| {
        anyhow::anyhow!("data-plane TLS needs a TLS directory: set CAIRN_TLS_DIR")
    })?;
    Ok(Some(cairn_rpc::tls::data::connector(&dir)?))
}

/// How a service process of the cluster (S3 gateway, NBD server) reaches it: it signs with its
/// service key (or, not recommended, as a server with the cluster secret), and may talk TLS to
/// the masters and the chunkservers.
#[derive(clap::Args, Clone)]
pub struct ServiceArgs {
    /// The service's own key (`cairn admin service-key s3|block --out FILE`; `cairn up` writes
    /// s3.key and nbd.key): the masters let it work in its namespace only
    /// (docs/security.md "Service credentials"). Used when given, else --cluster-secret-file;
    /// one of them unless --insecure.
    #[arg(long, env = "CAIRN_SERVICE_KEY_FILE")]
    service_key_file: Option<PathBuf>,
    /// The cluster secret instead of a service key: the service may then do anything a
    /// server may (not recommended).
    #[arg(long, env = "CAIRN_CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// For masters run --insecure.
    #[arg(long)]
    insecure: bool,
    /// A TLS directory (`cairn tls init`): talk TLS to the masters, checking them with its
    /// ca.pem.
    #[arg(long, env = "CAIRN_TLS_DIR")]
    tls_dir: Option<PathBuf>,
    /// Dial chunkservers over TLS (they run --data-tls), checking them with --tls-dir's
    /// ca.pem.
    #[arg(long, env = "CAIRN_DATA_TLS", requires = "tls_dir")]
    data_tls: bool,
}

impl ServiceArgs {
    /// The TLS directory the service talks to the masters with, if any.
    pub fn tls_dir(&self) -> Option<PathBuf> {
        self.tls_dir.clone()
    }

    /// The SDK options of this service, signing as `service` with its key (or as the server
    /// `who` with the cluster secret).
    ///
    /// # Errors
    /// The key, the secret or a TLS file is missing or unreadable; a key of another service.
    pub fn options(
        &self,
        service: cairn_rpc::auth::Service,
        who: String,
    ) -> anyhow::Result<cairn_client::ClientOptions> {
        let credential = match (&self.service_key_file, self.insecure) {
            (Some(p), false) => {
                let (of, key) = cairn_rpc::auth::ServiceKey::read(p)?;
                anyhow::ensure!(
                    of == service,
                    "{}: a key of the {of} service, not of the {service} service",
                    p.display()
                );
                Some(cairn_rpc::auth::Credential::Service { service, key })
            }
            _ => {
                let secret = crate::master::cluster_secret(
                    self.cluster_secret_file.as_deref(),
                    self.insecure,
                )
                .map_err(|e| {
                    anyhow::anyhow!("{e} (or --service-key-file, the {service} service's key)")
                })?;
                if secret.is_some() {
                    tracing::warn!(
                        "running with the cluster secret: this {service} service may do anything a server may; give it --service-key-file instead"
                    );
                }
                secret.map(|secret| cairn_rpc::auth::Credential::Server { secret, who })
            }
        };
        let tls_dir = self.tls_dir.as_deref();
        Ok(cairn_client::ClientOptions {
            credential,
            tls: tls_dir.map(cairn_rpc::tls::client_config).transpose()?,
            data_tls: match (tls_dir, self.data_tls) {
                (Some(d), true) => Some(cairn_rpc::tls::data::connector(d)?),
                _ => None,
            },
            ..cairn_client::ClientOptions::default()
        })
    }
}

/// A client of the masters that signs with [`credential`].
///
/// # Errors
/// As [`credential`]; a bad master address.
pub fn masters_client(masters: &[String]) -> anyhow::Result<cairn_rpc::Masters> {
    Ok(cairn_rpc::Masters::new(masters)?
        .credential(credential()?)
        .tls(tls()?)
        .unreachable_for(Some(UNREACHABLE_FOR)))
}

/// How long a command waits for masters that do not answer at all before it says so (an
/// election, when some master answers, is waited out for the SDK's `retry_for`).
pub const UNREACHABLE_FOR: std::time::Duration = std::time::Duration::from_secs(4);

/// The SDK's options with [`credential`].
///
/// # Errors
/// As [`credential`].
pub fn client_options() -> anyhow::Result<cairn_client::ClientOptions> {
    Ok(cairn_client::ClientOptions {
        credential: credential()?,
        tls: tls()?,
        data_tls: data_tls()?,
        unreachable_for: Some(UNREACHABLE_FOR),
        ..cairn_client::ClientOptions::default()
    })
}

/// An SDK client that signs with [`credential`].
///
/// # Errors
/// As [`credential`]; a bad master address.
pub async fn client(masters: &[String]) -> anyhow::Result<cairn_client::Client> {
    Ok(cairn_client::Client::with_options(masters, client_options()?).await?)
}

impl ClusterArgs {
    pub fn masters(&self) -> anyhow::Result<Vec<String>> {
        let _ = CREDENTIALS.set(self.credentials.clone());
        let _ = TLS_DIR.set(self.tls_dir.clone());
        let from_list = |s: &str| -> Vec<String> {
            s.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        };
        if let Some(c) = &self.cluster {
            return Ok(from_list(c));
        }
        if let Ok(c) = std::env::var("CAIRN_CLUSTER") {
            return Ok(from_list(&c));
        }
        match ClusterFile::load(Path::new("./cairn-data"))? {
            Some(f) if !f.masters.is_empty() => Ok(f.masters),
            _ => anyhow::bail!(
                "no cluster address: pass --cluster HOST:PORT, set CAIRN_CLUSTER, or run `cairn up` here"
            ),
        }
    }
}
