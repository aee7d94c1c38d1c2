//! The Cairn master: a Raft group (openraft) whose replicated state machine holds the
//! namespace, the stream meta (file → chunks) and the chunkserver registry.

pub mod state;
pub mod store;
pub mod network;
pub mod registry;
pub mod convert;
pub mod node;
pub mod service;

pub use node::{MasterOptions, serve};
pub use registry::RegistryOptions;
