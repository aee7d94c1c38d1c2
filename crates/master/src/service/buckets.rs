//! Buckets placed in partitions at the service (docs/partitions.md "Buckets";
//! state/objects/buckets.rs): routing each object change and read to the partition that holds
//! its key, merging a placed bucket's listings, placing a bucket (`cairn admin partition split
//! --bucket`), and deleting a placed one.

use super::Inner;
use crate::groups::Hosted;
use crate::state::objects::buckets::{BucketCommand, MAX_SHARDS};
use crate::state::partitions::{PartitionId, ROOT_PARTITION};
use crate::state::{Command, State};
use cairn_rpc::object::{
    ListEntry, ListPage, MAX_LIST_KEYS, ObjectError, ObjectOp, ObjectQuery, OpReply, OpResult,
    QueryReply, QueryResult, data_dir, data_dir_shard, shard_of,
};
use cairn_rpc::{ErrorKind, MetaError};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Where an object change goes.
pub(super) enum Prepared {
    /// One command in this partition.
    Write(Arc<Hosted>, Command),
    /// Answered already (a placed bucket's deletion, driven here).
    Done(OpResult),
}

/// Where an object read goes.
enum Target {
    One(PartitionId),
    /// A placed bucket's listing: every shard's page, merged.
    Merge(Vec<PartitionId>),
    /// Every partition that holds S3 data (the root and the bucket shards), answers joined.
    All,
}

/// The partition of `key` in `bucket` by the root's state (the root for a bucket it holds, or
/// an unknown one: that answers NoSuchBucket).
fn by_key(st: &State, bucket: &str, key: &str) -> PartitionId {
    st.bucket_shards(bucket)
        .and_then(|s| shard_of(key, &s))
        .unwrap_or(ROOT_PARTITION)
}

/// The partitions that hold a bucket shard's data directory (the root's map).
fn shard_partitions(st: &State) -> Vec<PartitionId> {
    st.subtrees()
        .iter()
        .filter(|(top, p)| data_dir_shard(top) == Some(**p) && data_dir(Some(**p)) == **top)
        .map(|(_, p)| *p)
        .collect()
}

fn op_target(st: &State, op: &ObjectOp) -> PartitionId {
    match op {
        ObjectOp::PutObject { bucket, key, .. }
        | ObjectOp::DeleteObject { bucket, key, .. }
        | ObjectOp::MoveExtent { bucket, key, .. } => by_key(st, bucket, key),
        ObjectOp::CreateUpload { upload, .. } => by_key(st, &upload.bucket, &upload.key),
        ObjectOp::PutPart { bucket, key, .. }
        | ObjectOp::AbortUpload { bucket, key, .. }
        | ObjectOp::CompleteUpload { bucket, key, .. }
            if !bucket.is_empty() =>
        {
            by_key(st, bucket, key)
        }
        ObjectOp::DropPack { path, .. } => st.route(path).partition,
        ObjectOp::EmptyTrash { paths } => paths
            .first()
            .map_or(ROOT_PARTITION, |p| st.route(p).partition),
        _ => ROOT_PARTITION,
    }
}

fn query_target(st: &State, q: &ObjectQuery) -> Target {
    match q {
        ObjectQuery::HeadObject { bucket, key, .. } | ObjectQuery::Locate { bucket, key } => {
            Target::One(by_key(st, bucket, key))
        }
        ObjectQuery::ListParts { bucket, key, .. } if !bucket.is_empty() => {
            Target::One(by_key(st, bucket, key))
        }
        ObjectQuery::ListObjects { bucket, .. } | ObjectQuery::ListUploads { bucket, .. } => {
            match st.bucket_shards(bucket) {
                Some(s) if !s.is_empty() => Target::Merge(s),
                _ => Target::One(ROOT_PARTITION),
            }
        }
        ObjectQuery::Unnamed { paths } => Target::One(
            paths
                .first()
                .map_or(ROOT_PARTITION, |p| st.route(p).partition),
        ),
        ObjectQuery::CompactionCandidates { dir, .. } => Target::One(st.route(dir).partition),
        ObjectQuery::Trash { .. } | ObjectQuery::StaleUploads { .. } | ObjectQuery::Gateways => {
            Target::All
        }
        _ => Target::One(ROOT_PARTITION),
    }
}

/// Merges one page from each shard of a bucket, each asked for the same `max` from the same
/// place, into one page of at most `max` keys and common prefixes, in order. The first `max`
/// of the pages' union are exactly the bucket's next `max`: a key missing from a shard's page
/// comes after that page's `max` items, so after at least `max` of the union. Memory is the
/// shards' pages.
pub fn merge_pages(pages: Vec<ListPage>, max: u32, uploads: bool) -> ListPage {
    let max = (max as usize).clamp(1, MAX_LIST_KEYS);
    let more = pages.iter().any(|p| p.truncated);
    // Position (as the listing orders it) → the entry, or `None` for a common prefix (which
    // several shards may hold keys of: listed once).
    let mut items: BTreeMap<String, Option<ListEntry>> = BTreeMap::new();
    for p in pages {
        for e in p.entries {
            let pos = if uploads {
                format!("{}\0{}", e.key, e.upload_id)
            } else {
                e.key.clone()
            };
            items.insert(pos, Some(e));
        }
        for c in p.prefixes {
            items.insert(c, None);
        }
    }
    let mut page = ListPage {
        truncated: more || items.len() > max,
        ..ListPage::default()
    };
    for (pos, item) in items.into_iter().take(max) {
        match item {
            Some(e) => page.entries.push(e),
            None => page.prefixes.push(pos.clone()),
        }
        page.last = Some(pos);
    }
    page
}

impl Inner {
    /// Where an object change (checked already) applies; a placed bucket's deletion is
    /// driven here and answered.
    pub(super) async fn prepare_object(&self, op: ObjectOp) -> Result<Prepared, MetaError> {
        self.leader_check()?;
        let (target, placed) = {
            let st = &self.sm.lock().state;
            let placed = match &op {
                ObjectOp::DeleteBucket { bucket, .. } => {
                    st.bucket_shards(bucket).filter(|s| !s.is_empty())
                }
                _ => None,
            };
            (op_target(st, &op), placed)
        };
        if let (ObjectOp::DeleteBucket { user, bucket }, Some(shards)) = (&op, placed) {
            return Ok(Prepared::Done(
                self.delete_placed_bucket(user, bucket, &shards).await?,
            ));
        }
        let h = self.led_soon(target).await?;
        Ok(Prepared::Write(h, Command::Object(Box::new(op))))
    }

    /// Answers a read of the object index from the partitions that hold what it asks.
    pub(super) async fn object_query(&self, q: &ObjectQuery) -> Result<QueryResult, MetaError> {
        self.leader_check()?;
        let target = query_target(&self.sm.lock().state, q);
        match target {
            Target::One(p) => self.query_in(p, q).await,
            Target::Merge(shards) => {
                let (list, uploads) = match q {
                    ObjectQuery::ListObjects { list, .. } => (list, false),
                    ObjectQuery::ListUploads { list, .. } => (list, true),
                    _ => return Err(MetaError::internal("a merged read that is no listing")),
                };
                let reads = shards.iter().map(|p| self.query_in(*p, q));
                let mut pages = Vec::with_capacity(shards.len());
                for r in futures::future::join_all(reads).await {
                    match r? {
                        Ok(QueryReply::List(page)) => pages.push(page),
                        Ok(_) => return Err(MetaError::internal("a listing answered otherwise")),
                        Err(e) => return Ok(Err(e)),
                    }
                }
                Ok(Ok(QueryReply::List(merge_pages(pages, list.max, uploads))))
            }
            Target::All => {
                let mut parts = vec![ROOT_PARTITION];
                parts.extend(shard_partitions(&self.sm.lock().state));
                let mut answers = Vec::with_capacity(parts.len());
                for p in parts {
                    match self.query_in(p, q).await? {
                        Ok(a) => answers.push(a),
                        Err(e) => return Ok(Err(e)),
                    }
                }
                Ok(join_answers(q, answers))
            }
        }
    }

    /// `q` answered by partition `p`'s state at a read barrier.
    async fn query_in(&self, p: PartitionId, q: &ObjectQuery) -> Result<QueryResult, MetaError> {
        if p == ROOT_PARTITION {
            self.read_barrier().await?;
            return Ok(self.sm.lock().state.query_objects(q));
        }
        let h = self.led_soon(p).await?;
        h.read_barrier().await?;
        Ok(h.sm.lock().state.query_objects(q))
    }

    /// Deletes a placed bucket (`user` must own it): every shard closes it (refused by one
    /// that holds objects: the ones closed reopen), the root forgets it, the shards drop
    /// their copies. Writes to the bucket wait while it is closed.
    async fn delete_placed_bucket(
        &self,
        user: &str,
        bucket: &str,
        shards: &[PartitionId],
    ) -> Result<OpResult, MetaError> {
        if let Err(e) = self
            .query_in(
                ROOT_PARTITION,
                &ObjectQuery::HeadBucket {
                    user: user.to_owned(),
                    bucket: bucket.to_owned(),
                },
            )
            .await?
        {
            return Ok(Err(e));
        }
        if !self.deleting_buckets.lock().insert(bucket.to_owned()) {
            return Err(MetaError::new(
                ErrorKind::Unavailable,
                format!("bucket {bucket} is being deleted (retry)"),
            ));
        }
        let r = self.close_and_forget(bucket, shards).await;
        self.deleting_buckets.lock().remove(bucket);
        r
    }

    async fn close_and_forget(
        &self,
        bucket: &str,
        shards: &[PartitionId],
    ) -> Result<OpResult, MetaError> {
        let mut closed = Vec::new();
        let mut refused: Option<Result<OpResult, MetaError>> = None;
        for &p in shards {
            let close = async {
                let h = self.led_soon(p).await?;
                let close = BucketCommand::Close {
                    bucket: bucket.to_owned(),
                };
                self.write_to(&h, Command::Bucket(close)).await
            };
            match close.await {
                Ok(reply) => match reply.object {
                    Some(Err(e)) => {
                        refused = Some(Ok(Err(e)));
                        break;
                    }
                    _ => closed.push(p),
                },
                Err(e) => {
                    refused = Some(Err(e));
                    break;
                }
            }
        }
        if let Some(answer) = refused {
            let reopen = BucketCommand::Reopen {
                bucket: bucket.to_owned(),
            };
            self.in_each(&closed, &reopen).await;
            return answer;
        }
        self.write(Command::Bucket(BucketCommand::Forget {
            bucket: bucket.to_owned(),
        }))
        .await?;
        // Deleted from here on.
        let drop = BucketCommand::Drop {
            bucket: bucket.to_owned(),
        };
        self.in_each(shards, &drop).await;
        Ok(Ok(OpReply::Done))
    }

    /// `c` applied in each of `shards` as far as it goes: a copy left closed is the tick's to
    /// reopen or drop ([`Inner::resume_bucket_deletes`]).
    async fn in_each(&self, shards: &[PartitionId], c: &BucketCommand) {
        for &p in shards {
            if let Ok(h) = self.led_soon(p).await
                && let Err(e) = self.write_to(&h, Command::Bucket(c.clone())).await
            {
                tracing::warn!(partition = p, %c, error = %e, "left to the tick");
            }
        }
    }

    /// Places the empty bucket `bucket` over `shards` new partitions hosted by `members`
    /// (the root's voters when empty): each takes `/.s3/p/N` and a copy of the bucket's
    /// record, then the root's map sends the bucket's keys there. Asked again for a bucket
    /// placed already, it changes nothing.
    pub(super) async fn split_bucket(
        &self,
        bucket: &str,
        shards: u32,
        members: &[u64],
    ) -> Result<(), MetaError> {
        let k = shards.max(1) as usize;
        if k > MAX_SHARDS {
            return Err(MetaError::invalid(format!(
                "a bucket is placed in 1 to {MAX_SHARDS} partitions"
            )));
        }
        self.read_barrier().await?;
        let (owner, created_ms, placed) = self
            .sm
            .lock()
            .state
            .bucket_record(bucket)
            .ok_or_else(|| MetaError::not_found(format!("no bucket {bucket}")))?;
        if !placed.is_empty() {
            if placed.len() == k {
                return Ok(());
            }
            return Err(MetaError::invalid(format!(
                "bucket {bucket} is placed in partitions {placed:?} already"
            )));
        }
        let parent = cairn_rpc::object::shards_dir();
        let mkdir = Command::Mkdir {
            path: parent.clone(),
            parents: true,
            now_ms: super::now_ms(),
            policy: None,
            mode: Some(0o700),
        };
        match self.write(mkdir).await {
            Ok(_) => {}
            Err(e) if e.kind == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let mut parts = Vec::with_capacity(k);
        for _ in 0..k {
            let p = self.add_partition(members).await?;
            self.host_partitions().await;
            self.split_subtree(&data_dir(Some(p)), p, &[]).await?;
            let h = self.led_soon(p).await?;
            self.write_to(
                &h,
                Command::Bucket(BucketCommand::Adopt {
                    bucket: bucket.to_owned(),
                    owner: owner.clone(),
                    created_ms,
                }),
            )
            .await?;
            parts.push(p);
        }
        self.write(Command::Bucket(BucketCommand::Assign {
            bucket: bucket.to_owned(),
            shards: parts.clone(),
        }))
        .await?;
        tracing::info!(bucket, shards = ?parts, "bucket placed");
        Ok(())
    }

    /// At the root's leader, once a second: a shard's copy left closed by a deletion that
    /// no driver here runs (its driver stopped, or another master's was) is reopened when
    /// the root still places the bucket there, and dropped otherwise.
    pub(crate) async fn resume_bucket_deletes(&self) {
        if self.leader_check().is_err() {
            return;
        }
        for h in self.groups.all() {
            if h.id == ROOT_PARTITION || h.leader_check().is_err() {
                continue;
            }
            let closed: Vec<String> = {
                let part = h.sm.lock();
                if part.state.home().path != data_dir(Some(h.id)) {
                    continue;
                }
                part.state
                    .adopted_buckets()
                    .into_iter()
                    .filter(|(_, closing)| *closing)
                    .map(|(b, _)| b)
                    .collect()
            };
            for bucket in closed {
                if self.deleting_buckets.lock().contains(&bucket) {
                    continue;
                }
                let here = self
                    .sm
                    .lock()
                    .state
                    .bucket_shards(&bucket)
                    .is_some_and(|s| s.contains(&h.id));
                let c = if here {
                    BucketCommand::Reopen {
                        bucket: bucket.clone(),
                    }
                } else {
                    BucketCommand::Drop {
                        bucket: bucket.clone(),
                    }
                };
                tracing::info!(partition = h.id, %c, "finishing a bucket's deletion left by its driver");
                if let Err(e) = self.write_to(&h, Command::Bucket(c)).await {
                    tracing::warn!(partition = h.id, %bucket, error = %e, "not finished (retried)");
                }
            }
        }
    }
}

/// Joins the answers of every partition to a read about all of them.
fn join_answers(q: &ObjectQuery, answers: Vec<QueryReply>) -> QueryResult {
    match q {
        ObjectQuery::Trash { max } | ObjectQuery::StaleUploads { max, .. } => {
            let max = *max as usize;
            let mut trash = Vec::new();
            let mut uploads = Vec::new();
            for a in answers {
                match a {
                    QueryReply::Trash(t) => trash.extend(t),
                    QueryReply::Uploads(u) => uploads.extend(u),
                    _ => {}
                }
            }
            if matches!(q, ObjectQuery::Trash { .. }) {
                trash.truncate(max);
                Ok(QueryReply::Trash(trash))
            } else {
                uploads.truncate(max);
                Ok(QueryReply::Uploads(uploads))
            }
        }
        ObjectQuery::Gateways => {
            let mut answers = answers.into_iter();
            let Some(QueryReply::Gateways {
                gateways,
                buckets,
                mut objects,
                mut uploads,
                mut trash,
            }) = answers.next()
            else {
                return Err(ObjectError::InvalidArgument(
                    "the root answered the gateways otherwise".into(),
                ));
            };
            // Buckets are the root's records; a shard's copies are not counted again.
            for a in answers {
                if let QueryReply::Gateways {
                    objects: o,
                    uploads: u,
                    trash: t,
                    ..
                } = a
                {
                    objects += o;
                    uploads += u;
                    trash += t;
                }
            }
            Ok(QueryReply::Gateways {
                gateways,
                buckets,
                objects,
                uploads,
                trash,
            })
        }
        _ => Err(ObjectError::InvalidArgument(
            "this read is answered by one partition".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::objects::list_keys;
    use cairn_rpc::object::ListRequest;
    use std::ops::Bound;

    /// One shard's page, as the shard's state lists it.
    fn shard_page(keys: &BTreeMap<String, ()>, req: &ListRequest) -> ListPage {
        let seek = |lower: Bound<&String>| {
            keys.range::<String, _>((lower, Bound::Unbounded))
                .next()
                .map(|(k, v)| (k.clone(), *v))
        };
        list_keys(seek, req, |k, _| ListEntry {
            key: k.clone(),
            size: 0,
            etag: String::new(),
            mtime_ms: 0,
            upload_id: String::new(),
            owner: String::new(),
        })
    }

    /// Every key and common prefix, page by page: of one map, or merged from shards.
    fn all_pages(
        shards: &[BTreeMap<String, ()>],
        prefix: &str,
        delimiter: Option<&str>,
        max: u32,
    ) -> Vec<String> {
        let mut out = Vec::new();
        let mut after = String::new();
        for _ in 0..10_000 {
            let req = ListRequest {
                prefix: prefix.into(),
                delimiter: delimiter.map(Into::into),
                after: after.clone(),
                max,
            };
            let pages: Vec<ListPage> = shards.iter().map(|s| shard_page(s, &req)).collect();
            let page = if shards.len() == 1 {
                pages.into_iter().next().unwrap()
            } else {
                merge_pages(pages, max, false)
            };
            assert!(page.entries.len() + page.prefixes.len() <= max as usize);
            let mut items: Vec<String> = page.entries.iter().map(|e| e.key.clone()).collect();
            items.extend(page.prefixes.iter().cloned());
            items.sort();
            out.extend(items);
            if !page.truncated {
                return out;
            }
            after = page.last.expect("a truncated page names its last");
        }
        panic!("the listing did not end");
    }

    /// Keys spread over shards by hash list, page by page, exactly as one map holding them
    /// all does, for every page size, prefix and delimiter.
    #[test]
    fn merged_listings_match_one_map() {
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let alphabet = ["a", "b", "/", "c"];
        for round in 0..40 {
            let shards_n = 1 + (round % 5) as usize;
            let ids: Vec<u32> = (1..=shards_n as u32).collect();
            let mut whole = BTreeMap::new();
            let mut shards = vec![BTreeMap::new(); shards_n];
            for _ in 0..(next() % 60) {
                let len = 1 + next() % 5;
                let key: String = (0..len).map(|_| alphabet[(next() % 4) as usize]).collect();
                let at = ids
                    .iter()
                    .position(|i| Some(*i) == shard_of(&key, &ids))
                    .unwrap();
                whole.insert(key.clone(), ());
                shards[at].insert(key, ());
            }
            for (prefix, delimiter) in [("", None), ("", Some("/")), ("a", Some("/")), ("b/", None)]
            {
                for max in [1, 2, 3, 7, 1000] {
                    let want = all_pages(std::slice::from_ref(&whole), prefix, delimiter, max);
                    let got = all_pages(&shards, prefix, delimiter, max);
                    assert_eq!(
                        got, want,
                        "{shards_n} shards, {prefix:?} {delimiter:?} max {max}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_merged_page_holds_at_most_max_and_common_prefixes_once() {
        let page = |keys: &[&str], prefixes: &[&str], truncated: bool| ListPage {
            entries: keys
                .iter()
                .map(|k| ListEntry {
                    key: (*k).into(),
                    size: 1,
                    etag: String::new(),
                    mtime_ms: 0,
                    upload_id: String::new(),
                    owner: String::new(),
                })
                .collect(),
            prefixes: prefixes.iter().map(|p| (*p).to_owned()).collect(),
            truncated,
            last: None,
        };
        let m = merge_pages(
            vec![
                page(&["a"], &["d/"], false),
                page(&["b"], &["d/"], false),
                page(&["c", "e"], &[], false),
            ],
            4,
            false,
        );
        let keys: Vec<&str> = m.entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert_eq!(m.prefixes, ["d/"]);
        assert!(m.truncated, "e is left for the next page");
        assert_eq!(m.last.as_deref(), Some("d/"));
    }
}
