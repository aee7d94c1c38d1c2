//! The nemesis's NBD workload: a client writing, trimming, flushing and reading a volume,
//! and the model of what each block may hold.

use super::*;

/// Blocks of the nemesis's volume (4 KiB each).
pub(super) const NBD_BLOCKS: u64 = 256;

/// What the nemesis's NBD client knows of its volume, block by block (block ids: 0 reads as
/// zeros): what is durable — the last answered write (a write is durable once answered: its
/// batch names its blocks) or what the last completed FLUSH left (several candidates when a
/// failed write before it may or may not have landed) — what was written or trimmed since
/// (answered or not; a trim is durable only at a FLUSH), and what the block holds now if that
/// is known (not after a failed request or a lost connection, until it is read).
pub(super) struct NbdModel {
    pub(super) durable: Vec<Vec<u64>>,
    pub(super) since: Vec<Vec<u64>>,
    pub(super) current: Vec<Option<u64>>,
    pub(super) next: u64,
}

impl NbdModel {
    pub(super) fn new() -> Self {
        let n = NBD_BLOCKS as usize;
        Self {
            durable: vec![vec![0]; n],
            since: vec![Vec::new(); n],
            current: vec![Some(0); n],
            next: 1,
        }
    }

    /// Whether block `b` may read as `id`.
    pub(super) fn allows(&self, b: usize, id: u64) -> bool {
        match self.current[b] {
            Some(v) => v == id,
            None => self.durable[b].contains(&id) || self.since[b].contains(&id),
        }
    }

    pub(super) fn written(&mut self, b: usize, id: u64, answered: bool) {
        if answered && id != 0 {
            // Durable now, and later than anything before it (a failed write that lands
            // anyway is in an earlier batch).
            self.durable[b] = vec![id];
            self.since[b].clear();
        } else {
            self.since[b].push(id);
        }
        self.current[b] = answered.then_some(id);
    }

    pub(super) fn flushed(&mut self) {
        for b in 0..self.durable.len() {
            let d = match self.current[b] {
                Some(v) => vec![v],
                None => {
                    let mut all = std::mem::take(&mut self.durable[b]);
                    all.append(&mut self.since[b]);
                    all.sort_unstable();
                    all.dedup();
                    all
                }
            };
            self.durable[b] = d;
            self.since[b].clear();
        }
    }

    /// Everything since the last completed FLUSH may or may not be there.
    pub(super) fn uncertain(&mut self) {
        self.current.iter_mut().for_each(|c| *c = None);
    }
}

/// The block side of the cluster: a `cairn nbd` process serving volume `nemesis`.
pub(super) struct Nbd {
    pub(super) proc: Proc,
    pub(super) model: Option<NbdModel>,
}

#[derive(Debug, Default)]
pub(super) struct NbdSeen {
    pub(super) writes: u64,
    pub(super) errors: u64,
    pub(super) checked: u64,
    pub(super) bad: u64,
    pub(super) unreadable: bool,
}

/// Reads the whole volume and checks every block against the model; learns what it read.
pub(super) fn nbd_check(
    c: &mut Raw,
    m: &mut NbdModel,
    seen: &mut NbdSeen,
    when: &str,
) -> std::io::Result<()> {
    let (err, data) = c.call(READ, 0, 0, (NBD_BLOCKS * 4096) as u32, &[])?;
    if err != 0 {
        seen.errors += 1;
        return Err(std::io::Error::other(format!("read: NBD error {err}")));
    }
    check_blocks(m, seen, 0, &data, when);
    Ok(())
}

/// Checks the blocks `data` holds from block `first` on against the model; learns them.
pub(super) fn check_blocks(
    m: &mut NbdModel,
    seen: &mut NbdSeen,
    first: usize,
    data: &[u8],
    when: &str,
) {
    for (i, got) in data.chunks(4096).enumerate() {
        let b = first + i;
        let id = u64::from_le_bytes(got[..8].try_into().unwrap());
        seen.checked += 1;
        if !m.allows(b, id) || got != block_of(id).as_slice() {
            eprintln!(
                "  NBD BAD block {b} {when}: read {id}, model: now {:?}, durable {:?}, since {:?}",
                m.current[b], m.durable[b], m.since[b]
            );
            seen.bad += 1;
        }
        m.current[b] = Some(id);
    }
}

/// The NBD client of one scenario (a thread): random writes (some FUA), trims, flushes and
/// checked reads against the model until `stop`; a lost connection makes everything since the
/// last FLUSH uncertain and is opened again; at the end the whole volume is checked (after
/// the server's restart, if it was killed) and flushed.
pub(super) fn nbd_client(
    addr: String,
    mut m: NbdModel,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> (NbdModel, NbdSeen) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seen = NbdSeen::default();
    let mut conn: Option<Raw> = None;
    let mut failures = 0;
    let mut ending = None;
    loop {
        if stop.load(Ordering::Relaxed) && ending.is_none() {
            ending = Some(Instant::now());
        }
        if let Some(t) = ending {
            // The final check: through restarts and lease hand-overs, for up to a minute.
            let c = match conn.take() {
                Some(c) => Some(c),
                None => Raw::open(&addr, "nemesis").ok(),
            };
            if let Some(mut c) = c {
                if nbd_check(&mut c, &mut m, &mut seen, "at the end").is_ok()
                    && matches!(c.call(FLUSH, 0, 0, 0, &[]), Ok((0, _)))
                {
                    m.flushed();
                    return (m, seen);
                }
                m.uncertain();
            }
            if t.elapsed() > Duration::from_secs(60) {
                eprintln!("  NBD UNREADABLE: the volume could not be read back within 60 s");
                seen.errors += 1;
                seen.unreadable = true;
                return (m, seen);
            }
            std::thread::sleep(Duration::from_millis(300));
            continue;
        }
        let Some(c) = conn.as_mut() else {
            match Raw::open(&addr, "nemesis") {
                Ok(mut c) => {
                    // What a crash or a failure left: checked, then known.
                    if nbd_check(&mut c, &mut m, &mut seen, "after reconnecting").is_ok() {
                        conn = Some(c);
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
            continue;
        };
        let lba = rng.random_range(0..NBD_BLOCKS);
        let n = rng.random_range(1..=8u64).min(NBD_BLOCKS - lba);
        let r = match rng.random_range(0..20) {
            0..=11 => {
                let fua = rng.random_range(0..8) == 0;
                let ids: Vec<u64> = (0..n).map(|i| m.next + i).collect();
                m.next += n;
                let data: Vec<u8> = ids.iter().flat_map(|&id| block_of(id)).collect();
                let flags = if fua { FUA } else { 0 };
                let r = c.call(WRITE, flags, lba * 4096, data.len() as u32, &data);
                let ok = matches!(r, Ok((0, _)));
                for (i, &id) in ids.iter().enumerate() {
                    m.written((lba + i as u64) as usize, id, ok);
                }
                if ok {
                    seen.writes += 1;
                    if fua {
                        m.flushed();
                    }
                }
                r
            }
            12..=13 => {
                let r = c.call(TRIM, 0, lba * 4096, (n * 4096) as u32, &[]);
                let ok = matches!(r, Ok((0, _)));
                for i in 0..n {
                    m.written((lba + i) as usize, 0, ok);
                }
                r
            }
            14..=16 => {
                let r = c.call(FLUSH, 0, 0, 0, &[]);
                if matches!(r, Ok((0, _))) {
                    m.flushed();
                }
                r
            }
            _ => {
                let r = c.call(READ, 0, lba * 4096, (n * 4096) as u32, &[]);
                if let Ok((0, data)) = &r {
                    check_blocks(&mut m, &mut seen, lba as usize, data, "while running");
                }
                r
            }
        };
        match r {
            Ok((0, _)) => failures = 0,
            Ok((err, _)) => {
                seen.errors += 1;
                failures += 1;
                // A volume that stopped serving (fenced, its journal failed) answers every
                // request with an error: it is opened again.
                if failures >= 3 {
                    eprintln!("  NBD: {failures} errors in a row (last {err}); reconnecting");
                    conn = None;
                    m.uncertain();
                    failures = 0;
                }
            }
            Err(e) => {
                eprintln!("  NBD: connection lost: {e}");
                seen.errors += 1;
                conn = None;
                m.uncertain();
            }
        }
    }
}
