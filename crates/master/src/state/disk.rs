//! The state in the master's store (docs/formats/master-state.md): which table or cell each
//! part of [`State`] is, opening them, writing a batch's changes, and writing a whole state
//! (read from a JSON snapshot) out.

use super::objects::ObjectIndex;
use super::{ChunkId, Inode, InodeId, State};
use crate::kv::{Cell, Record, Store, Sum, Table, TableDef};
use redb::WriteTransaction;
use serde::Deserializer;
use std::sync::Arc;

mod old;
pub use old::{inode_from_old, txns_from_old};

/// Inodes by id (docs/formats/master-state.md). Version 2 added `posix` (the file service's
/// attributes, docs/files.md), version 3 `posix.xattrs`, version 4 `posix.link` and
/// `posix.links` (hard links); older records are read as having none.
pub const INODES: TableDef = TableDef::new("inodes", 5).upgraded_by(inode_from_old);
/// (parent, name) → child.
pub const DENTRIES: TableDef = TableDef::new("dentries", 1);
/// chunk → the file that owns it.
pub const CHUNK_OWNER: TableDef = TableDef::new("chunk_owner", 1);
/// chunk → the partition its file moved to.
pub const FORWARDS: TableDef = TableDef::new("forwards", 1);

pub(super) fn inodes_from_rows<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Table<InodeId, Inode>, D::Error> {
    Ok(crate::kv::rows(INODES, d)?
        .summed(inode_sum)
        .tallied(inode_segments))
}

/// What an inode adds to the totals `cairn status` shows: files, directories, chunks, bytes.
pub(super) fn inode_sum(i: &Inode) -> Sum {
    match i.file() {
        Some(f) => [1, 0, f.chunks.len() as u64, f.committed_length()],
        None => [0, 1, 0, 0],
    }
}

/// What an inode adds to the inode table's tallies: each extent's bytes, and one extent, at
/// its segment (segment 0, a file's own log, is not a segment); and at key
/// [`LINKS_TALLY`], one for a node tied to another by hard links (a link entry, or a node
/// with links).
pub(super) fn inode_segments(i: &Inode, f: &mut dyn FnMut(u64, crate::kv::Tally)) {
    if let Some(p) = &i.posix {
        for e in p.extents.iter().flatten() {
            if e.seg != 0 {
                f(e.seg, [e.len, 1]);
            }
        }
        if p.link != 0 || !p.links.is_empty() {
            f(LINKS_TALLY, [1, 0]);
        }
    }
}

/// The inode table's tally of nodes tied by hard links (no segment is 0): while it is 0, no
/// subtree of the partition holds one, so moves need not look (files/links.rs).
pub(super) const LINKS_TALLY: u64 = 0;

pub(super) fn dentries_table() -> Table<(InodeId, String), InodeId> {
    Table::memory(DENTRIES)
}

pub(super) fn chunk_owner_table() -> Table<ChunkId, InodeId> {
    Table::memory(CHUNK_OWNER)
}

pub(super) fn forwards_table() -> Table<ChunkId, super::partitions::PartitionId> {
    Table::memory(FORWARDS)
}

/// The cells (one record each, key `()`), by table name.
pub(super) const fn cell(name: &'static str) -> TableDef {
    TableDef::new(name, 1)
}
const NEXT_INODE: TableDef = cell("next_inode");
const NEXT_CHUNK: TableDef = cell("next_chunk");
const SERVERS: TableDef = cell("servers");
const CONFIG: TableDef = cell("config");
const DIR_POLICIES: TableDef = cell("dir_policies");
const CONVERSIONS: TableDef = cell("conversions");
const CAP_KEYS: TableDef = cell("cap_keys");
const REVOCATIONS: TableDef = cell("revocations");
const PARTITIONS: TableDef = cell("partitions");
const SUBTREES: TableDef = cell("subtrees");
const HASHED: TableDef = cell("hashed");
const MOVE_SHARDS: TableDef = cell("move_shards");
const HOME: TableDef = cell("home");
const MOVING: TableDef = cell("moving");
const LOAD_SEALED: TableDef = cell("load_sealed");
/// The inode a decision carries is an inode of `INODES`' version: 5 since directory holds.
pub(super) const TXNS: TableDef = TableDef::new("txns", 5).upgraded_by(txns_from_old);
const LOCKS: TableDef = cell("locks");

/// Every table of the state, cells included (what a snapshot file holds; `counts` is
/// rebuilt when one is installed).
pub static TABLES: &[TableDef] = {
    use super::objects::stored as o;
    &[
        INODES,
        DENTRIES,
        CHUNK_OWNER,
        FORWARDS,
        NEXT_INODE,
        NEXT_CHUNK,
        SERVERS,
        CONFIG,
        DIR_POLICIES,
        CONVERSIONS,
        CAP_KEYS,
        REVOCATIONS,
        PARTITIONS,
        SUBTREES,
        HASHED,
        MOVE_SHARDS,
        HOME,
        MOVING,
        LOAD_SEALED,
        TXNS,
        LOCKS,
        super::segments::CONDEMNED,
        super::segments::ARRIVALS,
        o::OBJECTS,
        o::UPLOADS,
        o::PARTS,
        o::PACKS,
        o::TRASH,
        o::USERS,
        o::BUCKETS,
        o::GATEWAYS,
        o::VOLUMES,
        o::PLACEMENTS,
        crate::kv::SUMS,
        crate::kv::TALLIES,
        crate::kv::VERSIONS,
    ]
};

pub(super) fn open_cell<V: Record + Default>(
    def: TableDef,
    store: &Store,
) -> Result<Cell<V>, redb::Error> {
    Ok(Cell::open(def, store)?.unwrap_or_default())
}

impl State {
    /// Each table's rows and cache reads (for the metrics).
    pub fn table_reports(&self) -> Vec<crate::kv::TableReport> {
        let mut v = vec![
            self.inodes.report(),
            self.dentries.report(),
            self.chunk_owner.report(),
            self.forwards.report(),
            self.condemned.report(),
        ];
        v.extend(self.objects.table_reports());
        v
    }

    /// The state `store` holds; `None` when it holds none (a new master, or one that has
    /// only a JSON snapshot). `cache`: clean records each table keeps decoded.
    pub fn open(store: &Arc<Store>, cache: usize) -> Result<Option<Self>, redb::Error> {
        let Some(next_inode) = Cell::open(NEXT_INODE, store)? else {
            return Ok(None);
        };
        // Records an older master wrote (or an older leader's snapshot held) are rewritten
        // in this one's versions before anything reads them.
        let upgraded = crate::kv::upgrade(store.db(), TABLES).map_err(|e| match e {
            crate::kv::UpgradeError::Store(e) => e,
            crate::kv::UpgradeError::Record(e) => redb::Error::Corrupted(e.to_string()),
        })?;
        if upgraded > 0 {
            store.committed();
            tracing::info!(
                rows = upgraded,
                "master state: records of older versions rewritten"
            );
        }
        let mut st = Self {
            inodes: Table::open(INODES, store.clone(), cache)?
                .summed(inode_sum)
                .tallied(inode_segments),
            next_inode,
            next_chunk: open_cell(NEXT_CHUNK, store)?,
            servers: open_cell(SERVERS, store)?,
            config: open_cell(CONFIG, store)?,
            objects: ObjectIndex::open(store, cache)?,
            dir_policies: open_cell(DIR_POLICIES, store)?,
            conversions: open_cell(CONVERSIONS, store)?,
            cap_keys: open_cell(CAP_KEYS, store)?,
            revocations: open_cell(REVOCATIONS, store)?,
            partitions: open_cell(PARTITIONS, store)?,
            subtrees: open_cell(SUBTREES, store)?,
            hashed: open_cell(HASHED, store)?,
            move_shards: open_cell(MOVE_SHARDS, store)?,
            home: open_cell(HOME, store)?,
            moving: open_cell(MOVING, store)?,
            load_sealed: open_cell(LOAD_SEALED, store)?,
            txns: open_cell(TXNS, store)?,
            locks: open_cell(LOCKS, store)?,
            condemned: Table::open(super::segments::CONDEMNED, store.clone(), cache)?,
            segment_arrivals: open_cell(super::segments::ARRIVALS, store)?,
            forwards: Table::open(FORWARDS, store.clone(), cache)?,
            dentries: Table::open(DENTRIES, store.clone(), cache)?,
            chunk_owner: Table::open(CHUNK_OWNER, store.clone(), cache)?,
            acting: None,
        };
        // When this master applied each record is its own memory: loaded counts as now.
        st.revocations.rebuild();
        Ok(Some(st))
    }

    /// Writes every change since the last flush into `tx`.
    pub fn flush(&mut self, tx: &WriteTransaction) -> Result<(), redb::Error> {
        self.inodes.flush(tx)?;
        self.dentries.flush(tx)?;
        self.chunk_owner.flush(tx)?;
        self.forwards.flush(tx)?;
        self.next_inode.flush(NEXT_INODE, tx)?;
        self.next_chunk.flush(NEXT_CHUNK, tx)?;
        self.servers.flush(SERVERS, tx)?;
        self.config.flush(CONFIG, tx)?;
        self.dir_policies.flush(DIR_POLICIES, tx)?;
        self.conversions.flush(CONVERSIONS, tx)?;
        self.cap_keys.flush(CAP_KEYS, tx)?;
        self.revocations.flush(REVOCATIONS, tx)?;
        self.partitions.flush(PARTITIONS, tx)?;
        self.subtrees.flush(SUBTREES, tx)?;
        self.hashed.flush(HASHED, tx)?;
        self.move_shards.flush(MOVE_SHARDS, tx)?;
        self.home.flush(HOME, tx)?;
        self.moving.flush(MOVING, tx)?;
        self.load_sealed.flush(LOAD_SEALED, tx)?;
        self.txns.flush(TXNS, tx)?;
        self.locks.flush(LOCKS, tx)?;
        self.condemned.flush(tx)?;
        self.segment_arrivals.flush(super::segments::ARRIVALS, tx)?;
        self.objects.flush(tx)
    }

    /// Writes this whole state (one held in memory: new, or read from a JSON snapshot) into
    /// `store` through `tx`, replacing what the store held; the state then lives there.
    pub fn write_out(
        &mut self,
        store: &Arc<Store>,
        tx: &WriteTransaction,
        cache: usize,
    ) -> Result<(), redb::Error> {
        self.inodes.write_out(store.clone(), tx, cache)?;
        self.dentries.write_out(store.clone(), tx, cache)?;
        self.chunk_owner.write_out(store.clone(), tx, cache)?;
        self.forwards.write_out(store.clone(), tx, cache)?;
        self.condemned.write_out(store.clone(), tx, cache)?;
        self.objects.write_out(store, tx, cache)?;
        self.next_inode.touch();
        self.next_chunk.touch();
        self.servers.touch();
        self.config.touch();
        self.dir_policies.touch();
        self.conversions.touch();
        self.cap_keys.touch();
        self.revocations.touch();
        self.partitions.touch();
        self.subtrees.touch();
        self.hashed.touch();
        self.move_shards.touch();
        self.home.touch();
        self.moving.touch();
        self.load_sealed.touch();
        self.txns.touch();
        self.locks.touch();
        self.segment_arrivals.touch();
        self.flush(tx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, Lease, Policy, ServerRecord};
    use cairn_rpc::object::{Extent, ObjectMeta, ObjectOp, User};
    use rand::{Rng, SeedableRng, rngs::StdRng};
    use redb::{Database, backends::InMemoryBackend};

    fn store() -> Arc<Store> {
        let db = Database::builder()
            .create_with_backend(InMemoryBackend::new())
            .unwrap();
        Store::new(Arc::new(db))
    }

    fn flush(st: &mut State, store: &Store) {
        let tx = store.db().begin_write().unwrap();
        st.flush(&tx).unwrap();
        tx.commit().unwrap();
        store.committed();
    }

    fn policy() -> Policy {
        Policy {
            replicas: 3,
            compression: false,
            min_copy: 0,
            ec: None,
        }
    }

    fn random_command(rng: &mut StdRng, step: u64) -> Command {
        let dir = |rng: &mut StdRng| format!("/d{}", rng.random_range(0..4));
        let file =
            |rng: &mut StdRng| format!("/d{}/f{}", rng.random_range(0..4), rng.random_range(0..6));
        let object = |rng: &mut StdRng, put: String| {
            let extent = match rng.random_bool(0.5) {
                true => Extent {
                    path: "/p/1".into(),
                    offset: step,
                    len: 1,
                    shared: true,
                },
                false => Extent {
                    path: format!("/d{}/f{}", rng.random_range(0..4), rng.random_range(0..6)),
                    offset: 0,
                    len: 0,
                    shared: false,
                },
            };
            ObjectMeta {
                size: extent.len,
                // Hex, as a single PUT's (stored as bytes), or not.
                etag: match step % 3 {
                    0 => "e".into(),
                    _ => format!("{step:032x}"),
                },
                mtime_ms: step,
                put_id: put,
                extents: vec![extent],
                ..Default::default()
            }
        };
        let o = |op| Command::Object(Box::new(op));
        match rng.random_range(0..12) {
            0 => Command::Mkdir {
                path: dir(rng),
                parents: true,
                now_ms: step,
                policy: None,
                mode: None,
            },
            1..=3 => Command::Create {
                path: file(rng),
                mode: None,
                policy: policy(),
                parents: true,
                now_ms: step,
                lease: rng.random_bool(0.3).then(|| Lease {
                    holder: "w".into(),
                    expires_ms: step + 10,
                }),
                placements: vec![vec![1, 2, 3]; rng.random_range(0..3)],
                groups: false,
            },
            4 => Command::Rename {
                from: file(rng),
                to: file(rng),
                now_ms: step,
            },
            5 => Command::Delete { path: file(rng) },
            6 => Command::Register {
                server: ServerRecord {
                    id: rng.random_range(1..5),
                    addr: format!("10.0.0.{step}:1"),
                    host: "h".into(),
                    rack: "r".into(),
                    draining: false,
                },
            },
            7 => o(ObjectOp::CreateBucket {
                user: "u".into(),
                bucket: format!("bkt{}", rng.random_range(0..3)),
                now_ms: step,
            }),
            8 | 9 => o(ObjectOp::PutObject {
                user: "u".into(),
                bucket: format!("bkt{}", rng.random_range(0..3)),
                key: format!("k{}", rng.random_range(0..20)),
                meta: object(rng, format!("{step:024x}")),
                condition: None,
            }),
            10 => o(ObjectOp::DeleteObject {
                user: "u".into(),
                bucket: format!("bkt{}", rng.random_range(0..3)),
                key: format!("k{}", rng.random_range(0..20)),
            }),
            _ => o(ObjectOp::DeleteBucket {
                user: "u".into(),
                bucket: format!("bkt{}", rng.random_range(0..3)),
            }),
        }
    }

    /// A state kept in a store (tiny caches, flushed and reopened at random points) answers
    /// every command as one kept in memory and ends equal to it.
    /// The totals counted the slow way (the sum the inodes table keeps must equal them).
    fn scanned_totals(st: &State) -> (u64, u64, u64, u64) {
        let mut t = (0, 0, 0, 0);
        for (_, ino) in st.inodes.iter() {
            let [a, b, c, d] = inode_sum(&ino);
            t = (t.0 + a, t.1 + b, t.2 + c, t.3 + d);
        }
        t
    }

    #[test]
    fn a_stored_state_applies_as_one_in_memory() {
        let mut rng = StdRng::seed_from_u64(39);
        let mut cmds = StdRng::seed_from_u64(40);
        let store = store();
        let mut mem = State::default();
        let mut disk = State::default();
        let tx = store.db().begin_write().unwrap();
        disk.write_out(&store, &tx, 4).unwrap();
        tx.commit().unwrap();
        store.committed();
        let setup = [
            Command::Object(Box::new(ObjectOp::CreateUser {
                user: User {
                    name: "u".into(),
                    access_key: "AK".into(),
                    secret_key: "s".into(),
                    created_ms: 0,
                    admin: false,
                    certs: Vec::new(),
                },
            })),
            Command::Create {
                path: "/p/1".into(),
                mode: None,
                policy: policy(),
                parents: true,
                now_ms: 0,
                lease: None,
                placements: vec![vec![1, 2, 3]],
                groups: false,
            },
        ];
        let mut applied = 0;
        for (step, cmd) in setup
            .into_iter()
            .chain((0..3000).map(|s| random_command(&mut cmds, s)))
            .enumerate()
        {
            let a = mem.apply(&cmd);
            let b = disk.apply(&cmd);
            assert_eq!(a, b, "step {step}: {cmd:?}");
            if step % 50 == 0 {
                assert_eq!(disk.totals(), scanned_totals(&disk), "step {step}");
                assert_eq!(mem.totals(), scanned_totals(&mem), "step {step}");
            }

            applied += usize::from(a.is_ok_and(|r| !matches!(r.object, Some(Err(_)))));
            match rng.random_range(0..20) {
                0..=7 => flush(&mut disk, &store),
                8 => {
                    flush(&mut disk, &store);
                    disk = State::open(&store, 4).unwrap().expect("written");
                }
                _ => {}
            }
        }
        assert!(
            applied > 1000,
            "the workload mostly fails: {applied} applied"
        );
        flush(&mut disk, &store);
        let again = State::open(&store, 4).unwrap().expect("written");
        let want = serde_json::to_value(&mem).unwrap();
        assert_eq!(serde_json::to_value(&disk).unwrap(), want);
        assert_eq!(serde_json::to_value(&again).unwrap(), want);
        assert_eq!(again.totals(), mem.totals());
        assert_eq!(again.totals(), scanned_totals(&again));
        assert_eq!(again.objects().totals(), mem.objects().totals());
        assert!(
            mem.objects().totals().1 > 0 && mem.totals().0 > 0,
            "{:?} {:?}",
            mem.objects().totals(),
            mem.totals()
        );

        // Every table the state wrote is one a snapshot carries…
        use redb::{ReadableDatabase, TableHandle};
        let rx = store.db().begin_read().unwrap();
        for t in rx.list_tables().unwrap() {
            let name = t.name();
            assert!(
                name == "counts" || TABLES.iter().any(|d| d.name == name),
                "table {name} is missing from disk::TABLES (snapshots would lose it)"
            );
        }
        // …and a snapshot file of them, loaded into another store, is the same state.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.snap");
        crate::snapshot::write(&path, b"{}", &rx, TABLES).unwrap();
        let other = self::store();
        crate::snapshot::verify(&path, TABLES).unwrap();
        crate::snapshot::load(&path, TABLES, || Ok(other.db().begin_write()?), |_| Ok(())).unwrap();
        let mut loaded = State::open(&other, 4).unwrap().expect("loaded");
        assert_eq!(serde_json::to_value(&loaded).unwrap(), want);
        assert_eq!(loaded.totals(), mem.totals());
        // The same rows with the objects as an older master stored them (version 1) open as
        // the same state, rewritten to the same bytes.
        let older = self::store();
        crate::snapshot::load(&path, TABLES, || Ok(older.db().begin_write()?), |_| Ok(())).unwrap();
        {
            use redb::ReadableTable;
            let def = redb::TableDefinition::<&[u8], &[u8]>::new("objects");
            let tx = older.db().begin_write().unwrap();
            {
                let mut t = tx.open_table(def).unwrap();
                let rows: Vec<(Vec<u8>, Vec<u8>)> = t
                    .iter()
                    .unwrap()
                    .map(|r| r.unwrap())
                    .map(|(k, v)| (k.value().to_vec(), v.value().to_vec()))
                    .collect();
                assert!(rows.len() > 5, "{} objects", rows.len());
                for (k, v) in rows {
                    let old = crate::state::objects::stored::object_to_v1(&v);
                    t.insert(k.as_slice(), old.as_slice()).unwrap();
                }
            }
            // An older master recorded no versions.
            tx.delete_table(redb::TableDefinition::<&[u8], &[u8]>::new(
                crate::kv::VERSIONS.name,
            ))
            .unwrap();
            tx.commit().unwrap();
        }
        let upgraded = State::open(&older, 4).unwrap().expect("loaded");
        assert_eq!(serde_json::to_value(&upgraded).unwrap(), want);
        // The same rows in two stores have one digest (`cairn admin digests`); one more
        // command applied to one of them changes it.
        let digest =
            |s: &Store| crate::snapshot::digest(&s.db().begin_read().unwrap(), TABLES).unwrap();
        let (rows, crc) = digest(&store);
        assert!(rows > 100, "{rows} rows");
        assert_eq!(digest(&other), (rows, crc));
        assert_eq!(
            digest(&older),
            (rows, crc),
            "upgraded rows are the same bytes"
        );
        loaded
            .apply(&Command::Mkdir {
                path: "/one-more".into(),
                parents: false,
                now_ms: 1,
                policy: None,
                mode: None,
            })
            .unwrap();
        flush(&mut loaded, &other);
        let (more, changed) = digest(&other);
        assert!(more > rows && changed != crc);
        // A row changed in place (as many rows, other bytes): another CRC. (Canary: a CRC
        // taken over the stream with its own CRC trailer is the same for every stream.)
        loaded
            .apply(&Command::SetAttr {
                path: "/one-more".into(),
                mode: Some(0o700),
                owner: None,
            })
            .unwrap();
        flush(&mut loaded, &other);
        let (same_rows, other_crc) = digest(&other);
        assert_eq!(same_rows, more);
        assert_ne!(other_crc, changed);
    }
}
