//! Directory policies apply to the files a mount writes under them (docs/files.md
//! "Policies"): their bytes go to segments of the directory's policy — erasure coded,
//! compressed — and read back whole through a new mount.

use super::{Mount, read_all};
use crate::common::{Cluster, bytes};
use std::collections::BTreeMap;
use std::fs;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_under_a_directory_policy_go_to_segments_of_that_policy() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let c = cl.client().await;
    let ec: cairn_client::Policy = "ec:2+1".parse().unwrap();
    let lz: cairn_client::Policy = "replicas:2,lz4".parse().unwrap();
    c.mkdir_with_policy("/ec", false, Some(&ec)).await.unwrap();
    c.mkdir_with_policy("/lz", false, Some(&lz)).await.unwrap();
    let a = Mount::start(&masters, &dir.path().join("a"));
    let (big, text) = (bytes(5, 0, 1 << 20), b"cairn ".repeat(50_000));
    fs::write(a.path("ec/big"), &big).unwrap();
    fs::write(a.path("lz/text"), &text).unwrap();
    fs::write(a.path("plain"), b"plain").unwrap();
    // A file keeps its policy when it moves (as a FlatLogFile does); it is written there.
    fs::create_dir(a.path("ec/sub")).unwrap();
    fs::write(a.path("ec/sub/small"), b"small").unwrap();
    a.stop();

    // One segment of each policy, and the default one.
    let mut policies: BTreeMap<String, u64> = BTreeMap::new();
    for e in c.list("/.fs/seg").await.unwrap() {
        let st = c.stat(&format!("/.fs/seg/{}", e.name)).await.unwrap();
        *policies.entry(st.policy.unwrap_or_default()).or_default() += st.length;
    }
    let keys: Vec<&str> = policies.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["ec:2+1", "replicas:2,lz4", "replicas:3"],
        "{policies:?}"
    );
    assert!(policies["ec:2+1"] > 1 << 20, "{policies:?}");

    let a = Mount::start(&masters, &dir.path().join("a"));
    assert_eq!(read_all(&a.path("ec/big")), big);
    assert_eq!(read_all(&a.path("lz/text")), text);
    assert_eq!(fs::read(a.path("plain")).unwrap(), b"plain");
    assert_eq!(fs::read(a.path("ec/sub/small")).unwrap(), b"small");
    a.stop();
}
