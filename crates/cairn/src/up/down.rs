//! `cairn down`: stops the cluster a `cairn up` runs on a data directory.

use super::lock;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// ` --data-dir DIR` unless `dir` is the default.
pub(super) fn down_flag(dir: &Path) -> String {
    if dir == Path::new("./cairn-data") {
        String::new()
    } else {
        format!(" --data-dir {}", dir.display())
    }
}

#[derive(clap::Args)]
pub struct DownArgs {
    /// The data directory of the cluster to stop.
    #[arg(long, default_value = "./cairn-data")]
    data_dir: PathBuf,
    /// How long to wait for it to stop, in seconds.
    #[arg(long, default_value_t = 60)]
    wait: u64,
}

/// `cairn down`: asks the supervisor running on the directory to stop (SIGTERM, as Ctrl-C)
/// and waits until it has (its lock is free).
pub fn down(a: DownArgs) -> anyhow::Result<()> {
    let Some(pid) = lock::running(&a.data_dir)? else {
        anyhow::bail!(
            "{}: no cluster is running on this data directory",
            a.data_dir.display()
        );
    };
    anyhow::ensure!(
        pid > 1,
        "{}: the running supervisor's pid is unreadable",
        a.data_dir.display()
    );
    // SAFETY: kill(2) with a pid read from the lock file of a supervisor that holds it.
    if unsafe { libc::kill(pid as i32, libc::SIGTERM) } != 0 {
        anyhow::bail!(
            "cannot signal cairn up (pid {pid}): {}",
            std::io::Error::last_os_error()
        );
    }
    eprintln!("cairn down: stopping the cluster (cairn up, pid {pid})");
    let deadline = Instant::now() + Duration::from_secs(a.wait);
    while lock::running(&a.data_dir)?.is_some() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "cairn up (pid {pid}) has not stopped after {} s",
            a.wait
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("cairn down: stopped");
    Ok(())
}
