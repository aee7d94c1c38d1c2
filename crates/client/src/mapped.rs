//! Reading a file through the file service's map (docs/files.md): its bytes are extents of
//! segments (what a mount wrote) or its own FlatLogFile (what `cairn fs` wrote).

use crate::fs::{Client, Error, Result};
use cairn_rpc::files::{Data, FileQuery, FileReply, segment_path};

impl Client {
    /// Where the file at `path` keeps its bytes, and its size.
    ///
    /// A file a mount closed a moment ago and still commits (docs/files.md "A close that
    /// does not wait") is asked for again until the mount's hold ends.
    ///
    /// # Errors
    /// As the masters' `FileRead`.
    pub async fn file_map(&self, path: &str) -> Result<(Data, u64)> {
        let q = FileQuery::Map {
            path: path.to_owned(),
            ino: 0,
            mount: String::new(),
        };
        let started = std::time::Instant::now();
        let reply = loop {
            match self.masters().file_query(&q).await {
                Err(e)
                    if e.kind == cairn_rpc::ErrorKind::LeaseHeld
                        && started.elapsed() < std::time::Duration::from_secs(120) =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                r => break r?,
            }
        };
        match reply {
            FileReply::Map { attr, data, .. } => Ok((data, attr.size)),
            other => Err(Error::Meta(cairn_rpc::MetaError::internal(format!(
                "a map answered with {other:?}"
            )))),
        }
    }

    /// Up to `len` bytes at `offset` of the file at `path` whose bytes `data` says where to
    /// find and which holds `size` bytes: nothing past the size, zeros in gaps (a sparse file,
    /// bytes of its own log not committed yet).
    ///
    /// # Errors
    /// A segment or the file's log cannot be read.
    pub async fn read_mapped(
        &self,
        path: &str,
        data: &Data,
        size: u64,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        if offset >= size {
            return Ok(Vec::new());
        }
        let end = offset + (len as u64).min(size - offset);
        let want = (end - offset) as usize;
        // (Where in the answer, the bytes): one piece that is the whole answer is the
        // answer, without a zeroed buffer and a copy (a sequential reader's case).
        let mut pieces: Vec<(usize, Vec<u8>)> = Vec::new();
        let own = [cairn_rpc::files::Extent {
            offset: 0,
            len: size,
            seg: 0,
            seg_offset: 0,
        }];
        let extents = match data {
            Data::Extents(x) => x.as_slice(),
            Data::Own => &own,
        };
        let mut committed = None;
        for e in extents
            .iter()
            .filter(|e| e.offset < end && e.end() > offset)
        {
            let lo = e.offset.max(offset);
            let hi = e.end().min(end);
            let at = e.seg_offset + (lo - e.offset);
            let n = (hi - lo) as usize;
            let bytes = if e.seg == 0 {
                // The file's own log: its committed bytes (past them, zeros).
                let c = match committed {
                    Some(c) => c,
                    None => *committed.insert(self.stat(path).await?.length),
                };
                let n = (n as u64).min(c.saturating_sub(at)) as usize;
                if n == 0 {
                    continue;
                }
                self.read(path, at, n).await?
            } else {
                self.read_acknowledged(&segment_path(e.seg), at, n).await?
            };
            pieces.push(((lo - offset) as usize, bytes));
        }
        if let [(0, b)] = pieces.as_slice()
            && b.len() == want
        {
            return Ok(pieces.swap_remove(0).1);
        }
        let mut out = vec![0u8; want];
        for (from, bytes) in pieces {
            out[from..from + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(out)
    }
}
