//! Buckets whose objects live in other partitions than the root (docs/partitions.md
//! "Buckets").
//!
//! The root keeps every bucket's record (its owner, and for a placed bucket the partitions —
//! *shards* — its objects are hashed over by key: [`cairn_rpc::object::shard_of`]); ListBuckets
//! and HeadBucket are the root's. Each shard keeps a copy of the record and everything about
//! the bucket's objects whose keys hash to it: the objects, uploads and parts, and the data
//! files they name, below its top directory `/.s3/p/N`. So a PUT, a DELETE or an upload's step
//! is one Raft write in one shard, and a shard's index never names a file of another.
//!
//! A bucket is placed while it is empty ([`BucketCommand::Assign`], after each shard
//! [`BucketCommand::Adopt`]ed it); from that entry on, the root refuses the bucket's object
//! writes as misrouted (`unavailable`: the caller retries and is routed to the shard).
//! Deleting a placed bucket closes it in every shard (each refuses when it holds objects, and
//! holds the bucket's writes back while closed), then the root forgets it, then the shards drop
//! their copies; a refusal reopens the shards closed so far. The root's leader drives it and its
//! tick finishes or undoes what a driver that died left (service/buckets.rs).

use super::{Bucket, ObjectIndex};
use crate::state::partitions::ROOT_PARTITION;
use crate::state::{Reply, State};
use cairn_rpc::object::{BucketInfo, ObjectError, ObjectOp, OpReply, data_dir};
use cairn_rpc::{ErrorKind, MetaError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most partitions one bucket's objects are hashed over.
pub const MAX_SHARDS: usize = 64;

/// Where a bucket's objects live, besides its record (the `placements` cell: a bucket without
/// one is the root's, open).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// In the root's state: the partitions the bucket's objects are hashed over. Set once,
    /// while the bucket is empty.
    pub shards: Vec<u32>,
    /// In a shard's copy: the bucket is being deleted, so its writes wait.
    pub closing: bool,
}

/// A change to where a bucket's objects live (`Command::Bucket`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BucketCommand {
    /// The root's: the empty bucket's objects are hashed over `shards` from now on.
    Assign { bucket: String, shards: Vec<u32> },
    /// The root's: forgets a placed bucket that every shard has closed.
    Forget { bucket: String },
    /// A shard's: holds the bucket's objects that hash here (a copy of its record).
    Adopt {
        bucket: String,
        owner: String,
        created_ms: u64,
    },
    /// A shard's: the bucket is being deleted; refused (the reply's object answer is
    /// `BucketNotEmpty`) when the shard holds objects of it. Writes wait while closed.
    Close { bucket: String },
    /// A shard's: undoes [`BucketCommand::Close`] (a delete that was refused elsewhere).
    Reopen { bucket: String },
    /// A shard's: drops its closed copy, aborting the bucket's uploads here.
    Drop { bucket: String },
}

impl std::fmt::Display for BucketCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Assign { bucket, shards } => write!(f, "assign-bucket {bucket} {shards:?}"),
            Self::Forget { bucket } => write!(f, "forget-bucket {bucket}"),
            Self::Adopt { bucket, .. } => write!(f, "adopt-bucket {bucket}"),
            Self::Close { bucket } => write!(f, "close-bucket {bucket}"),
            Self::Reopen { bucket } => write!(f, "reopen-bucket {bucket}"),
            Self::Drop { bucket } => write!(f, "drop-bucket {bucket}"),
        }
    }
}

fn unavailable(message: String) -> MetaError {
    MetaError::new(ErrorKind::Unavailable, message)
}

fn answer(r: Result<(), ObjectError>) -> Reply {
    Reply {
        object: Some(r.map(|()| OpReply::Done)),
        ..Reply::default()
    }
}

impl ObjectIndex {
    /// A bucket as ListBuckets and HeadBucket show it, with its shards.
    pub(super) fn info(&self, name: &str, b: &Bucket) -> BucketInfo {
        BucketInfo {
            name: name.to_owned(),
            owner: b.owner.clone(),
            created_ms: b.created_ms,
            shards: self.shards_of(name),
        }
    }

    /// The partitions `bucket`'s objects are hashed over (empty: this state holds them).
    pub(super) fn shards_of(&self, bucket: &str) -> Vec<u32> {
        self.placements
            .get(bucket)
            .map(|p| p.shards.clone())
            .unwrap_or_default()
    }

    /// Whether this (shard's) copy of `bucket` is closed for the bucket's deletion.
    fn closing(&self, bucket: &str) -> bool {
        self.placements.get(bucket).is_some_and(|p| p.closing)
    }

    /// Whether an upload of `bucket` is under way here.
    fn holds_uploads(&self, bucket: &str) -> bool {
        self.uploads.values().any(|u| u.bucket == bucket)
    }

    /// The bucket an object change is about (an upload's step by its id when the gateway
    /// did not name the bucket).
    fn op_bucket<'a>(&self, op: &'a ObjectOp) -> Option<std::borrow::Cow<'a, str>> {
        use std::borrow::Cow;
        let by_upload = |bucket: &'a String, id: &String| {
            if bucket.is_empty() {
                self.uploads.get(id).map(|u| Cow::Owned(u.bucket.clone()))
            } else {
                Some(Cow::Borrowed(bucket.as_str()))
            }
        };
        match op {
            ObjectOp::PutObject { bucket, .. }
            | ObjectOp::DeleteObject { bucket, .. }
            | ObjectOp::DeleteBucket { bucket, .. }
            | ObjectOp::MoveExtent { bucket, .. } => Some(Cow::Borrowed(bucket)),
            ObjectOp::CreateUpload { upload, .. } => Some(Cow::Borrowed(&upload.bucket)),
            ObjectOp::PutPart {
                bucket, upload_id, ..
            }
            | ObjectOp::AbortUpload {
                bucket, upload_id, ..
            }
            | ObjectOp::CompleteUpload {
                bucket, upload_id, ..
            } => by_upload(bucket, upload_id),
            _ => None,
        }
    }
}

impl State {
    /// Refuses, as `unavailable` (retried), an object change this state must not apply: one
    /// for a bucket the root has placed in shards (routed before the placement), or for a
    /// bucket a shard has closed for its deletion.
    ///
    /// # Errors
    /// `Unavailable`.
    pub(in crate::state) fn object_guard(&self, op: &ObjectOp) -> Result<(), MetaError> {
        let Some(bucket) = self.objects.op_bucket(op) else {
            return Ok(());
        };
        if !self.objects.buckets.contains_key(bucket.as_ref()) {
            return Ok(()); // the change itself answers NoSuchBucket
        }
        let shards = self.objects.shards_of(&bucket);
        if !shards.is_empty() {
            return Err(unavailable(format!(
                "bucket {bucket}'s objects are in partitions {shards:?}, not the root (retry)"
            )));
        }
        if self.objects.closing(&bucket) {
            return Err(unavailable(format!(
                "bucket {bucket} is being deleted (retry)"
            )));
        }
        Ok(())
    }

    /// Removes `bucket` (holding no object) with its placement. Unfinished multipart uploads
    /// go with it, as on AWS: their parts' bytes are freed as an abort frees them.
    pub(super) fn forget_bucket(&mut self, bucket: &str) {
        let ids: Vec<String> = self
            .objects
            .uploads
            .iter()
            .filter(|(_, u)| u.bucket == bucket)
            .map(|(id, _)| id.clone())
            .collect();
        let mut extents = Vec::new();
        for id in ids {
            extents.extend(self.objects.take_upload(&id).into_iter().map(|p| p.extent));
        }
        self.free(&extents);
        self.objects.buckets.remove(bucket);
        self.objects.placements.remove(bucket);
    }

    /// The partitions `bucket`'s objects are hashed over (empty: the root's), if the bucket
    /// exists (the root's state).
    pub fn bucket_shards(&self, bucket: &str) -> Option<Vec<u32>> {
        self.objects
            .buckets
            .contains_key(bucket)
            .then(|| self.objects.shards_of(bucket))
    }

    /// A bucket's owner, creation time and shards, if it exists.
    pub fn bucket_record(&self, bucket: &str) -> Option<(String, u64, Vec<u32>)> {
        self.objects.buckets.get(bucket).map(|b| {
            (
                b.owner.clone(),
                b.created_ms,
                self.objects.shards_of(bucket),
            )
        })
    }

    /// The buckets a shard holds copies of, with whether each is closed.
    pub fn adopted_buckets(&self) -> BTreeMap<String, bool> {
        self.objects
            .buckets
            .keys()
            .map(|n| (n.clone(), self.objects.closing(n)))
            .collect()
    }

    /// Applies a [`BucketCommand`].
    ///
    /// # Errors
    /// The command is not this partition's, or its checks fail (nothing changed then).
    pub(in crate::state) fn apply_bucket(
        &mut self,
        cmd: &BucketCommand,
    ) -> Result<Reply, MetaError> {
        let root = self.home.partition == ROOT_PARTITION;
        match cmd {
            BucketCommand::Assign { bucket, shards } => {
                if !root {
                    return Err(MetaError::invalid("buckets are placed by the root"));
                }
                self.check_assign(bucket, shards)?;
                self.objects.placements.insert(
                    bucket.clone(),
                    Placement {
                        shards: shards.clone(),
                        closing: false,
                    },
                );
                Ok(Reply::default())
            }
            BucketCommand::Forget { bucket } => {
                if !root {
                    return Err(MetaError::invalid("buckets are forgotten by the root"));
                }
                if !self.objects.buckets.contains_key(bucket) {
                    return Ok(Reply::default());
                }
                if self.objects.shards_of(bucket).is_empty() {
                    return Err(MetaError::invalid(format!(
                        "bucket {bucket} is the root's: it is deleted as any other"
                    )));
                }
                self.objects.buckets.remove(bucket);
                self.objects.placements.remove(bucket);
                Ok(Reply::default())
            }
            BucketCommand::Adopt {
                bucket,
                owner,
                created_ms,
            } => {
                self.check_shard()?;
                match self.objects.buckets.get(bucket) {
                    Some(b) if b.owner == *owner && b.created_ms == *created_ms => {}
                    Some(_) => {
                        return Err(MetaError::invalid(format!(
                            "partition {} holds another bucket {bucket} (not dropped yet)",
                            self.home.partition
                        )));
                    }
                    None => {
                        self.objects.buckets.insert(
                            bucket.clone(),
                            Bucket {
                                owner: owner.clone(),
                                created_ms: *created_ms,
                                objects: BTreeMap::new(),
                            },
                        );
                    }
                }
                Ok(Reply::default())
            }
            BucketCommand::Close { bucket } => {
                self.check_shard()?;
                if !self.objects.buckets.contains_key(bucket) {
                    return Ok(answer(Ok(()))); // dropped already
                }
                if self.objects.holds_objects(bucket) {
                    return Ok(answer(Err(ObjectError::BucketNotEmpty)));
                }
                self.objects.placements.insert(
                    bucket.clone(),
                    Placement {
                        shards: Vec::new(),
                        closing: true,
                    },
                );
                Ok(answer(Ok(())))
            }
            BucketCommand::Reopen { bucket } => {
                self.check_shard()?;
                if self.objects.closing(bucket) {
                    self.objects.placements.remove(bucket);
                }
                Ok(Reply::default())
            }
            BucketCommand::Drop { bucket } => {
                self.check_shard()?;
                if !self.objects.buckets.contains_key(bucket) {
                    return Ok(Reply::default());
                }
                if !self.objects.closing(bucket) {
                    return Err(MetaError::invalid(format!(
                        "bucket {bucket} is open here: only a closed copy is dropped"
                    )));
                }
                // Its uploads go with it, as the root's DeleteBucket lets them go.
                self.forget_bucket(bucket);
                Ok(Reply::default())
            }
        }
    }

    /// Whether `bucket` may be hashed over `shards` (the root's checks, as the placement
    /// applies): it exists, holds nothing, is not placed elsewhere, and each shard is a
    /// partition whose subtree is its data directory `/.s3/p/N`.
    fn check_assign(&self, bucket: &str, shards: &[u32]) -> Result<(), MetaError> {
        if !self.objects.buckets.contains_key(bucket) {
            return Err(MetaError::not_found(format!("no bucket {bucket}")));
        }
        let placed = self.objects.shards_of(bucket);
        if placed == shards {
            return Ok(()); // asked again
        }
        if !placed.is_empty() {
            return Err(MetaError::invalid(format!(
                "bucket {bucket} is placed in partitions {placed:?} already"
            )));
        }
        if shards.is_empty() || shards.len() > MAX_SHARDS {
            return Err(MetaError::invalid(format!(
                "a bucket is placed in 1 to {MAX_SHARDS} partitions"
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        for &n in shards {
            if !seen.insert(n) {
                return Err(MetaError::invalid(format!("partition {n} is named twice")));
            }
            if n == ROOT_PARTITION || self.subtrees.get(&data_dir(Some(n))) != Some(&n) {
                return Err(MetaError::invalid(format!(
                    "partition {n} does not hold {} (the split makes it)",
                    data_dir(Some(n))
                )));
            }
        }
        if self.objects.holds_objects(bucket) || self.objects.holds_uploads(bucket) {
            return Err(MetaError::invalid(format!(
                "bucket {bucket} holds objects or uploads: only an empty bucket is placed \
                 (moving a populated one is not built)"
            )));
        }
        Ok(())
    }

    /// Refuses a shard's command in a partition that is not a bucket shard.
    fn check_shard(&self) -> Result<(), MetaError> {
        let p = self.home.partition;
        if p == ROOT_PARTITION || self.home.path != data_dir(Some(p)) {
            return Err(MetaError::invalid(format!(
                "partition {p} holds {}, not a bucket shard's {}",
                if self.home.path.is_empty() {
                    "/"
                } else {
                    &self.home.path
                },
                data_dir(Some(p))
            )));
        }
        Ok(())
    }
}
