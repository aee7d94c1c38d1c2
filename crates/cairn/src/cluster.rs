//! Where the cluster is: `--cluster`, `CAIRN_CLUSTER`, or `./cairn-data/cluster.toml`.

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
}

impl ClusterArgs {
    pub fn masters(&self) -> anyhow::Result<Vec<String>> {
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
