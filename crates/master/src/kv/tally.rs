//! Tallies: counts by key that a table keeps of its records as they change ([`super::Table::tallied`]),
//! e.g. the bytes and extents of each segment the inodes name — so that "does any file name
//! segment S?" is one read, not a scan of every inode. Stored in table `tallies`
//! (docs/formats/master-state.md): key the table's name, a 0 byte and the tally's key (u64
//! big-endian), value [`TALLY_WIDTH`] u64s little-endian; a row keyed by the table's name alone
//! says its tallies are stored (without it they are counted once over the table when it is
//! opened). A zero tally has no row.
//!
//! A record lent by [`super::Table::get_mut`] is taken out of the tallies when lent and put back
//! (as it is then) at the next flush, as sums are.

use super::{Key, Store, TableDef, fatal};
use redb::{ReadableTable, WriteTransaction};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// How many numbers a tally has.
pub const TALLY_WIDTH: usize = 2;

/// A tally (e.g. bytes and extents).
pub type Tally = [u64; TALLY_WIDTH];

/// What a record adds to its table's tallies: `f(key, tally)` for each (a key may come twice:
/// they add up).
pub type TallyOf<V> = fn(&V, &mut dyn FnMut(u64, Tally));

/// The tallies of every tallied table.
pub const TALLIES: TableDef = TableDef::new("tallies", 1);

pub(super) struct Tallies<K, V> {
    pub(super) of: TallyOf<V>,
    /// Changes not in the store yet (everything, for a table without a store), wrapping: a
    /// key's delta may be "negative" until added to its stored tally.
    delta: BTreeMap<u64, Tally>,
    /// Records lent by `get_mut`: taken out already, put back at the next flush.
    pending: BTreeSet<K>,
    /// Counted by a scan at open: the marker row is written at the next flush.
    unmarked: bool,
}

fn row_key(table: &str, key: Option<u64>) -> Vec<u8> {
    let mut k = table.as_bytes().to_vec();
    if let Some(key) = key {
        k.push(0);
        key.encode(&mut k); // big-endian: numeric order
    }
    k
}

/// A tally's stored bytes.
pub fn tally_bytes(t: &Tally) -> Vec<u8> {
    super::sum::words_bytes(t)
}

/// A tally from its stored bytes (`None`: not [`TALLY_WIDTH`] × 8 bytes).
pub fn tally_from(b: &[u8]) -> Option<Tally> {
    super::sum::words_from(b)
}

/// `to` plus (or minus) `t`, wrapping: a delta may be "negative" until added to its tally.
fn add(to: &mut Tally, t: Tally, negate: bool) {
    for (x, y) in to.iter_mut().zip(t) {
        *x = if negate {
            x.wrapping_sub(y)
        } else {
            x.wrapping_add(y)
        };
    }
}

fn add_to(map: &mut BTreeMap<u64, Tally>, key: u64, t: Tally, negate: bool) {
    let d = map.entry(key).or_insert([0; TALLY_WIDTH]);
    add(d, t, negate);
    if *d == [0; TALLY_WIDTH] {
        map.remove(&key);
    }
}

/// Whether `table`'s tallies are in the store.
fn marked(store: &Store, table: &str) -> bool {
    let reader = store.reader();
    let t = match reader.open_table(TALLIES.raw()) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return false,
        Err(e) => fatal(TALLIES.name, e),
    };
    t.get(row_key(table, None).as_slice())
        .unwrap_or_else(|e| fatal(TALLIES.name, e))
        .is_some()
}

fn stored(store: &Store, table: &str, key: u64) -> Tally {
    let reader = store.reader();
    let t = match reader.open_table(TALLIES.raw()) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return [0; TALLY_WIDTH],
        Err(e) => fatal(TALLIES.name, e),
    };
    match t
        .get(row_key(table, Some(key)).as_slice())
        .unwrap_or_else(|e| fatal(TALLIES.name, e))
    {
        Some(v) => {
            tally_from(v.value()).unwrap_or_else(|| fatal(TALLIES.name, "a tally of bad length"))
        }
        None => [0; TALLY_WIDTH],
    }
}

impl<K: Key, V> Tallies<K, V> {
    /// The tallies of `table`: read from `store` when they are there, otherwise counted over
    /// `records` now.
    pub(super) fn open(
        of: TallyOf<V>,
        table: &str,
        store: Option<&Store>,
        records: impl Iterator<Item = Arc<V>>,
    ) -> Self {
        let mut t = Self {
            of,
            delta: BTreeMap::new(),
            pending: BTreeSet::new(),
            unmarked: false,
        };
        if store.is_some_and(|s| marked(s, table)) {
            return t;
        }
        for v in records {
            t.change(&v, false);
        }
        t.unmarked = store.is_some();
        t
    }

    fn change(&mut self, v: &V, negate: bool) {
        let delta = &mut self.delta;
        (self.of)(v, &mut |k, t| add_to(delta, k, t, negate));
    }

    /// `k`'s record `v` is lent for a change in place.
    pub(super) fn lend(&mut self, k: &K, v: &V) {
        if !self.pending.contains(k) {
            self.change(v, true);
            self.pending.insert(k.clone());
        }
    }

    /// `k`'s record `old` (if any) is replaced by `new`.
    pub(super) fn insert(&mut self, k: &K, old: Option<&V>, new: &V) {
        if let Some(old) = old
            && !self.pending.remove(k)
        {
            self.change(old, true);
        }
        self.change(new, false);
    }

    /// `k`'s record `old` is removed.
    pub(super) fn remove(&mut self, k: &K, old: &V) {
        if !self.pending.remove(k) {
            self.change(old, true);
        }
    }

    /// `key`'s tally: the store's, the changes since, and the lent records as they are now.
    pub(super) fn get(
        &self,
        table: &str,
        store: Option<&Store>,
        overlay: &BTreeMap<K, Option<Arc<V>>>,
        key: u64,
    ) -> Tally {
        let mut sum = store.map_or([0; TALLY_WIDTH], |s| stored(s, table, key));
        if let Some(d) = self.delta.get(&key) {
            add(&mut sum, *d, false);
        }
        for k in &self.pending {
            if let Some(Some(v)) = overlay.get(k) {
                (self.of)(v, &mut |k2, t| {
                    if k2 == key {
                        add(&mut sum, t, false);
                    }
                });
            }
        }
        sum
    }

    /// Every non-zero tally (for checks: it reads them all).
    pub(super) fn all(
        &self,
        table: &str,
        store: Option<&Store>,
        overlay: &BTreeMap<K, Option<Arc<V>>>,
    ) -> BTreeMap<u64, Tally> {
        let mut m = BTreeMap::new();
        if let Some(s) = store {
            let reader = s.reader();
            match reader.open_table(TALLIES.raw()) {
                Ok(t) => {
                    let lo = row_key(table, Some(0));
                    let hi = row_key(table, Some(u64::MAX));
                    for r in t
                        .range::<&[u8]>(lo.as_slice()..=hi.as_slice())
                        .unwrap_or_else(|e| fatal(TALLIES.name, e))
                    {
                        let (k, v) = r.unwrap_or_else(|e| fatal(TALLIES.name, e));
                        let key = u64::decode(&k.value()[lo.len() - 8..])
                            .unwrap_or_else(|e| fatal(TALLIES.name, e));
                        let t = tally_from(v.value())
                            .unwrap_or_else(|| fatal(TALLIES.name, "a tally of bad length"));
                        add_to(&mut m, key, t, false);
                    }
                }
                Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => fatal(TALLIES.name, e),
            }
        }
        for (k, d) in &self.delta {
            add_to(&mut m, *k, *d, false);
        }
        for k in &self.pending {
            if let Some(Some(v)) = overlay.get(k) {
                (self.of)(v, &mut |k2, t| add_to(&mut m, k2, t, false));
            }
        }
        m
    }

    /// Puts the lent records back, and writes the changes (and the marker) into `tx`.
    pub(super) fn flush(
        &mut self,
        table: &str,
        tx: &WriteTransaction,
        overlay: &BTreeMap<K, Option<Arc<V>>>,
    ) -> Result<(), redb::Error> {
        for k in std::mem::take(&mut self.pending) {
            if let Some(Some(v)) = overlay.get(&k) {
                let v = v.clone();
                self.change(&v, false);
            }
        }
        let mut t = tx.open_table(TALLIES.raw())?;
        for (key, d) in std::mem::take(&mut self.delta) {
            let rk = row_key(table, Some(key));
            let mut now = match t.get(rk.as_slice())? {
                Some(v) => tally_from(v.value())
                    .unwrap_or_else(|| fatal(TALLIES.name, "a tally of bad length")),
                None => [0; TALLY_WIDTH],
            };
            add(&mut now, d, false);
            if now == [0; TALLY_WIDTH] {
                t.remove(rk.as_slice())?;
            } else {
                t.insert(rk.as_slice(), tally_bytes(&now).as_slice())?;
            }
        }
        if std::mem::take(&mut self.unmarked) {
            t.insert(row_key(table, None).as_slice(), [].as_slice())?;
        }
        Ok(())
    }

    /// Writes tallies counted over `records` (a memory table being written out), replacing
    /// whatever `table` had stored.
    pub(super) fn write_out(
        of: TallyOf<V>,
        table: &str,
        tx: &WriteTransaction,
        records: impl Iterator<Item = Arc<V>>,
    ) -> Result<Self, redb::Error> {
        let mut t = Self {
            of,
            delta: BTreeMap::new(),
            pending: BTreeSet::new(),
            unmarked: true,
        };
        for v in records {
            t.change(&v, false);
        }
        {
            let mut rows = tx.open_table(TALLIES.raw())?;
            let prefix = row_key(table, None);
            rows.retain(|k, _| {
                !(k.starts_with(&prefix) && k.get(prefix.len()).is_none_or(|b| *b == 0))
            })?;
        }
        t.flush(table, tx, &BTreeMap::new())?;
        Ok(t)
    }
}
