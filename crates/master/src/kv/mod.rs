//! The masters' state as tables of typed records (docs/formats/master-state.md).
//!
//! A [`Table`] looks like a `BTreeMap` to the state machine but keeps only what changed since
//! its last [`Table::flush`] (the *overlay*) and a bounded cache of clean records in memory;
//! the rest is in a redb table of the master's database ([`Store`]). Applying a batch of log
//! entries changes overlays; the batch ends with one redb transaction that writes them, and the
//! overlays empty into the caches. A table without a store keeps everything in its overlay
//! (unit tests, and states read from a JSON snapshot before they are written out).
//!
//! Reads between flushes see the overlay first, then the cache, then the store through one
//! read transaction that is begun again after every commit.

mod cache;
mod cell;
pub mod codec;
mod sum;
mod tally;
mod upgrade;

use cache::Cache;
pub use cell::Cell;
pub use codec::{Key, Record, RecordError};
pub use sum::{SUM_WIDTH, Sum};
use sum::{add, sub, sum_bytes, sum_from};
use tally::Tallies;
pub use tally::{TALLIES, TALLY_WIDTH, Tally, TallyOf, tally_bytes, tally_from};
pub use upgrade::{Upgrade, UpgradeError, VERSIONS, upgrade};

use parking_lot::Mutex;
use redb::{Database, ReadTransaction, ReadableDatabase, TableDefinition, WriteTransaction};
use std::collections::BTreeMap;
use std::collections::btree_map;
use std::iter::Peekable;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Every table's row count, by table name (u64 little-endian).
pub const COUNTS: TableDefinition<&str, u64> = TableDefinition::new("counts");

/// The sums tables keep of their records ([`Table::summed`]): key the table's name, value
/// [`SUM_WIDTH`] u64s little-endian. Carried in snapshots (it is in the state's table list).
pub const SUMS: TableDef = TableDef::new("sums", 1);

/// The records in the store are bytes to redb; [`codec`] gives them their types.
type Raw = TableDefinition<'static, &'static [u8], &'static [u8]>;

/// Default bytes of clean records a table keeps decoded in memory (estimated: see
/// [`TableDef::decoded`]). 8 MiB created and statted 2 million files as fast as 16 did, and
/// kept the master inside 64 MiB per million (BENCHMARKS.md "Where a master's memory goes").
pub const DEFAULT_CACHE_BYTES: usize = 8 << 20;

/// What a cached record costs besides its key and record: the LRU's node and hash slot, the
/// `Arc`, the allocator's rounding (an estimate).
const ENTRY_OVERHEAD: usize = 96;

/// A master's database and the read transaction reads go through until the next commit.
pub struct Store {
    db: Arc<Database>,
    reader: Mutex<Option<Arc<ReadTransaction>>>,
}

/// The store failed under a running state machine: the master cannot go on (its replicated
/// state would diverge from its peers'), so it stops; the others serve and it catches up from
/// a snapshot once its disk is replaced.
#[track_caller]
pub fn fatal(what: &str, e: impl std::fmt::Display) -> ! {
    tracing::error!("master store: {what}: {e}");
    panic!("master store: {what}: {e}")
}

impl Store {
    pub fn new(db: Arc<Database>) -> Arc<Self> {
        Arc::new(Self {
            db,
            reader: Mutex::new(None),
        })
    }

    pub fn db(&self) -> &Arc<Database> {
        &self.db
    }

    fn reader(&self) -> Arc<ReadTransaction> {
        let mut r = self.reader.lock();
        if let Some(r) = &*r {
            return r.clone();
        }
        let tx = Arc::new(
            self.db
                .begin_read()
                .unwrap_or_else(|e| fatal("begin a read", e)),
        );
        *r = Some(tx.clone());
        tx
    }

    /// Forgets the read transaction after a commit (the next read sees the commit, and the
    /// pages the old one held can be reused).
    pub fn committed(&self) {
        *self.reader.lock() = None;
    }
}

/// A table's name in the store, the version of its records, and how much larger a record is
/// decoded than encoded (for the cache's budget).
#[derive(Debug, Clone, Copy)]
pub struct TableDef {
    pub name: &'static str,
    pub version: u8,
    /// Bytes of memory a decoded record takes per byte of its encoding (an estimate; strings
    /// and numbers take ~2–4×, each map or vector adds its own allocation).
    pub decoded: u16,
    /// Rewrites a record of an older version (its bytes, version byte included) as one of
    /// `version`; [`upgrade`] runs it over the table when the store is opened.
    pub upgrade: Option<Upgrade>,
}

impl TableDef {
    pub const fn new(name: &'static str, version: u8) -> Self {
        Self {
            name,
            version,
            decoded: 4,
            upgrade: None,
        }
    }

    /// The same table, whose records of older versions `f` rewrites (see [`upgrade`]).
    pub const fn upgraded_by(self, f: Upgrade) -> Self {
        Self {
            upgrade: Some(f),
            ..self
        }
    }

    /// The same table with records `factor` times larger decoded than encoded.
    pub const fn decoded(self, factor: u16) -> Self {
        Self {
            decoded: factor,
            ..self
        }
    }

    /// The estimated memory of a cached record of these encoded lengths.
    fn weight(&self, key: usize, record: usize) -> usize {
        ENTRY_OVERHEAD + 2 * key + record * usize::from(self.decoded)
    }

    fn raw(&self) -> Raw {
        TableDefinition::new(self.name)
    }
}

/// Reads of a table's records that the cache answered or did not.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

/// What a table reports for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableReport {
    pub name: &'static str,
    pub rows: u64,
    pub cached_bytes: u64,
    pub hits: u64,
    pub misses: u64,
}

/// A map from `K` to `V` kept in the store (see the module doc).
pub struct Table<K: Key, V: Record> {
    def: TableDef,
    store: Option<Arc<Store>>,
    /// Changes since the last flush (`None`: removed); everything when there is no store.
    overlay: BTreeMap<K, Option<Arc<V>>>,
    cache: Mutex<Cache<K, V>>,
    len: u64,
    stats: CacheStats,
    /// The table's sum, if it keeps one: the function, the sum of every record but those in
    /// `pending` (taken out when lent by [`Table::get_mut`], added back at the next flush).
    summary: Option<Summary<K, V>>,
    /// Counts by key of parts of the records, if it keeps them ([`Table::tallied`]).
    tallies: Option<Tallies<K, V>>,
}

struct Summary<K, V> {
    of: fn(&V) -> Sum,
    sum: Sum,
    pending: std::collections::BTreeSet<K>,
    changed: bool,
}

impl<K: Key, V: Record> Table<K, V> {
    /// A table held in memory only.
    pub fn memory(def: TableDef) -> Self {
        Self {
            def,
            store: None,
            overlay: BTreeMap::new(),
            cache: Mutex::new(Cache::new(0)),
            len: 0,
            stats: CacheStats::default(),
            summary: None,
            tallies: None,
        }
    }

    /// The table `def` of `store`, keeping up to `cache` bytes of clean records decoded.
    pub fn open(def: TableDef, store: Arc<Store>, cache: usize) -> Result<Self, redb::Error> {
        let tx = store.db.begin_read()?;
        let len = match tx.open_table(COUNTS) {
            Ok(t) => t.get(def.name)?.map(|v| v.value()).unwrap_or(0),
            Err(redb::TableError::TableDoesNotExist(_)) => 0,
            Err(e) => return Err(e.into()),
        };
        Ok(Self {
            def,
            store: Some(store),
            overlay: BTreeMap::new(),
            cache: Mutex::new(Cache::new(cache)),
            len,
            stats: CacheStats::default(),
            summary: None,
            tallies: None,
        })
    }

    pub fn def(&self) -> TableDef {
        self.def
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }

    /// The table's name, rows, its cache's estimated bytes, and reads the cache answered and
    /// did not.
    pub fn report(&self) -> TableReport {
        TableReport {
            name: self.def.name,
            rows: self.len,
            cached_bytes: self.cache.lock().bytes as u64,
            hits: self.stats.hits.load(Ordering::Relaxed),
            misses: self.stats.misses.load(Ordering::Relaxed),
        }
    }

    fn decode(&self, k: &[u8], v: &[u8]) -> (K, V) {
        let key = K::decode(k).unwrap_or_else(|e| fatal(self.def.name, e));
        let value = codec::decode_record(self.def.name, self.def.version, v)
            .unwrap_or_else(|e| fatal(self.def.name, e));
        (key, value)
    }

    /// The record from the cache or the store (not the overlay).
    fn load(&self, k: &K) -> Option<Arc<V>> {
        let store = self.store.as_ref()?;
        if let Some(v) = self.cache.lock().get(k) {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            return Some(v.clone());
        }
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        let reader = store.reader();
        let t = match reader.open_table(self.def.raw()) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return None,
            Err(e) => fatal(self.def.name, e),
        };
        let bytes = k.to_bytes();
        let got = t
            .get(bytes.as_slice())
            .unwrap_or_else(|e| fatal(self.def.name, e))?;
        let weight = self.def.weight(bytes.len(), got.value().len());
        let (_, v) = self.decode(&bytes, got.value());
        let v = Arc::new(v);
        self.cache.lock().put(k.clone(), v.clone(), weight);
        Some(v)
    }

    pub fn get(&self, k: &K) -> Option<Arc<V>> {
        match self.overlay.get(k) {
            Some(v) => v.clone(),
            None => self.load(k),
        }
    }

    pub fn contains_key(&self, k: &K) -> bool {
        self.get(k).is_some()
    }

    /// The record to change in place; the change is written at the next flush.
    pub fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        if !self.overlay.contains_key(k) {
            let v = self.load(k)?;
            self.overlay.insert(k.clone(), Some(v));
        }
        let v = self.overlay.get_mut(k)?.as_mut()?;
        if let Some(s) = &mut self.summary
            && !s.pending.contains(k)
        {
            sub(&mut s.sum, (s.of)(v));
            s.pending.insert(k.clone());
            s.changed = true;
        }
        if let Some(t) = &mut self.tallies {
            t.lend(k, v);
        }
        Some(Arc::make_mut(v))
    }

    /// The record at `k`, made the default one first if there is none.
    pub fn get_or_default(&mut self, k: &K) -> &mut V
    where
        V: Default,
    {
        if !self.contains_key(k) {
            self.insert(k.clone(), V::default());
        }
        self.get_mut(k).expect("just inserted")
    }

    pub fn insert(&mut self, k: K, v: V) -> Option<Arc<V>> {
        let old = self.get(&k);
        if old.is_none() {
            self.len += 1;
        }
        if let Some(s) = &mut self.summary {
            if let Some(old) = &old
                && !s.pending.remove(&k)
            {
                sub(&mut s.sum, (s.of)(old));
            }
            add(&mut s.sum, (s.of)(&v));
            s.changed = true;
        }
        if let Some(t) = &mut self.tallies {
            t.insert(&k, old.as_deref(), &v);
        }
        self.overlay.insert(k, Some(Arc::new(v)));
        old
    }

    pub fn remove(&mut self, k: &K) -> Option<Arc<V>> {
        let old = self.get(k)?;
        self.len -= 1;
        if let Some(s) = &mut self.summary {
            if !s.pending.remove(k) {
                sub(&mut s.sum, (s.of)(&old));
            }
            s.changed = true;
        }
        if let Some(t) = &mut self.tallies {
            t.remove(k, &old);
        }
        if self.store.is_some() {
            self.overlay.insert(k.clone(), None);
        } else {
            self.overlay.remove(k);
        }
        Some(old)
    }

    /// The records with keys in `range`, in key order.
    pub fn range<R: RangeBounds<K>>(&self, range: R) -> Merge<'_, K, V> {
        let lo = range.start_bound().cloned();
        let hi = range.end_bound().cloned();
        let disk = self.store.as_ref().and_then(|store| {
            let t = match store.reader().open_table(self.def.raw()) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return None,
                Err(e) => fatal(self.def.name, e),
            };
            let enc = |b: &Bound<K>| match b {
                Bound::Included(k) => Bound::Included(k.to_bytes()),
                Bound::Excluded(k) => Bound::Excluded(k.to_bytes()),
                Bound::Unbounded => Bound::Unbounded,
            };
            let (lo, hi) = (enc(&lo), enc(&hi));
            fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
                match b {
                    Bound::Included(v) => Bound::Included(v.as_slice()),
                    Bound::Excluded(v) => Bound::Excluded(v.as_slice()),
                    Bound::Unbounded => Bound::Unbounded,
                }
            }
            let r = t
                .range::<&[u8]>((as_ref(&lo), as_ref(&hi)))
                .unwrap_or_else(|e| fatal(self.def.name, e));
            Some(r.peekable())
        });
        Merge {
            table: self,
            overlay: self.overlay.range((lo, hi)).peekable(),
            disk,
        }
    }

    pub fn iter(&self) -> Merge<'_, K, V> {
        self.range::<std::ops::RangeFull>(..)
    }

    pub fn values(&self) -> impl Iterator<Item = Arc<V>> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// Keeps the sum of `of` over the records from now on (read with [`Table::sum`]): read
    /// from the store, or counted once over the table when it has none stored.
    pub fn summed(mut self, of: fn(&V) -> Sum) -> Self {
        let stored = self.store.as_ref().and_then(|store| {
            let reader = store.reader();
            let t = match reader.open_table(SUMS.raw()) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return None,
                Err(e) => fatal(SUMS.name, e),
            };
            let got = t
                .get(self.def.name.as_bytes())
                .unwrap_or_else(|e| fatal(SUMS.name, e))?;
            Some(sum_from(got.value()).unwrap_or_else(|| fatal(SUMS.name, "a sum of bad length")))
        });
        let (sum, changed) = match stored {
            Some(sum) => (sum, false),
            None => {
                let mut sum = [0; SUM_WIDTH];
                for v in self.values() {
                    add(&mut sum, of(&v));
                }
                (sum, true)
            }
        };
        self.summary = Some(Summary {
            of,
            sum,
            pending: Default::default(),
            changed,
        });
        self
    }

    /// Keeps tallies by key of `of` over the records from now on (read with
    /// [`Table::tally`]): read from the store, or counted once over the table when it has
    /// none stored.
    pub fn tallied(mut self, of: TallyOf<V>) -> Self {
        let t = Tallies::open(of, self.def.name, self.store.as_deref(), self.values());
        self.tallies = Some(t);
        self
    }

    /// The tally at `key` (zeros if the table keeps none).
    pub fn tally(&self, key: u64) -> Tally {
        match &self.tallies {
            Some(t) => t.get(self.def.name, self.store.as_deref(), &self.overlay, key),
            None => [0; TALLY_WIDTH],
        }
    }

    /// Every non-zero tally (empty if the table keeps none). Reads them all: for checks.
    pub fn tallies(&self) -> BTreeMap<u64, Tally> {
        match &self.tallies {
            Some(t) => t.all(self.def.name, self.store.as_deref(), &self.overlay),
            None => BTreeMap::new(),
        }
    }

    /// The sum of the records (zeros if the table keeps none).
    pub fn sum(&self) -> Sum {
        let Some(s) = &self.summary else {
            return [0; SUM_WIDTH];
        };
        let mut sum = s.sum;
        for k in &s.pending {
            if let Some(Some(v)) = self.overlay.get(k) {
                add(&mut sum, (s.of)(v));
            }
        }
        sum
    }

    /// Adds the lent records back into the sum and writes it (if it changed) into `tx`.
    fn flush_sum(&mut self, tx: &WriteTransaction) -> Result<(), redb::Error> {
        let sum = self.sum();
        let Some(s) = &mut self.summary else {
            return Ok(());
        };
        s.sum = sum;
        s.pending.clear();
        if std::mem::take(&mut s.changed) {
            tx.open_table(SUMS.raw())?
                .insert(self.def.name.as_bytes(), sum_bytes(&sum).as_slice())?;
        }
        Ok(())
    }

    /// Writes the changes since the last flush into `tx` (with the row count); they become
    /// clean records in the cache.
    pub fn flush(&mut self, tx: &WriteTransaction) -> Result<(), redb::Error> {
        if self.store.is_none() || self.overlay.is_empty() {
            return Ok(());
        }
        self.flush_sum(tx)?;
        if let Some(t) = &mut self.tallies {
            t.flush(self.def.name, tx, &self.overlay)?;
        }
        {
            let mut t = tx.open_table(self.def.raw())?;
            let mut cache = self.cache.lock();
            for (k, v) in std::mem::take(&mut self.overlay) {
                let kb = k.to_bytes();
                match v {
                    Some(v) => {
                        let vb = codec::encode_record(self.def.version, &*v);
                        t.insert(kb.as_slice(), vb.as_slice())?;
                        cache.put(k, v, self.def.weight(kb.len(), vb.len()));
                    }
                    None => {
                        t.remove(kb.as_slice())?;
                        cache.pop(&k);
                    }
                }
            }
        }
        tx.open_table(COUNTS)?.insert(self.def.name, self.len)?;
        Ok(())
    }

    /// Moves a memory table's records into `store` through `tx` (a state read from a JSON
    /// snapshot being written out); the table then reads from the store, caching up to
    /// `cache` bytes.
    pub fn write_out(
        &mut self,
        store: Arc<Store>,
        tx: &WriteTransaction,
        cache: usize,
    ) -> Result<(), redb::Error> {
        let rows = std::mem::take(&mut self.overlay);
        let summary = self.summary.take().map(|s| s.of);
        let tallies = match self.tallies.take() {
            Some(t) => Some(Tallies::write_out(
                t.of,
                self.def.name,
                tx,
                rows.values().flatten().cloned(),
            )?),
            None => None,
        };
        *self = Self::open_empty(self.def, store, cache);
        self.tallies = tallies;
        let mut t = tx.open_table(self.def.raw())?;
        t.retain(|_, _| false)?;
        let mut n = 0u64;
        let mut sum = [0; SUM_WIDTH];
        for (k, v) in rows {
            if let Some(v) = v {
                if let Some(of) = summary {
                    add(&mut sum, of(&v));
                }
                let vb = codec::encode_record(self.def.version, &*v);
                t.insert(k.to_bytes().as_slice(), vb.as_slice())?;
                n += 1;
            }
        }
        drop(t);
        self.len = n;
        tx.open_table(COUNTS)?.insert(self.def.name, n)?;
        if let Some(of) = summary {
            tx.open_table(SUMS.raw())?
                .insert(self.def.name.as_bytes(), sum_bytes(&sum).as_slice())?;
            self.summary = Some(Summary {
                of,
                sum,
                pending: Default::default(),
                changed: false,
            });
        }
        Ok(())
    }

    fn open_empty(def: TableDef, store: Arc<Store>, cache: usize) -> Self {
        Self {
            def,
            store: Some(store),
            overlay: BTreeMap::new(),
            cache: Mutex::new(Cache::new(cache)),
            len: 0,
            stats: CacheStats::default(),
            summary: None,
            tallies: None,
        }
    }
}

type DiskRange = Peekable<redb::Range<'static, &'static [u8], &'static [u8]>>;

/// A table's records in key order: the overlay's merged over the store's.
pub struct Merge<'a, K: Key, V: Record> {
    table: &'a Table<K, V>,
    overlay: Peekable<btree_map::Range<'a, K, Option<Arc<V>>>>,
    disk: Option<DiskRange>,
}

impl<K: Key, V: Record> Merge<'_, K, V> {
    fn next_disk(&mut self) -> Option<(K, Arc<V>)> {
        let item = self.disk.as_mut()?.next()?;
        let (k, v) = item.unwrap_or_else(|e| fatal(self.table.def.name, e));
        let (k, v) = self.table.decode(k.value(), v.value());
        Some((k, Arc::new(v)))
    }
}

impl<K: Key, V: Record> Iterator for Merge<'_, K, V> {
    type Item = (K, Arc<V>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let disk_key = match self.disk.as_mut().and_then(|d| d.peek()) {
                Some(Ok((k, _))) => {
                    Some(K::decode(k.value()).unwrap_or_else(|e| fatal(self.table.def.name, e)))
                }
                Some(Err(_)) => return self.next_disk(),
                None => None,
            };
            let over = self.overlay.peek().map(|(k, _)| *k);
            let from_overlay = match (over, disk_key.as_ref()) {
                (None, None) => return None,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some(o), Some(d)) => {
                    if o == d {
                        // The overlay's change replaces the stored record.
                        self.disk.as_mut().and_then(Iterator::next);
                    }
                    o <= d
                }
            };
            if !from_overlay {
                return self.next_disk();
            }
            if let (k, Some(v)) = self.overlay.next()? {
                return Some((k.clone(), v.clone()));
            }
        }
    }
}

/// Serializes as a sequence of `(key, record)` pairs (the JSON snapshot).
impl<K: Key + serde::Serialize, V: Record> serde::Serialize for Table<K, V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter().map(|(k, v)| (k, V::clone(&v))))
    }
}

impl<K: Key, V: Record> std::fmt::Debug for Table<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("name", &self.def.name)
            .field("len", &self.len)
            .field("changed", &self.overlay.len())
            .finish()
    }
}

impl<K: Key, V: Record> Table<K, V> {
    /// A memory table holding `rows`.
    pub fn from_rows(def: TableDef, rows: impl IntoIterator<Item = (K, V)>) -> Self {
        let mut t = Self::memory(def);
        for (k, v) in rows {
            t.insert(k, v);
        }
        t
    }
}

/// A memory table `def` from a JSON snapshot's field: a sequence of `(key, record)` pairs, or
/// the map an older snapshot wrote (its keys as JSON strings, as serde_json writes integers).
pub fn rows<'de, D, K, V>(def: TableDef, d: D) -> Result<Table<K, V>, D::Error>
where
    D: serde::Deserializer<'de>,
    K: Key + serde::Deserialize<'de>,
    V: Record,
{
    struct Rows<K, V>(std::marker::PhantomData<(K, V)>);
    impl<'de, K: serde::Deserialize<'de>, V: serde::Deserialize<'de>> serde::de::Visitor<'de>
        for Rows<K, V>
    {
        type Value = Vec<(K, V)>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a sequence of (key, record) pairs or a map")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut a: A,
        ) -> Result<Self::Value, A::Error> {
            let mut v = Vec::new();
            while let Some(row) = a.next_element()? {
                v.push(row);
            }
            Ok(v)
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut a: A,
        ) -> Result<Self::Value, A::Error> {
            let mut v = Vec::new();
            while let Some(row) = a.next_entry()? {
                v.push(row);
            }
            Ok(v)
        }
    }
    let rows = d.deserialize_any(Rows::<K, V>(std::marker::PhantomData))?;
    Ok(Table::from_rows(def, rows))
}

/// A copy in memory (for the JSON snapshot of a state that still has one).
impl<K: Key, V: Record> Clone for Table<K, V> {
    fn clone(&self) -> Self {
        Self::from_rows(self.def, self.iter().map(|(k, v)| (k, (*v).clone())))
    }
}

impl<K: Key, V: Record + PartialEq> PartialEq for Table<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().zip(other.iter()).all(|(a, b)| a == b)
    }
}

impl<K: Key, V: Record + Eq> Eq for Table<K, V> {}

#[cfg(test)]
mod tests;
