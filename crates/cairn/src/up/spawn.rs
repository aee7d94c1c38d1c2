//! Starting `cairn up`'s processes: free ports for them, and the spawn that ties each to
//! the supervisor.

use super::Managed;
use std::path::Path;
use std::process::{Child, Command, Stdio};

fn free_port() -> anyhow::Result<String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.to_string())
}

/// Free ports for the processes of one `cairn up`, none handed out twice and none that the
/// cluster file already gives a process: a port is free only until someone binds it, so two
/// picks (or a pick and a process that has not started yet) could otherwise meet — a
/// chunkserver once got another's data port as its metrics port and could not start.
pub(super) struct Ports(std::cell::RefCell<std::collections::HashSet<String>>);

impl Ports {
    pub(super) fn new(taken: impl IntoIterator<Item = String>) -> Self {
        Self(std::cell::RefCell::new(taken.into_iter().collect()))
    }

    pub(super) fn pick(&self) -> anyhow::Result<String> {
        for _ in 0..100 {
            let p = free_port()?;
            if self.0.borrow_mut().insert(p.clone()) {
                return Ok(p);
            }
        }
        anyhow::bail!("no free port that no process of this cluster has")
    }
}

pub(super) fn spawn(exe: &Path, m: &Managed, logs: &Path) -> anyhow::Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(logs.join(format!("{}.log", m.name)))?;
    let mut cmd = Command::new(exe);
    cmd.args(&m.args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // The cluster goes with its supervisor: a `cairn up` killed outright (SIGKILL, the OOM
    // killer) leaves no server behind holding its ports and store locks. The signal is the
    // one Ctrl-C's stop sends (servers shut down cleanly on it); it follows the thread that
    // spawned the child, and this is `cairn up`'s main thread, which ends with the process.
    let parent = std::process::id();
    // SAFETY: between fork and exec only async-signal-safe calls (prctl, getppid, _exit).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The supervisor died before the line above took effect.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    Ok(cmd.spawn()?)
}
