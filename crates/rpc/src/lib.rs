//! The control plane's API: generated gRPC code (proto/meta.proto) and the typed errors and
//! conversions both ends share.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("cairn.meta.v1");
}

pub mod admission;
pub mod audit;
pub mod auth;
mod error;
pub mod files;
pub mod object;
mod path;
pub mod private;
pub mod seal;
pub mod tls;

pub use error::{ErrorKind, LEADER_METADATA, MetaError};
pub use path::{MAX_PATH, PathError, components, normalize};

/// Most copies a file may ask for.
pub const MAX_REPLICAS: u32 = 5;
/// Most chunks one create/open/allocate call may ask for.
pub const MAX_ALLOCATE: u32 = 8;
/// Most operations in one `Batch` call.
pub const MAX_BATCH_OPS: usize = 256;
/// Most entries one `List` page holds (`ListRequest.limit` is clamped to it).
pub const LIST_PAGE_MAX: u32 = 10_000;
/// Most entries a `List` without a limit answers: a larger directory is refused, so that a
/// caller that does not page never takes a cut list for the whole.
pub const LIST_WHOLE_MAX: usize = 10_000;
/// The page the client library asks for.
pub const LIST_PAGE: u32 = 1_000;

mod batch;
mod masters;
pub use batch::BatchStats;
pub use masters::Masters;
