//! Cairn's chunk store: the append-only, self-contained storage engine each chunkserver runs
//! on each of its disks (USSFS in the Pangu paper).
//!
//! A store keeps *chunks* — byte strings that are created, appended to at an expected offset,
//! read, sealed and deleted — in 1 MiB extents of one preallocated device. Every append
//! reaches the device as one write of self-describing sector units (data + footer with chunk
//! id, offset, length, CRC32C, epoch), so nothing else is written on the append path;
//! concurrent appends share one flush. Appends of ≥ 512 KiB given in an aligned buffer
//! ([`ChunkStore::append_aligned`]) are written from that buffer without a copy, after segment
//! headers that carry their CRCs. The byte-level format is in
//! `docs/formats/chunk-store.md`.
//!
//! ```no_run
//! use cairn_chunkstore::{ChunkStore, FileDisk, FormatOptions, OpenOptions};
//! use std::sync::Arc;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let disk = Arc::new(FileDisk::create("disk0.cairn".as_ref(), 1 << 30, true)?);
//! ChunkStore::format(&*disk, &FormatOptions::default())?;
//! let (store, _report) = ChunkStore::open(disk, OpenOptions::default())?;
//! store.create(42, 1)?;
//! let len = store.append(42, 0, b"hello")?;
//! assert_eq!(store.read(42, 0, len as usize)?, b"hello");
//! store.seal(42)?;
//! store.close()?;
//! # Ok(()) }
//! ```
//!
//! Modules, from the bytes up:
//! - [`buf`]: aligned buffers for O_DIRECT.
//! - [`checksum`]: CRC32C, salted per store.
//! - [`format`]: every on-disk structure's encoder and decoder.
//! - [`disk`]: the device trait, the real O_DIRECT + io_uring device, the fault-injecting one.
//! - `layout`: where a logical byte lives (and a large append's segments); region planning.
//! - `index`: the in-memory chunk table and free-extent bitmap.
//! - `prepare`: the caller's half of an append (units and CRCs, on the caller's thread).
//! - `writer`: the device thread (batching, group commit, unit building).
//! - `read`: the read path.
//! - `recovery`: open after a crash.
//! - `store`: the public API.

pub mod buf;
pub mod checksum;
pub mod disk;
mod doorbell;
mod error;
pub mod format;
mod index;
mod layout;
mod prepare;
mod read;
mod recovery;
mod store;
mod writer;

pub use disk::{CrashPolicy, Disk, FaultConfig, FaultDisk, FileDisk, WriteTicket};
pub use error::{ChunkId, CorruptionKind, Error, Result};
pub use layout::FormatOptions;
pub use read::ReadBuf;
pub use recovery::RecoveryReport;
pub use store::{ChunkStat, ChunkStore, Durability, OpenOptions, Pending, SpaceStat, Stats};
