//! The fuzz targets' properties on random inputs, in the default suite (cargo-fuzz needs
//! nightly; see fuzz/README.md): no decoder and no recovery panics on any bytes.

use cairn_chunkstore::format::checkpoint::Checkpoint;
use cairn_chunkstore::format::footer::{self, Footer};
use cairn_chunkstore::format::log;
use cairn_chunkstore::format::segment::SegHeader;
use cairn_chunkstore::format::superblock::Superblock;
use cairn_chunkstore::{ChunkStore, Disk, FaultDisk, FormatOptions, OpenOptions};
use proptest::prelude::*;
use std::sync::{Arc, OnceLock};

const EXTENT: u64 = 256 * 1024;
const CAPACITY: usize = 12 * EXTENT as usize;

proptest! {
    #[test]
    fn footer_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = Footer::decode(7, &bytes);
    }

    #[test]
    fn unit_evaluation_never_panics(bytes in proptest::collection::vec(any::<u8>(), 4096)) {
        let _ = footer::unit_state(7, &bytes, 1, 1, 0, 0);
    }

    #[test]
    fn segment_header_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
        let _ = SegHeader::decode(7, &bytes);
    }

    #[test]
    fn superblock_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
        if let Ok(sb) = Superblock::decode(&bytes) {
            prop_assert!(sb.validate().is_ok());
        }
    }

    #[test]
    fn log_decoder_never_panics(lsn in any::<u64>(), bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
        let _ = log::decode_block(3, lsn, &bytes);
    }

    #[test]
    fn checkpoint_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
        let _ = Checkpoint::decode_header(3, &bytes);
        let _ = Checkpoint::decode(3, &bytes, 100);
    }
}

fn base_image() -> &'static Vec<u8> {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let disk = Arc::new(FaultDisk::new(CAPACITY as u64, 512, 0));
        let opts = FormatOptions {
            extent_bytes: EXTENT as u32,
            log_bytes: Some(EXTENT),
            max_chunk_bytes: 1 << 20,
            ..Default::default()
        };
        ChunkStore::format(&*disk, &opts).unwrap();
        let (store, _) =
            ChunkStore::open(disk.clone() as Arc<dyn Disk>, OpenOptions::default()).unwrap();
        for id in 0..3u64 {
            store.create(id, 1).unwrap();
            let mut off = 0;
            for k in 0..5 {
                off = store
                    .append(id, off, &vec![id as u8 + k; 1000 + 3000 * k as usize])
                    .unwrap();
            }
        }
        // And one with a large append (docs/formats/chunk-store.md §3.2), not checkpointed.
        store.create(3, 1).unwrap();
        let off = store.append(3, 0, &[3; 3000]).unwrap();
        store.append(3, off, &vec![4; 700_000]).unwrap();
        assert_eq!(
            store
                .stats()
                .large_appends
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        store.seal(0).unwrap();
        store.abandon();
        disk.snapshot()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Recovery of a real store whose bytes were overwritten at random places returns a store
    /// or a typed error, and a returned store serves reads (or typed errors) without panicking.
    #[test]
    fn recovery_of_a_corrupted_image_never_panics(patches in proptest::collection::vec((0..CAPACITY, proptest::collection::vec(any::<u8>(), 1..64)), 1..20)) {
        let mut image = base_image().clone();
        for (off, bytes) in patches {
            let end = (off + bytes.len()).min(CAPACITY);
            image[off..end].copy_from_slice(&bytes[..end - off]);
        }
        let disk = Arc::new(FaultDisk::from_image(image, 512, 0));
        if let Ok((store, _)) = ChunkStore::open(disk as Arc<dyn Disk>, OpenOptions::default()) {
            for id in store.list() {
                let s = store.stat(id).unwrap();
                let _ = store.read(id, 0, s.length as usize);
            }
            store.abandon();
        }
    }
}

#[test]
fn the_untouched_base_image_recovers_every_chunk() {
    // Canary for the test above: without patches, recovery finds the three chunks.
    let disk = Arc::new(FaultDisk::from_image(base_image().clone(), 512, 0));
    let (store, _) = ChunkStore::open(disk as Arc<dyn Disk>, OpenOptions::default()).unwrap();
    assert_eq!(store.list(), vec![0, 1, 2, 3]);
    assert_eq!(store.stat(3).unwrap().length, 703_000);
    assert_eq!(store.read(3, 600_000, 4).unwrap(), vec![4; 4]);
    assert!(store.stat(0).unwrap().sealed);
    assert_eq!(store.stat(1).unwrap().length, 5 * 1000 + 3000 * 10);
}
