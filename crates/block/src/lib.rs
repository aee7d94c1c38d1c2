//! Cairn's block service (docs/block.md): volumes whose random writes land as appends in
//! FlatLogFiles, with an index from blocks to where they were written, made durable by its
//! own journal and checkpoints (seeds/000 §1–§2, design brief §2.6); served over NBD.

pub mod extent;
pub mod journal;
pub mod nbd;
pub mod volume;
