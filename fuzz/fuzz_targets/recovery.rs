#![no_main]
//! Recovery from any device image: it returns a store or a typed error, never panics; and
//! whatever store it returns serves reads without panicking.
//!
//! Input: the first byte picks the mode. Mode 0: the rest is the whole image (prefix of a 3 MiB
//! device). Otherwise: a valid store with data (built once) is patched with the input as
//! (offset u32, length u8, bytes) records — deep corruption of a real layout.
use cairn_chunkstore::{ChunkStore, Disk, FaultDisk, FormatOptions, OpenOptions};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};

const EXTENT: u64 = 256 * 1024;
const CAPACITY: usize = 12 * EXTENT as usize;

fn base_image() -> &'static Vec<u8> {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let disk = Arc::new(FaultDisk::new(CAPACITY as u64, 512, 0));
        let opts = FormatOptions { extent_bytes: EXTENT as u32, log_bytes: Some(EXTENT), max_chunk_bytes: 1 << 20, ..Default::default() };
        ChunkStore::format(&*disk, &opts).unwrap();
        let (store, _) = ChunkStore::open(disk.clone() as Arc<dyn Disk>, OpenOptions::default()).unwrap();
        for id in 0..3u64 {
            store.create(id, 1).unwrap();
            let mut off = 0;
            for k in 0..5 {
                off = store.append(id, off, &vec![id as u8 + k; 1000 + 3000 * k as usize]).unwrap();
            }
        }
        store.seal(0).unwrap();
        store.abandon();
        disk.snapshot()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let image = if mode == 0 {
        let mut img = vec![0u8; CAPACITY];
        let n = rest.len().min(CAPACITY);
        img[..n].copy_from_slice(&rest[..n]);
        img
    } else {
        let mut img = base_image().clone();
        let mut r = rest;
        while r.len() >= 5 {
            let off = u32::from_le_bytes(r[..4].try_into().unwrap()) as usize % CAPACITY;
            let len = (r[4] as usize).min(r.len() - 5);
            let end = (off + len).min(CAPACITY);
            img[off..end].copy_from_slice(&r[5..5 + (end - off)]);
            r = &r[5 + len..];
        }
        img
    };
    let disk = Arc::new(FaultDisk::from_image(image, 512, 0));
    if let Ok((store, _)) = ChunkStore::open(disk as Arc<dyn Disk>, OpenOptions::default()) {
        for id in store.list() {
            let s = store.stat(id).unwrap();
            let _ = store.read(id, 0, s.length.min(1 << 20) as usize);
        }
        store.abandon();
    }
});
