//! Cairn client SDK: the "heavyweight client" of the Pangu design.
//!
//! A [`Client`] talks to the masters for metadata (gRPC, following the leader) and straight to
//! the chunkservers for data ([`DataConn`], one multiplexed connection per server). Files are
//! FlatLogFiles: append-only, read anywhere, sealed once done. The client replicates every
//! append to all of a chunk's servers itself and acknowledges it once MinCopy of them (2 of 3
//! by default) are durable, chasing the others; a chunk whose replicas fail is sealed and the
//! append goes on in a new one (see [`FlatLogFile`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), cairn_client::Error> {
//! use cairn_client::{Client, CreateOptions};
//! let client = Client::connect(&["127.0.0.1:7000".to_string()]).await?;
//! let mut log = client.create("/logs/app.log", CreateOptions::default()).await?;
//! let at = log.append(b"first record\n").await?; // file offset of the record: 0
//! log.append(b"second record\n").await?;
//! log.close().await?;
//! assert_eq!(client.read("/logs/app.log", at, 13).await?, b"first record\n");
//! # Ok(()) }
//! ```
//!
//! [`blocking::Client`] wraps the same API for scripts and tools without async.

pub mod blocking;
pub mod caps;
mod data;
mod fs;
mod group;
pub mod health;
mod mapped;
mod policy;
mod writer;

/// The owned byte buffer [`FlatLogFile::append_bytes`] takes.
pub use bytes::Bytes;
/// A file's redundancy policy (`replicas:3`, `ec:4+2`, `replicas:3,then:ec:4+2`, `,lz4`).
pub use cairn_ec::{Policy, Redundancy};
pub use data::{
    ChunkInfo, ConnStats, DataConn, Error as DataError, FaultSpec, Result as DataResult, Status,
};
pub use fs::{
    Client, ClientOptions, CreateOptions, DirEntry, Error, FileStat, FlatLogFile, Traffic,
};
pub use writer::WriterStats;
