//! Cairn's wire formats.
//!
//! The data-plane frame between clients and chunkservers ([`frame`], docs/formats/wire.md),
//! the capability it carries ([`cap`], docs/security.md) and the payload of its fault-injection request ([`fault`]). The control plane is gRPC
//! (`cairn-rpc`).

pub mod cap;
pub mod fault;
pub mod frame;

pub use frame::{FrameError, HEADER_BYTES, Header, MAX_PAYLOAD, Opcode, Status};
