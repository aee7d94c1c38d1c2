//! The `cairn fs` CLI as people use Unix tools: `get` writes as `cp` does, `put` reads
//! standard input, errors name the local path, `mv`/`put` onto a directory go inside it, one-
//! line appends share a chunk, concurrent appends take turns, `| head` ends quietly, names
//! are escaped, `--json` everywhere. Real master and chunkserver processes; the real binary.

mod common;

use common::{Cluster, run_ok};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// `cairn fs ARGS…` against `cl`, as a command to finish.
fn fs(cl: &Cluster, args: &[&str]) -> Command {
    let mut c = common::cairn();
    c.arg("fs")
        .args(args)
        .env("CAIRN_CLUSTER", cl.master_addrs().join(","));
    c
}

fn fails(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "succeeded: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn mkfifo(p: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string; mkfifo(3) only creates a node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_writes_as_cp_does_and_put_reads_standard_input() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let local = dir.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let src = local.join("src.bin");
    std::fs::write(&src, &data).unwrap();
    run_ok(fs(&cl, &["put"]).arg(&src).arg("/d/file"));

    // A symlink: its target is written, the link stays a link.
    let target = local.join("target");
    std::fs::write(&target, b"old").unwrap();
    let link = local.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    run_ok(fs(&cl, &["get", "/d/file"]).arg(&link));
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read(&target).unwrap(), data);

    // A regular file is replaced atomically, keeping its mode; nothing is left beside it.
    let kept = local.join("kept");
    std::fs::write(&kept, b"old").unwrap();
    std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o640)).unwrap();
    run_ok(fs(&cl, &["get", "/d/file"]).arg(&kept));
    assert_eq!(std::fs::read(&kept).unwrap(), data);
    let m = std::fs::metadata(&kept).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o640);

    // A FIFO is written as a stream, and stays a FIFO.
    let fifo = local.join("fifo");
    mkfifo(&fifo);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    run_ok(fs(&cl, &["get", "/d/file"]).arg(&fifo));
    assert_eq!(reader.join().unwrap(), data);
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo()
    );

    // Into a directory, under the cluster's name; `-` is standard output.
    run_ok(fs(&cl, &["get", "/d/file"]).arg(&local));
    assert_eq!(std::fs::read(local.join("file")).unwrap(), data);
    let out = run_ok(&mut fs(&cl, &["get", "/d/file", "-"]));
    assert!(out.stdout == data);
    let names: Vec<String> = std::fs::read_dir(&local)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n.contains("cairn-partial")),
        "temporary files left: {names:?}"
    );

    // `put -` reads standard input.
    let mut child = fs(&cl, &["put", "-", "/d/stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"from stdin\n")
        .unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    let out = run_ok(&mut fs(&cl, &["cat", "/d/stdin"]));
    assert_eq!(out.stdout, b"from stdin\n");

    // Local errors name the path as Unix tools do; a directory is refused before anything
    // is made in the cluster.
    let e = fails(fs(&cl, &["put", "missing.txt", "/d/missing"]).current_dir(&local));
    assert!(
        e.contains("error: missing.txt: No such file or directory"),
        "{e}"
    );
    let e = fails(fs(&cl, &["put"]).arg(&local).arg("/y"));
    assert!(e.contains("is a directory"), "{e}");
    let e = fails(&mut fs(&cl, &["stat", "/y"]));
    assert!(e.contains("no such file") || e.contains("not found"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mv_and_put_onto_a_directory_go_inside_and_trees_copy_with_r() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let local = dir.path().join("tree");
    std::fs::create_dir_all(local.join("sub")).unwrap();
    std::fs::write(local.join("a.txt"), b"a").unwrap();
    std::fs::write(local.join("sub/b.txt"), b"bb").unwrap();
    run_ok(&mut fs(&cl, &["mkdir", "-p", "/dst"]));
    // put onto a directory, and onto a path ending in '/'.
    run_ok(fs(&cl, &["put"]).arg(local.join("a.txt")).arg("/dst"));
    run_ok(fs(&cl, &["put"]).arg(local.join("a.txt")).arg("/other/"));
    assert_eq!(run_ok(&mut fs(&cl, &["cat", "/dst/a.txt"])).stdout, b"a");
    assert_eq!(run_ok(&mut fs(&cl, &["cat", "/other/a.txt"])).stdout, b"a");
    // mv onto a directory (which must exist, as for mv).
    let e = fails(&mut fs(&cl, &["mv", "/other/a.txt", "/dst/sub/"]));
    assert!(e.contains("no such file"), "{e}");
    run_ok(&mut fs(&cl, &["mkdir", "/dst/sub"]));
    run_ok(&mut fs(&cl, &["mv", "/other/a.txt", "/dst/sub/"]));
    run_ok(&mut fs(&cl, &["mkdir", "/dst/sub2"]));
    run_ok(&mut fs(&cl, &["mv", "/dst/sub", "/dst/sub2"]));
    assert_eq!(
        run_ok(&mut fs(&cl, &["cat", "/dst/sub2/sub/a.txt"])).stdout,
        b"a"
    );
    // A tree, both ways.
    run_ok(fs(&cl, &["put", "-r"]).arg(&local).arg("/trees/"));
    assert_eq!(
        run_ok(&mut fs(&cl, &["cat", "/trees/tree/sub/b.txt"])).stdout,
        b"bb"
    );
    let back = dir.path().join("back");
    run_ok(fs(&cl, &["get", "-r", "/trees/tree"]).arg(&back));
    assert_eq!(std::fs::read(back.join("sub/b.txt")).unwrap(), b"bb");
    assert_eq!(std::fs::read(back.join("a.txt")).unwrap(), b"a");
    // du, rm -r.
    let out = run_ok(&mut fs(&cl, &["du", "--json", "/trees"]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["bytes"].as_u64(), v["files"].as_u64()),
        (Some(3), Some(2))
    );
    let out = run_ok(&mut fs(&cl, &["rm", "-r", "--json", "/trees"]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["removed"], 5, "{v}"); // /trees, tree, sub and two files
    assert!(
        !fs(&cl, &["stat", "/trees"])
            .output()
            .unwrap()
            .status
            .success()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_shows_owner_and_mode_and_escapes_names_and_every_command_speaks_json() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let keys = common::create_user(&masters, "carol");
    let creds = dir.path().join("carol.credentials");
    std::fs::write(
        &creds,
        format!(
            "access_key = {}\nsecret_key = {}\n",
            keys.access, keys.secret
        ),
    )
    .unwrap();
    // Each command that changes something answers JSON with --json.
    for (args, field) in [
        (vec!["mkdir", "-p", "/home"], "path"),
        (vec!["create", "/home/plain"], "created"),
        (vec!["create", "/home/bad\nname\x1b[31m"], "created"),
        (vec!["chmod", "640", "/home/plain"], "mode"),
        (vec!["chown", "carol", "/home/plain"], "owner"),
        (vec!["mv", "/home/plain", "/home/moved"], "to"),
        (vec!["seal", "/home/moved"], "sealed"),
    ] {
        let mut a = args.clone();
        a.push("--json");
        let out = run_ok(&mut fs(&cl, &a));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", stdout(&out)));
        assert!(!v[field].is_null(), "{args:?}: {v}");
    }
    let out = run_ok(&mut fs(&cl, &["ls", "-l", "/home"]));
    let text = stdout(&out);
    let moved = text.lines().find(|l| l.ends_with(" moved")).unwrap();
    assert!(moved.starts_with("-rw-r----- carol"), "{text}");
    // The name's control characters never reach the terminal raw.
    assert!(text.contains("bad\\nname\\x1b[31m"), "{text}");
    assert!(!text.contains('\x1b'), "{text:?}");
    // Errors as JSON with --json; the file system's df.
    let e = fails(&mut fs(&cl, &["stat", "/nope", "--json"]));
    let v: serde_json::Value = serde_json::from_str(e.trim()).unwrap();
    assert!(v["error"].as_str().unwrap().contains("/nope"), "{v}");
    let out = run_ok(&mut fs(&cl, &["df", "--json"]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["chunkservers_up"], 3);
    assert!(v["free_bytes"].as_u64().unwrap() > 0);
    // carol, not an admin, may not give her file away; carol can read her own listing.
    let e = fails(fs(&cl, &["chown", "admin", "/home/moved"]).env("CAIRN_CREDENTIALS", &creds));
    assert!(e.to_lowercase().contains("denied"), "{e}");
}

/// A directory larger than a page lists whole and in order, page by page (`ls`, `ls --json`,
/// the client's `list`); a page's cursor is a name, valid while entries come and go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_directory_lists_in_pages_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let c = cl.client().await;
    let n = 2 * cairn_rpc::LIST_PAGE as usize + 500;
    let names: Vec<String> = (0..n).map(|i| format!("f{i:05}")).collect();
    for part in names.chunks(64) {
        futures::future::join_all(part.iter().map(|name| {
            let c = c.clone();
            async move {
                let opts = cairn_client::CreateOptions {
                    parents: true,
                    ..Default::default()
                };
                c.create(&format!("/big/{name}"), opts)
                    .await
                    .unwrap()
                    .close()
                    .await
                    .unwrap();
            }
        }))
        .await;
    }
    let out = run_ok(&mut fs(&cl, &["ls", "/big"]));
    let listed: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    assert_eq!(listed, names);
    let out = run_ok(&mut fs(&cl, &["ls", "-l", "/big", "--json"]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let json: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(json, names);
    assert_eq!(c.list("/big").await.unwrap().len(), n);
    // Pages: cut at the limit, more after the last name; a cursor whose entry was deleted
    // still works; the last page says there is no more.
    let (p1, more) = c.list_page("/big", "", 700).await.unwrap();
    assert!(more);
    assert_eq!(p1.len(), 700);
    assert_eq!(p1[699].name, names[699]);
    c.delete("/big/f00699").await.unwrap();
    c.delete("/big/f00700").await.unwrap();
    let (p2, _) = c.list_page("/big", "f00699", 3).await.unwrap();
    let p2: Vec<&str> = p2.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(p2, ["f00701", "f00702", "f00703"]);
    let (last, more) = c.list_page("/big", &names[n - 3], 10).await.unwrap();
    assert_eq!((last.len(), more), (2, false));
    // A page larger than the most one may hold is cut to it.
    let (all, more) = c.list_page("/big", "", u32::MAX).await.unwrap();
    assert_eq!((all.len(), more), (n - 2, false));
}

/// One-line appends by separate processes share the file's last chunk: a hundred of them
/// leave one chunk, not a hundred (each held a 1 MiB extent on every replica before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_one_line_appends_share_a_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let used = |s: &cairn_rpc::pb::StatusReply| -> Vec<u64> {
        s.servers.iter().map(|c| c.used_bytes).collect()
    };
    let before = used(&cl.status().await.unwrap());
    let mut expect = Vec::new();
    for i in 0..100 {
        let line = format!("line {i}\n");
        let mut child = fs(&cl, &["append", "/logs/app"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(line.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(stdout(&out).trim(), expect.len().to_string());
        expect.extend_from_slice(line.as_bytes());
    }
    let c = cl.client().await;
    let chunks = common::chunks(&c, "/logs/app").await;
    assert_eq!(chunks.len(), 1, "{chunks:?}");
    assert_eq!(run_ok(&mut fs(&cl, &["cat", "/logs/app"])).stdout, expect);
    // Space: the chunk store counts whole extents; one chunk is one extent per replica.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let after = used(&cl.status().await.unwrap());
        let grown: Vec<u64> = after
            .iter()
            .zip(&before)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect();
        if grown.iter().all(|g| *g <= 4 << 20) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "100 appends grew the servers by {grown:?} bytes"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// Appends from several processes at once all succeed, each waiting its turn; every line
/// is in the file once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_take_turns() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let addrs = cl.master_addrs().join(",");
            std::thread::spawn(move || {
                for i in 0..8 {
                    let mut child = common::cairn()
                        .args(["fs", "append", "/shared/log"])
                        .env("CAIRN_CLUSTER", &addrs)
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped())
                        .spawn()
                        .unwrap();
                    let line = format!("writer {w} line {i}\n");
                    child
                        .stdin
                        .take()
                        .unwrap()
                        .write_all(line.as_bytes())
                        .unwrap();
                    let out = child.wait_with_output().unwrap();
                    assert!(
                        out.status.success(),
                        "writer {w} append {i}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let text = stdout(&run_ok(&mut fs(&cl, &["cat", "/shared/log"])));
    for w in 0..4 {
        for i in 0..8 {
            let line = format!("writer {w} line {i}");
            assert_eq!(
                text.lines().filter(|l| *l == line).count(),
                1,
                "{line} in {text}"
            );
        }
    }
    assert_eq!(text.lines().count(), 32);
}

/// `cairn fs cat BIG | head -c 1`: the reader goes away; cairn ends as `cat` does, killed by
/// SIGPIPE, with nothing on standard error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pipe_ends_the_cli_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let big = dir.path().join("big");
    std::fs::write(&big, vec![b'x'; 8 << 20]).unwrap();
    run_ok(fs(&cl, &["put"]).arg(&big).arg("/big"));
    for args in [&["cat", "/big"][..], &["ls", "/"][..]] {
        let mut child = fs(&cl, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut one = [0u8; 1];
        out.read_exact(&mut one).unwrap();
        drop(out);
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = child.wait().unwrap();
        // `ls /` may finish before the pipe closes: then it simply succeeded.
        assert!(
            status.signal() == Some(libc::SIGPIPE) || status.success(),
            "{args:?}: {status:?}"
        );
        assert!(err.is_empty(), "{args:?}: {err}");
        if args[0] == "cat" {
            assert_eq!(status.signal(), Some(libc::SIGPIPE));
        }
    }
}

/// `cairn user list|rotate-key|delete`: the list never shows secrets; a rotated key stops
/// working at once and the new one works; a deleted user's key stops working; a user who owns
/// buckets is not deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_are_listed_rotated_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let keys = common::create_user(&masters, "dave");
    let user = |args: &[&str]| {
        let mut c = common::cairn();
        c.arg("user")
            .args(args)
            .env("CAIRN_CLUSTER", masters.join(","));
        c
    };
    let out = run_ok(&mut user(&["list", "--json"]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let dave = v
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "dave")
        .unwrap();
    assert_eq!(dave["access_key"], keys.access.as_str());
    assert!(!stdout(&out).contains(&keys.secret), "a secret in the list");
    // As dave: with a credentials file.
    let as_dave = |access: &str, secret: &str| {
        let f = dir.path().join(format!("{access}.credentials"));
        std::fs::write(
            &f,
            format!("access_key = {access}\nsecret_key = {secret}\n"),
        )
        .unwrap();
        let mut c = fs(&cl, &["ls", "/"]);
        c.env("CAIRN_CREDENTIALS", f);
        c
    };
    run_ok(&mut as_dave(&keys.access, &keys.secret));
    let out = run_ok(&mut user(&["rotate-key", "dave", "--json"]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (access, secret) = (
        v["access_key"].as_str().unwrap().to_owned(),
        v["secret_key"].as_str().unwrap().to_owned(),
    );
    assert_ne!(access, keys.access);
    fails(&mut as_dave(&keys.access, &keys.secret));
    run_ok(&mut as_dave(&access, &secret));
    run_ok(&mut user(&["delete", "dave"]));
    fails(&mut as_dave(&access, &secret));
    let e = fails(&mut user(&["delete", "dave"]));
    assert!(e.contains("no user dave"), "{e}");
}

/// Masters that do not answer — nothing listening, or a process that accepts and never
/// replies (stopped) — are reported within seconds, naming the address (the SDK alone keeps
/// trying for 15 s).
#[test]
fn unreachable_and_frozen_masters_are_named_within_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    // Accepts (the kernel's backlog) and never answers: a SIGSTOPped master.
    let frozen_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let frozen = frozen_listener.local_addr().unwrap().to_string();
    for addr in [&closed, &frozen] {
        let started = std::time::Instant::now();
        let mut c = common::cairn();
        c.current_dir(dir.path())
            .args(["fs", "ls", "/"])
            .env("CAIRN_CLUSTER", addr);
        let err = fails(&mut c);
        let took = started.elapsed();
        eprintln!("{addr}: {took:?}: {err}");
        assert!(err.contains(addr.as_str()), "{err}");
        assert!(took < std::time::Duration::from_secs(14), "{took:?}");
    }
}

/// `put` and `get` of a large file draw a progress bar on a terminal (script(1) gives the
/// command one) and nothing when stderr is not a terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transfers_show_progress_on_a_terminal_only() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let big = dir.path().join("big");
    std::fs::write(&big, vec![b'p'; 64 << 20]).unwrap();
    // Not a terminal: nothing on stderr.
    let out = run_ok(fs(&cl, &["put"]).arg(&big).arg("/quiet"));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A terminal: the bar, with what it does and the sizes.
    let proto = common::cairn();
    let bin = proto.get_program().to_owned();
    let line = format!(
        "{} fs put {} /shown && {} fs get /shown {}",
        bin.to_string_lossy(),
        big.display(),
        bin.to_string_lossy(),
        dir.path().join("back").display()
    );
    let mut cmd = Command::new("script");
    // The same environment the CLI gets in every test (credentials, …).
    for (k, v) in proto.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let out = cmd
        .args(["-qfec", &line, "/dev/null"])
        .env("CAIRN_CLUSTER", cl.master_addrs().join(","))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("put") && shown.contains("get") && shown.contains("MiB"),
        "{shown}"
    );
    assert_eq!(
        std::fs::read(dir.path().join("back")).unwrap().len(),
        64 << 20
    );
}
