//! `cairn fs cat`: files to standard output, a piece at a time — a FlatLogFile's bytes, or a
//! mounted file's through its extents (docs/files.md). Moved from fs.rs.

use super::{PIECE, copy_out};
use cairn_client::Client;
use std::io::Write;

pub(super) async fn cat(c: &Client, paths: &[String]) -> anyhow::Result<()> {
    let mut out = crate::local::Stdout(std::io::stdout());
    for path in paths {
        let st = c.stat(path).await?;
        anyhow::ensure!(!st.is_dir, "{path}: is a directory");
        // A file a mount wrote: its bytes are extents of segments.
        if let Ok((data @ cairn_rpc::files::Data::Extents(_), size)) = c.file_map(path).await {
            let mut off = 0;
            while off < size {
                let n = (size - off).min(PIECE as u64) as usize;
                out.write_all(&c.read_mapped(path, &data, size, off, n).await?)?;
                off += n as u64;
            }
            continue;
        }
        copy_out(
            c,
            path,
            st.length,
            &mut out,
            &indicatif::ProgressBar::hidden(),
        )
        .await?;
    }
    out.flush()?;
    Ok(())
}
