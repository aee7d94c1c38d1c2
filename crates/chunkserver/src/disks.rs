//! The disks of a chunkserver: one chunk store each, and which chunk lives on which.

use cairn_chunkstore::{
    ChunkId, ChunkStore, Disk, Error as StoreError, FileDisk, FormatOptions, OpenOptions,
};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How a chunkserver's disks are found or made.
#[derive(Debug, Clone)]
pub struct DiskSetOptions {
    /// Store files; each is created (and formatted) if it does not exist.
    pub paths: Vec<PathBuf>,
    /// Size of a store file created here.
    pub create_bytes: u64,
    /// Write zeros over a new store file. Slower to create, but on ext4/xfs a preallocated,
    /// never-written block is an unwritten extent: the first append into it makes its flush
    /// commit a journal transaction as well (docs/operations.md, "Store files").
    pub zero_fill: bool,
    pub format: FormatOptions,
    pub open: OpenOptions,
}

/// The chunk stores of one chunkserver.
pub struct DiskSet {
    stores: Vec<Arc<ChunkStore>>,
    paths: Vec<PathBuf>,
    /// Which store holds each chunk.
    placement: RwLock<HashMap<ChunkId, usize>>,
}

impl DiskSet {
    /// Opens every store (recovering it), creating and formatting missing ones.
    ///
    /// # Errors
    /// A store that does not open, or a chunk id found on two disks.
    pub fn open(opts: &DiskSetOptions) -> Result<Self, StoreError> {
        let mut stores = Vec::new();
        let mut placement = HashMap::new();
        for (i, path) in opts.paths.iter().enumerate() {
            let disk = open_or_create(path, opts)?;
            let (store, report) = ChunkStore::open(disk as Arc<dyn Disk>, opts.open.clone())?;
            tracing::info!(path = %path.display(), ?report, "disk opened");
            for id in store.list() {
                if placement.insert(id, i).is_some() {
                    return Err(StoreError::Config("a chunk id is on two disks"));
                }
            }
            stores.push(Arc::new(store));
        }
        if stores.is_empty() {
            return Err(StoreError::Config("a chunkserver needs at least one disk"));
        }
        Ok(Self {
            stores,
            paths: opts.paths.clone(),
            placement: RwLock::new(placement),
        })
    }

    pub fn stores(&self) -> &[Arc<ChunkStore>] {
        &self.stores
    }

    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// The store holding `id`.
    pub fn find(&self, id: ChunkId) -> Result<Arc<ChunkStore>, StoreError> {
        self.placement
            .read()
            .get(&id)
            .map(|&i| self.stores[i].clone())
            .ok_or(StoreError::NotFound { chunk_id: id })
    }

    /// Reserves `id` on the store a new chunk goes to (the one with the most free extents)
    /// and returns it; [`DiskSet::unplace`] undoes it if the create fails. Two creates of one
    /// id cannot land on two disks: the second finds the reservation.
    pub fn place(&self, id: ChunkId) -> Result<Arc<ChunkStore>, StoreError> {
        let mut p = self.placement.write();
        if p.contains_key(&id) {
            return Err(StoreError::AlreadyExists { chunk_id: id });
        }
        let (i, store) = self
            .stores
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_failed())
            .max_by_key(|(_, s)| s.space().extents_free)
            .ok_or(StoreError::StoreFailed)?;
        p.insert(id, i);
        Ok(store.clone())
    }

    /// Every chunk with its length and seal, from every disk.
    pub fn chunks(&self) -> HashMap<ChunkId, (u64, bool)> {
        let mut out = HashMap::new();
        for s in &self.stores {
            for id in s.list() {
                if let Ok(st) = s.stat(id) {
                    out.insert(id, (st.length, st.sealed));
                }
            }
        }
        out
    }

    /// (capacity, used) bytes over all disks.
    ///
    /// A disk whose chunk table fills faster than its extents counts as used in proportion to
    /// the table, so that placement avoids it before creates start failing.
    pub fn space(&self) -> (u64, u64) {
        self.stores.iter().fold((0, 0), |(c, u), s| {
            let sp = s.space();
            let total = u64::from(sp.extents_total) * sp.extent_bytes;
            let free = u64::from(sp.extents_free) * sp.extent_bytes;
            let by_table = (total as u128 * sp.chunks as u128 / u128::from(sp.max_chunks.max(1)))
                .min(u128::from(total)) as u64;
            (c + total, u + (total - free).max(by_table))
        })
    }

    /// Whether every disk is working.
    pub fn healthy(&self) -> bool {
        self.stores.iter().all(|s| !s.is_failed())
    }

    /// Forgets a chunk (deleted, or a create that failed).
    pub fn unplace(&self, id: ChunkId) {
        self.placement.write().remove(&id);
    }

    /// Closes every store (each writes a final checkpoint).
    pub fn close(self) -> Result<(), StoreError> {
        let mut first = Ok(());
        for s in self.stores {
            match Arc::try_unwrap(s) {
                Ok(s) => {
                    if let Err(e) = s.close()
                        && first.is_ok()
                    {
                        first = Err(e);
                    }
                }
                Err(_) => tracing::warn!("a store is still in use at close; dropped instead"),
            }
        }
        first
    }
}

fn open_or_create(path: &Path, opts: &DiskSetOptions) -> Result<Arc<FileDisk>, StoreError> {
    let io = |e| StoreError::Io {
        op: "open disk",
        source: Arc::new(e),
    };
    // A store file is made under a temporary name and renamed into place once formatted: a
    // process killed while zero-filling or formatting leaves no half-made store behind, only a
    // temporary file that the next start removes.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
    if tmp.exists() {
        tracing::warn!(path = %tmp.display(), "removing a store file left half-made");
        std::fs::remove_file(&tmp).map_err(io)?;
    }
    if path.exists() {
        return FileDisk::open(path).map(Arc::new).map_err(io);
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let began = std::time::Instant::now();
    if opts.zero_fill {
        tracing::info!(path = %path.display(), bytes = opts.create_bytes, "zero-filling a new store file");
    }
    let made = FileDisk::create(&tmp, opts.create_bytes, opts.zero_fill)
        .map_err(io)
        .and_then(|disk| ChunkStore::format(&disk, &opts.format));
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path).map_err(io)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)?;
    tracing::info!(
        path = %path.display(),
        bytes = opts.create_bytes,
        zero_filled = opts.zero_fill,
        seconds = began.elapsed().as_secs_f64(),
        "created a store file"
    );
    FileDisk::open(path).map(Arc::new).map_err(io)
}
