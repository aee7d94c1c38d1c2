//! `cairn fs append`: one append by one short-lived writer, taking its turn.
//!
//! Several `cairn fs append`s to one file at once (a shell loop in the background, cron jobs)
//! all succeed: each waits for the writer in front to release the file's lease, and a file
//! that two of them both find missing is created by one and opened by the other. Each writer
//! continues the file's last chunk when the writer before it closed cleanly
//! (`Client::open_append`), so a thousand one-line appends share a chunk instead of holding a
//! chunk (an extent on every replica) each.

use cairn_client::{Client, CreateOptions};
use cairn_rpc::ErrorKind;
use std::time::{Duration, Instant};

/// Appends `data` to `path` (created with `opts` if missing), waiting up to `wait` for another
/// writer of the file to finish; returns the file offset the bytes start at.
///
/// # Errors
/// The file is sealed or refused, another writer held it for all of `wait`, or the append
/// failed.
pub async fn append(
    c: &Client,
    path: &str,
    data: &[u8],
    opts: CreateOptions,
    wait: Duration,
) -> anyhow::Result<u64> {
    let began = Instant::now();
    let mut backoff = Duration::from_millis(20);
    loop {
        let opened = match c.open_append(path).await {
            Err(cairn_client::Error::Meta(e)) if e.kind == ErrorKind::NotFound => {
                c.create(path, opts.clone()).await
            }
            r => r,
        };
        let mut w = match opened {
            Ok(w) => w,
            // Another append holds the lease, or created the file between our two calls.
            Err(cairn_client::Error::Meta(e))
                if matches!(e.kind, ErrorKind::LeaseHeld | ErrorKind::AlreadyExists) =>
            {
                if began.elapsed() >= wait {
                    anyhow::bail!(
                        "{path}: another writer held the file for {} s ({e}); try again, or \
                         wait longer with --wait SECONDS",
                        wait.as_secs()
                    );
                }
                // Jittered, so that waiting appends do not all ask at the same instant.
                let jitter = Duration::from_millis(rand::random::<u64>() % 20);
                tokio::time::sleep(backoff + jitter).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let at = w.append(data).await?;
        w.close().await?;
        return Ok(at);
    }
}
