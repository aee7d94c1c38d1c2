//! The volume through real NBD clients: qemu-img, qemu-io, nbdinfo, nbdcopy and fio's nbd
//! engine write and read back what they wrote.

use super::common::nbd::pattern;
use super::common::{self, Cluster};
use super::{SERIAL, create_volume, ok, tool};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_nbdcopy_and_fio_read_back_what_they_wrote() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let nbd = common::nbd::server(&masters, &[]);
    let v = create_volume(&masters, "disk1", "64m");
    assert_eq!(v["size"], 64 << 20);
    assert_eq!(v["block_size"], 4096);
    let uri = format!("nbd://{}/disk1", nbd.addr);

    // nbdinfo: the export as the handshake describes it.
    let info: serde_json::Value =
        serde_json::from_str(&ok(tool("nbdinfo").args(["--json", &uri]))).unwrap();
    let e = &info["exports"][0];
    assert_eq!(e["export-size"], 64 << 20, "{info}");
    assert_eq!(e["block_size_minimum"], 4096, "{info}");
    assert_eq!(e["can_multi_conn"], true, "{info}");
    assert_eq!(e["can_flush"], true);
    assert_eq!(e["can_fua"], true);
    assert_eq!(e["can_trim"], true);
    assert_eq!(e["can_zero"], true);
    assert_eq!(info["protocol"], "newstyle-fixed", "{info}");
    let list = ok(tool("nbdinfo").args(["--list", &format!("nbd://{}", nbd.addr)]));
    assert!(list.contains("disk1"), "{list}");

    // qemu-img: a raw image with data and holes onto the volume, compared, and back.
    let img = dir.path().join("disk.img");
    let mut body = pattern(1, 20 << 20);
    body.resize(40 << 20, 0);
    body.extend(pattern(2, 8 << 20));
    body.resize(64 << 20, 0);
    std::fs::write(&img, &body).unwrap();
    ok(tool("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&img)
        .arg(&uri));
    ok(tool("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&img)
        .arg(&uri));
    // Canary: compare does see a difference.
    let other = dir.path().join("other.img");
    let mut changed = body.clone();
    changed[12345] ^= 1;
    std::fs::write(&other, &changed).unwrap();
    let diff = tool("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&other)
        .arg(&uri)
        .output()
        .unwrap();
    assert_eq!(
        diff.status.code(),
        Some(1),
        "qemu-img compare missed a flipped bit"
    );
    let back = dir.path().join("back.img");
    ok(tool("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(&uri)
        .arg(&back));
    assert!(
        std::fs::read(&back).unwrap() == body,
        "qemu-img read back other bytes"
    );

    // nbdcopy: random data in, out, compared.
    let rnd = dir.path().join("rnd.img");
    let mut r = pattern(3, 64 << 20);
    for (i, b) in r.iter_mut().enumerate() {
        *b ^= (i as u64 % 251) as u8;
    }
    std::fs::write(&rnd, &r).unwrap();
    ok(tool("nbdcopy").arg(&rnd).arg(&uri));
    let out = dir.path().join("out.img");
    ok(tool("nbdcopy").arg(&uri).arg(&out));
    assert!(
        std::fs::read(&out).unwrap() == r,
        "nbdcopy read back other bytes"
    );

    // qemu-io: patterns, zeroes, discards.
    let io = ok(tool("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x5a 1M 64k",
        "-c",
        "read -P 0x5a 1M 64k",
        "-c",
        "write -z 2M 128k",
        "-c",
        "read -P 0 2M 128k",
        "-c",
        "discard 8M 64k",
        "-c",
        "read -P 0 8M 64k",
        "-c",
        "write -P 0x11 60M 4k",
        "-c",
        "aio_write -P 0x22 61M 4k",
        "-c",
        "aio_write -P 0x33 62M 4k",
        "-c",
        "aio_flush",
        "-c",
        "read -P 0x22 61M 4k",
        "-c",
        "read -P 0x33 62M 4k",
        &uri,
    ]));
    assert!(!io.contains("Pattern verification failed"), "{io}");
    assert!(!io.to_lowercase().contains("error"), "{io}");
    // And again in a new process (a new connection reads what the last one wrote).
    let io = ok(tool("qemu-io").args(["-f", "raw", "-c", "read -P 0x11 60M 4k", &uri]));
    assert!(!io.contains("Pattern verification failed"), "{io}");
    // Canary: a wrong pattern is reported.
    let bad = tool("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0x12 60M 4k", &uri])
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&bad.stdout).into_owned() + &String::from_utf8_lossy(&bad.stderr);
    assert!(said.contains("Pattern verification failed"), "{said}");

    // fio's nbd engine: random writes at depth 16 with a flush every 16, then verified.
    let fio = ok(tool("fio").args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        "--offset=16m",
        "--size=8m",
        "--fsync=16",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--output-format=json",
    ]));
    let j: serde_json::Value = serde_json::from_str(&fio[fio.find('{').unwrap()..]).unwrap();
    let job = &j["jobs"][0];
    assert_eq!(job["error"], 0, "{fio}");
    assert!(
        job["write"]["io_bytes"].as_u64().unwrap() >= 8 << 20,
        "{fio}"
    );
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() >= 8 << 20,
        "fio verified nothing"
    );

    // A chunkserver SIGKILLed: I/O goes on (writes on the two left, reads from any copy).
    cl.chunkservers[0].kill();
    let io = ok(tool("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x77 30M 256k",
        "-c",
        "flush",
        "-c",
        "read -P 0x77 30M 256k",
        "-c",
        "read -P 0x5a 1M 64k",
        &uri,
    ]));
    assert!(!io.contains("Pattern verification failed"), "{io}");
    assert!(!io.to_lowercase().contains("error"), "{io}");

    // The CLI: list, info, status.
    let m = masters.join(",");
    let list: serde_json::Value = serde_json::from_slice(
        &common::run_ok(common::cairn().args(["volume", "list", "--json", "--cluster", &m])).stdout,
    )
    .unwrap();
    assert_eq!(list[0]["name"], "disk1");
    let status: serde_json::Value = serde_json::from_slice(
        &common::run_ok(common::cairn().args(["status", "--json", "--cluster", &m])).stdout,
    )
    .unwrap();
    let listed = status["nbd"].as_array().unwrap();
    assert!(
        listed
            .iter()
            .any(|s| s["uri"] == format!("nbd://{}", nbd.addr) && s["pid"] == nbd.pid()),
        "{status}"
    );
}
