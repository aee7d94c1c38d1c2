//! Space: `fs du` (bytes under a path), `fs df` (the chunkservers' capacity) and the check
//! that refuses, before anything is written, what would not fit.

use super::{child, human};
use cairn_client::Client;
use cairn_rpc::pb;

/// Bytes, files and directories under `path`.
pub(super) async fn du(c: &Client, path: &str) -> anyhow::Result<(u64, u64, u64)> {
    let st = c.stat(path).await?;
    if !st.is_dir {
        return Ok((st.length, 1, 0));
    }
    let (mut bytes, mut files, mut dirs) = (0, 0, 1);
    let mut todo = vec![path.to_owned()];
    while let Some(d) = todo.pop() {
        for e in c.list(&d).await? {
            if e.is_dir {
                dirs += 1;
                todo.push(child(&d, &e.name));
            } else {
                bytes += e.length;
                files += 1;
            }
        }
    }
    Ok((bytes, files, dirs))
}

/// `fs df`: the chunkservers' capacity as `df` shows a file system's.
pub(super) async fn df(
    masters: &cairn_rpc::Masters,
    exact: bool,
    json: bool,
) -> anyhow::Result<()> {
    let s = masters
        .send(pb::Empty {}, |mut c, r| async move { c.status(r).await })
        .await?;
    let up: Vec<_> = s.servers.iter().filter(|c| c.state == "up").collect();
    let capacity: u64 = up.iter().map(|c| c.capacity_bytes).sum();
    let used: u64 = up.iter().map(|c| c.used_bytes).sum();
    let free = capacity.saturating_sub(used);
    let pct = if capacity == 0 {
        0
    } else {
        (used * 100).div_ceil(capacity)
    };
    if json {
        println!(
            "{}",
            serde_json::json!({
                "capacity_bytes": capacity, "used_bytes": used, "free_bytes": free,
                "used_percent": pct, "chunkservers_up": up.len(),
                "logical_bytes": s.logical_bytes, "pending_deletes": s.pending_deletes,
            })
        );
    } else {
        println!(
            "{:>10} {:>10} {:>10} {:>5}  chunkservers up",
            "capacity", "used", "free", "use%"
        );
        println!(
            "{:>10} {:>10} {:>10} {:>4}%  {}",
            size(capacity, exact),
            size(used, exact),
            size(free, exact),
            pct,
            up.len()
        );
        println!(
            "files hold {} (logical); {} chunks pending delete",
            size(s.logical_bytes, exact),
            s.pending_deletes
        );
    }
    Ok(())
}

/// Bytes as `du`/`df` print them: exact, or in the largest unit.
pub(super) fn size(b: u64, exact: bool) -> String {
    if exact { b.to_string() } else { human(b) }
}

/// Refuses, before anything is written, `user_bytes` that would not fit: their stored size
/// under `policy` (full stripes, every copy) against the free space of the chunkservers up,
/// less each one's reserve (the masters' rule: min(64 MiB, capacity / 16)).
pub(crate) async fn check_fits(
    masters: &cairn_rpc::Masters,
    user_bytes: u64,
    policy: &cairn_client::Policy,
) -> anyhow::Result<()> {
    let s = masters
        .send(pb::Empty {}, |mut c, r| async move { c.status(r).await })
        .await?;
    let free: u64 = s
        .servers
        .iter()
        .filter(|c| c.state == "up")
        .map(|c| {
            let reserve = (64u64 << 20).min(c.capacity_bytes / 16);
            c.capacity_bytes.saturating_sub(c.used_bytes + reserve)
        })
        .sum();
    let stored = (user_bytes as f64 * policy.write.overhead()).ceil() as u64;
    anyhow::ensure!(
        stored <= free,
        "would not fit: {} at {policy} is {} stored, and the chunkservers up have {} free \
         (past their reserves); delete data, add chunkservers or use a leaner policy",
        human(user_bytes),
        human(stored),
        human(free)
    );
    Ok(())
}
