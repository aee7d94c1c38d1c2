use super::*;
use redb::backends::InMemoryBackend;

const T: TableDef = TableDef::new("test", 1);

/// A store in memory, for tests.
pub(super) fn store() -> Arc<Store> {
    let db = Database::builder()
        .create_with_backend(InMemoryBackend::new())
        .unwrap();
    Store::new(Arc::new(db))
}

fn flush(store: &Store, t: &mut Table<(String, String), u64>) {
    let tx = store.db().begin_write().unwrap();
    t.flush(&tx).unwrap();
    tx.commit().unwrap();
    store.committed();
}

/// A table over the store and a BTreeMap see the same operations and must agree at every
/// step, with flushes at random points (the overlay merged over the store).
#[test]
fn a_stored_table_behaves_as_a_map() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let s = store();
    let mut t: Table<(String, String), u64> = Table::open(T, s.clone(), 4).unwrap();
    let mut mem: Table<(String, String), u64> = Table::memory(T);
    let mut model = BTreeMap::new();
    let key = |rng: &mut rand::rngs::StdRng| {
        (
            ["a", "b", "a\0"][rng.random_range(0..3)].to_owned(),
            format!("{}", rng.random_range(0..40)),
        )
    };
    for step in 0..4000u64 {
        let k = key(&mut rng);
        match rng.random_range(0..10) {
            0..=3 => {
                let a = t.insert(k.clone(), step).map(|v| *v);
                let b = mem.insert(k.clone(), step).map(|v| *v);
                assert_eq!(a, model.insert(k.clone(), step));
                assert_eq!(b, a);
            }
            4..=5 => {
                let a = t.remove(&k).map(|v| *v);
                assert_eq!(mem.remove(&k).map(|v| *v), a);
                assert_eq!(a, model.remove(&k));
            }
            6 => {
                if let Some(v) = t.get_mut(&k) {
                    *v += 1;
                }
                if let Some(v) = mem.get_mut(&k) {
                    *v += 1;
                }
                if let Some(v) = model.get_mut(&k) {
                    *v += 1;
                }
            }
            7 => flush(&s, &mut t),
            _ => {
                let lo = key(&mut rng);
                let want: Vec<_> = model
                    .range(lo.clone()..)
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                let got: Vec<_> = t.range(lo.clone()..).map(|(k, v)| (k, *v)).collect();
                let got_mem: Vec<_> = mem.range(lo..).map(|(k, v)| (k, *v)).collect();
                assert_eq!(got, want);
                assert_eq!(got_mem, want);
            }
        }
        assert_eq!(t.get(&k).map(|v| *v), model.get(&k).copied());
        assert_eq!(t.len(), model.len() as u64);
        assert_eq!(mem.len(), model.len() as u64);
    }
    flush(&s, &mut t);
    // Reopened, the table has what was flushed, counted.
    let again: Table<(String, String), u64> = Table::open(T, s, 4).unwrap();
    assert_eq!(again.len(), model.len() as u64);
    let all: Vec<_> = again.iter().map(|(k, v)| (k, *v)).collect();
    assert_eq!(all, model.into_iter().collect::<Vec<_>>());
    assert!(again.stats().misses.load(Ordering::Relaxed) == 0);
}

#[test]
fn a_memory_table_writes_out_into_a_store() {
    let s = store();
    let mut t: Table<(String, String), u64> = Table::from_rows(
        T,
        [
            (("b".into(), "k".into()), 1u64),
            (("a".into(), "k".into()), 2),
        ],
    );
    let tx = s.db().begin_write().unwrap();
    t.write_out(s.clone(), &tx, 16).unwrap();
    tx.commit().unwrap();
    s.committed();
    let again: Table<(String, String), u64> = Table::open(T, s, 16).unwrap();
    assert_eq!(again.len(), 2);
    assert_eq!(again.get(&("a".into(), "k".into())).map(|v| *v), Some(2));
    assert_eq!(again.get(&("a".into(), "x".into())), None);
}

/// What a u64 record adds to the test tallies: its value and 1, at `value % 5`.
fn tally_of(v: &u64, f: &mut dyn FnMut(u64, Tally)) {
    f(*v % 5, [*v, 1]);
    if v.is_multiple_of(7) {
        f(*v % 5, [1, 0]); // a key twice: they add up
    }
}

fn recount(model: &BTreeMap<(String, String), u64>) -> Vec<Tally> {
    let mut want = vec![[0u64; TALLY_WIDTH]; 5];
    for v in model.values() {
        tally_of(v, &mut |k, t| {
            want[k as usize][0] += t[0];
            want[k as usize][1] += t[1];
        });
    }
    want
}

fn tallies(t: &Table<(String, String), u64>) -> Vec<Tally> {
    (0..5).map(|k| t.tally(k)).collect()
}

/// Tallies follow inserts, removes, changes in place and flushes (stored and in memory),
/// are read back from the store, are counted over a table stored without them, and are
/// written out with a memory table.
#[test]
fn tallies_equal_a_recount_at_every_step() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let s = store();
    let mut t: Table<(String, String), u64> =
        Table::open(T, s.clone(), 4).unwrap().tallied(tally_of);
    let mut mem: Table<(String, String), u64> = Table::memory(T).tallied(tally_of);
    let mut model = BTreeMap::new();
    for step in 0..3000u64 {
        let k = (
            ["a", "b"][rng.random_range(0..2)].to_owned(),
            format!("{}", rng.random_range(0..30)),
        );
        match rng.random_range(0..8) {
            0..=2 => {
                t.insert(k.clone(), step);
                mem.insert(k.clone(), step);
                model.insert(k, step);
            }
            3 => {
                t.remove(&k);
                mem.remove(&k);
                model.remove(&k);
            }
            4..=5 => {
                let by = rng.random_range(1..4);
                for v in [t.get_mut(&k), mem.get_mut(&k), model.get_mut(&k)]
                    .into_iter()
                    .flatten()
                {
                    *v += by;
                }
            }
            _ => flush(&s, &mut t),
        }
        let want = recount(&model);
        assert_eq!(tallies(&t), want, "step {step}");
        let all: Vec<Tally> = (0..5)
            .map(|k| t.tallies().get(&k).copied().unwrap_or_default())
            .collect();
        assert_eq!(all, want, "step {step} (all)");
        assert_eq!(tallies(&mem), want, "step {step} (memory)");
    }
    flush(&s, &mut t);
    let want = recount(&model);
    let mem_want = want.clone();
    let again: Table<(String, String), u64> =
        Table::open(T, s.clone(), 4).unwrap().tallied(tally_of);
    assert_eq!(tallies(&again), want, "read back");
    // A store whose table was kept without tallies: counted when first tallied, then stored.
    let s2 = store();
    let mut plain: Table<(String, String), u64> = Table::open(T, s2.clone(), 4).unwrap();
    for (k, v) in &model {
        plain.insert(k.clone(), *v);
    }
    flush(&s2, &mut plain);
    let mut counted: Table<(String, String), u64> =
        Table::open(T, s2.clone(), 4).unwrap().tallied(tally_of);
    assert_eq!(tallies(&counted), want, "counted at open");
    let k = model.keys().next().unwrap().clone();
    *counted.get_mut(&k).unwrap() += 1;
    *model.get_mut(&k).unwrap() += 1;
    flush(&s2, &mut counted);
    let want = recount(&model);
    let stored: Table<(String, String), u64> = Table::open(T, s2, 4).unwrap().tallied(tally_of);
    assert_eq!(tallies(&stored), want, "stored after the first flush");
    // A memory table written out keeps its tallies, replacing what the store had.
    let s3 = store();
    let mut old: Table<(String, String), u64> =
        Table::open(T, s3.clone(), 4).unwrap().tallied(tally_of);
    old.insert(("z".into(), "z".into()), 4);
    flush(&s3, &mut old);
    let tx = s3.db().begin_write().unwrap();
    mem.write_out(s3.clone(), &tx, 16).unwrap();
    tx.commit().unwrap();
    s3.committed();
    assert_eq!(tallies(&mem), mem_want, "written out");
    let out: Table<(String, String), u64> = Table::open(T, s3, 4).unwrap().tallied(tally_of);
    assert_eq!(tallies(&out), mem_want, "written out, read back");
}
