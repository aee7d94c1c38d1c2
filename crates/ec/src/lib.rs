//! Redundancy for Cairn (docs/erasure-coding.md): per-file policies, the erasure codec behind
//! Cairn's own [`Codec`] trait (Reed-Solomon from reed-solomon-simd), the stripe layout of an
//! erasure-coded chunk group, and LZ4-compressed blocks that carry their own length and CRC.

pub mod block;
pub mod codec;
pub mod layout;
pub mod policy;

pub use codec::{CELL_ALIGN, Codec, CodecError, ReedSolomon};
pub use layout::{Piece, StripeLayout};
pub use policy::{Policy, PolicyError, Redundancy};
