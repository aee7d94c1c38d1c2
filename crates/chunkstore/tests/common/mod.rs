//! Helpers shared by the chunk store's integration tests.
#![allow(dead_code)]

use cairn_chunkstore::{ChunkStore, Disk, FaultDisk, FormatOptions, OpenOptions, RecoveryReport};
use std::sync::Arc;

pub const MIB: u64 = 1 << 20;

/// A small store on a fault-injecting disk: 48 MiB, 512-byte alignment (like the dev VM).
pub fn fault_store(seed: u64) -> (Arc<FaultDisk>, ChunkStore) {
    fault_store_sized(48 * MIB, seed)
}

/// A store of `capacity` bytes on a fault-injecting disk.
pub fn fault_store_sized(capacity: u64, seed: u64) -> (Arc<FaultDisk>, ChunkStore) {
    let disk = Arc::new(FaultDisk::new(capacity, 512, seed));
    let opts = FormatOptions {
        log_bytes: Some(2 * MIB),
        ..Default::default()
    };
    ChunkStore::format(&*disk, &opts).expect("format");
    let (store, _) =
        ChunkStore::open(disk.clone() as Arc<dyn Disk>, OpenOptions::default()).expect("open");
    (disk, store)
}

/// Reopens the image a crash left behind.
pub fn reopen(image: Vec<u8>, seed: u64) -> (Arc<FaultDisk>, ChunkStore, RecoveryReport) {
    let disk = Arc::new(FaultDisk::from_image(image, 512, seed));
    let (store, report) =
        ChunkStore::open(disk.clone() as Arc<dyn Disk>, OpenOptions::default()).expect("recovery");
    (disk, store, report)
}

/// Deterministic content: byte `offset + i` of chunk `id`, from a strong mixer (splitmix64),
/// so that any byte read back can be checked and no 64-byte window repeats.
pub fn pattern(id: u64, offset: u64, len: usize) -> Vec<u8> {
    (offset..offset + len as u64)
        .map(|pos| {
            (splitmix64(id.wrapping_mul(0xA24B_AED4_963E_E407) ^ (pos / 8)) >> ((pos % 8) * 8))
                as u8
        })
        .collect()
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
