//! Records of older versions rewritten in the current ones when a store is opened
//! (docs/formats/master-state.md "Changing a record type").

use super::{RecordError, TableDef, codec};
use redb::{Database, ReadableDatabase};
use std::ops::Bound;

/// See [`TableDef::upgrade`].
pub type Upgrade = fn(&[u8]) -> Result<Vec<u8>, RecordError>;

/// Rows rewritten in one transaction by [`upgrade`]: memory is one batch's pages.
const UPGRADE_BATCH: usize = 10_000;

/// Rewrites every record of `tables` whose version is older than its table's (with the
/// table's [`TableDef::upgrade`]), [`UPGRADE_BATCH`] rows a durable transaction;
/// the number of rows rewritten. Run where the store is opened, before anything reads it: at
/// a master's start (records written by an older master) and after a snapshot is installed
/// (rows of an older leader). The rows keep their meaning, so a crash between transactions
/// loses nothing: the next open rewrites what is left.
///
/// # Errors
/// The store cannot be read or written, or a record does not convert (a master older than
/// the data, or damage): the master does not start.
pub fn upgrade(db: &Database, tables: &[TableDef]) -> Result<u64, UpgradeError> {
    let mut total = 0;
    for def in tables {
        let Some(f) = def.upgrade else { continue };
        if stored_version(db, def.name)? == Some(def.version) {
            continue;
        }
        let mut after: Option<Vec<u8>> = None;
        loop {
            // The next batch of old records, read after the last key seen.
            let batch: Vec<(Vec<u8>, Vec<u8>)> = {
                let rx = db.begin_read()?;
                let t = match rx.open_table(def.raw()) {
                    Ok(t) => t,
                    Err(redb::TableError::TableDoesNotExist(_)) => break,
                    Err(e) => return Err(redb::Error::from(e).into()),
                };
                let from = after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
                let mut out = Vec::new();
                let mut last = None;
                for row in t
                    .range::<&[u8]>((from, Bound::Unbounded))?
                    .take(UPGRADE_BATCH)
                {
                    let (k, v) = row?;
                    last = Some(k.value().to_vec());
                    match v.value().first() {
                        Some(&found) if found < def.version => {
                            out.push((k.value().to_vec(), f(v.value())?));
                        }
                        Some(&found) if found > def.version => {
                            return Err(RecordError::Version {
                                table: def.name,
                                found,
                                expected: def.version,
                            }
                            .into());
                        }
                        _ => {}
                    }
                }
                match last {
                    Some(l) => after = Some(l),
                    None => break,
                }
                out
            };
            if batch.is_empty() {
                continue;
            }
            // Durable, each: redb reuses the pages a transaction frees only once a durable
            // commit follows it, so batches committed without fsync would copy the table
            // whole (measured: a 67 MB store grew to 134 MB) where durable ones reuse them.
            let mut tx = db.begin_write()?;
            tx.set_durability(redb::Durability::Immediate)?;
            {
                let mut t = tx.open_table(def.raw())?;
                for (k, v) in &batch {
                    t.insert(k.as_slice(), v.as_slice())?;
                }
            }
            tx.commit()?;
            total += batch.len() as u64;
        }
        // Every record is of this version now: later opens need not read them again.
        let mut tx = db.begin_write()?;
        tx.set_durability(redb::Durability::Immediate)?;
        tx.open_table(VERSIONS.raw())?.insert(
            def.name.as_bytes(),
            codec::encode_record(VERSIONS.version, &def.version).as_slice(),
        )?;
        tx.commit()?;
    }
    Ok(total)
}

/// The version every record of a table is in, by table name, once [`upgrade`] made them so
/// (`u8`; a table without a row here is read whole by the next [`upgrade`]). In the state's
/// tables, so a snapshot carries it: one from an older leader has none, and its rows are
/// read and rewritten when it is installed.
pub const VERSIONS: TableDef = TableDef::new("record_versions", 1);

fn stored_version(db: &Database, table: &'static str) -> Result<Option<u8>, UpgradeError> {
    let rx = db.begin_read()?;
    let t = match rx.open_table(VERSIONS.raw()) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(redb::Error::from(e).into()),
    };
    Ok(match t.get(table.as_bytes())? {
        Some(v) => Some(codec::decode_record(
            VERSIONS.name,
            VERSIONS.version,
            v.value(),
        )?),
        None => None,
    })
}

/// Why [`upgrade`] failed.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error(transparent)]
    Store(#[from] redb::Error),
    #[error(transparent)]
    Record(#[from] RecordError),
}

macro_rules! store_error {
    ($($t:ty),*) => {$(
        impl From<$t> for UpgradeError {
            fn from(e: $t) -> Self {
                Self::Store(e.into())
            }
        }
    )*};
}
store_error!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::tests::store;
    use crate::kv::{COUNTS, Key, Table};

    const T: TableDef = TableDef::new("test", 1);

    /// Version 1 records were `u64`s; version 2 holds the number and its double.
    fn double(bytes: &[u8]) -> Result<Vec<u8>, RecordError> {
        let n: u64 = codec::decode_record("test", 1, bytes)?;
        Ok(codec::encode_record(2, &(n, 2 * n)))
    }

    /// Old records are rewritten in batches, new ones left alone, and a table read with the
    /// new version sees every row converted; a record newer than the master refuses the open.
    #[test]
    fn upgrade_rewrites_older_records_and_refuses_newer() {
        let s = store();
        let n = UPGRADE_BATCH as u64 * 2 + 7;
        let tx = s.db().begin_write().unwrap();
        {
            let mut t = tx.open_table(T.raw()).unwrap();
            for i in 0..n {
                // Every tenth row is new already (a crash between batches leaves such).
                let v = if i % 10 == 0 {
                    codec::encode_record(2, &(i, 2 * i))
                } else {
                    codec::encode_record(1, &i)
                };
                t.insert(i.to_bytes().as_slice(), v.as_slice()).unwrap();
            }
            tx.open_table(COUNTS).unwrap().insert("test", n).unwrap();
        }
        tx.commit().unwrap();
        const V2: TableDef = TableDef::new("test", 2).upgraded_by(double);
        assert_eq!(upgrade(s.db(), &[V2]).unwrap(), n - n.div_ceil(10));
        assert_eq!(
            upgrade(s.db(), &[V2]).unwrap(),
            0,
            "nothing is left to rewrite"
        );
        assert_eq!(stored_version(s.db(), "test").unwrap(), Some(2));
        s.committed();
        let t: Table<u64, (u64, u64)> = Table::open(V2, s.clone(), 1 << 20).unwrap();
        assert_eq!(t.len(), n);
        for i in 0..n {
            assert_eq!(*t.get(&i).unwrap(), (i, 2 * i));
        }
        // Without the table's version recorded (a snapshot of an older leader installed),
        // the rows are read again.
        let forget = || {
            let tx = s.db().begin_write().unwrap();
            tx.open_table(VERSIONS.raw())
                .unwrap()
                .remove("test".as_bytes())
                .unwrap();
            tx.commit().unwrap();
        };
        forget();
        // A table one version older than its rows: an older master than the data.
        assert!(matches!(
            upgrade(s.db(), &[TableDef::new("test", 1).upgraded_by(double)]),
            Err(UpgradeError::Record(RecordError::Version { found: 2, .. }))
        ));
        // A record the conversion cannot read.
        forget();
        let tx = s.db().begin_write().unwrap();
        tx.open_table(T.raw())
            .unwrap()
            .insert(n.to_bytes().as_slice(), [1u8, 0xff].as_slice())
            .unwrap();
        tx.commit().unwrap();
        assert!(matches!(
            upgrade(s.db(), &[V2]),
            Err(UpgradeError::Record(RecordError::Body { .. }))
        ));
    }
}
