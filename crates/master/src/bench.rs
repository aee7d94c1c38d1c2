//! What S3 object records cost a master's state machine alone (`cairn bench master-state`):
//! PutObject commands applied as Raft applies them — batches of [`BATCH`] in one transaction
//! committed without fsync, a snapshot (a durable commit) every [`SNAPSHOT_EVERY`] — with
//! the process's RSS and the data directory's bytes measured as they grow; and the floor of
//! the same run: the same rows' bytes (key and encoded record) inserted into one redb table
//! in the same transactions, which any store of these records must at least do.
//!
//! No Raft log, network or gateway: those are measured by `scripts/bench-meta-objects.py`
//! against a running cluster.

use crate::kv::codec::{Key, encode_record};
use crate::state::Command;
use crate::store::{StateMachine, TypeConfig, commit_batch, end_batch, open_db_with};
use cairn_rpc::object::{Extent, ObjectMeta, ObjectOp};
use openraft::storage::RaftSnapshotBuilder;
use redb::{Durability, TableDefinition};
use std::io;
use std::path::Path;
use std::time::Instant;

/// Commands per applied batch (what a loaded leader's batches hold, roughly).
pub const BATCH: u64 = 32;
/// Entries between snapshots (`cairn master --snapshot-every`'s default).
pub const SNAPSHOT_EVERY: u64 = 10_000;

const PACK: &str = "/.s3/packs/127.0.0.1:7000-000000000001";

/// What the state machine had applied at one step.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Step {
    pub objects: u64,
    pub seconds: f64,
    /// CPU seconds (user + system) of this process since the start.
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    /// Allocated bytes of the data directory (database, snapshots).
    pub data_bytes: u64,
    /// Estimated bytes of the tables' record caches.
    pub cached_bytes: u64,
}

/// The `i`th object's record: what a gateway's 1-byte PUT from boto3 records.
fn meta(i: u64) -> ObjectMeta {
    ObjectMeta {
        size: 1,
        etag: format!("{:032x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        mtime_ms: 1_764_000_000_000 + i,
        put_id: format!("{:024x}", i.wrapping_mul(0xc2b2_ae3d_27d4_eb4f) >> 16),
        headers: [("content-type".into(), "binary/octet-stream".into())].into(),
        checksums: [("CRC32".into(), "AAAAAA==".into())].into(),
        checksum_type: Some("FULL_OBJECT".into()),
        extents: vec![Extent {
            path: PACK.into(),
            offset: i,
            len: 1,
            shared: true,
        }],
        ..Default::default()
    }
}

fn key(i: u64) -> String {
    format!("obj-{i:09}")
}

/// Applies `n` PutObjects to a new state machine in `dir` (`cache` bytes of record cache per
/// table, `store_cache` bytes of redb pages), calling `step` ten times along the way and at
/// the end.
pub async fn objects(
    dir: &Path,
    n: u64,
    cache: usize,
    store_cache: usize,
    mut step: impl FnMut(&Step),
) -> io::Result<Step> {
    let db = open_db_with(&dir.join("master.redb"), store_cache)?;
    let mut sm = StateMachine::open(db, dir, cache)?;
    let mut index = 0;
    let apply = |sm: &StateMachine, index: &mut u64, c: Command| -> io::Result<()> {
        apply_entry(sm, index, &c).map(drop)
    };
    apply(
        &sm,
        &mut index,
        Command::Create {
            path: PACK.into(),
            mode: None,
            policy: crate::state::Policy {
                replicas: 3,
                compression: false,
                min_copy: 0,
                ec: None,
            },
            parents: true,
            now_ms: 1,
            lease: None,
            placements: vec![vec![1, 2, 3]],
            groups: false,
        },
    )?;
    apply(
        &sm,
        &mut index,
        Command::Object(Box::new(ObjectOp::CreateBucket {
            user: "bench".into(),
            bucket: "bench".into(),
            now_ms: 1,
        })),
    )?;
    commit_batch(&sm.store, &mut sm.inner.lock(), Durability::Immediate)?;
    let t0 = Instant::now();
    let cpu0 = cpu_seconds();
    let every = (n / 10).max(1);
    let mut last = None;
    for i in 0..n {
        apply(
            &sm,
            &mut index,
            Command::Object(Box::new(ObjectOp::PutObject {
                user: "bench".into(),
                bucket: "bench".into(),
                key: key(i),
                meta: meta(i),
                condition: None,
            })),
        )?;
        let measure = (i + 1) % every == 0 || i + 1 == n;
        if measure {
            // Durable, so the directory holds everything measured (ten more fsyncs).
            commit_batch(&sm.store, &mut sm.inner.lock(), Durability::Immediate)?;
        } else if i % BATCH == BATCH - 1 {
            commit_batch(&sm.store, &mut sm.inner.lock(), Durability::None)?;
        }
        if index % SNAPSHOT_EVERY == 0 {
            sm.build_snapshot().await?;
        }
        if measure {
            let cached = sm
                .inner
                .lock()
                .state
                .table_reports()
                .iter()
                .map(|t| t.cached_bytes)
                .sum();
            let s = Step {
                objects: i + 1,
                seconds: t0.elapsed().as_secs_f64(),
                cpu_seconds: cpu_seconds() - cpu0,
                rss_bytes: rss_bytes(),
                data_bytes: du(dir),
                cached_bytes: cached,
            };
            step(&s);
            last = Some(s);
        }
    }
    last.ok_or_else(|| io::Error::other("no objects"))
}

/// Applies `c` as the log entry after `index` (which it advances), as the state machine's
/// `apply` does, leaving it uncommitted.
fn apply_entry(sm: &StateMachine, index: &mut u64, c: &Command) -> io::Result<crate::state::Reply> {
    let mut a = sm.inner.lock();
    let r = a
        .state
        .apply(c)
        .map_err(|e| io::Error::other(format!("{e:?}")))?;
    *index += 1;
    a.last_applied = Some(openraft::testing::log_id::<TypeConfig>(1, 1, *index));
    a.uncommitted += 1;
    Ok(r)
}

/// What the `i`th file of [`files`]'s tree is named: 20 files a directory, 20 directories
/// a level, three levels (a source tree's shape: `/t/a0/b3/c17/f05-…`).
fn file_path(i: u64) -> (String, String) {
    let dir = format!("/t/a{}/b{}/c{}", i / 8000, (i / 400) % 20, (i / 20) % 20);
    let name = format!(
        "f{:02}-{:016x}.c",
        i % 20,
        i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    );
    let path = format!("{dir}/{name}");
    (dir, path)
}

/// What one phase of [`files`] cost: `ops` commands in `seconds` (and CPU seconds) from the
/// phase's start.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileStep {
    pub phase: &'static str,
    pub files: u64,
    pub ops: u64,
    pub seconds: f64,
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    pub data_bytes: u64,
}

/// What an untar then a `rm -rf` of `n` small files cost the state machine alone, as a
/// mount makes them: per file a `Make` and a `Write` of one extent carrying its
/// `chmod`/`utimens` (`then`); directories made as the tree reaches them; then each file
/// removed, in the order made. `batch` commands applied at a time (1: a serial workload's,
/// one Raft write at a time), committed once `commit_every` wait
/// ([`crate::store::COMMIT_EVERY`] in a master), a snapshot every [`SNAPSHOT_EVERY`];
/// `step` is called ten times a phase.
#[allow(clippy::too_many_arguments)]
pub async fn files(
    dir: &Path,
    n: u64,
    cache: usize,
    store_cache: usize,
    batch: u64,
    commit_every: u64,
    mut step: impl FnMut(&FileStep),
) -> io::Result<()> {
    use cairn_rpc::files::{Extent as FileExtent, FileOp, NewNode, SetAttr, Time};
    let db = open_db_with(&dir.join("master.redb"), store_cache)?;
    let mut sm = StateMachine::open(db, dir, cache)?;
    let batch = batch.max(1);
    let mut index = 0u64;
    let mut pending = 0u64;
    let now = Time::from_ms(1_764_000_000_000);
    let mut apply = async |sm: &mut StateMachine, op: FileOp| -> io::Result<Option<u64>> {
        let reply = apply_entry(sm, &mut index, &Command::Files(Box::new(op)))?;
        pending += 1;
        if pending == batch {
            end_batch(&sm.store, &mut sm.inner.lock(), commit_every)?;
            pending = 0;
        }
        if index.is_multiple_of(SNAPSHOT_EVERY) {
            sm.build_snapshot().await?;
        }
        Ok(match reply.file {
            Some(cairn_rpc::files::FileReply::Attr(a)) => Some(a.ino),
            _ => None,
        })
    };
    let mkdir = |path: String| FileOp::Make {
        path,
        node: NewNode::Directory,
        mode: 0o755,
        uid: 0,
        gid: 0,
        now,
        hold: String::new(),
        mount: String::new(),
        ino: 0,
        reserve: 0,
    };
    let mut made = std::collections::HashSet::new();
    let mut inos = Vec::with_capacity(n as usize);
    apply(&mut sm, mkdir("/t".into())).await?;
    let every = (n / 10).max(1);
    let (mut t0, mut cpu0, mut ops) = (Instant::now(), cpu_seconds(), 0u64);
    let mut report = |phase, files, ops, t0: Instant, cpu0: f64| {
        step(&FileStep {
            phase,
            files,
            ops,
            seconds: t0.elapsed().as_secs_f64(),
            cpu_seconds: cpu_seconds() - cpu0,
            rss_bytes: rss_bytes(),
            data_bytes: du(dir),
        })
    };
    for i in 0..n {
        let (d, path) = file_path(i);
        let mut at = String::new();
        for part in d.split('/').skip(2) {
            at = format!("{at}/{part}");
            let full = format!("/t{at}");
            if made.insert(full.clone()) {
                apply(&mut sm, mkdir(full)).await?;
                ops += 1;
            }
        }
        let ino = apply(
            &mut sm,
            FileOp::Make {
                path: path.clone(),
                node: NewNode::Regular,
                mode: 0o600,
                uid: 0,
                gid: 0,
                now,
                hold: String::new(),
                mount: String::new(),
                ino: 0,
                reserve: 0,
            },
        )
        .await?
        .ok_or_else(|| io::Error::other("a make answered no attributes"))?;
        apply(
            &mut sm,
            FileOp::Write {
                path,
                ino,
                extents: vec![FileExtent {
                    offset: 0,
                    len: 4096,
                    seg: 1 + i / 1000,
                    seg_offset: (i % 1000) * 4096,
                }],
                size: 4096,
                then: Some(SetAttr {
                    mode: Some(0o644),
                    mtime: Some(now),
                    atime: Some(now),
                    ..SetAttr::default()
                }),
                now,
            },
        )
        .await?;
        inos.push(ino);
        ops += 2;
        if (i + 1) % every == 0 || i + 1 == n {
            report("create", i + 1, ops, t0, cpu0);
        }
    }
    commit_batch(&sm.store, &mut sm.inner.lock(), Durability::Immediate)?;
    (t0, cpu0, ops) = (Instant::now(), cpu_seconds(), 0);
    for (i, ino) in inos.iter().enumerate() {
        let i = i as u64;
        apply(
            &mut sm,
            FileOp::Remove {
                path: file_path(i).1,
                ino: *ino,
                dir: false,
                now,
                mount: String::new(),
            },
        )
        .await?;
        ops += 1;
        if (i + 1).is_multiple_of(every) || i + 1 == n {
            report("remove", i + 1, ops, t0, cpu0);
        }
    }
    commit_batch(&sm.store, &mut sm.inner.lock(), Durability::Immediate)?;
    Ok(())
}

/// The floor: the same keys and encoded records inserted into one redb table of a new
/// database in `dir`, in the same transactions (a durable commit every [`SNAPSHOT_EVERY`]
/// and at the end).
/// Returns (seconds, CPU seconds, allocated bytes of `dir`).
pub fn objects_floor(dir: &Path, n: u64, store_cache: usize) -> io::Result<(f64, f64, u64)> {
    let db = open_db_with(&dir.join("floor.redb"), store_cache)?;
    let table: TableDefinition<&[u8], &[u8]> = TableDefinition::new("objects");
    let t0 = Instant::now();
    let cpu0 = cpu_seconds();
    let io = |e: redb::Error| io::Error::other(e);
    let mut i = 0;
    while i < n {
        let mut tx = db.begin_write().map_err(|e| io(e.into()))?;
        let end = (i + BATCH).min(n);
        let durable = i / SNAPSHOT_EVERY != end / SNAPSHOT_EVERY || end == n;
        tx.set_durability(if durable {
            Durability::Immediate
        } else {
            Durability::None
        })
        .map_err(|e| io(e.into()))?;
        {
            let mut t = tx.open_table(table).map_err(|e| io(e.into()))?;
            for j in i..end {
                let k = ("bench".to_owned(), key(j)).to_bytes();
                let v = encode_record(1, &meta(j));
                t.insert(k.as_slice(), v.as_slice())
                    .map_err(|e| io(e.into()))?;
            }
        }
        tx.commit().map_err(|e| io(e.into()))?;
        i = end;
    }
    Ok((t0.elapsed().as_secs_f64(), cpu_seconds() - cpu0, du(dir)))
}

/// This process's resident memory.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

/// User + system CPU seconds of this process.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) as f64 / hz
}

/// Allocated bytes of the files under `dir`.
fn du(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut n = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in entries.flatten() {
        let Ok(m) = e.metadata() else { continue };
        n += if m.is_dir() {
            du(&e.path())
        } else {
            m.blocks() * 512
        };
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bench applies what it says: every object is there afterwards, and the floor
    /// writes as many rows.
    #[tokio::test]
    async fn the_bench_stores_every_object() {
        let dir = tempfile::tempdir().unwrap();
        let mut steps = 0;
        let last = objects(dir.path(), 500, 1 << 20, 1 << 20, |_| steps += 1)
            .await
            .unwrap();
        assert_eq!((last.objects, steps), (500, 10));
        let db = crate::store::open_db(&dir.path().join("master.redb")).unwrap();
        let sm = StateMachine::open(db, dir.path(), 1 << 20).unwrap();
        let a = sm.shared();
        let a = a.lock();
        assert_eq!(a.state.objects().totals(), (1, 500, 0));
        let pack = a.state.objects().packs().get(&PACK.to_owned()).unwrap();
        assert_eq!((pack.live_objects, pack.live_bytes), (500, 500));
        let floor = tempfile::tempdir().unwrap();
        let (_, _, bytes) = objects_floor(floor.path(), 500, 1 << 20).unwrap();
        assert!(bytes > 500 * 100, "{bytes}");
    }
}
