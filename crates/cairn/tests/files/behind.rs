//! A close that does not wait (docs/files.md): the close of a file a mount made a moment ago
//! answers before its flush, and the masters hold the file for that mount until the flush
//! commits — so another mount's `stat` or `open` after the close still sees it whole, a
//! rename after the close carries the bytes, and a mount killed with closes behind it lets
//! its files go when the hold lapses.

use super::{Mount, read_all};
use crate::common::{Cluster, bytes};
use cairn_rpc::files::FileQuery;
use std::fs;
use std::io::Write;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_answers_before_its_flush_and_other_mounts_still_read_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let mut a = Mount::start(&masters, &dir.path().join("a"));
    let b = Mount::start(&masters, &dir.path().join("b"));

    // Small files closed on A, looked at and read at once on B: whole, every one.
    for i in 0..60u64 {
        let data = bytes(i, 0, 100 + i as usize * 997);
        let name = format!("small{i}");
        fs::write(a.path(&name), &data).unwrap();
        assert_eq!(
            fs::metadata(b.path(&name)).unwrap().len(),
            data.len() as u64,
            "{name}: its size on the other mount right after the close"
        );
        assert!(read_all(&b.path(&name)) == data, "{name} read whole on B");
    }

    // The canary: A stopped the moment its close of a large new file returned, so its flush
    // (7 MiB to append, then a commit) cannot have committed — the masters answer that A
    // holds it, and B's read waits; A continued, B reads it whole.
    let big = bytes(77, 0, 7 << 20);
    fs::write(a.path("big"), &big).unwrap();
    a.pause();
    let c = cl.client().await;
    let q = FileQuery::Lookup {
        path: "/big".into(),
        mount: String::new(),
    };
    let held = c.masters().file_query(&q).await;
    let reader = {
        let p = b.path("big");
        std::thread::spawn(move || read_all(&p))
    };
    std::thread::sleep(Duration::from_millis(800));
    let waited = !reader.is_finished();
    a.resume();
    let got = reader.join().unwrap();
    assert_eq!(
        held.as_ref().err().map(|e| e.kind),
        Some(cairn_rpc::ErrorKind::LeaseHeld),
        "the close answered before its commit and the masters hold the file: {held:?}"
    );
    assert!(waited, "B's read waited for A's commit");
    assert!(got == big, "B read the held file whole once A committed it");

    // write a temporary file, close it, rename it over another — then the mount dies: the
    // rename came after the bytes, so the name holds them (ext4's guarantee for this idiom).
    let (old, new) = (bytes(80, 0, 50_000), bytes(81, 0, 60_000));
    {
        let mut f = fs::File::create(a.path("config")).unwrap();
        f.write_all(&old).unwrap();
        f.sync_all().unwrap();
    }
    fs::write(a.path("config.tmp"), &new).unwrap();
    fs::rename(a.path("config.tmp"), a.path("config")).unwrap();
    let adir = a.dir.clone();
    a.kill();
    assert!(
        read_all(&b.path("config")) == new,
        "the renamed file's bytes"
    );

    // A mount killed right after closes that did not wait: the other mount's reads wait out
    // the dead mount's holds, then find each file as committed — whole or empty, never torn.
    let a = Mount::start(&masters, &adir);
    let files: Vec<Vec<u8>> = (0..20).map(|i| bytes(90 + i, 0, 30_000)).collect();
    for (i, d) in files.iter().enumerate() {
        fs::write(a.path(&format!("k{i}")), d).unwrap();
    }
    let a_dir = a.dir();
    a.kill();
    let mut whole = 0;
    for (i, d) in files.iter().enumerate() {
        let got = read_all(&b.path(&format!("k{i}")));
        assert!(got.is_empty() || got == *d, "k{i}: {} bytes", got.len());
        whole += usize::from(got == *d);
    }
    eprintln!("after the kill: {whole} of {} files whole", files.len());
    b.stop();
    super::detach_dead(&a_dir);
}
