//! Cairn's wire formats.
//!
//! Today: the data-plane frame between clients and chunkservers ([`frame`],
//! docs/formats/wire.md). The control plane (gRPC) arrives with the masters.

pub mod frame;

pub use frame::{FrameError, HEADER_BYTES, Header, MAX_PAYLOAD, Opcode, Status};
