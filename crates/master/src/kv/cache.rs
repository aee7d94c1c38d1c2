//! A table's cache of decoded records, bounded by their estimated bytes
//! (docs/formats/master-state.md § Reads, writes and failures).

use super::Key;
use lru::LruCache;
use std::sync::Arc;

/// Decoded records by key, the least recently used dropped first once their estimated bytes
/// pass the budget (a record estimated larger than the whole budget is not kept).
pub(super) struct Cache<K: Key, V> {
    lru: LruCache<K, (Arc<V>, usize)>,
    pub(super) bytes: usize,
    budget: usize,
}

impl<K: Key, V> Cache<K, V> {
    pub(super) fn new(budget: usize) -> Self {
        Self {
            lru: LruCache::unbounded(),
            bytes: 0,
            budget,
        }
    }

    pub(super) fn get(&mut self, k: &K) -> Option<&Arc<V>> {
        self.lru.get(k).map(|(v, _)| v)
    }

    pub(super) fn put(&mut self, k: K, v: Arc<V>, weight: usize) {
        if weight > self.budget {
            self.pop(&k);
            return;
        }
        if let Some((_, (_, old))) = self.lru.push(k, (v, weight)) {
            self.bytes -= old;
        }
        self.bytes += weight;
        while self.bytes > self.budget {
            match self.lru.pop_lru() {
                Some((_, (_, w))) => self.bytes -= w,
                None => break,
            }
        }
    }

    pub(super) fn pop(&mut self, k: &K) {
        if let Some((_, w)) = self.lru.pop(k) {
            self.bytes -= w;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache keeps what its byte budget holds, dropping the least recently used first;
    /// a record larger than the budget is not kept.
    #[test]
    fn the_cache_keeps_its_budget() {
        let mut c: Cache<u64, u64> = Cache::new(1_000);
        for k in 0..10 {
            c.put(k, Arc::new(k), 300);
        }
        assert_eq!(c.bytes, 900);
        assert_eq!(c.lru.len(), 3);
        assert!(c.get(&7).is_some() && c.get(&6).is_none());
        c.put(10, Arc::new(10), 300); // 8 is the least recently used now
        assert!(c.get(&8).is_none() && c.get(&7).is_some() && c.get(&9).is_some());
        c.put(9, Arc::new(9), 100); // replaced: its old weight is given back
        assert_eq!(c.bytes, 700);
        c.put(11, Arc::new(11), 1_001);
        assert!(c.get(&11).is_none());
        c.put(9, Arc::new(9), 5_000); // too large now: the old one goes too
        assert!(c.get(&9).is_none());
        assert_eq!(c.bytes, 600);
        c.pop(&7);
        c.pop(&10);
        assert_eq!((c.bytes, c.lru.len()), (0, 0));
    }
}
