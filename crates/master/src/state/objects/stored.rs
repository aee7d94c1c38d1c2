//! Where the object index lives in the master's store (docs/formats/master-state.md): its
//! tables and cells, opening, flushing and writing them out, and reading them from a JSON
//! snapshot (code moved from objects/mod.rs unchanged).

use super::{ObjectIndex, PackUse};
use crate::kv::{Cell, Store, Table, TableDef};
use cairn_rpc::object::{ObjectMeta, Part, Upload};
use redb::WriteTransaction;
use serde::{Deserialize, Deserializer};
use std::sync::Arc;

/// Objects by (bucket, key) (docs/formats/master-state.md).
pub const OBJECTS: TableDef = TableDef::new("objects", 1).decoded(11);
/// Multipart uploads by id.
pub const UPLOADS: TableDef = TableDef::new("uploads", 1);
/// Uploads' parts by (upload id, part number).
pub const PARTS: TableDef = TableDef::new("upload_parts", 1);
/// Pack usage by pack path.
pub const PACKS: TableDef = TableDef::new("packs", 1);
/// Files to delete, by path (records empty).
pub const TRASH: TableDef = TableDef::new("trash", 1);

pub(in crate::state) const USERS: TableDef = crate::state::disk::cell("users");
pub(in crate::state) const BUCKETS: TableDef = crate::state::disk::cell("buckets");
pub(in crate::state) const GATEWAYS: TableDef = crate::state::disk::cell("gateways");
pub(in crate::state) const VOLUMES: TableDef = crate::state::disk::cell("volumes");
pub(in crate::state) const PLACEMENTS: TableDef = crate::state::disk::cell("bucket_placements");

/// The index in the master's store (see `state/disk.rs`).
impl ObjectIndex {
    pub(in crate::state) fn table_reports(&self) -> [crate::kv::TableReport; 5] {
        [
            self.by_key.report(),
            self.uploads.report(),
            self.parts.report(),
            self.packs.report(),
            self.trash.report(),
        ]
    }

    pub(in crate::state) fn open(store: &Arc<Store>, cache: usize) -> Result<Self, redb::Error> {
        use crate::state::disk::open_cell;
        Ok(Self {
            users: open_cell(USERS, store)?,
            buckets: open_cell(BUCKETS, store)?,
            by_key: Table::open(OBJECTS, store.clone(), cache)?,
            uploads: Table::open(UPLOADS, store.clone(), cache)?,
            parts: Table::open(PARTS, store.clone(), cache)?,
            packs: Table::open(PACKS, store.clone(), cache)?,
            gateways: open_cell(GATEWAYS, store)?,
            trash: Table::open(TRASH, store.clone(), cache)?,
            volumes: open_cell(VOLUMES, store)?,
            placements: open_cell(PLACEMENTS, store)?,
        })
    }

    pub(in crate::state) fn flush(&mut self, tx: &WriteTransaction) -> Result<(), redb::Error> {
        self.users.flush(USERS, tx)?;
        self.buckets.flush(BUCKETS, tx)?;
        self.by_key.flush(tx)?;
        self.uploads.flush(tx)?;
        self.parts.flush(tx)?;
        self.packs.flush(tx)?;
        self.gateways.flush(GATEWAYS, tx)?;
        self.trash.flush(tx)?;
        self.volumes.flush(VOLUMES, tx)?;
        self.placements.flush(PLACEMENTS, tx)
    }

    pub(in crate::state) fn write_out(
        &mut self,
        store: &Arc<Store>,
        tx: &WriteTransaction,
        cache: usize,
    ) -> Result<(), redb::Error> {
        self.by_key.write_out(store.clone(), tx, cache)?;
        self.uploads.write_out(store.clone(), tx, cache)?;
        self.parts.write_out(store.clone(), tx, cache)?;
        self.packs.write_out(store.clone(), tx, cache)?;
        self.trash.write_out(store.clone(), tx, cache)?;
        self.users.touch();
        self.buckets.touch();
        self.gateways.touch();
        self.volumes.touch();
        self.placements.touch();
        self.flush(tx)
    }
}

impl Default for ObjectIndex {
    fn default() -> Self {
        Self {
            users: Cell::default(),
            buckets: Cell::default(),
            by_key: objects_table(),
            uploads: Table::memory(UPLOADS),
            parts: parts_table(),
            packs: Table::memory(PACKS),
            gateways: Cell::default(),
            trash: trash_table(),
            volumes: Cell::default(),
            placements: Cell::default(),
        }
    }
}

pub(super) fn objects_table() -> Table<(String, String), ObjectMeta> {
    Table::memory(OBJECTS)
}

pub(super) fn parts_table() -> Table<(String, u32), Part> {
    Table::memory(PARTS)
}

pub(super) fn parts_from_rows<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Table<(String, u32), Part>, D::Error> {
    crate::kv::rows(PARTS, d)
}

pub(super) fn trash_table() -> Table<String, ()> {
    Table::memory(TRASH)
}

pub(super) fn uploads_from_rows<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Table<String, Upload>, D::Error> {
    crate::kv::rows(UPLOADS, d)
}

pub(super) fn packs_from_rows<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Table<String, PackUse>, D::Error> {
    crate::kv::rows(PACKS, d)
}

/// The trash of a JSON snapshot: rows, or the list of paths an older one wrote.
pub(super) fn trash_from_rows<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Table<String, ()>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Row {
        Path(String),
        Row((String, ())),
    }
    let rows: Vec<Row> = Deserialize::deserialize(d)?;
    Ok(Table::from_rows(
        TRASH,
        rows.into_iter().map(|r| match r {
            Row::Path(p) | Row::Row((p, ())) => (p, ()),
        }),
    ))
}

pub(super) fn objects_from_rows<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Table<(String, String), ObjectMeta>, D::Error> {
    crate::kv::rows(OBJECTS, d)
}
