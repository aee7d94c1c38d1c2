//! A real `cairn chunkserver` process, killed with SIGKILL in the middle of concurrent appends
//! over the network and restarted: every acknowledged append is still there, and nothing past
//! the durable length is served.

use cairn_client::DataConn;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

fn start(dir: &std::path::Path) -> (Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["chunkserver", "--data-dir"])
        .arg(dir)
        .args([
            "--disks",
            "2",
            "--disk-size",
            "128m",
            "--listen",
            "127.0.0.1:0",
            // Alone, without masters: no capability keys to check requests with.
            "--insecure",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start cairn chunkserver");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    (child, addr)
}

/// The byte at `pos` of chunk `id`: any durable prefix of a chunk must match it.
fn byte(id: u64, pos: u64) -> u8 {
    (pos.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ id.wrapping_mul(31)).to_le_bytes()[3]
}

fn data(id: u64, from: u64, len: usize) -> Vec<u8> {
    (from..from + len as u64).map(|p| byte(id, p)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_appends_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr) = start(dir.path());
    let conn = Arc::new(
        DataConn::connect(addr, std::time::Duration::from_secs(30))
            .await
            .unwrap(),
    );
    let chunks = 8u64;
    let mut writers = Vec::new();
    for id in 0..chunks {
        let conn = conn.clone();
        writers.push(tokio::spawn(async move {
            // The last acknowledged length; an error (the kill) ends the writer.
            let mut acked = match conn.create(id, 1, data(id, 0, 1000)).await {
                Ok(n) => n,
                Err(_) => return None,
            };
            for k in 0u64.. {
                let size = 512 + ((k * 7919 + id * 104_729) % 60_000) as usize;
                match conn.append(id, acked, data(id, acked, size)).await {
                    Ok(n) => acked = n,
                    Err(_) => break,
                }
            }
            Some(acked)
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    // SIGKILL: no shutdown path runs.
    child.kill().unwrap();
    child.wait().unwrap();
    let mut acked = Vec::new();
    for w in writers {
        acked.push(w.await.unwrap());
    }
    let created = acked.iter().filter(|a| a.is_some()).count();
    assert!(created > 0, "no chunk was created before the kill");
    let total: u64 = acked.iter().flatten().sum();
    assert!(
        total > 100_000,
        "too little was acknowledged ({total} B) to test anything"
    );

    let (mut child, addr) = start(dir.path());
    let conn = DataConn::connect(addr, std::time::Duration::from_secs(30))
        .await
        .unwrap();
    for (id, acked) in acked.iter().enumerate() {
        let id = id as u64;
        let Some(acked) = *acked else { continue };
        let st = conn.stat(id).await.unwrap();
        assert!(
            st.length >= acked,
            "chunk {id}: {acked} B acknowledged, {} B after restart",
            st.length
        );
        // Everything the server now serves is the bytes that were written: acknowledged ones,
        // and possibly a whole unacknowledged append that became durable; never a torn tail.
        let got = conn.read(id, 0, st.length as usize).await.unwrap();
        assert!(got == data(id, 0, st.length as usize), "chunk {id} differs");
    }
    // SIGTERM: a clean stop (final checkpoints), exit status 0.
    // SAFETY: plain syscall on our child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "chunkserver exited with {status}");
}
