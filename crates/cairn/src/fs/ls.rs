//! `cairn fs ls`: a directory listed page by page (moved from fs.rs unchanged).

use super::{escape, mode_string, owner_name, time_string};
use cairn_client::Client;

/// `ls` and `ls -l`; names with control characters escaped as `ls -b` does. A directory is
/// read a page at a time and each page printed as it comes (memory is one page).
pub(super) async fn ls(c: &Client, path: &str, long: bool, json: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut after = String::new();
    let mut first_page = true;
    let mut printed = 0usize;
    if json {
        write!(out, "[")?;
    }
    loop {
        let (page, more) = match c.list_page(path, &after, cairn_rpc::LIST_PAGE).await {
            Ok(p) => p,
            Err(cairn_client::Error::Meta(e))
                if first_page
                    && matches!(
                        e.kind,
                        cairn_rpc::ErrorKind::InvalidArgument | cairn_rpc::ErrorKind::NotADirectory
                    ) =>
            {
                // A file: listed as `ls FILE` lists it.
                let st = c.stat(path).await?;
                let entry = cairn_client::DirEntry {
                    name: path.to_owned(),
                    is_dir: false,
                    length: st.length,
                    chunks: st.chunks as u32,
                    sealed: st.sealed,
                    mtime_ms: st.mtime_ms,
                    owner: st.owner,
                    mode: st.mode,
                };
                (vec![entry], false)
            }
            Err(e) => return Err(e.into()),
        };
        first_page = false;
        for e in &page {
            if json {
                if printed > 0 {
                    write!(out, ",")?;
                }
                serde_json::to_writer(&mut out, e)?;
            } else {
                print_entry(&mut out, e, long)?;
            }
            printed += 1;
        }
        match page.last() {
            Some(last) if more => after = last.name.clone(),
            _ => break,
        }
        out.flush()?;
    }
    if json {
        writeln!(out, "]")?;
    }
    out.flush()?;
    Ok(())
}

fn print_entry(
    out: &mut impl std::io::Write,
    e: &cairn_client::DirEntry,
    long: bool,
) -> std::io::Result<()> {
    let name = escape(&e.name);
    let name = if e.is_dir { format!("{name}/") } else { name };
    if long {
        writeln!(
            out,
            "{}{} {:<8} {:>14} {:>6} {:<6} {} {}",
            if e.is_dir { 'd' } else { '-' },
            mode_string(e.mode),
            owner_name(&e.owner),
            e.length,
            e.chunks,
            if e.is_dir {
                "-"
            } else if e.sealed {
                "sealed"
            } else {
                "open"
            },
            time_string(e.mtime_ms),
            name
        )
    } else {
        writeln!(out, "{name}")
    }
}
