//! The mount's calls to the masters: reads (`FileQuery`) and changes (`FileOp`), each after
//! the makes behind early creates it names (early.rs), and retried while another mount holds
//! what it asks for (docs/files.md "A close that does not wait", "A create that does not
//! wait").

use crate::shared::{Shared, errno};
use cairn_rpc::files::{FileOp, FileQuery, FileReply};
use cairn_rpc::{ErrorKind, MetaError};
use fuser::Errno;
use std::time::{Duration, Instant};

/// How long a call another mount's hold refuses is retried (the holder renews the hold while
/// its commit runs; past this the call fails).
const HELD_WAIT_MAX: Duration = Duration::from_secs(120);

/// `call` asked again (1 → 50 ms apart) while it answers `lease-held`, for up to
/// [`HELD_WAIT_MAX`].
async fn while_held<F, Fut>(call: F) -> Result<FileReply, MetaError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<FileReply, MetaError>>,
{
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match call().await {
            Err(e) if e.kind == ErrorKind::LeaseHeld && started.elapsed() < HELD_WAIT_MAX => {
                tracing::debug!(error = %e, "waiting for another mount's hold");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) if e.kind == ErrorKind::LeaseHeld => {
                tracing::warn!(error = %e, "another mount's hold did not end");
                return Err(e);
            }
            r => return r,
        }
    }
}

impl Shared {
    /// A read of the masters, after the makes behind early creates at its path.
    pub(crate) async fn query(&self, q: &FileQuery) -> Result<FileReply, Errno> {
        match q {
            FileQuery::Lookup { path, .. }
            | FileQuery::Readdir { path, .. }
            | FileQuery::Map { path, .. }
            | FileQuery::Xattrs { path, .. } => {
                // What failed is the masters' to tell (not found).
                let _ = self.made_under(&[path]).await;
            }
            FileQuery::Statfs => {}
        }
        while_held(|| self.client.masters().file_query(q))
            .await
            .map_err(|e| errno(&e))
    }

    /// `Lookup` of `path`, asked as this mount.
    pub(crate) fn lookup_query(&self, path: String) -> FileQuery {
        FileQuery::Lookup {
            path,
            mount: self.mount_id.clone(),
        }
    }

    /// `Map` of `path` (inode `ino`), asked as this mount.
    pub(crate) fn map_query(&self, path: String, ino: u64) -> FileQuery {
        FileQuery::Map {
            path,
            ino,
            mount: self.mount_id.clone(),
        }
    }

    /// A change at the masters, after the makes behind early creates it names.
    pub(crate) async fn op(&self, op: &FileOp) -> Result<FileReply, Errno> {
        // What failed is the masters' to tell (not found).
        let _ = self.made_under(&crate::early::op_paths(op)).await;
        // A change that may touch files whose attributes are kept here (known.rs) other
        // than by their own commit: nothing kept holds from before it to after it.
        let touches = !matches!(
            op,
            FileOp::Make { .. } | FileOp::Hold { .. } | FileOp::Write { .. }
        );
        if touches {
            self.known.lock().changing();
        }
        let r = while_held(|| self.client.masters().file_op(op)).await;
        if touches {
            self.known.lock().changing();
        } else if let FileOp::Write { ino, .. } = op {
            // Its caller keeps what the commit answered, if it may.
            self.known.lock().drop_ino(*ino);
        }
        r.map_err(|e| {
            let n = errno(&e);
            if n == Errno::EIO {
                // No errno says what went wrong: the log does.
                tracing::warn!(op = op.name(), path = op.path(), error = %e,
                        "a change failed (EIO)");
            }
            n
        })
    }
}
