//! Errors of the chunk store. Every variant carries what the caller needs to act on it.

use crate::format::DecodeError;
use std::sync::Arc;

/// A chunk's identifier, assigned by the masters.
pub type ChunkId = u64;

/// What was wrong with bytes read back from the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CorruptionKind {
    /// No footer slot of the unit is valid for this chunk, or none covers the bytes asked for.
    NoValidFooter,
}

/// Errors of chunk operations.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("chunk {chunk_id} does not exist")]
    NotFound { chunk_id: ChunkId },
    #[error("chunk {chunk_id} already exists")]
    AlreadyExists { chunk_id: ChunkId },
    #[error("chunk {chunk_id} is sealed at length {length}")]
    Sealed { chunk_id: ChunkId, length: u64 },
    #[error("append to chunk {chunk_id} at offset {offset}, but its length is {length}")]
    OffsetMismatch {
        chunk_id: ChunkId,
        offset: u64,
        length: u64,
    },
    #[error(
        "chunk {chunk_id} has length {length}; appending {append_bytes} bytes would pass the maximum {max_chunk_bytes}"
    )]
    ChunkFull {
        chunk_id: ChunkId,
        length: u64,
        append_bytes: u64,
        max_chunk_bytes: u64,
    },
    #[error("an append of {append_bytes} bytes is outside 1..={max_append_bytes}")]
    BadAppendSize {
        append_bytes: u64,
        max_append_bytes: u64,
    },
    #[error("read of [{offset}, {offset}+{len}) in chunk {chunk_id} is past its length {length}")]
    OutOfRange {
        chunk_id: ChunkId,
        offset: u64,
        len: u64,
        length: u64,
    },
    #[error("chunk {chunk_id} is corrupt at logical offset {offset}: {kind:?}")]
    Corruption {
        chunk_id: ChunkId,
        offset: u64,
        kind: CorruptionKind,
    },
    #[error("no free extent on the device")]
    NoSpace,
    #[error("the chunk table is full ({max_chunks} chunks)")]
    TooManyChunks { max_chunks: u32 },
    #[error("chunk {chunk_id} had a write error; it can be read and sealed, not appended to")]
    ChunkFailed { chunk_id: ChunkId },
    #[error("the store had a flush or log error and refuses writes until it is reopened")]
    StoreFailed,
    #[error("the store is closed")]
    Closed,
    #[error("I/O error during {op}: {source}")]
    Io {
        op: &'static str,
        source: Arc<std::io::Error>,
    },
    #[error("{what} does not decode: {source}")]
    Format {
        what: &'static str,
        source: DecodeError,
    },
    #[error("invalid configuration: {0}")]
    Config(&'static str),
}

impl Error {
    pub(crate) fn io(op: &'static str, e: std::io::Error) -> Self {
        Error::Io {
            op,
            source: Arc::new(e),
        }
    }
}

/// Result alias of the chunk store.
pub type Result<T, E = Error> = std::result::Result<T, E>;
