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
pub mod object;
mod path;
pub mod private;
pub mod seal;
pub mod tls;

pub use error::{ErrorKind, LEADER_METADATA, MetaError};
pub use path::{PathError, components, normalize};

/// Most copies a file may ask for.
pub const MAX_REPLICAS: u32 = 5;
/// Most chunks one create/open/allocate call may ask for.
pub const MAX_ALLOCATE: u32 = 8;
/// Most operations in one `Batch` call.
pub const MAX_BATCH_OPS: usize = 256;

mod batch;
mod masters;
pub use batch::BatchStats;
pub use masters::Masters;
