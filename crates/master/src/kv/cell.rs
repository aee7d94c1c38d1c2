//! A record of which the state keeps one (code moved from kv/mod.rs unchanged).

use super::{Store, TableDef, codec, fatal};
use crate::kv::Record;
use redb::{ReadableDatabase, WriteTransaction};

/// A record of which the state keeps one, always in memory (the cluster's servers, its
/// configuration, the capability keys…): reads go through `Deref`, and any mutable access
/// marks it changed, so the next flush writes it (one row, key `()`, in its own table).
/// Serializes as the value itself (the JSON snapshot's shape is unchanged).
#[derive(Default, Clone)]
pub struct Cell<V> {
    value: V,
    changed: bool,
}

impl<V> Cell<V> {
    pub fn new(value: V) -> Self {
        Self {
            value,
            changed: true,
        }
    }

    /// Marks the value changed (the next flush writes it).
    pub fn touch(&mut self) {
        self.changed = true;
    }

    /// Writes the value as the one row of table `def` if it changed since the last flush.
    pub fn flush(&mut self, def: TableDef, tx: &WriteTransaction) -> Result<(), redb::Error>
    where
        V: Record,
    {
        if !std::mem::take(&mut self.changed) {
            return Ok(());
        }
        let vb = codec::encode_record(def.version, &self.value);
        tx.open_table(def.raw())?.insert(&[][..], vb.as_slice())?;
        Ok(())
    }

    /// The value stored in table `def` (`None`: never written).
    pub fn open(def: TableDef, store: &Store) -> Result<Option<Self>, redb::Error>
    where
        V: Record,
    {
        let tx = store.db.begin_read()?;
        let t = match tx.open_table(def.raw()) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let Some(v) = t.get(&[][..])? else {
            return Ok(None);
        };
        let value = codec::decode_record(def.name, def.version, v.value())
            .unwrap_or_else(|e| fatal(def.name, e));
        Ok(Some(Self {
            value,
            changed: false,
        }))
    }
}

/// Equal values are equal cells, written or not.
impl<V: PartialEq> PartialEq for Cell<V> {
    fn eq(&self, o: &Self) -> bool {
        self.value == o.value
    }
}

impl<V: Eq> Eq for Cell<V> {}

impl<V> std::ops::Deref for Cell<V> {
    type Target = V;

    fn deref(&self) -> &V {
        &self.value
    }
}

impl<V> std::ops::DerefMut for Cell<V> {
    fn deref_mut(&mut self) -> &mut V {
        self.changed = true;
        &mut self.value
    }
}

impl<V: std::fmt::Debug> std::fmt::Debug for Cell<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.value.fmt(f)
    }
}

impl<V: serde::Serialize> serde::Serialize for Cell<V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

impl<'de, V: serde::Deserialize<'de>> serde::Deserialize<'de> for Cell<V> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        V::deserialize(d).map(Self::new)
    }
}
