//! Property test: random operation sequences against a naive model (a map of byte vectors),
//! with power cuts injected at random points through the fault-injecting disk.
//!
//! After every recovery the store must equal the model's acknowledged state, up to the
//! operations in flight at the cut: each of those either happened entirely or not at all.
//! `PROPTEST_CASES` sets the number of sequences (default 40; the soak runs more).

mod common;
use cairn_chunkstore::{
    ChunkStore, CrashPolicy, Disk, Error, FaultConfig, FaultDisk, FormatOptions, OpenOptions,
};
use common::pattern;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const EXTENT: u64 = 256 * 1024;
const CAPACITY: u64 = 40 * EXTENT;
const MAX_CHUNK: u64 = 2 << 20;
const IDS: u8 = 4;

/// Coverage probes: proof that the rare paths ran (an unacknowledged append that survived a
/// crash, one that was lost, an acknowledged append checked after a crash).
static UNACKED_SURVIVED: AtomicU64 = AtomicU64::new(0);
static UNACKED_LOST: AtomicU64 = AtomicU64::new(0);
static ACKED_CHECKED_AFTER_CRASH: AtomicU64 = AtomicU64::new(0);
/// Bursts in which an append continued a unit left open by another append of its batch.
static CHAINED: AtomicU64 = AtomicU64::new(0);
/// Large appends acknowledged, and crashes whose recovery had to follow one it never saw
/// checkpointed.
static LARGE: AtomicU64 = AtomicU64::new(0);
/// Creates with a first append acknowledged, with and without a crash right after.
static CREATED_WITH_APPEND: AtomicU64 = AtomicU64::new(0);
static CREATED_WITH_APPEND_THEN_CRASH: AtomicU64 = AtomicU64::new(0);
/// Metadata operations of a crash scenario that their caller ran itself (the device thread
/// idle), the power cut falling before, in or after them.
static ALONE_IN_CRASH: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Clone)]
enum Meta {
    Create(u8),
    /// A create with its first append, in one batch.
    CreateAppend(u8, u32),
    Seal(u8),
    Delete(u8),
}

#[derive(Debug, Clone)]
enum Op {
    Create(u8),
    /// A create with its first append, in one batch.
    CreateAppend(u8, u32),
    Append {
        id: u8,
        len: u32,
        wrong_offset: bool,
    },
    Seal(u8),
    /// Seal at `f / 65536` of the chunk's length (a quorum's length, maybe shorter).
    SealAt(u8, u16),
    Delete(u8),
    Read {
        id: u8,
        at: u32,
        len: u16,
    },
    Checkpoint,
    /// Pipelined appends to several chunks, sharing group commits.
    Burst(Vec<(u8, u32)>),
    /// A burst and a metadata operation with the power cut after `after_ops` device
    /// operations, then recovery from what a crash leaves (`seed` picks the fate of each
    /// unsynced write).
    Crash {
        after_ops: u8,
        seed: u64,
        burst: Vec<(u8, u32)>,
        meta: Option<Meta>,
    },
    CleanReopen,
}

fn op() -> impl Strategy<Value = Op> {
    let id = 0..IDS;
    // Mostly small appends; now and then a large one (docs/formats/chunk-store.md §3.2),
    // which crosses extents here (256 KiB).
    let len = prop_oneof![12 => 1u32..20_000, 1 => 524_288u32..900_000];
    let burst_len = prop_oneof![10 => 1u32..12_000, 1 => 524_288u32..800_000];
    let burst = proptest::collection::vec((0..IDS, burst_len), 1..8);
    let meta = prop_oneof![
        (0..IDS).prop_map(Meta::Create),
        (0..IDS, 1u32..20_000).prop_map(|(id, len)| Meta::CreateAppend(id, len)),
        (0..IDS).prop_map(Meta::Seal),
        (0..IDS).prop_map(Meta::Delete),
    ];
    prop_oneof![
        3 => id.clone().prop_map(Op::Create),
        2 => (id.clone(), len.clone()).prop_map(|(id, len)| Op::CreateAppend(id, len)),
        8 => (id.clone(), len, proptest::bool::weighted(0.1)).prop_map(|(id, len, wrong_offset)| Op::Append { id, len, wrong_offset }),
        1 => id.clone().prop_map(Op::Seal),
        1 => (id.clone(), any::<u16>()).prop_map(|(id, f)| Op::SealAt(id, f)),
        1 => id.clone().prop_map(Op::Delete),
        2 => (id.clone(), 0u32..2_000_000, any::<u16>()).prop_map(|(id, at, len)| Op::Read { id, at, len }),
        1 => Just(Op::Checkpoint),
        3 => burst.clone().prop_map(Op::Burst),
        3 => (0u8..16, any::<u64>(), burst, proptest::option::of(meta)).prop_map(|(after_ops, seed, burst, meta)| Op::Crash { after_ops, seed, burst, meta }),
        1 => Just(Op::CleanReopen),
    ]
}

#[derive(Debug, Clone, Default, PartialEq)]
struct MChunk {
    data: Vec<u8>,
    sealed: bool,
}

type Model = BTreeMap<u64, MChunk>;

struct Harness {
    disk: Arc<FaultDisk>,
    store: Option<ChunkStore>,
    model: Model,
    generation: u64,
}

impl Harness {
    fn new() -> Self {
        let disk = Arc::new(FaultDisk::new(CAPACITY, 512, 0));
        let opts = FormatOptions {
            log_bytes: Some(EXTENT),
            extent_bytes: EXTENT as u32,
            max_chunk_bytes: MAX_CHUNK,
            ..Default::default()
        };
        ChunkStore::format(&*disk, &opts).unwrap();
        let mut h = Self {
            disk,
            store: None,
            model: Model::new(),
            generation: 0,
        };
        h.open_image(None);
        h
    }

    fn store(&self) -> &ChunkStore {
        self.store.as_ref().unwrap()
    }

    fn open_image(&mut self, image: Option<Vec<u8>>) {
        self.store = None;
        if let Some(image) = image {
            self.generation += 1;
            self.disk = Arc::new(FaultDisk::from_image(image, 512, self.generation));
        }
        let (store, _) =
            ChunkStore::open(self.disk.clone() as Arc<dyn Disk>, OpenOptions::default())
                .expect("recovery must succeed");
        self.store = Some(store);
    }

    fn run(&mut self, op: Op) -> Result<(), String> {
        match op {
            Op::Create(id) => {
                let r = self.store().create(id as u64, 1);
                let expect_exists = self.model.contains_key(&(id as u64));
                match r {
                    Ok(()) if !expect_exists => {
                        self.model.insert(id as u64, MChunk::default());
                    }
                    Err(Error::AlreadyExists { .. }) if expect_exists => {}
                    other => return Err(format!("create {id}: {other:?}")),
                }
            }
            Op::CreateAppend(id, len) => {
                let id64 = id as u64;
                let data = pattern(id64, 0, len as usize);
                let r = self.store().create_with_append(id64, 1, &data);
                let existed = self.model.contains_key(&id64);
                match r {
                    Ok(end) if !existed && end == len as u64 => {
                        CREATED_WITH_APPEND.fetch_add(1, Ordering::Relaxed);
                        self.model.insert(
                            id64,
                            MChunk {
                                data,
                                sealed: false,
                            },
                        );
                    }
                    Err(Error::AlreadyExists { .. }) if existed => {}
                    // Created; the append found no room.
                    Err(Error::NoSpace) if !existed => {
                        self.model.insert(id64, MChunk::default());
                    }
                    other => return Err(format!("create {id} with {len} bytes: {other:?}")),
                }
            }
            Op::Append {
                id,
                len,
                wrong_offset,
            } => {
                let id64 = id as u64;
                let cur = self.model.get(&id64).map(|c| c.data.len() as u64);
                let offset = cur.unwrap_or(0) + wrong_offset as u64;
                let data = pattern(id64, offset, len as usize);
                let r = self.store().append(id64, offset, &data);
                match (self.model.get_mut(&id64), r) {
                    (None, Err(Error::NotFound { .. })) => {}
                    (Some(c), Err(Error::Sealed { .. })) if c.sealed => {}
                    (Some(c), Err(Error::OffsetMismatch { length, .. }))
                        if wrong_offset && length == c.data.len() as u64 => {}
                    (Some(c), Err(Error::ChunkFull { .. }))
                        if c.data.len() as u64 + len as u64 > MAX_CHUNK => {}
                    (Some(_), Err(Error::NoSpace)) => {}
                    (Some(c), Ok(end))
                        if !c.sealed && !wrong_offset && end == offset + len as u64 =>
                    {
                        c.data.extend_from_slice(&data)
                    }
                    (_, other) => return Err(format!("append {id} @{offset}+{len}: {other:?}")),
                }
            }
            Op::Seal(id) => match (
                self.model.get_mut(&(id as u64)),
                self.store.as_ref().unwrap().seal(id as u64),
            ) {
                (None, Err(Error::NotFound { .. })) => {}
                (Some(c), Ok(stat)) if stat.length == c.data.len() as u64 => c.sealed = true,
                (_, other) => return Err(format!("seal {id}: {other:?}")),
            },
            Op::SealAt(id, f) => {
                let key = id as u64;
                let cur = self
                    .model
                    .get(&key)
                    .map(|c| (c.data.len() as u64, c.sealed));
                let at = cur.map_or(0, |(len, _)| len * u64::from(f) / 65536);
                match (cur, self.store().seal_at(key, at)) {
                    (None, Err(Error::NotFound { .. })) => {}
                    (Some((len, true)), Err(Error::Sealed { length, .. }))
                        if at != len && length == len => {}
                    (Some(_), Ok(stat)) if stat.length == at && stat.sealed => {
                        let c = self.model.get_mut(&key).expect("present");
                        c.data.truncate(at as usize);
                        c.sealed = true;
                        if stat.crc32c != crc32c::crc32c(&c.data) {
                            return Err(format!("seal_at {id}: crc {:#x}", stat.crc32c));
                        }
                    }
                    (_, other) => return Err(format!("seal_at {id} {at}: {other:?}")),
                }
            }
            Op::Delete(id) => match (
                self.model.contains_key(&(id as u64)),
                self.store().delete(id as u64),
            ) {
                (false, Err(Error::NotFound { .. })) => {}
                (true, Ok(())) => {
                    self.model.remove(&(id as u64));
                }
                (_, other) => return Err(format!("delete {id}: {other:?}")),
            },
            Op::Read { id, at, len } => {
                let id64 = id as u64;
                let r = self.store().read(id64, at as u64, len as usize);
                match (self.model.get(&id64), r) {
                    (None, Err(Error::NotFound { .. })) => {}
                    (Some(c), Err(Error::OutOfRange { .. }))
                        if at as usize + len as usize > c.data.len() => {}
                    (Some(c), Ok(bytes))
                        if bytes[..] == c.data[at as usize..at as usize + len as usize] => {}
                    (_, other) => {
                        return Err(format!(
                            "read {id} @{at}+{len}: {:?}",
                            other.map(|b| b.len())
                        ));
                    }
                }
            }
            Op::Checkpoint => self
                .store()
                .checkpoint()
                .map_err(|e| format!("checkpoint: {e}"))?,
            Op::Burst(burst) => {
                for (id, outcome) in self.burst(&burst) {
                    let c = self
                        .model
                        .get_mut(&id)
                        .expect("burst only targets live chunks");
                    match outcome {
                        (data, Ok(_)) => c.data.extend_from_slice(&data),
                        (_, Err(Error::ChunkFull { .. } | Error::NoSpace)) => {}
                        (_, Err(e)) => return Err(format!("burst append {id}: {e}")),
                    }
                }
            }
            Op::Crash {
                after_ops,
                seed,
                burst,
                meta,
            } => self.crash(after_ops, seed, &burst, meta)?,
            Op::CleanReopen => {
                self.store
                    .take()
                    .unwrap()
                    .close()
                    .map_err(|e| format!("close: {e}"))?;
                let image = self.disk.crash(CrashPolicy::DropAll);
                self.open_image(Some(image));
            }
        }
        check(self.store(), &self.model)
    }

    /// Submits pipelined appends (in order, per chunk) to live unsealed chunks, then waits.
    #[allow(clippy::type_complexity)]
    fn burst(&self, burst: &[(u8, u32)]) -> Vec<(u64, (Vec<u8>, Result<u64, Error>))> {
        let mut ends: BTreeMap<u64, u64> = BTreeMap::new();
        let mut pending = Vec::new();
        for &(id, len) in burst {
            let id = id as u64;
            let Some(c) = self.model.get(&id).filter(|c| !c.sealed) else {
                continue;
            };
            let off = *ends.entry(id).or_insert(c.data.len() as u64);
            if off + len as u64 > MAX_CHUNK {
                continue;
            }
            let data = pattern(id, off, len as usize);
            ends.insert(id, off + len as u64);
            match self.store().append_pipelined(id, off, &data) {
                Ok(p) => pending.push((id, data, p)),
                Err(e) => panic!("submit: {e}"),
            }
        }
        let before = self.store().stats().chained_appends.load(Ordering::Relaxed);
        let large_before = self.store().stats().large_appends.load(Ordering::Relaxed);
        let out = pending
            .into_iter()
            .map(|(id, data, p)| (id, (data, p.wait())))
            .collect();
        if self.store().stats().chained_appends.load(Ordering::Relaxed) > before {
            CHAINED.fetch_add(1, Ordering::Relaxed);
        }
        LARGE.fetch_add(
            self.store().stats().large_appends.load(Ordering::Relaxed) - large_before,
            Ordering::Relaxed,
        );
        out
    }

    fn crash(
        &mut self,
        after_ops: u8,
        seed: u64,
        burst: &[(u8, u32)],
        meta: Option<Meta>,
    ) -> Result<(), String> {
        self.disk.set_faults(FaultConfig {
            power_cut_after_ops: Some(after_ops as u64),
            ..Default::default()
        });
        let outcomes = self.burst(burst);
        let alone0 = self.store().stats().alone_batches.load(Ordering::Relaxed);
        let meta_result = meta.clone().map(|m| match m {
            Meta::Create(id) => self.store().create(id as u64, 1).map(|_| ()),
            Meta::CreateAppend(id, len) => self
                .store()
                .create_with_append(id as u64, 1, &pattern(id as u64, 0, len as usize))
                .map(|_| ()),
            Meta::Seal(id) => self.store().seal(id as u64).map(|_| ()),
            Meta::Delete(id) => self.store().delete(id as u64),
        });
        if self.store().stats().alone_batches.load(Ordering::Relaxed) > alone0 {
            ALONE_IN_CRASH.fetch_add(1, Ordering::Relaxed);
        }
        // Power is cut now if it was not already; what survives is up to the crash policy.
        self.disk.power_off();
        let image = self.disk.crash(CrashPolicy::Random { seed });
        self.open_image(Some(image));

        // Appends: the acknowledged ones are certain; the others may have landed, whole, in order.
        // Per chunk: (acknowledged appends, unacknowledged appends), in submission order.
        type Appends = (Vec<Vec<u8>>, Vec<Vec<u8>>);
        let mut per_chunk: BTreeMap<u64, Appends> = BTreeMap::new();
        for (id, (data, r)) in outcomes {
            let e = per_chunk.entry(id).or_default();
            match r {
                Ok(_) if e.1.is_empty() => e.0.push(data),
                Ok(_) => {
                    return Err(format!(
                        "chunk {id}: an append was acknowledged after an earlier one failed"
                    ));
                }
                Err(_) => e.1.push(data),
            }
        }
        // Metadata in flight.
        let mut meta_maybe: Option<Meta> = None;
        if let (Some(m), Some(r)) = (meta, meta_result) {
            match r {
                Ok(()) => match m {
                    Meta::Create(id) => {
                        self.model.entry(id as u64).or_default();
                    }
                    Meta::CreateAppend(id, len) => {
                        if self.model.contains_key(&(id as u64)) {
                            return Err(format!(
                                "create {id}: acknowledged over an existing chunk"
                            ));
                        }
                        let data = pattern(id as u64, 0, len as usize);
                        self.model.insert(
                            id as u64,
                            MChunk {
                                data,
                                sealed: false,
                            },
                        );
                        CREATED_WITH_APPEND_THEN_CRASH.fetch_add(1, Ordering::Relaxed);
                    }
                    Meta::Seal(id) => {
                        if let Some(c) = self.model.get_mut(&(id as u64)) {
                            c.sealed = true;
                        }
                    }
                    Meta::Delete(id) => {
                        self.model.remove(&(id as u64));
                    }
                },
                Err(_) => meta_maybe = Some(m),
            }
        }
        for (id, (acked, maybe)) in per_chunk {
            let Some(c) = self.model.get_mut(&id) else {
                continue;
            };
            for d in acked {
                c.data.extend_from_slice(&d);
                ACKED_CHECKED_AFTER_CRASH.fetch_add(1, Ordering::Relaxed);
            }
            // The store's length must be the acknowledged end plus a whole number of the
            // unacknowledged appends, in order.
            let got = match self.store.as_ref().unwrap().stat(id) {
                Ok(s) => s.length,
                Err(_) if matches!(meta_maybe, Some(Meta::Delete(m)) if m as u64 == id) => continue,
                Err(e) => return Err(format!("chunk {id} lost after crash: {e}")),
            };
            let mut ok_lengths = vec![c.data.len() as u64];
            for d in &maybe {
                ok_lengths.push(ok_lengths.last().unwrap() + d.len() as u64);
            }
            let Some(k) = ok_lengths.iter().position(|&l| l == got) else {
                return Err(format!(
                    "chunk {id}: recovered length {got}, allowed {ok_lengths:?}"
                ));
            };
            UNACKED_SURVIVED.fetch_add(k as u64, Ordering::Relaxed);
            UNACKED_LOST.fetch_add((maybe.len() - k) as u64, Ordering::Relaxed);
            for d in maybe.into_iter().take(k) {
                c.data.extend_from_slice(&d);
            }
        }
        if let Some(m) = meta_maybe {
            match m {
                Meta::Create(id) => {
                    if self.store().stat(id as u64).is_ok() {
                        self.model.entry(id as u64).or_default();
                    }
                }
                // Not acknowledged: the chunk may be there, empty or with the whole append.
                Meta::CreateAppend(id, len) if !self.model.contains_key(&(id as u64)) => {
                    if let Ok(st) = self.store().stat(id as u64) {
                        let data = if st.length == len as u64 {
                            pattern(id as u64, 0, len as usize)
                        } else if st.length == 0 {
                            Vec::new()
                        } else {
                            return Err(format!(
                                "create {id} with {len} bytes, unacknowledged: recovered {} bytes",
                                st.length
                            ));
                        };
                        self.model.insert(
                            id as u64,
                            MChunk {
                                data,
                                sealed: false,
                            },
                        );
                    }
                }
                Meta::CreateAppend(..) => {}
                Meta::Seal(id) => {
                    if let (Some(c), Ok(s)) = (
                        self.model.get_mut(&(id as u64)),
                        self.store.as_ref().unwrap().stat(id as u64),
                    ) {
                        c.sealed = s.sealed;
                    }
                }
                Meta::Delete(id) => {
                    if self.store().stat(id as u64).is_err() {
                        self.model.remove(&(id as u64));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The store equals the model: same chunks, lengths, seal state, bytes and CRCs.
fn check(store: &ChunkStore, model: &Model) -> Result<(), String> {
    let ids: Vec<u64> = model.keys().copied().collect();
    if store.list() != ids {
        return Err(format!("chunks {:?}, model {:?}", store.list(), ids));
    }
    for (&id, c) in model {
        let s = store.stat(id).map_err(|e| format!("stat {id}: {e}"))?;
        if s.length != c.data.len() as u64 || s.sealed != c.sealed {
            return Err(format!(
                "chunk {id}: store {s:?}, model length {} sealed {}",
                c.data.len(),
                c.sealed
            ));
        }
        let bytes = store
            .read(id, 0, c.data.len())
            .map_err(|e| format!("read {id}: {e}"))?;
        if bytes != c.data {
            return Err(format!("chunk {id}: bytes differ"));
        }
        if s.crc32c != crc32c::crc32c(&c.data) {
            return Err(format!("chunk {id}: crc differs"));
        }
        // A read without the copy hands out the same bytes and the CRC of exactly them,
        // combined from the CRCs they were verified against: whole, and a middle part that
        // starts and ends inside units or data slots.
        let n = c.data.len();
        for (a, b) in [(0, n), (n / 3, n - n / 3)] {
            let r = store
                .read_buf(id, a as u64, b - a)
                .map_err(|e| format!("read_buf {id} {a}..{b}: {e}"))?;
            if r.to_vec() != c.data[a..b] {
                return Err(format!("chunk {id}: read_buf {a}..{b}: bytes differ"));
            }
            if r.crc32c() != crc32c::crc32c(&c.data[a..b]) {
                return Err(format!("chunk {id}: read_buf {a}..{b}: crc differs"));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(40),
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    })]

    #[test]
    fn store_matches_model_across_crashes(ops in proptest::collection::vec(op(), 1..60)) {
        let mut h = Harness::new();
        for (i, op) in ops.into_iter().enumerate() {
            let desc = format!("{op:?}");
            if let Err(e) = h.run(op) {
                return Err(TestCaseError::fail(format!("step {i} ({desc}): {e}")));
            }
        }
    }
}

/// Canary: the checker must notice when the store serves something other than the model.
/// If this test ever passes trivially, the property test above proves nothing.
#[test]
fn canary_checker_detects_corrupted_acknowledged_bytes() {
    let mut h = Harness::new();
    h.run(Op::Create(1)).unwrap();
    h.run(Op::Append {
        id: 1,
        len: 5000,
        wrong_offset: false,
    })
    .unwrap();
    assert!(check(h.store(), &h.model).is_ok());
    // Flip one bit in every data extent's first unit: whichever holds chunk 1 is now corrupt.
    let image = h.disk.snapshot();
    let data_start = h.store().data_offset();
    for e in 0..(image.len() as u64 - data_start) / EXTENT {
        h.disk.flip_bit(data_start + e * EXTENT + 100, 3);
    }
    assert!(
        check(h.store(), &h.model).is_err(),
        "checker missed a flipped bit"
    );
    // And a model that claims one more byte than the store holds.
    let mut h2 = Harness::new();
    h2.run(Op::Create(1)).unwrap();
    h2.model.get_mut(&1).unwrap().data.push(0);
    assert!(
        check(h2.store(), &h2.model).is_err(),
        "checker missed a lost byte"
    );
}

/// The crash paths above must really run: with a fixed seed, 150 sequences must include
/// unacknowledged appends that survived, ones that were lost, and acknowledged ones checked
/// after a crash.
#[test]
fn crash_paths_are_exercised() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = proptest::collection::vec(op(), 1..60);
    for _ in 0..150 {
        let ops = strategy.new_tree(&mut runner).unwrap().current();
        let mut h = Harness::new();
        for op in ops {
            h.run(op).unwrap();
        }
    }
    let probes = [
        &UNACKED_SURVIVED,
        &UNACKED_LOST,
        &ACKED_CHECKED_AFTER_CRASH,
        &CHAINED,
        &LARGE,
        &CREATED_WITH_APPEND,
        &CREATED_WITH_APPEND_THEN_CRASH,
        &ALONE_IN_CRASH,
    ]
    .map(|p| p.load(Ordering::Relaxed));
    assert!(
        probes.iter().all(|&n| n > 0),
        "probes (survived, lost, acked checked, chained in a batch, large, created with an \
         append, that and a crash, run by its caller in a crash) = {probes:?}"
    );
}
