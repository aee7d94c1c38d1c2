//! What the chunkservers' heartbeats, repair and conversion read (docs/partitions.md): chunks
//! by id from the partition that allocated them, servers, settings and keys from the root.
//! The leader reads the states of the partitions it leads; a chunk of a partition outside its
//! view is unknown: never deleted as an orphan, never repaired, until the view holds it.

use crate::state::partitions::{PartitionId, ROOT_PARTITION, partition_of};
use crate::state::{
    Chunk, ChunkId, Config, Conversion, Inode, InodeId, KeyRecord, ServerId, ServerRecord, State,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Where a walk of the inodes goes on: in partition `partition`, after inode `after`. (A
/// partition's inodes are not all in its id range: those of a subtree moved into it keep
/// their ids, moves.rs.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub partition: PartitionId,
    pub after: InodeId,
}

/// The replicated state as the leader's background work reads it.
pub trait StateView {
    fn servers(&self) -> &BTreeMap<ServerId, ServerRecord>;
    fn config(&self) -> &Config;
    fn cap_keys(&self) -> &[KeyRecord];
    /// The chunk and the file that owns it.
    fn chunk(&self, id: ChunkId) -> Option<(Arc<Inode>, Chunk)>;
    /// Whether the state of chunk `id`'s partition is in the view.
    fn knows(&self, id: ChunkId) -> bool;
    /// Whether `server` is being written member `group` of a conversion.
    fn converting_on(&self, group: ChunkId, server: ServerId) -> bool;
    /// The next chunk id that chunk `id`'s partition will allocate.
    fn next_chunk_of(&self, id: ChunkId) -> ChunkId;
    /// Every chunk of every file.
    fn chunks(&self) -> impl Iterator<Item = Chunk> + '_;
    /// Conversions under way, by group id.
    fn conversions(&self) -> impl Iterator<Item = (ChunkId, &Conversion)> + '_;
    /// Up to `budget` inodes after `after` (from the first when `None`), each partition's
    /// in id order, and where the next call goes on (`None`: this one reached the end).
    fn inodes_after(
        &self,
        after: Option<Cursor>,
        budget: usize,
    ) -> (Vec<Arc<Inode>>, Option<Cursor>);
}

impl StateView for State {
    fn servers(&self) -> &BTreeMap<ServerId, ServerRecord> {
        State::servers(self)
    }
    fn config(&self) -> &Config {
        State::config(self)
    }
    fn cap_keys(&self) -> &[KeyRecord] {
        State::cap_keys(self)
    }
    fn chunk(&self, id: ChunkId) -> Option<(Arc<Inode>, Chunk)> {
        State::chunk(self, id)
    }
    fn knows(&self, id: ChunkId) -> bool {
        self.owns_chunk(id) || self.chunk_partition(id) == self.home().partition
    }
    fn converting_on(&self, group: ChunkId, server: ServerId) -> bool {
        State::converting_on(self, group, server)
    }
    fn next_chunk_of(&self, _id: ChunkId) -> ChunkId {
        State::next_chunk_id(self)
    }
    fn chunks(&self) -> impl Iterator<Item = Chunk> + '_ {
        State::chunks(self)
    }
    fn conversions(&self) -> impl Iterator<Item = (ChunkId, &Conversion)> + '_ {
        State::conversions(self).iter().map(|(g, c)| (*g, c))
    }
    fn inodes_after(
        &self,
        after: Option<Cursor>,
        budget: usize,
    ) -> (Vec<Arc<Inode>>, Option<Cursor>) {
        let partition = self.home().partition;
        let (got, next) = State::inodes_after(self, after.map(|c| c.after), budget);
        (got, next.map(|after| Cursor { partition, after }))
    }
}

/// The root's state and those of the partitions the leader leads.
pub struct View<'a> {
    pub root: &'a State,
    pub parts: BTreeMap<PartitionId, &'a State>,
}

impl<'a> View<'a> {
    /// The state that holds chunk `id` (its allocating partition's, unless the root
    /// forwards it), if in the view.
    fn of(&self, id: u64) -> Option<&'a State> {
        let alloc = self.state(partition_of(id))?;
        self.state(alloc.chunk_partition(id))
    }

    fn state(&self, p: PartitionId) -> Option<&'a State> {
        match p {
            ROOT_PARTITION => Some(self.root),
            p => self.parts.get(&p).copied(),
        }
    }

    /// The root's state, then each partition's.
    pub fn all(&self) -> impl Iterator<Item = (PartitionId, &'a State)> + '_ {
        std::iter::once((ROOT_PARTITION, self.root)).chain(self.parts.iter().map(|(p, s)| (*p, *s)))
    }
}

impl StateView for View<'_> {
    fn servers(&self) -> &BTreeMap<ServerId, ServerRecord> {
        self.root.servers()
    }
    fn config(&self) -> &Config {
        self.root.config()
    }
    fn cap_keys(&self) -> &[KeyRecord] {
        self.root.cap_keys()
    }
    fn chunk(&self, id: ChunkId) -> Option<(Arc<Inode>, Chunk)> {
        self.of(id)?.chunk(id)
    }
    fn knows(&self, id: ChunkId) -> bool {
        self.of(id).is_some()
    }
    fn converting_on(&self, group: ChunkId, server: ServerId) -> bool {
        self.of(group)
            .is_some_and(|s| s.converting_on(group, server))
    }
    fn next_chunk_of(&self, id: ChunkId) -> ChunkId {
        // An unknown partition's: nothing below the id counts as allocated.
        self.state(partition_of(id)).map_or(0, State::next_chunk_id)
    }
    fn chunks(&self) -> impl Iterator<Item = Chunk> + '_ {
        self.all().flat_map(|(_, s)| s.chunks())
    }
    fn conversions(&self) -> impl Iterator<Item = (ChunkId, &Conversion)> + '_ {
        self.all()
            .flat_map(|(_, s)| s.conversions().iter().map(|(g, c)| (*g, c)))
    }
    /// One cursor walks every partition: the root's inodes, then each partition's in turn,
    /// each from its first inode (those moved into it from the root's range, then its own).
    /// A partition's top directory (inode 1 in its state) is walked too; the scans that read
    /// files skip it as every directory.
    fn inodes_after(
        &self,
        after: Option<Cursor>,
        budget: usize,
    ) -> (Vec<Arc<Inode>>, Option<Cursor>) {
        let budget = budget.max(1);
        let start = after.map_or(ROOT_PARTITION, |c| c.partition);
        let mut out: Vec<Arc<Inode>> = Vec::new();
        for (p, st) in self.all().filter(|(p, _)| *p >= start) {
            let mut cursor = after.filter(|c| c.partition == p).map(|c| c.after);
            loop {
                let (got, next) = st.inodes_after(cursor, budget - out.len());
                out.extend(got);
                if out.len() >= budget && next.is_some() {
                    return (
                        out,
                        next.map(|after| Cursor {
                            partition: p,
                            after,
                        }),
                    );
                }
                match next {
                    Some(n) => cursor = Some(n),
                    None => break,
                }
            }
            if out.len() >= budget {
                let last = out.last().map(|i| Cursor {
                    partition: p,
                    after: i.id,
                });
                return (out, last);
            }
        }
        (out, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(st: &mut State, path: &str) {
        crate::state::tests::create_file(st, path, 1);
    }

    fn partition(id: PartitionId, top: &str) -> State {
        crate::state::tests::partition_state(id, top)
    }

    #[test]
    fn one_cursor_walks_every_partition_and_chunks_resolve_by_id() {
        let mut root = State::default();
        let (mut p1, mut p3) = (partition(1, "/a"), partition(3, "/c"));
        for i in 0..5 {
            create(&mut root, &format!("/r{i}"));
            create(&mut p1, &format!("/a/x/f{i}"));
            create(&mut p3, &format!("/c/f{i}"));
        }
        let view = View {
            root: &root,
            parts: BTreeMap::from([(1, &p1), (3, &p3)]),
        };
        // Budgets that end inside and at the end of a partition's inodes.
        for budget in [1, 2, 3, 6, 7, 100] {
            let mut cursor = None;
            let mut files = Vec::new();
            let mut calls = 0;
            loop {
                let (got, next) = view.inodes_after(cursor, budget);
                assert!(got.len() <= budget);
                files.extend(got.into_iter().filter(|i| i.file().is_some()).map(|i| i.id));
                calls += 1;
                assert!(calls < 100, "the scan does not end");
                match next {
                    Some(n) => cursor = Some(n),
                    None => break,
                }
            }
            assert_eq!(files.len(), 15, "budget {budget}");
            assert!(files.windows(2).all(|w| w[0] < w[1]), "in id order");
        }
        assert_eq!(view.chunks().count(), 15);
        for st in [&root, &p1, &p3] {
            for c in st.chunks() {
                assert!(view.knows(c.id));
                assert_eq!(view.chunk(c.id).unwrap().1.id, c.id);
                assert!(c.id < view.next_chunk_of(c.id));
            }
        }
        // Partition 3 outside the view: its chunks are unknown, not absent.
        let part = View {
            root: &root,
            parts: BTreeMap::from([(1, &p1)]),
        };
        let c3 = p3.chunks().next().unwrap().id;
        assert!(!part.knows(c3) && part.chunk(c3).is_none());
        assert_eq!(part.chunks().count(), 10);
    }
}
