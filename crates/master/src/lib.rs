//! The Cairn master: a Raft group (openraft) whose replicated state machine holds the
//! namespace, the stream meta (file → chunks) and the chunkserver registry.

mod audit;
pub mod bench;
pub mod caps;
pub mod confine;
pub mod conversion;
pub mod convert;
pub mod groups;
mod heap;
pub mod kv;
pub mod network;
pub mod node;
pub mod registry;
pub mod repair;
pub mod reports;
pub mod service;
pub mod snapshot;
pub mod state;
pub mod store;
pub mod view;
pub mod wal;

pub use node::{MasterOptions, serve};
pub use registry::RegistryOptions;
pub use service::autosplit::SplitPolicy;
pub use service::segments::SegmentCollection;
