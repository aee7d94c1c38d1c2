//! Replica→EC conversions in the state: a conversion begun (its group id and servers
//! chosen) and ended (the chunk switched to its group, or abandoned).

use super::*;

impl State {
    /// Begins converting `chunk_id` onto `servers`: its group's id is the next chunk id.
    pub(super) fn convert_begin(
        &mut self,
        chunk_id: ChunkId,
        servers: &[ServerId],
        now_ms: u64,
    ) -> Response {
        let (ino, c) = self
            .chunk(chunk_id)
            .ok_or_else(|| MetaError::not_found(format!("chunk {chunk_id}")))?;
        let policy = ino.file().expect("chunks belong to files").policy;
        let Some(ec) = policy.ec.filter(|e| e.then) else {
            return Err(MetaError::invalid(format!(
                "chunk {chunk_id}: its file's policy converts nothing"
            )));
        };
        if !c.sealed || c.ec.is_some() || c.length == 0 {
            return Err(MetaError::invalid(format!(
                "chunk {chunk_id} is not a sealed replicated chunk"
            )));
        }
        let mut distinct = servers.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        if servers.len() != usize::from(ec.k) + usize::from(ec.m) || distinct.len() != servers.len()
        {
            return Err(MetaError::invalid(format!(
                "a conversion to ec:{}+{} needs {} distinct servers, got {servers:?}",
                ec.k,
                ec.m,
                usize::from(ec.k) + usize::from(ec.m)
            )));
        }
        if self.conversions.values().any(|v| v.chunk == chunk_id) {
            return Err(MetaError::new(
                ErrorKind::AlreadyExists,
                format!("chunk {chunk_id} is being converted"),
            ));
        }
        let length = c.length;
        let group = *self.next_chunk;
        *self.next_chunk += 1;
        self.conversions.insert(
            group,
            Conversion {
                chunk: chunk_id,
                length,
                group: Group {
                    k: ec.k,
                    m: ec.m,
                    cell: DEFAULT_CELL,
                    lz4: None,
                },
                lz4_block: if policy.compression { LZ4_BLOCK } else { 0 },
                servers: servers.to_vec(),
                started_ms: now_ms,
            },
        );
        Ok(Reply {
            chunk: Some(group),
            ..Reply::default()
        })
    }

    /// Drops the conversions of chunks that left this partition's files (deleted, or moved
    /// to another partition): their groups' members, written or not, become orphans and are
    /// deleted; a worker's late result ends nothing.
    pub(super) fn drop_conversions(&mut self, chunks: &[ChunkId]) {
        if self.conversions.values().any(|c| chunks.contains(&c.chunk)) {
            self.conversions.retain(|_, c| !chunks.contains(&c.chunk));
        }
    }

    /// Ends the conversion of group `group_id`: with `switch`, the chunk becomes the group
    /// (when it is still what was converted), else it is abandoned.
    pub(super) fn convert_end(&mut self, group_id: ChunkId, switch: bool, stream: u64) {
        let Some(conv) = self.conversions.remove(&group_id) else {
            return;
        };
        if !switch {
            return;
        }
        let mut group = conv.group;
        if conv.lz4_block > 0 {
            // The blocks of the chunk's bytes (each at least its 16-byte header) and their
            // index (8 bytes a block, a 24-byte trailer).
            let blocks = conv.length.div_ceil(u64::from(conv.lz4_block));
            if stream < blocks * 24 + 24 {
                return;
            }
            group.lz4 = Some(Lz4 {
                stream,
                block: conv.lz4_block,
            });
        }
        let Some(owner) = self.chunk_owner.get(&conv.chunk).map(|o| *o) else {
            return; // the file or the chunk went meanwhile
        };
        let Some(Inode {
            kind: Kind::File(f),
            ..
        }) = self.inodes.get_mut(&owner)
        else {
            return;
        };
        let Some(c) = f.chunks.iter_mut().find(|c| c.id == conv.chunk) else {
            return;
        };
        if !c.sealed || c.ec.is_some() || c.length != conv.length {
            return;
        }
        c.id = group_id;
        c.ec = Some(group);
        c.servers = conv.servers;
        self.chunk_owner.remove(&conv.chunk);
        self.chunk_owner.insert(group_id, owner);
    }
}
