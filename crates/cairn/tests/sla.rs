//! The latency-SLA mechanisms of seeds/000 §3.3, one test per sentence of the paper they check
//! (the etcd-raft `raft_paper_test` habit), on real processes with injected faults.

mod common;

use cairn_client::{ClientOptions, CreateOptions, FaultSpec};
use cairn_rpc::pb;
use common::{Cluster, bytes, chunks};
use std::time::{Duration, Instant};

/// These tests time chasing, backup delays and blacklisting: run one at a time, so that the
/// others' clusters do not starve the one being timed of the two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Reads a whole chunk from one replica directly.
async fn replica_bytes(cl: &Cluster, server: u64, chunk: u64, len: u64) -> Vec<u8> {
    let i = cl.index_of(server).await;
    let d = cl.replica_conn(i, &[chunk]).await;
    d.read(chunk, 0, len as usize).await.unwrap()
}

/// Every chunk of `path` has `copies` locations, each holding the chunk's bytes.
async fn assert_copies(cl: &Cluster, c: &cairn_client::Client, path: &str, copies: usize) {
    let all = c
        .read(path, 0, c.stat(path).await.unwrap().length as usize)
        .await
        .unwrap();
    let mut start = 0usize;
    for ch in chunks(c, path).await {
        assert!(ch.sealed, "{path}: chunk {} not sealed", ch.id);
        if ch.length == 0 {
            continue; // a spare closed empty: nothing to hold
        }
        assert_eq!(
            ch.servers.len(),
            copies,
            "{path}: chunk {} {:?}",
            ch.id,
            ch.servers
        );
        let want = &all[start..start + ch.length as usize];
        for s in &ch.servers {
            let got = replica_bytes(cl, *s, ch.id, ch.length).await;
            assert!(got == want, "{path}: chunk {} differs on server {s}", ch.id);
        }
        start += ch.length as usize;
    }
}

/// "A write returns success once MinCopy replicas are durable": with one of three replicas
/// frozen, appends are acknowledged by the other two; with MinCopy = 3 they are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_returns_success_after_min_copy_replicas() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let c = cl
        .client_with(ClientOptions {
            chase_timeout: Duration::from_secs(30), // keep chasing: nothing is dropped
            request_timeout: Duration::from_secs(2),
            retry_for: Duration::from_secs(3),
            ..ClientOptions::default()
        })
        .await;
    let mut w = c.create("/mc", CreateOptions::default()).await.unwrap();
    w.append(&bytes(1, 0, 4096)).await.unwrap();
    cl.fault(
        2,
        FaultSpec {
            stall: true,
            ..FaultSpec::default()
        },
    )
    .await;
    for i in 1..20u64 {
        w.append(&bytes(1, i * 4096, 4096)).await.unwrap();
    }
    let st = w.stats().clone();
    assert!(st.chased >= 19, "{st:?}");
    assert_eq!((st.dropped, st.switches), (0, 0), "{st:?}");
    // Readers see what MinCopy replicas hold, while the third is still frozen.
    assert_eq!(
        c.read("/mc", 0, 20 * 4096).await.unwrap(),
        bytes(1, 0, 20 * 4096)
    );
    // Thawed, the lagging replica catches up before the chunk is finished.
    cl.fault(2, FaultSpec::default()).await;
    assert_eq!(w.close().await.unwrap(), 20 * 4096);
    assert_copies(&cl, &c, "/mc", 3).await;

    // Canary: MinCopy = 3 of 3 cannot acknowledge with a frozen replica (three servers only,
    // so no chunk avoids it): the append fails once retry_for is spent.
    let mut all = c
        .create(
            "/all",
            CreateOptions {
                min_copy: Some(3),
                ..CreateOptions::default()
            },
        )
        .await
        .unwrap();
    all.append(b"first").await.unwrap();
    cl.fault(
        0,
        FaultSpec {
            stall: true,
            ..FaultSpec::default()
        },
    )
    .await;
    let r = all.append(b"second").await;
    assert!(r.is_err(), "MinCopy 3 acknowledged with a frozen replica");
    assert_eq!(all.stats().chased, 0);
    cl.fault(0, FaultSpec::default()).await;
}

/// "A lagging replica beyond k bytes is sealed and re-replicated": a replica slowed down
/// falls more than k bytes behind for longer than t, is dropped, and the masters copy the
/// sealed chunk to a third server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_beyond_k_bytes_is_sealed_and_re_replicated() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 4).await;
    let c = cl
        .client_with(ClientOptions {
            chase_timeout: Duration::from_millis(300),
            chase_retry_bytes: 64 << 10,
            ..ClientOptions::default()
        })
        .await;
    let mut w = c.create("/lag", CreateOptions::default()).await.unwrap();
    w.append(&bytes(2, 0, 16 << 10)).await.unwrap();
    let first = chunks(&c, "/lag").await[0].clone();
    let slow = cl.index_of(first.servers[0]).await;
    cl.fault(
        slow,
        FaultSpec {
            delay_ms: 100,
            ..FaultSpec::default()
        },
    )
    .await;
    let t0 = Instant::now();
    let mut len = 16u64 << 10;
    while t0.elapsed() < Duration::from_secs(2) {
        w.append(&bytes(2, len, 16 << 10)).await.unwrap();
        len += 16 << 10;
    }
    let st = w.stats().clone();
    assert!(
        st.dropped >= 1,
        "the slow replica was never dropped: {st:?}"
    );
    assert_eq!(st.switches, 0, "{st:?}");
    assert_eq!(w.close().await.unwrap(), len);
    let after = chunks(&c, "/lag").await;
    assert!(
        !after[0].servers.contains(&first.servers[0]),
        "the dropped replica is still a location: {:?}",
        after[0].servers
    );
    cl.fault(slow, FaultSpec::default()).await;
    // The masters bring the chunk back to three copies.
    let deadline = Instant::now() + Duration::from_secs(30);
    while chunks(&c, "/lag")
        .await
        .iter()
        .any(|ch| ch.servers.len() < 3)
    {
        assert!(Instant::now() < deadline, "not re-replicated");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let s = cl.wait_fully_replicated(Duration::from_secs(30)).await;
    assert!(s.repairs_done >= 1);
    assert_copies(&cl, &c, "/lag", 3).await;
}

/// "A failed chunk is sealed and the write continues in a new chunk": two of a chunk's three
/// replicas fail every request; the append is not failed but goes on in a new chunk on other
/// servers, and the sealed-short chunk is repaired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_chunk_is_sealed_and_the_write_continues_in_a_new_chunk() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 5).await;
    let c = cl.client().await;
    let mut w = c.create("/ns", CreateOptions::default()).await.unwrap();
    w.append(&bytes(3, 0, 10_000)).await.unwrap();
    let first = chunks(&c, "/ns").await[0].clone();
    let broken = [
        cl.index_of(first.servers[0]).await,
        cl.index_of(first.servers[1]).await,
    ];
    for &i in &broken {
        cl.fault(
            i,
            FaultSpec {
                error_ppm: 1_000_000,
                ..FaultSpec::default()
            },
        )
        .await;
    }
    let mut len = 10_000u64;
    for _ in 0..50 {
        let at = w.append(&bytes(3, len, 3000)).await.unwrap();
        assert_eq!(at, len);
        len += 3000;
    }
    let st = w.stats().clone();
    assert!(st.switches >= 1, "{st:?}");
    let list = chunks(&c, "/ns").await;
    assert!(list[0].sealed);
    assert_eq!(list[0].length, 10_000, "sealed at the acknowledged length");
    // The next chunk with data (a spare on a failed server is passed over, closed empty).
    let next = list[1..]
        .iter()
        .find(|ch| ch.length > 0 || !ch.sealed)
        .unwrap();
    for s in &next.servers {
        assert!(
            !first.servers[..2].contains(s),
            "new chunk on a failed server"
        );
    }
    for &i in &broken {
        cl.fault(i, FaultSpec::default()).await;
    }
    assert_eq!(w.close().await.unwrap(), len);
    assert_eq!(
        c.read("/ns", 0, len as usize).await.unwrap(),
        bytes(3, 0, len as usize)
    );
    // The short chunk lost two copies: repaired back to three.
    let deadline = Instant::now() + Duration::from_secs(30);
    while chunks(&c, "/ns")
        .await
        .iter()
        .any(|ch| ch.servers.len() < 3)
    {
        assert!(Instant::now() < deadline, "not re-replicated");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cl.wait_fully_replicated(Duration::from_secs(30)).await;
    assert_copies(&cl, &c, "/ns", 3).await;
}

/// "Sealed-short chunks are repaired ... or rewritten from the client's buffer if none has
/// it": the two replicas that acknowledged fail, the third is still chasing; the chunk is
/// sealed where the third holds the bytes, and the acknowledged rest, which no replica holds,
/// is written again from the client's memory into the next chunk, at the same file offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_bytes_no_replica_holds_are_rewritten_from_the_clients_buffer() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 5).await;
    let c = cl
        .client_with(ClientOptions {
            chase_timeout: Duration::from_secs(20), // the slow replica is never dropped
            chase_retry_bytes: 64 << 20,
            request_timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(30),
            ..ClientOptions::default()
        })
        .await;
    let mut w = c.create("/rw", CreateOptions::default()).await.unwrap();
    w.append(&bytes(4, 0, 4096)).await.unwrap();
    let first = chunks(&c, "/rw").await[0].clone();
    let idx = [
        cl.index_of(first.servers[0]).await,
        cl.index_of(first.servers[1]).await,
        cl.index_of(first.servers[2]).await,
    ];
    // The third replica answers every request 1.5 s late: it chases.
    cl.fault(
        idx[2],
        FaultSpec {
            delay_ms: 1500,
            ..FaultSpec::default()
        },
    )
    .await;
    let mut len = 4096u64;
    for _ in 0..4 {
        w.append(&bytes(4, len, 4096)).await.unwrap();
        len += 4096;
    }
    assert!(w.stats().chased >= 4, "{:?}", w.stats());
    let acked = len;
    // The two that acknowledged now fail every request.
    for &i in &idx[..2] {
        cl.fault(
            i,
            FaultSpec {
                error_ppm: 1_000_000,
                ..FaultSpec::default()
            },
        )
        .await;
    }
    let at = w.append(&bytes(4, len, 4096)).await.unwrap();
    assert_eq!(at, len, "the append keeps its file offset");
    len += 4096;
    let st = w.stats().clone();
    assert!(st.switches >= 1, "{st:?}");
    assert!(st.rewritten > 0, "nothing rewritten: {st:?}");
    let list = chunks(&c, "/rw").await;
    assert!(list[0].sealed);
    assert!(
        list[0].length < acked && list[0].length + st.rewritten == acked,
        "chunk 0 sealed at {} of {acked} acknowledged bytes, {} rewritten",
        list[0].length,
        st.rewritten
    );
    assert_eq!(
        list[0].servers,
        vec![first.servers[2]],
        "only the chasing replica holds the short chunk"
    );
    for i in idx {
        cl.fault(i, FaultSpec::default()).await;
    }
    assert_eq!(w.close().await.unwrap(), len);
    assert_eq!(
        c.read("/rw", 0, len as usize).await.unwrap(),
        bytes(4, 0, len as usize),
        "every acknowledged byte at its offset"
    );
    // The short chunk (one copy) and any replica dropped meanwhile are repaired.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = chunks(&c, "/rw").await;
        if list
            .iter()
            .all(|ch| ch.length == 0 || ch.servers.len() == 3)
        {
            break;
        }
        assert!(Instant::now() < deadline, "not re-replicated: {list:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cl.wait_fully_replicated(Duration::from_secs(60)).await;
    assert_copies(&cl, &c, "/rw", 3).await;
}

/// "The masters declare a chunkserver down after a silence and re-replicate its chunks
/// chunkserver-to-chunkserver under a bandwidth cap": a killed server's chunks are copied
/// elsewhere, no faster than the cap; its copies are deleted when it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_servers_chunks_are_re_replicated_under_the_bandwidth_cap() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cl = Cluster::start(dir.path(), 1, 4).await;
    let m = cl.masters();
    let cap = 2u64 << 20;
    m.send(
        pb::ConfigRequest {
            repair_bytes_per_sec: cap,
            ..Default::default()
        },
        |mut c, r| async move { c.set_config(r).await },
    )
    .await
    .unwrap();
    let c = cl.client().await;
    for f in 0..4u64 {
        let mut w = c
            .create(&format!("/r/f{f}"), CreateOptions::default())
            .await
            .unwrap();
        w.append(&bytes(10 + f, 0, 1 << 20)).await.unwrap();
        w.close().await.unwrap();
    }
    let victim_id = chunks(&c, "/r/f0").await[0].servers[0];
    let victim = cl.index_of(victim_id).await;
    let mut lost_bytes = 0u64;
    for f in 0..4u64 {
        for ch in chunks(&c, &format!("/r/f{f}")).await {
            if ch.servers.contains(&victim_id) {
                lost_bytes += ch.length;
            }
        }
    }
    cl.chunkservers[victim].kill();
    // Down after 4 s of silence, repaired after 1 s more.
    let deadline = Instant::now() + Duration::from_secs(30);
    let started = loop {
        let s = cl.status().await.unwrap();
        if s.under_replicated > 0 || s.repairs_running > 0 {
            // The totals agree with repair: the dead server's copies are missing replicas.
            assert!(
                s.missing_replicas > 0,
                "{} chunks under-replicated, {} repairs running, but no missing replicas",
                s.under_replicated,
                s.repairs_running
            );
            break Instant::now();
        }
        assert!(Instant::now() < deadline, "the loss was never noticed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let s = cl.wait_fully_replicated(Duration::from_secs(60)).await;
    let took = started.elapsed();
    assert!(
        s.repaired_bytes >= lost_bytes,
        "{} of {lost_bytes}",
        s.repaired_bytes
    );
    // The cap holds: each target may burst one 1 MiB piece, then waits its share of the cap.
    let burst = 4 << 20;
    let floor = Duration::from_secs_f64(lost_bytes.saturating_sub(burst) as f64 / cap as f64);
    assert!(
        took >= floor,
        "{lost_bytes} bytes repaired in {took:?} under a {cap} B/s cap"
    );
    for f in 0..4u64 {
        let path = format!("/r/f{f}");
        assert_copies(&cl, &c, &path, 3).await;
        assert!(
            chunks(&c, &path)
                .await
                .iter()
                .all(|ch| !ch.servers.contains(&victim_id))
        );
    }
    // Back, the victim's copies are orphans and go.
    cl.chunkservers[victim].start();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = cl.status().await.unwrap();
        let v = s.servers.iter().find(|x| x.id == victim_id).unwrap();
        if v.state == "up" && v.chunk_count == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "victim still holds {} chunks",
            v.chunk_count
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// "Drain moves everything off a server": a draining server's chunks are copied elsewhere and
/// its copies deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_server_is_emptied() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 4).await;
    let c = cl.client().await;
    for f in 0..3u64 {
        let mut w = c
            .create(&format!("/d/f{f}"), CreateOptions::default())
            .await
            .unwrap();
        w.append(&bytes(20 + f, 0, 300_000)).await.unwrap();
        w.close().await.unwrap();
    }
    let target = chunks(&c, "/d/f0").await[0].servers[0];
    let m = cl.masters();
    m.send(
        pb::ServerStateRequest {
            server_id: target,
            state: "draining".into(),
        },
        |mut c, r| async move { c.set_server_state(r).await },
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = cl.status().await.unwrap();
        let v = s.servers.iter().find(|x| x.id == target).unwrap();
        assert_eq!(v.state, "draining");
        if v.chunk_count == 0 && s.under_replicated == 0 && s.repairs_running == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {} chunks on the drained server",
            v.chunk_count
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for f in 0..3u64 {
        assert_copies(&cl, &c, &format!("/d/f{f}"), 3).await;
    }
}

/// "A backup read is sent after the delay and the first answer wins": the replica a fresh
/// client reads first is frozen; the read is answered by the next replica after the backup
/// delay instead of waiting out the request timeout. Canary: with backup reads off the same
/// read waits for the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_read_is_sent_after_the_delay_and_the_first_answer_wins() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let c = cl.client().await;
    let data = bytes(40, 0, 64 << 10);
    let mut w = c.create("/b/f", CreateOptions::default()).await.unwrap();
    w.append(&data).await.unwrap();
    w.close().await.unwrap();
    // A fresh client knows no latencies and asks the replicas in the masters' order.
    let first = chunks(&c, "/b/f").await[0].servers[0];
    let i = cl.index_of(first).await;
    cl.fault(
        i,
        FaultSpec {
            stall: true,
            disk_only: true,
            ..FaultSpec::default()
        },
    )
    .await;
    let timeout = Duration::from_secs(3);
    let fresh = |backup_reads| {
        let mut o = ClientOptions {
            request_timeout: timeout,
            ..ClientOptions::default()
        };
        o.health.backup_reads = backup_reads;
        cl.client_with(o)
    };
    let hedged = fresh(true).await;
    let t = Instant::now();
    let got = hedged.read("/b/f", 1000, 4096).await.unwrap();
    let took = t.elapsed();
    assert_eq!(got, &data[1000..5096]);
    let st = hedged.health_stats();
    assert_eq!((st.backups_sent, st.backups_won), (1, 1), "{st:?}");
    assert!(took < timeout / 2, "hedged read took {took:?}");

    let plain = fresh(false).await;
    let t = Instant::now();
    let got = plain.read("/b/f", 1000, 4096).await.unwrap();
    let took = t.elapsed();
    assert_eq!(got, &data[1000..5096]);
    assert_eq!(plain.health_stats().backups_sent, 0);
    assert!(
        took >= timeout,
        "an unhedged read skipped the frozen replica: {took:?}"
    );
}

/// "A server several times slower than the median is blacklisted" (seeds/000 §3.3) and
/// "masters stop placing new chunks on a server that many clients report" (seeds/004 §6.2):
/// one of four servers is slowed; a writer's client lists it, reports it, the masters avoid it
/// for new chunks, and once it recovers the client's probes release it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_server_is_blacklisted_avoided_and_released() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 4).await;
    let c = cl.client().await;
    let slow = cl.server_id(0).await;
    // A file with a replica on the server to be slowed.
    let mut w = None;
    for f in 0..20 {
        let path = format!("/s/f{f}");
        let x = c.create(&path, CreateOptions::default()).await.unwrap();
        if chunks(&c, &path).await[0].servers.contains(&slow) {
            w = Some(x);
            break;
        }
        x.close().await.unwrap();
    }
    let mut w = w.expect("no file placed on server 0 in 20 tries");
    cl.fault(
        0,
        FaultSpec {
            delay_ms: 20,
            ..FaultSpec::default()
        },
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 0u64;
    while !c.is_blacklisted(slow) {
        assert!(
            Instant::now() < deadline,
            "not blacklisted: {:?}",
            c.health_stats()
        );
        w.append(&bytes(41, n * 4096, 4096)).await.unwrap();
        n += 1;
    }
    let listed = c.blacklisted();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        listed[0].kind,
        cairn_client::health::ListKind::Slow,
        "{listed:?}"
    );
    assert!(listed[0].reason.contains("median"), "{listed:?}");
    // The client reports it; the masters stop placing new chunks on it.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = cl.status().await.unwrap();
        let v = s.servers.iter().find(|x| x.id == slow).unwrap();
        if v.avoided {
            assert!(v.reported_by >= 1);
            break;
        }
        assert!(Instant::now() < deadline, "masters never avoided {slow}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let other = cl.client().await;
    for f in 0..6 {
        let path = format!("/s/new{f}");
        other
            .create(&path, CreateOptions::default())
            .await
            .unwrap()
            .close()
            .await
            .unwrap();
        for ch in chunks(&c, &path).await {
            assert!(
                !ch.servers.contains(&slow),
                "new chunk {} placed on {slow}",
                ch.id
            );
        }
    }
    w.close().await.unwrap();
    // Healthy again: a probe after the grace releases it.
    cl.fault(0, FaultSpec::default()).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.is_blacklisted(slow) {
        assert!(
            Instant::now() < deadline,
            "never released: {:?}",
            c.health_stats()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(c.health_stats().released >= 1);
}
