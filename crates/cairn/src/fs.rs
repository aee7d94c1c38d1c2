//! `cairn fs …`: the cluster's files through the client SDK, with the conventions of `cp`,
//! `mv`, `ls`, `du` and `df`.

mod cat;
mod ls;
mod space;

pub(crate) use space::check_fits;
use space::{df, du, size};

use crate::cluster::ClusterArgs;
use crate::local::{Dest, Source, path_error};
use cairn_client::{Client, CreateOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

#[derive(clap::Subcommand)]
pub enum FsCommand {
    /// Copy a local file into the cluster (a new file, sealed when complete); onto a directory
    /// (or a path ending in `/`), into it under the local name.
    Put {
        /// The local file; `-` reads standard input.
        local: PathBuf,
        /// Where in the cluster.
        path: String,
        /// Copy a local directory and everything below it.
        #[arg(short = 'r', long)]
        recursive: bool,
        #[command(flatten)]
        new: NewFile,
    },
    /// Copy a file out of the cluster, as `cp` writes: through symlinks, into FIFOs and
    /// devices as a stream, over a regular file atomically (keeping its mode).
    Get {
        /// The file in the cluster.
        path: String,
        /// The local destination (a directory: into it under the cluster's name); `-` is
        /// standard output.
        local: PathBuf,
        /// Copy a directory of the cluster and everything below it.
        #[arg(short = 'r', long)]
        recursive: bool,
    },
    /// Print files.
    Cat {
        /// The files, printed one after the other.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Append standard input to a file (created if missing); prints the acknowledged offset.
    /// Waits its turn behind another writer of the file (up to --wait).
    Append {
        /// The file in the cluster.
        path: String,
        /// How long to wait for another writer of the file to finish, in seconds.
        #[arg(long, default_value_t = 30)]
        wait: u64,
        /// How the file is made if it is missing.
        #[command(flatten)]
        new: NewFile,
    },
    /// Create an empty file (open for appends).
    Create {
        /// The file in the cluster.
        path: String,
        #[command(flatten)]
        new: NewFile,
    },
    /// List a directory (`-l`: owner, mode, length, chunks, state, modified).
    Ls {
        /// The directory (or a file).
        #[arg(default_value = "/")]
        path: String,
        /// Long listing.
        #[arg(short = 'l')]
        long: bool,
    },
    /// Describe a file or directory: length, chunks, policy, owner, mode, writer.
    Stat {
        /// The file or directory.
        path: String,
    },
    /// Delete files, or empty directories (`-r`: a directory and everything below it).
    Rm {
        /// What to delete.
        #[arg(required = true)]
        paths: Vec<String>,
        /// Delete directories and everything below them.
        #[arg(short = 'r', long)]
        recursive: bool,
    },
    /// Seal a file: no more appends.
    Seal {
        /// The file in the cluster.
        path: String,
    },
    /// Make a directory; `--policy` sets the default policy of files created below it (with
    /// `-p` also on a directory that exists).
    Mkdir {
        /// The directory to make.
        path: String,
        /// Make missing parents too; no error if it exists.
        #[arg(short = 'p')]
        parents: bool,
        /// Default redundancy policy of files created below it (as --policy of `fs put`).
        #[arg(long)]
        policy: Option<cairn_client::Policy>,
    },
    /// Rename a file or directory; onto a directory (or a path ending in `/`), into it.
    Mv {
        /// What to move.
        from: String,
        /// The new name, or a directory to move it into.
        to: String,
    },
    /// Change permission bits (octal, as chmod 640).
    Chmod {
        /// The new bits, in octal.
        mode: String,
        /// The files or directories.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Change the owning user (an admin may).
    Chown {
        /// The new owner (a user name).
        owner: String,
        /// The files or directories.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Bytes stored under each path (files' lengths, summed through directories).
    Du {
        /// Files or directories.
        #[arg(default_value = "/")]
        paths: Vec<String>,
        /// Print exact bytes rather than KiB/MiB/GiB.
        #[arg(short = 'b', long)]
        bytes: bool,
    },
    /// The cluster's capacity, used and free space (chunkservers up), and space awaiting
    /// reclamation.
    Df {
        /// Print exact bytes rather than KiB/MiB/GiB.
        #[arg(short = 'b', long)]
        bytes: bool,
    },
}

/// How a new file is made.
#[derive(clap::Args)]
pub struct NewFile {
    /// Redundancy policy: replicas:N, ec:K+M or replicas:N,then:ec:K+M, optionally ,lz4
    /// (default: the directory's, else replicas:3).
    #[arg(long, conflicts_with = "replicas")]
    policy: Option<cairn_client::Policy>,
    /// Shorthand for --policy replicas:N.
    #[arg(long)]
    replicas: Option<u8>,
    /// Copies durable before a write is acknowledged (default: a majority of the replicas).
    #[arg(long)]
    min_copy: Option<u32>,
}

impl NewFile {
    fn options(&self) -> CreateOptions {
        let policy = self.policy.or_else(|| {
            self.replicas
                .and_then(|n| CreateOptions::replicas(n).policy)
        });
        CreateOptions {
            policy,
            min_copy: self.min_copy,
            ..CreateOptions::default()
        }
    }
}

#[derive(clap::Args)]
pub struct FsArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Print JSON (errors too, on standard error).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: FsCommand,
}

/// Pieces a transfer moves at a time.
const PIECE: usize = 4 << 20;

fn progress(total: u64, what: &str) -> indicatif::ProgressBar {
    if total < (64 << 20) || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template"),
    );
    pb.set_message(what.to_owned());
    pb
}

pub fn run(a: FsArgs) -> anyhow::Result<()> {
    let masters = a.cluster.masters()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(fs(masters, a.json, a.command))
}

/// Prints `v` as one JSON line, or `text` without `--json`.
fn report(json: bool, v: serde_json::Value, text: impl FnOnce() -> String) {
    if json {
        println!("{v}");
    } else {
        let t = text();
        if !t.is_empty() {
            println!("{t}");
        }
    }
}

async fn fs(masters: Vec<String>, json: bool, cmd: FsCommand) -> anyhow::Result<()> {
    let c = crate::cluster::client(&masters).await?;
    match cmd {
        FsCommand::Put {
            local,
            path,
            recursive,
            new,
        } => {
            if recursive {
                let m = std::fs::metadata(&local).map_err(|e| path_error(&local, e))?;
                if m.is_dir() {
                    let to = into_dir(&c, &path, &local).await?;
                    return put_tree(&c, &local, &to, &new, json).await;
                }
            }
            let src = Source::open(&local)?;
            let to = into_dir(&c, &path, &local).await?;
            put_one(&c, src, &to, &new, json).await?;
        }
        FsCommand::Get {
            path,
            local,
            recursive,
        } => {
            let st = c.stat(&path).await?;
            if st.is_dir {
                anyhow::ensure!(recursive, "{path}: is a directory (-r copies a tree)");
                let to = match std::fs::metadata(&local) {
                    Ok(m) if m.is_dir() => local.join(base_name(&path)),
                    _ => local.clone(),
                };
                return get_tree(&c, &path, &to, json).await;
            }
            get_one(&c, &path, st.length, &local).await?;
            report(
                json,
                serde_json::json!({"path": path, "length": st.length}),
                String::new,
            );
        }
        FsCommand::Cat { paths } => cat::cat(&c, &paths).await?,
        FsCommand::Append { path, wait, new } => {
            let mut data = Vec::new();
            std::io::stdin().read_to_end(&mut data)?;
            let at = crate::append::append(
                &c,
                &path,
                &data,
                new.options(),
                std::time::Duration::from_secs(wait),
            )
            .await?;
            report(
                json,
                serde_json::json!({"path": path, "offset": at, "length": data.len()}),
                || at.to_string(),
            );
        }
        FsCommand::Ls { path, long } => ls::ls(&c, &path, long, json).await?,
        FsCommand::Stat { path } => {
            let st = c.stat(&path).await?;
            if json {
                println!("{}", serde_json::to_string(&st)?);
            } else if st.is_dir {
                let owner = owner_name(&st.owner);
                match &st.policy {
                    Some(p) => println!(
                        "{}: directory, owner {owner}, mode {:04o}, new files {p}",
                        st.path, st.mode
                    ),
                    None => println!(
                        "{}: directory, owner {owner}, mode {:04o}",
                        st.path, st.mode
                    ),
                }
            } else {
                println!(
                    "{}: {} bytes, {} chunk(s), {} (writes acknowledged at {} copies), {}, \
                     owner {}, mode {:04o}{}",
                    st.path,
                    st.length,
                    st.chunks,
                    st.policy.as_deref().unwrap_or("replicas:3"),
                    st.min_copy,
                    if st.sealed { "sealed" } else { "open" },
                    owner_name(&st.owner),
                    st.mode,
                    st.writer
                        .map(|w| format!(", written by {w}"))
                        .unwrap_or_default()
                );
            }
        }
        FsCommand::Rm { paths, recursive } => {
            for path in paths {
                let n = if recursive {
                    rm_tree(&c, &path).await?
                } else {
                    c.delete(&path).await?;
                    1
                };
                report(
                    json,
                    serde_json::json!({"path": path, "removed": n}),
                    String::new,
                );
            }
        }
        FsCommand::Seal { path } => {
            let w = c.open_append(&path).await?;
            let len = w.seal().await?;
            report(
                json,
                serde_json::json!({"path": path, "length": len, "sealed": true}),
                || format!("{path}: sealed at {len} bytes"),
            );
        }
        FsCommand::Create { path, new } => {
            let w = c.create(&path, new.options()).await?;
            w.close().await?;
            report(
                json,
                serde_json::json!({"path": path, "created": true}),
                String::new,
            );
        }
        FsCommand::Mkdir {
            path,
            parents,
            policy,
        } => {
            c.mkdir_with_policy(&path, parents, policy.as_ref()).await?;
            report(
                json,
                serde_json::json!({"path": path, "policy": policy.map(|p| p.to_string())}),
                String::new,
            );
        }
        FsCommand::Mv { from, to } => {
            let to = into_dir(&c, &to, Path::new(base_name(&from))).await?;
            c.rename(&from, &to).await?;
            report(
                json,
                serde_json::json!({"from": from, "to": to}),
                String::new,
            );
        }
        FsCommand::Chmod { mode, paths } => {
            let bits = u32::from_str_radix(&mode, 8)
                .ok()
                .filter(|b| *b <= 0o7777)
                .ok_or_else(|| anyhow::anyhow!("{mode}: not an octal mode (as 644 or 0750)"))?;
            for path in paths {
                c.set_attr(&path, Some(bits), None).await?;
                report(
                    json,
                    serde_json::json!({"path": path, "mode": format!("{bits:04o}")}),
                    String::new,
                );
            }
        }
        FsCommand::Chown { owner, paths } => {
            for path in paths {
                c.set_attr(&path, None, Some(&owner)).await?;
                report(
                    json,
                    serde_json::json!({"path": path, "owner": owner}),
                    String::new,
                );
            }
        }
        FsCommand::Du { paths, bytes } => {
            for path in paths {
                let (length, files, dirs) = du(&c, &path).await?;
                report(
                    json,
                    serde_json::json!({"path": path, "bytes": length, "files": files, "dirs": dirs}),
                    || format!("{}\t{path}", size(length, bytes)),
                );
            }
        }
        FsCommand::Df { bytes } => df(c.masters(), bytes, json).await?,
    }
    Ok(())
}

/// The cluster path a copy or move named `to` lands at: `to` itself, or `to/NAME` when `to`
/// ends in `/` or is a directory (`NAME`: `source`'s last component), as `cp` and `mv` do.
async fn into_dir(c: &Client, to: &str, source: &Path) -> anyhow::Result<String> {
    let name = || -> anyhow::Result<String> {
        anyhow::ensure!(
            source.as_os_str() != "-",
            "{to}: is a directory; name the file standard input is copied to"
        );
        source
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| anyhow::anyhow!("{}: has no file name", source.display()))
    };
    if to.ends_with('/') {
        return Ok(format!("{to}{}", name()?));
    }
    match c.stat(to).await {
        Ok(st) if st.is_dir => Ok(format!("{}/{}", to.trim_end_matches('/'), name()?)),
        _ => Ok(to.to_owned()),
    }
}

/// A cluster path's last component.
fn base_name(path: &str) -> &str {
    path.rsplit('/').find(|s| !s.is_empty()).unwrap_or("/")
}

/// A directory entry's path.
fn child(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

async fn put_one(
    c: &Client,
    mut src: Source,
    path: &str,
    new: &NewFile,
    json: bool,
) -> anyhow::Result<u64> {
    let policy = match new.options().policy {
        Some(p) => p,
        None => inherited(c, path).await,
    };
    if let Some(total) = src.length() {
        check_fits(c.masters(), total, &policy).await?;
    }
    let bar = progress(src.length().unwrap_or(0), "put");
    let mut w = c.create(path, new.options()).await?;
    let mut buf = vec![0u8; PIECE];
    loop {
        let n = read_full(src.reader(), &mut buf)?;
        if n == 0 {
            break;
        }
        w.append(&buf[..n]).await?;
        bar.inc(n as u64);
    }
    let len = w.seal().await?;
    bar.finish_and_clear();
    report(
        json,
        serde_json::json!({"path": path, "length": len}),
        || format!("{path}: {len} bytes"),
    );
    Ok(len)
}

/// `put -r`: `local`'s tree made at `to` (directories first, then their files).
async fn put_tree(
    c: &Client,
    local: &Path,
    to: &str,
    new: &NewFile,
    json: bool,
) -> anyhow::Result<()> {
    let mut todo = vec![(local.to_path_buf(), to.to_owned())];
    while let Some((dir, remote)) = todo.pop() {
        c.mkdir_with_policy(&remote, true, None).await?;
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| path_error(&dir, e))?
            .collect::<Result<_, _>>()
            .map_err(|e| path_error(&dir, e))?;
        entries.sort_by_key(std::fs::DirEntry::file_name);
        for e in entries {
            let p = e.path();
            let r = child(&remote, &e.file_name().to_string_lossy());
            if std::fs::metadata(&p)
                .map_err(|e| path_error(&p, e))?
                .is_dir()
            {
                todo.push((p, r));
            } else {
                put_one(c, Source::open(&p)?, &r, new, json).await?;
            }
        }
    }
    Ok(())
}

async fn get_one(c: &Client, path: &str, length: u64, local: &Path) -> anyhow::Result<()> {
    let mut dest = Dest::open(local, path)?;
    let bar = progress(length, "get");
    copy_out(c, path, length, dest.writer(), &bar).await?;
    dest.finish()?;
    bar.finish_and_clear();
    Ok(())
}

/// `get -r`: the cluster's tree at `path` made at `local`.
async fn get_tree(c: &Client, path: &str, local: &Path, json: bool) -> anyhow::Result<()> {
    let mut todo = vec![(path.to_owned(), local.to_path_buf())];
    while let Some((remote, dir)) = todo.pop() {
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(e) => return Err(path_error(&dir, e)),
        }
        for e in c.list(&remote).await? {
            let r = child(&remote, &e.name);
            let l = dir.join(&e.name);
            if e.is_dir {
                todo.push((r, l));
            } else {
                let length = c.stat(&r).await?.length;
                get_one(c, &r, length, &l).await?;
                report(
                    json,
                    serde_json::json!({"path": r, "length": length}),
                    String::new,
                );
            }
        }
    }
    Ok(())
}

/// `rm -r`: deletes everything below `path`, then `path`; returns how many entries went.
async fn rm_tree(c: &Client, path: &str) -> anyhow::Result<u64> {
    let st = c.stat(path).await?;
    let mut n = 0;
    if st.is_dir {
        for e in c.list(path).await? {
            n += Box::pin(rm_tree(c, &child(path, &e.name))).await?;
        }
    }
    c.delete(path).await?;
    Ok(n + 1)
}

/// An owner as people read it: the cluster itself owns what servers made.
pub(crate) fn owner_name(owner: &str) -> &str {
    if owner.is_empty() { "cairn" } else { owner }
}

/// `rwxr-x---` for 0o750 (setuid, setgid and sticky as `ls` shows them).
pub(crate) fn mode_string(mode: u32) -> String {
    let mut s = String::with_capacity(9);
    for (shift, special, set, unset) in [
        (6, 0o4000, 's', 'S'),
        (3, 0o2000, 's', 'S'),
        (0, 0o1000, 't', 'T'),
    ] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(match (bits & 1 != 0, mode & special != 0) {
            (true, true) => set,
            (false, true) => unset,
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    s
}

/// A time in milliseconds since the epoch as `YYYY-MM-DD HH:MM` (UTC).
pub(crate) fn time_string(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// A name with control characters and backslashes escaped (`\n`, `\t`, `\x1b`, `\\`), so
/// a name cannot move the terminal's cursor or fake another line.
pub(crate) fn escape(name: &str) -> String {
    if !name.chars().any(|c| c.is_control() || c == '\\') {
        return name.to_owned();
    }
    let mut s = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        match c {
            '\n' => s.push_str("\\n"),
            '\t' => s.push_str("\\t"),
            '\r' => s.push_str("\\r"),
            '\\' => s.push_str("\\\\"),
            c if c.is_control() => s.push_str(&format!("\\x{:02x}", c as u32)),
            c => s.push(c),
        }
    }
    s
}

/// The policy a new file at `path` would get: its nearest existing directory's default.
async fn inherited(c: &Client, path: &str) -> cairn_client::Policy {
    let mut dir = path;
    while let Some((parent, _)) = dir.rsplit_once('/') {
        let parent = if parent.is_empty() { "/" } else { parent };
        if let Ok(st) = c.stat(parent).await {
            return st.policy.and_then(|p| p.parse().ok()).unwrap_or_default();
        }
        if parent == "/" {
            break;
        }
        dir = parent;
    }
    cairn_client::Policy::default()
}

fn read_full(f: &mut (impl Read + ?Sized), buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

pub(super) async fn copy_out(
    c: &Client,
    path: &str,
    length: u64,
    out: &mut (impl Write + ?Sized),
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<()> {
    let mut off = 0;
    while off < length {
        let n = (length - off).min(PIECE as u64) as usize;
        let data = c.read(path, off, n).await?;
        out.write_all(&data)?;
        off += n as u64;
        bar.inc(n as u64);
    }
    Ok(())
}

pub(crate) fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_control_characters_are_escaped() {
        assert_eq!(escape("plain name"), "plain name");
        assert_eq!(escape("a\nb"), "a\\nb");
        assert_eq!(escape("\x1b[31mred"), "\\x1b[31mred");
        assert_eq!(escape("back\\slash"), "back\\\\slash");
    }

    #[test]
    fn modes_and_times_read_as_ls_prints_them() {
        assert_eq!(mode_string(0o750), "rwxr-x---");
        assert_eq!(mode_string(0o644), "rw-r--r--");
        assert_eq!(mode_string(0o1777), "rwxrwxrwt");
        assert_eq!(time_string(0), "1970-01-01 00:00");
        assert_eq!(time_string(1_795_000_000_000), "2026-11-18 11:06");
    }
}
