//! Where a placed bucket's objects live (docs/partitions.md "Buckets"): the partition a key
//! hashes to, and the data directory of each partition that holds objects.

use crate::auth::Service;

/// The partition that holds `key` of a bucket whose objects are hashed over `shards`
/// (`None`: the bucket is the root partition's). The hash is FNV-1a 64 of the key's bytes,
/// modulo the number of shards: fixed, because gateways and masters of different versions
/// must agree on it.
pub fn shard_of(key: &str, shards: &[u32]) -> Option<u32> {
    if shards.is_empty() {
        return None;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    Some(shards[(h % shards.len() as u64) as usize])
}

/// The directory above every bucket shard's data directory (`/.s3/p`).
pub fn shards_dir() -> String {
    format!("{}/p", Service::S3.root())
}

/// The directory that holds the data files (`blobs/`, `packs/`) of objects in partition
/// `shard` (`None`: the root's, `/.s3`).
pub fn data_dir(shard: Option<u32>) -> String {
    match shard {
        None => Service::S3.root().to_owned(),
        Some(n) => format!("{}/{n}", shards_dir()),
    }
}

/// The partition whose data directory holds `path` (`/.s3/p/N/…`), if it is one.
pub fn data_dir_shard(path: &str) -> Option<u32> {
    let rest = path.strip_prefix(Service::S3.root())?.strip_prefix("/p/")?;
    rest.split('/').next()?.parse().ok()
}
