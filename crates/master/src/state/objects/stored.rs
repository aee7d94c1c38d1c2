//! Where the object index lives in the master's store (docs/formats/master-state.md): its
//! tables and cells, opening, flushing and writing them out, and reading them from a JSON
//! snapshot (code moved from objects/mod.rs unchanged).

use super::{ObjectIndex, PackUse};
use crate::kv::{Cell, Store, Table, TableDef};
use cairn_rpc::object::{ObjectMeta, Part, Upload};
use redb::WriteTransaction;
use serde::{Deserialize, Deserializer};
use std::sync::Arc;

/// Objects by (bucket, key) (docs/formats/master-state.md). Version 2 stores a hex ETag
/// and put id as their bytes (`cairn_rpc::object::compact`); version 1 as text.
pub const OBJECTS: TableDef = TableDef::new("objects", 2)
    .decoded(11)
    .upgraded_by(object_from_v1);

/// `ObjectMeta` as version 1 of `objects` stored it: the same fields, ETag and put id as text.
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct ObjectMetaV1 {
    size: u64,
    etag: String,
    mtime_ms: u64,
    put_id: String,
    headers: std::collections::BTreeMap<String, String>,
    user_meta: std::collections::BTreeMap<String, String>,
    checksums: std::collections::BTreeMap<String, String>,
    extents: Vec<cairn_rpc::object::Extent>,
    part_sizes: Vec<u64>,
    checksum_type: Option<String>,
    part_checksums: Vec<String>,
}

/// A version 1 record of `objects` as version 2 (see [`crate::kv::upgrade`]).
///
/// # Errors
/// The bytes are not a version 1 record.
pub fn object_from_v1(bytes: &[u8]) -> Result<Vec<u8>, crate::kv::RecordError> {
    let o: ObjectMetaV1 = crate::kv::codec::decode_record(OBJECTS.name, 1, bytes)?;
    let meta = ObjectMeta {
        size: o.size,
        etag: o.etag,
        mtime_ms: o.mtime_ms,
        put_id: o.put_id,
        headers: o.headers,
        user_meta: o.user_meta,
        checksums: o.checksums,
        extents: o.extents,
        part_sizes: o.part_sizes,
        checksum_type: o.checksum_type,
        part_checksums: o.part_checksums,
    };
    Ok(crate::kv::codec::encode_record(OBJECTS.version, &meta))
}
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

/// `bytes`, a version 2 record, as version 1 wrote it (what an older master left).
#[cfg(test)]
pub(crate) fn object_to_v1(bytes: &[u8]) -> Vec<u8> {
    let o: ObjectMeta = crate::kv::codec::decode_record(OBJECTS.name, 2, bytes).unwrap();
    crate::kv::codec::encode_record(
        1,
        &ObjectMetaV1 {
            size: o.size,
            etag: o.etag,
            mtime_ms: o.mtime_ms,
            put_id: o.put_id,
            headers: o.headers,
            user_meta: o.user_meta,
            checksums: o.checksums,
            extents: o.extents,
            part_sizes: o.part_sizes,
            checksum_type: o.checksum_type,
            part_checksums: o.part_checksums,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::codec::{decode_record, encode_record};
    use cairn_rpc::object::Extent;

    fn v1(etag: &str, put_id: &str) -> ObjectMetaV1 {
        ObjectMetaV1 {
            size: 1,
            etag: etag.into(),
            mtime_ms: 1_795_000_000_000,
            put_id: put_id.into(),
            headers: [("content-type".into(), "text/plain".into())].into(),
            user_meta: Default::default(),
            checksums: Default::default(),
            extents: vec![Extent {
                path: "/.s3/packs/10.0.0.1:9000-000000000042".into(),
                offset: 123_456,
                len: 1,
                shared: true,
            }],
            part_sizes: vec![],
            checksum_type: None,
            part_checksums: vec![],
        }
    }

    /// A version 1 record converts to a version 2 one holding the same object, 26 bytes
    /// shorter for a single PUT's hex ETag and put id; text that is not lowercase hex (a
    /// multipart ETag, an upper-case id) stays text. JSON (Raft entries, calls) is unchanged.
    #[test]
    fn version_1_objects_convert_to_version_2() {
        for (etag, put_id, saved) in [
            (
                "0cc175b9c0f1b6a831c399e269772661",
                "0123456789abcdef01234567",
                26,
            ),
            (
                "0cc175b9c0f1b6a831c399e269772661-3",
                "0123456789ABCDEF01234567",
                -2,
            ),
            ("", "", -2),
        ] {
            let old = v1(etag, put_id);
            let old_bytes = encode_record(1, &old);
            let new_bytes = object_from_v1(&old_bytes).unwrap();
            assert_eq!(new_bytes[0], 2);
            assert_eq!(
                old_bytes.len() as i64 - new_bytes.len() as i64,
                saved,
                "{etag} {put_id}"
            );
            let o: ObjectMeta = decode_record("objects", 2, &new_bytes).unwrap();
            assert_eq!((o.etag.as_str(), o.put_id.as_str()), (etag, put_id));
            assert_eq!((o.size, o.mtime_ms), (old.size, old.mtime_ms));
            assert_eq!((o.headers, o.extents), (old.headers, old.extents));
            let json = serde_json::to_value(
                decode_record::<ObjectMeta>("objects", 2, &new_bytes).unwrap(),
            )
            .unwrap();
            assert_eq!(json["etag"], etag);
            assert_eq!(json["put_id"], put_id);
        }
        assert!(object_from_v1(&[1, 0xff]).is_err());
        assert!(
            object_from_v1(&[2]).is_err(),
            "a version 2 record is not converted"
        );
    }
}
