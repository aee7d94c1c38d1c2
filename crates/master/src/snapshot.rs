//! Snapshot files: the state's tables as a stream of rows (docs/formats/master-state.md
//! § Snapshot files).
//!
//! A snapshot is written from one redb read transaction (a consistent view of the tables at
//! the last applied batch), row by row, without decoding a record or holding the state: its
//! memory is a write buffer. The leader writes one only into the chunks it sends a master
//! that needs it ([`write_to`]); that master keeps it as a file while installing it: checks
//! the whole file first ([`verify`]), then streams its rows into the tables ([`load`]).
//! Files live in `<data>/snapshots/`.

use crate::kv::{self, TableDef};
use redb::{ReadTransaction, ReadableTable, TableDefinition, WriteTransaction};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// First bytes of every snapshot file.
pub const MAGIC: &[u8; 8] = b"CAIRNSNP";
/// The format this code writes and reads.
pub const FORMAT: u8 = 1;

const TAG_TABLE: u8 = 1;
const TAG_ROW: u8 = 2;
const TAG_END: u8 = 3;

/// Longest meta, key and record a reader accepts (larger lengths are corruption).
pub const MAX_META: u32 = 16 << 20;
pub const MAX_KEY: u32 = 64 << 10;
pub const MAX_VALUE: u32 = 64 << 20;

/// Rows loaded per redb transaction (each commits without fsync; the last one durably).
const LOAD_BATCH: usize = 50_000;

/// Why a snapshot file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot file: {0}")]
    Io(#[from] io::Error),
    #[error("snapshot file is not one (bad magic)")]
    Magic,
    #[error("snapshot file format {0} (this master reads {FORMAT})")]
    Format(u8),
    #[error("snapshot file: {what} of {len} bytes is over the limit")]
    TooLong { what: &'static str, len: u32 },
    #[error("snapshot file names table {0:?}, which the state does not have")]
    UnknownTable(String),
    #[error("snapshot file holds table {0:?} twice")]
    RepeatedTable(String),
    #[error("snapshot file has a row before any table")]
    RowOutsideTable,
    #[error("snapshot file's rows of {0:?} are not in key order")]
    Order(String),
    #[error("snapshot file has tag {0} where a frame starts")]
    Tag(u8),
    #[error("snapshot file ends with {counted} rows but says {said}")]
    RowCount { counted: u64, said: u64 },
    #[error(
        "snapshot file's checksum does not match (stored {stored:08x}, computed {computed:08x})"
    )]
    Checksum { stored: u32, computed: u32 },
    #[error("snapshot file has bytes after its end")]
    Trailing,
    #[error("snapshot meta: {0}")]
    Meta(serde_json::Error),
    #[error("snapshot file: {0}")]
    Store(#[from] redb::Error),
}

impl From<SnapshotError> for io::Error {
    fn from(e: SnapshotError) -> Self {
        match e {
            SnapshotError::Io(e) => e,
            e => io::Error::new(io::ErrorKind::InvalidData, e),
        }
    }
}

fn raw(name: &str) -> TableDefinition<'_, &'static [u8], &'static [u8]> {
    TableDefinition::new(name)
}

/// Writes `w`'s bytes and folds them into a CRC-32C.
struct Summing<W> {
    inner: W,
    crc: u32,
}

impl<W: Write> Summing<W> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.inner.write_all(bytes)
    }
}

/// Writes the snapshot of `tables` as `rx` sees them, with `meta` (JSON) in its header, to
/// `path` (through a temporary file, synced, renamed, directory synced). Returns the rows
/// written.
pub fn write(
    path: &Path,
    meta: &[u8],
    rx: &ReadTransaction,
    tables: &[TableDef],
) -> Result<u64, SnapshotError> {
    let tmp = path.with_extension("tmp");
    let file = File::create(&tmp)?;
    let (rows, w) = write_to(BufWriter::with_capacity(1 << 20, file), meta, rx, tables)?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    sync_dir(path)?;
    Ok(rows)
}

/// Writes the snapshot of `tables` as `rx` sees them, with `meta` (JSON) in its header, into
/// `w` (a file, or the chunks sent to a master that needs it); returns the rows written and
/// `w`.
pub fn write_to<W: Write>(
    w: W,
    meta: &[u8],
    rx: &ReadTransaction,
    tables: &[TableDef],
) -> Result<(u64, W), SnapshotError> {
    let mut w = Summing { inner: w, crc: 0 };
    w.put(MAGIC)?;
    w.put(&[FORMAT])?;
    w.put(&(meta.len() as u32).to_le_bytes())?;
    w.put(meta)?;
    let mut rows = 0u64;
    for def in tables {
        let t = match rx.open_table(raw(def.name)) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => continue,
            Err(e) => return Err(redb::Error::from(e).into()),
        };
        // Empty tables are left out (the format's rule): two stores with the same rows write
        // the same stream whether or not an empty table exists in them.
        let mut header = true;
        for row in t.iter().map_err(redb::Error::from)? {
            let (k, v) = row.map_err(redb::Error::from)?;
            let (k, v) = (k.value(), v.value());
            if std::mem::take(&mut header) {
                w.put(&[TAG_TABLE, def.name.len() as u8])?;
                w.put(def.name.as_bytes())?;
            }
            w.put(&[TAG_ROW])?;
            w.put(&(k.len() as u32).to_le_bytes())?;
            w.put(k)?;
            w.put(&(v.len() as u32).to_le_bytes())?;
            w.put(v)?;
            rows += 1;
        }
    }
    w.put(&[TAG_END])?;
    w.put(&rows.to_le_bytes())?;
    let crc = w.crc;
    w.inner.write_all(&crc.to_le_bytes())?;
    w.inner.flush()?;
    Ok((rows, w.inner))
}

/// A digest of `tables` as `rx` sees them: the rows, and the CRC32C of the stream
/// [`write_to`] would write with an empty header. Two stores holding the same rows have the
/// same digest; masters of one group at the same applied index must.
///
/// # Errors
/// A table cannot be read.
pub fn digest(rx: &ReadTransaction, tables: &[TableDef]) -> Result<(u64, u32), SnapshotError> {
    /// Keeps only the last four bytes written: the stream's own CRC32C of everything before
    /// them. (A CRC over the whole stream, trailer included, is the same for every stream:
    /// a CRC appended to its data leaves a constant residue.)
    struct Trailer([u8; 4]);
    impl Write for Trailer {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let n = b.len().min(4);
            self.0.rotate_left(n);
            self.0[4 - n..].copy_from_slice(&b[b.len() - n..]);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let (rows, t) = write_to(Trailer([0; 4]), b"", rx, tables)?;
    Ok((rows, u32::from_le_bytes(t.0)))
}

/// Each table's rows and the CRC32C of their keys' and records' bytes (with their lengths),
/// tables with rows only: where two copies whose [`digest`] differs differ.
///
/// # Errors
/// A table cannot be read.
pub fn table_digests(
    rx: &ReadTransaction,
    tables: &[TableDef],
) -> Result<Vec<(&'static str, u64, u32)>, SnapshotError> {
    let mut out = Vec::new();
    for def in tables {
        let t = match rx.open_table(raw(def.name)) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => continue,
            Err(e) => return Err(redb::Error::from(e).into()),
        };
        let (mut rows, mut crc) = (0u64, 0u32);
        for row in t.iter().map_err(redb::Error::from)? {
            let (k, v) = row.map_err(redb::Error::from)?;
            for b in [k.value(), v.value()] {
                crc = crc32c::crc32c_append(crc, &(b.len() as u32).to_le_bytes());
                crc = crc32c::crc32c_append(crc, b);
            }
            rows += 1;
        }
        if rows > 0 {
            out.push((def.name, rows, crc));
        }
    }
    Ok(out)
}

/// Syncs the directory holding `path` (a rename in it is durable after this).
pub fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    File::open(dir)?.sync_all()
}

/// One thing a snapshot file holds, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// The rows that follow belong to this table.
    Table(&'static str),
    Row(Vec<u8>, Vec<u8>),
}

/// Reads a snapshot file frame by frame, checking every rule of the format; the checksum and
/// the row count are checked when the end is reached, so a caller must not act on the rows
/// before [`Reader::frame`] has returned `Ok(None)` (see [`verify`]).
pub struct Reader<R> {
    inner: R,
    crc: u32,
    meta: Vec<u8>,
    tables: &'static [TableDef],
    seen: Vec<&'static str>,
    last_key: Option<Vec<u8>>,
    rows: u64,
    done: bool,
}

impl<R: Read> Reader<R> {
    /// Reads the header; `tables` are the names a snapshot may hold.
    pub fn new(inner: R, tables: &'static [TableDef]) -> Result<Self, SnapshotError> {
        let mut r = Self {
            inner,
            crc: 0,
            meta: Vec::new(),
            tables,
            seen: Vec::new(),
            last_key: None,
            rows: 0,
            done: false,
        };
        let mut magic = [0u8; 8];
        r.take(&mut magic)?;
        if &magic != MAGIC {
            return Err(SnapshotError::Magic);
        }
        let format = r.u8()?;
        if format != FORMAT {
            return Err(SnapshotError::Format(format));
        }
        let len = r.len("meta", MAX_META)?;
        r.meta = r.bytes(len)?;
        Ok(r)
    }

    /// The meta (JSON) from the header.
    pub fn meta(&self) -> &[u8] {
        &self.meta
    }

    fn take(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_exact(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, buf);
        Ok(())
    }

    fn u8(&mut self) -> io::Result<u8> {
        let mut b = [0u8; 1];
        self.take(&mut b)?;
        Ok(b[0])
    }

    fn len(&mut self, what: &'static str, max: u32) -> Result<usize, SnapshotError> {
        let mut b = [0u8; 4];
        self.take(&mut b)?;
        let len = u32::from_le_bytes(b);
        if len > max {
            return Err(SnapshotError::TooLong { what, len });
        }
        Ok(len as usize)
    }

    /// `len` bytes, read in steps so a lying length cannot allocate more than the file has.
    fn bytes(&mut self, len: usize) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(len.min(64 << 10));
        let mut left = len;
        let mut buf = [0u8; 8192];
        while left > 0 {
            let n = left.min(buf.len());
            self.take(&mut buf[..n])?;
            out.extend_from_slice(&buf[..n]);
            left -= n;
        }
        Ok(out)
    }

    /// The next frame, or `None` after the end (checksum, row count and nothing after it
    /// checked).
    pub fn frame(&mut self) -> Result<Option<Frame>, SnapshotError> {
        if self.done {
            return Ok(None);
        }
        match self.u8()? {
            TAG_TABLE => {
                let n = self.u8()? as usize;
                let name = self.bytes(n)?;
                let name = String::from_utf8_lossy(&name).into_owned();
                let def = self
                    .tables
                    .iter()
                    .find(|d| d.name == name)
                    .ok_or(SnapshotError::UnknownTable(name))?;
                if self.seen.contains(&def.name) {
                    return Err(SnapshotError::RepeatedTable(def.name.to_owned()));
                }
                self.seen.push(def.name);
                self.last_key = None;
                Ok(Some(Frame::Table(def.name)))
            }
            TAG_ROW => {
                let Some(table) = self.seen.last().copied() else {
                    return Err(SnapshotError::RowOutsideTable);
                };
                let kl = self.len("key", MAX_KEY)?;
                let k = self.bytes(kl)?;
                let vl = self.len("record", MAX_VALUE)?;
                let v = self.bytes(vl)?;
                if self.last_key.as_ref().is_some_and(|last| *last >= k) {
                    return Err(SnapshotError::Order(table.to_owned()));
                }
                self.last_key = Some(k.clone());
                self.rows += 1;
                Ok(Some(Frame::Row(k, v)))
            }
            TAG_END => {
                let mut b = [0u8; 8];
                self.take(&mut b)?;
                let said = u64::from_le_bytes(b);
                let computed = self.crc;
                let mut c = [0u8; 4];
                self.inner.read_exact(&mut c)?;
                let stored = u32::from_le_bytes(c);
                if stored != computed {
                    return Err(SnapshotError::Checksum { stored, computed });
                }
                if said != self.rows {
                    return Err(SnapshotError::RowCount {
                        counted: self.rows,
                        said,
                    });
                }
                if self.inner.read(&mut [0u8; 1])? != 0 {
                    return Err(SnapshotError::Trailing);
                }
                self.done = true;
                Ok(None)
            }
            t => Err(SnapshotError::Tag(t)),
        }
    }
}

fn open(
    path: &Path,
    tables: &'static [TableDef],
) -> Result<Reader<BufReader<File>>, SnapshotError> {
    Reader::new(BufReader::with_capacity(1 << 20, File::open(path)?), tables)
}

/// Reads the whole file, checking it; returns its meta.
pub fn verify(path: &Path, tables: &'static [TableDef]) -> Result<Vec<u8>, SnapshotError> {
    let mut r = open(path, tables)?;
    while r.frame()?.is_some() {}
    Ok(r.meta)
}

/// Replaces `tables` in the store with the rows of the (verified) file at `path`, in
/// transactions of [`LOAD_BATCH`] rows begun by `begin` (each committed without fsync but the
/// last, which `finish` completes first: e.g. with the applied position). Every table the
/// file lacks ends empty; row counts are rewritten.
pub fn load(
    path: &Path,
    tables: &'static [TableDef],
    begin: impl Fn() -> Result<WriteTransaction, redb::Error>,
    finish: impl FnOnce(&WriteTransaction) -> Result<(), redb::Error>,
) -> Result<u64, SnapshotError> {
    let mut r = open(path, tables)?;
    let mut tx = begin()?;
    tx.set_durability(redb::Durability::None)
        .map_err(redb::Error::from)?;
    for def in tables {
        tx.delete_table(raw(def.name)).map_err(redb::Error::from)?;
    }
    let mut counts: Vec<(&'static str, u64)> = tables.iter().map(|d| (d.name, 0)).collect();
    let mut current: Option<&'static str> = None;
    let mut in_tx = 0usize;
    let mut total = 0u64;
    while let Some(frame) = r.frame()? {
        match frame {
            Frame::Table(name) => current = Some(name),
            Frame::Row(k, v) => {
                let name = current.ok_or(SnapshotError::RowOutsideTable)?;
                tx.open_table(raw(name))
                    .map_err(redb::Error::from)?
                    .insert(k.as_slice(), v.as_slice())
                    .map_err(redb::Error::from)?;
                if let Some(c) = counts.iter_mut().find(|c| c.0 == name) {
                    c.1 += 1;
                }
                total += 1;
                in_tx += 1;
                if in_tx == LOAD_BATCH {
                    tx.commit().map_err(redb::Error::from)?;
                    tx = begin()?;
                    tx.set_durability(redb::Durability::None)
                        .map_err(redb::Error::from)?;
                    in_tx = 0;
                }
            }
        }
    }
    tx.set_durability(redb::Durability::Immediate)
        .map_err(redb::Error::from)?;
    {
        let mut t = tx.open_table(kv::COUNTS).map_err(redb::Error::from)?;
        for (name, n) in counts {
            t.insert(name, n).map_err(redb::Error::from)?;
        }
    }
    finish(&tx)?;
    tx.commit().map_err(redb::Error::from)?;
    Ok(total)
}

/// Removes every file of `dir` but `keep` (older snapshots, partial transfers, temporaries).
pub fn remove_others(dir: &Path, keep: Option<&Path>) -> io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p: PathBuf = e?.path();
        if Some(p.as_path()) != keep
            && let Err(e) = std::fs::remove_file(&p)
        {
            tracing::warn!(path = %p.display(), error = %e, "cannot remove an old snapshot file");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{Database, ReadableDatabase, backends::InMemoryBackend};

    static TABLES: &[TableDef] = &[
        TableDef::new("a", 1),
        TableDef::new("b", 1),
        TableDef::new("c", 1),
    ];

    fn db() -> Database {
        Database::builder()
            .create_with_backend(InMemoryBackend::new())
            .unwrap()
    }

    fn fill(db: &Database, table: &str, rows: &[(&[u8], &[u8])]) {
        let tx = db.begin_write().unwrap();
        {
            let mut t = tx.open_table(raw(table)).unwrap();
            for (k, v) in rows {
                t.insert(*k, *v).unwrap();
            }
        }
        tx.commit().unwrap();
    }

    fn dump(db: &Database, table: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        let rx = db.begin_read().unwrap();
        let Ok(t) = rx.open_table(raw(table)) else {
            return Vec::new();
        };
        t.iter()
            .unwrap()
            .map(|r| {
                let (k, v) = r.unwrap();
                (k.value().to_vec(), v.value().to_vec())
            })
            .collect()
    }

    fn written(dir: &Path) -> (PathBuf, Database) {
        let src = db();
        fill(
            &src,
            "a",
            &[(b"k1", b"v1"), (b"k2", b""), (b"", b"empty key")],
        );
        fill(&src, "c", &[(b"\x00\xff", &[7u8; 100_000])]);
        let path = dir.join("1-2-3.snap");
        let rows = write(&path, b"{\"m\":1}", &src.begin_read().unwrap(), TABLES).unwrap();
        assert_eq!(rows, 4);
        (path, src)
    }

    #[test]
    fn tables_round_trip_and_replace_what_was_there() {
        let dir = tempfile::tempdir().unwrap();
        let (path, src) = written(dir.path());
        assert_eq!(verify(&path, TABLES).unwrap(), b"{\"m\":1}");
        let dst = db();
        fill(&dst, "b", &[(b"stale", b"x")]);
        fill(&dst, "a", &[(b"k0", b"stale")]);
        let n = load(&path, TABLES, || Ok(dst.begin_write()?), |_| Ok(())).unwrap();
        assert_eq!(n, 4);
        for t in ["a", "b", "c"] {
            assert_eq!(dump(&dst, t), dump(&src, t), "table {t}");
        }
        let rx = dst.begin_read().unwrap();
        let counts = rx.open_table(kv::COUNTS).unwrap();
        assert_eq!(counts.get("a").unwrap().unwrap().value(), 3);
        assert_eq!(counts.get("b").unwrap().unwrap().value(), 0);
        // Nothing but the file is left in the directory.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// Every byte matters: flipping any one, or cutting the file anywhere, is refused (the
    /// canary that the checks run: a reader that skipped them would load the damage).
    #[test]
    fn any_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = written(dir.path());
        let good = std::fs::read(&path).unwrap();
        let bad = dir.path().join("bad.snap");
        for i in (0..good.len())
            .step_by(97)
            .chain(good.len() - 12..good.len())
        {
            let mut b = good.clone();
            b[i] ^= 0x41;
            std::fs::write(&bad, &b).unwrap();
            assert!(verify(&bad, TABLES).is_err(), "flip at {i} accepted");
        }
        for cut in [0, 5, 9, 13, 40, good.len() - 1] {
            std::fs::write(&bad, &good[..cut]).unwrap();
            assert!(verify(&bad, TABLES).is_err(), "cut at {cut} accepted");
        }
        let mut longer = good.clone();
        longer.push(0);
        std::fs::write(&bad, &longer).unwrap();
        assert!(matches!(verify(&bad, TABLES), Err(SnapshotError::Trailing)));
        // Tables the state does not have are refused by name.
        static FEWER: &[TableDef] = &[TableDef::new("a", 1)];
        assert!(matches!(
            verify(&path, FEWER),
            Err(SnapshotError::UnknownTable(t)) if t == "c"
        ));
    }
}
