//! A volume's index journal and checkpoint records and its segments' batch headers
//! (`cairn_block::journal`, docs/block.md), as a reopening server reads them from its files:
//! never panic; every record replayed and every batch scanned encodes back to exactly the
//! bytes it was read from; a checkpoint that decodes decodes the same again from its own
//! encoding; and applying what was replayed never panics.
#![no_main]
use cairn_block::extent::ExtentMap;
use cairn_block::journal::{Checkpoint, Record, replay, scan_batches};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (records, used) = replay(data);
    let mut at = 0;
    let mut map = ExtentMap::new(4096);
    for r in &records {
        let b = r.encode();
        assert_eq!(&data[at..at + b.len()], &b[..], "a record did not round-trip");
        at += b.len();
        assert_eq!(Record::decode(&b).map(|(x, n)| (x, n)), Ok((r.clone(), b.len())));
        for c in &r.changes {
            // Changes far past any volume are legal records; keep the map small.
            c.apply(&mut map);
        }
    }
    assert_eq!(at, used);
    let _ = map.lookup(0, 1 << 20);
    let (batches, used, _) = scan_batches(data, 512);
    let mut at = 0;
    for (i, (b, data_at)) in batches.iter().enumerate() {
        assert_eq!(*data_at, at + b.header_len());
        let end = batches
            .get(i + 1)
            .map_or(used, |(x, d)| d - x.header_len());
        let again = b.encode(&data[*data_at..end]);
        assert_eq!(&again[..], &data[at..*data_at], "a batch did not round-trip");
        at = end;
    }
    assert_eq!(at, used);
    if let Ok(c) = Checkpoint::decode(data) {
        let again = Checkpoint::decode(&c.encode()).expect("an encoded checkpoint decodes");
        assert_eq!(again, c);
    }
});
