//! The object index in the replicated state: users, buckets, objects, multipart uploads and
//! the usage of shared small-object logs (docs/object.md).
//!
//! Every change is checked before anything is touched, so a refused change leaves the state
//! as it was; a change that frees data (overwrite, delete, abort, a replaced part) deletes the
//! extents' own files in the same step, so no object ever names a deleted file.

pub mod buckets;
mod extents;
mod listing;
mod query;
pub mod stored;

use extents::{check_condition, check_meta};
pub use listing::list_keys;

use super::{Command, State};
use crate::kv::{Cell, Table};
use cairn_rpc::object::{
    Extent, GATEWAY_FORGET_MS, Gateway, ListEntry, MAX_LIST_KEYS, MIN_PART_BYTES, ObjectError,
    ObjectMeta, ObjectOp, ObjectQuery, OpReply, OpResult, PackCandidate, Part, PutCondition,
    QueryReply, QueryResult, Upload, User, Volume, VolumeAccess,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectIndex {
    /// By access key.
    users: Cell<BTreeMap<String, User>>,
    buckets: Cell<BTreeMap<String, Bucket>>,
    /// Every bucket's objects, by (bucket, key).
    #[serde(
        default = "stored::objects_table",
        deserialize_with = "stored::objects_from_rows"
    )]
    by_key: Table<(String, String), ObjectMeta>,
    /// By upload id (stored without their parts: those are in `parts`).
    #[serde(deserialize_with = "stored::uploads_from_rows")]
    uploads: Table<String, Upload>,
    /// Uploads' parts by (upload id, part number): a part is one row, not a rewrite of its
    /// upload's record.
    #[serde(
        default = "stored::parts_table",
        deserialize_with = "stored::parts_from_rows"
    )]
    parts: Table<(String, u32), Part>,
    /// Shared small-object logs: live bytes and objects in each (compaction picks the ones
    /// mostly dead).
    #[serde(deserialize_with = "stored::packs_from_rows")]
    packs: Table<String, PackUse>,
    /// S3 gateways by endpoint.
    #[serde(default)]
    gateways: Cell<BTreeMap<String, Gateway>>,
    /// Files no object names any more, deleted once gateways empty them (after a grace
    /// period, so that GETs reading them finish).
    #[serde(
        default = "stored::trash_table",
        deserialize_with = "stored::trash_from_rows"
    )]
    trash: Table<String, ()>,
    /// The block service's volumes, by name (docs/block.md).
    #[serde(default)]
    pub(super) volumes: Cell<BTreeMap<String, Volume>>,
    /// Buckets placed in shards (the root's) and shards' copies being deleted (buckets.rs).
    #[serde(default)]
    placements: Cell<BTreeMap<String, buckets::Placement>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Bucket {
    owner: String,
    created_ms: u64,
    /// Snapshots before the objects table held each bucket's objects here; read once and
    /// moved into `by_key` ([`ObjectIndex::rebuild`]).
    #[serde(default)]
    objects: BTreeMap<String, ObjectMeta>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackUse {
    pub live_bytes: u64,
    pub live_objects: u64,
}

impl ObjectIndex {
    pub fn totals(&self) -> (u64, u64, u64) {
        (
            self.buckets.len() as u64,
            self.by_key.len(),
            self.uploads.len(),
        )
    }

    /// Moves objects read from an older snapshot (inside their buckets) into `by_key`.
    pub(super) fn rebuild(&mut self) {
        for (name, b) in self.buckets.iter_mut() {
            for (key, o) in std::mem::take(&mut b.objects) {
                self.by_key.insert((name.clone(), key), o);
            }
        }
        // Snapshots before the parts table kept each upload's parts in it.
        let ids: Vec<String> = self
            .uploads
            .iter()
            .filter(|(_, u)| !u.parts.is_empty())
            .map(|(id, _)| id)
            .collect();
        for id in ids {
            let u = self.uploads.get_mut(&id).expect("listed");
            for (n, p) in std::mem::take(&mut u.parts) {
                self.parts.insert((id.clone(), n), p);
            }
        }
    }

    /// The parts of upload `id` from part number `from` on, in order.
    fn parts_of(&self, id: &str, from: u32) -> impl Iterator<Item = Arc<Part>> + '_ {
        self.parts
            .range((id.to_owned(), from)..=(id.to_owned(), u32::MAX))
            .map(|(_, p)| p)
    }

    /// Removes upload `id` and its parts; returns the parts.
    fn take_upload(&mut self, id: &str) -> Vec<Part> {
        self.uploads.remove(&id.to_owned());
        let numbers: Vec<u32> = self.parts_of(id, 0).map(|p| p.number).collect();
        numbers
            .into_iter()
            .filter_map(|n| self.parts.remove(&(id.to_owned(), n)))
            .map(Arc::unwrap_or_clone)
            .collect()
    }

    /// The object at `key` of `bucket`.
    fn object(&self, bucket: &str, key: &str) -> Option<Arc<ObjectMeta>> {
        self.by_key.get(&(bucket.to_owned(), key.to_owned()))
    }

    /// Whether `bucket` holds any object.
    fn holds_objects(&self, bucket: &str) -> bool {
        self.by_key
            .range((bucket.to_owned(), String::new())..)
            .next()
            .is_some_and(|((b, _), _)| b == bucket)
    }

    /// The first object of `bucket` at or after `lower` (for listings).
    fn seek(&self, bucket: &str, lower: Bound<&String>) -> Option<(String, Arc<ObjectMeta>)> {
        let lo = match lower {
            Bound::Included(k) => Bound::Included((bucket.to_owned(), k.clone())),
            Bound::Excluded(k) => Bound::Excluded((bucket.to_owned(), k.clone())),
            Bound::Unbounded => Bound::Included((bucket.to_owned(), String::new())),
        };
        self.by_key
            .range((lo, Bound::Unbounded))
            .next()
            .filter(|((b, _), _)| b == bucket)
            .map(|((_, k), o)| (k, o))
    }

    pub fn packs(&self) -> &Table<String, PackUse> {
        &self.packs
    }

    fn bucket(&self, user: &str, name: &str) -> Result<&Bucket, ObjectError> {
        let b = self.buckets.get(name).ok_or(ObjectError::NoSuchBucket)?;
        if b.owner != user {
            return Err(ObjectError::AccessDenied);
        }
        Ok(b)
    }

    fn upload(&self, user: &str, id: &str) -> Result<Arc<Upload>, ObjectError> {
        let u = self
            .uploads
            .get(&id.to_owned())
            .ok_or(ObjectError::NoSuchUpload)?;
        if u.owner != user {
            return Err(ObjectError::AccessDenied);
        }
        Ok(u)
    }

    /// Files freed into the trash, not yet deleted.
    pub fn trash_len(&self) -> usize {
        self.trash.len() as usize
    }

    /// Objects in every bucket.
    pub fn object_count(&self) -> u64 {
        self.by_key.len()
    }

    /// A user by access key (for checking the proofs of calls).
    pub fn user(&self, access_key: &str) -> Option<&User> {
        self.users.get(access_key)
    }

    /// A user by name (users are few: a scan).
    pub fn user_named(&self, name: &str) -> Option<&User> {
        self.users.values().find(|u| u.name == name)
    }

    /// Access keys of users whose secret key is not sealed (from before secrets were), with
    /// those secrets.
    pub fn plain_secrets(&self) -> Vec<(String, String)> {
        self.users
            .values()
            .filter(|u| !cairn_rpc::seal::Sealer::is_sealed(&u.secret_key))
            .map(|u| (u.access_key.clone(), u.secret_key.clone()))
            .collect()
    }

    /// [`crate::state::Command::SealSecrets`].
    pub(super) fn seal_secrets(&mut self, sealed: &[(String, String)]) {
        for (key, secret) in sealed {
            if let Some(u) = self.users.get_mut(key)
                && !cairn_rpc::seal::Sealer::is_sealed(&u.secret_key)
                && cairn_rpc::seal::Sealer::is_sealed(secret)
            {
                u.secret_key.clone_from(secret);
            }
        }
    }
}

impl State {
    /// Answers a read of the object index (some need the namespace too).
    pub fn query_objects(&self, q: &ObjectQuery) -> QueryResult {
        match q {
            ObjectQuery::CompactionCandidates {
                dir,
                now_ms,
                live_pct,
                max,
            } => {
                let mut found: Vec<PackCandidate> = Vec::new();
                for ino in self.list(dir).unwrap_or_default() {
                    let Some(f) = ino.file() else { continue };
                    if f.lease.as_ref().is_some_and(|l| l.expires_ms > *now_ms) {
                        continue; // a writer still appends to it
                    }
                    let path = format!("{}/{}", dir.trim_end_matches('/'), ino.name);
                    if self.objects.trash.contains_key(&path) {
                        continue; // retired already
                    }
                    let length = f.committed_length();
                    let used = self
                        .objects
                        .packs
                        .get(&path)
                        .map(|u| *u)
                        .unwrap_or_default();
                    if u128::from(used.live_bytes) * 100
                        < u128::from(length) * u128::from(*live_pct)
                        || used.live_objects == 0
                    {
                        found.push(PackCandidate {
                            path,
                            length,
                            live_bytes: used.live_bytes,
                            live_objects: used.live_objects,
                        });
                    }
                }
                found.sort_by_key(|c| std::cmp::Reverse(c.length - c.live_bytes.min(c.length)));
                found.truncate(*max as usize);
                Ok(QueryReply::Packs(found))
            }
            q => self.objects.query(q),
        }
    }

    /// Applies a change to the object index.
    pub(super) fn apply_object(&mut self, op: &ObjectOp) -> OpResult {
        let idx = &mut self.objects;
        match op {
            ObjectOp::CreateUser { user } => {
                let taken = idx.users.contains_key(&user.access_key)
                    || idx.users.values().any(|u| u.name == user.name);
                if taken {
                    return Err(ObjectError::UserExists);
                }
                if user.name.is_empty() || user.access_key.is_empty() || user.secret_key.is_empty()
                {
                    return Err(ObjectError::InvalidArgument(
                        "user name, access key and secret must not be empty".into(),
                    ));
                }
                idx.users.insert(user.access_key.clone(), user.clone());
                Ok(OpReply::Done)
            }
            ObjectOp::DeleteUser { name } => {
                let key = idx
                    .users
                    .values()
                    .find(|u| u.name == *name)
                    .map(|u| u.access_key.clone())
                    .ok_or_else(|| ObjectError::InvalidArgument(format!("no user {name}")))?;
                let owned: Vec<&str> = idx
                    .buckets
                    .iter()
                    .filter(|(_, b)| b.owner == *name)
                    .map(|(n, _)| n.as_str())
                    .collect();
                if !owned.is_empty() {
                    return Err(ObjectError::InUse(format!(
                        "user {name} owns buckets {}; delete them first",
                        owned.join(", ")
                    )));
                }
                idx.users.remove(&key);
                // Capabilities handed to the user stop working (revoke.rs).
                let generation = self.revocations.next_generation();
                self.revocations.add(super::revoke::Record::Holder {
                    holder: cairn_proto::cap::holder_of(name),
                    generation,
                });
                Ok(OpReply::Done)
            }
            ObjectOp::AddUserCert { name, fingerprint } => {
                let valid = fingerprint.len() == 64
                    && fingerprint
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                if !valid {
                    return Err(ObjectError::InvalidArgument(
                        "a certificate's fingerprint is 64 lower-case hex digits".into(),
                    ));
                }
                if idx.users.values().any(|u| u.certs.contains(fingerprint)) {
                    return Err(ObjectError::InvalidArgument(
                        "that certificate is already issued".into(),
                    ));
                }
                let u = idx
                    .users
                    .values_mut()
                    .find(|u| u.name == *name)
                    .ok_or_else(|| ObjectError::InvalidArgument(format!("no user {name}")))?;
                if u.certs.len() >= cairn_rpc::object::MAX_USER_CERTS {
                    return Err(ObjectError::InvalidArgument(format!(
                        "user {name} holds {} certificates already; revoke them first",
                        u.certs.len()
                    )));
                }
                u.certs.push(fingerprint.clone());
                Ok(OpReply::Done)
            }
            ObjectOp::RevokeUserCerts { name } => {
                let u = idx
                    .users
                    .values_mut()
                    .find(|u| u.name == *name)
                    .ok_or_else(|| ObjectError::InvalidArgument(format!("no user {name}")))?;
                u.certs.clear();
                Ok(OpReply::Done)
            }
            ObjectOp::SetUserKeys {
                name,
                access_key,
                secret_key,
            } => {
                if access_key.is_empty() || secret_key.is_empty() {
                    return Err(ObjectError::InvalidArgument(
                        "access key and secret must not be empty".into(),
                    ));
                }
                if idx.users.contains_key(access_key) {
                    return Err(ObjectError::UserExists);
                }
                let old = idx
                    .users
                    .values()
                    .find(|u| u.name == *name)
                    .map(|u| u.access_key.clone())
                    .ok_or_else(|| ObjectError::InvalidArgument(format!("no user {name}")))?;
                let mut u = idx.users.remove(&old).expect("found");
                u.access_key = access_key.clone();
                u.secret_key = secret_key.clone();
                idx.users.insert(access_key.clone(), u);
                Ok(OpReply::Done)
            }
            ObjectOp::CreateBucket {
                user,
                bucket,
                now_ms,
            } => {
                if !cairn_rpc::object::valid_bucket_name(bucket) {
                    return Err(ObjectError::InvalidArgument(format!(
                        "invalid bucket name {bucket:?}"
                    )));
                }
                match idx.buckets.get(bucket) {
                    Some(b) if b.owner == *user => Err(ObjectError::BucketAlreadyOwnedByYou),
                    Some(_) => Err(ObjectError::BucketAlreadyExists),
                    None => {
                        idx.buckets.insert(
                            bucket.clone(),
                            Bucket {
                                owner: user.clone(),
                                created_ms: *now_ms,
                                objects: BTreeMap::new(),
                            },
                        );
                        Ok(OpReply::Done)
                    }
                }
            }
            ObjectOp::DeleteBucket { user, bucket } => {
                idx.bucket(user, bucket)?;
                if idx.holds_objects(bucket) {
                    return Err(ObjectError::BucketNotEmpty);
                }
                self.forget_bucket(bucket);
                Ok(OpReply::Done)
            }
            ObjectOp::PutObject {
                user,
                bucket,
                key,
                meta,
                condition,
            } => {
                idx.bucket(user, bucket)?;
                if let Some(c) = condition {
                    check_condition(idx.object(bucket, key).as_deref(), meta, c)?;
                }
                check_meta(meta)?;
                self.check_extents(meta.extents.iter())?;
                Ok(OpReply::Object(self.install(bucket, key, meta.clone())))
            }
            ObjectOp::DeleteObject { user, bucket, key } => {
                idx.bucket(user, bucket)?;
                if let Some(old) = idx.by_key.remove(&(bucket.clone(), key.clone())) {
                    self.free(&old.extents);
                }
                Ok(OpReply::Done)
            }
            ObjectOp::CreateUpload { user, upload } => {
                idx.bucket(user, &upload.bucket)?;
                if upload.owner != *user || !upload.parts.is_empty() {
                    return Err(ObjectError::InvalidArgument(
                        "a new upload has its user as owner and no parts".into(),
                    ));
                }
                if idx.uploads.contains_key(&upload.id) {
                    // A retry of a create that applied.
                    return Ok(OpReply::Done);
                }
                idx.uploads.insert(upload.id.clone(), upload.clone());
                Ok(OpReply::Done)
            }
            ObjectOp::PutPart {
                user,
                upload_id,
                part,
                ..
            } => {
                idx.upload(user, upload_id)?;
                if !(1..=cairn_rpc::object::MAX_PARTS).contains(&part.number)
                    || part.extent.len != part.size
                {
                    return Err(ObjectError::InvalidArgument(format!(
                        "part {} of {} bytes in an extent of {}",
                        part.number, part.size, part.extent.len
                    )));
                }
                self.check_extents(std::iter::once(&part.extent))?;
                let old = self
                    .objects
                    .parts
                    .insert((upload_id.clone(), part.number), part.clone());
                self.take_extent(&part.extent);
                match old {
                    // A retry: its extent was counted when it first applied.
                    Some(o) if o.extent == part.extent => self.release_pack(&o.extent),
                    Some(o) => self.free(std::slice::from_ref(&o.extent)),
                    None => {}
                }
                Ok(OpReply::Done)
            }
            ObjectOp::CompleteUpload {
                user,
                upload_id,
                bucket,
                key,
                parts,
                meta,
                condition,
            } => self.complete_upload(
                user,
                upload_id,
                (bucket, key),
                parts,
                meta,
                condition.as_ref(),
            ),
            ObjectOp::GatewaySeen { gateway } => {
                let now = gateway.seen_ms;
                idx.gateways
                    .retain(|_, g| now.saturating_sub(g.seen_ms) < GATEWAY_FORGET_MS);
                idx.gateways
                    .insert(gateway.endpoint.clone(), gateway.clone());
                Ok(OpReply::Done)
            }
            ObjectOp::MoveExtent {
                bucket,
                key,
                put_id,
                from,
                to,
            } => {
                if !from.shared || !to.shared || from.len != to.len {
                    return Err(ObjectError::InvalidArgument(
                        "a move is between pack records of one length".into(),
                    ));
                }
                self.check_extents(std::iter::once(to))?;
                let o = self
                    .objects
                    .by_key
                    .get_mut(&(bucket.clone(), key.clone()))
                    .filter(|o| o.put_id == *put_id)
                    .ok_or(ObjectError::NoSuchKey)?;
                let at = o
                    .extents
                    .iter()
                    .position(|e| e == from)
                    .ok_or(ObjectError::NoSuchKey)?;
                o.extents[at] = to.clone();
                self.release_pack(from);
                self.take_extent(to);
                Ok(OpReply::Done)
            }
            ObjectOp::DropPack { path, now_ms } => {
                let live = self
                    .objects
                    .packs
                    .get(path)
                    .is_some_and(|u| u.live_objects > 0);
                let held = match self.lookup(path) {
                    Ok(ino) => ino
                        .file()
                        .and_then(|f| f.lease.as_ref())
                        .is_some_and(|l| l.expires_ms > *now_ms),
                    Err(_) => false,
                };
                if live || held {
                    return Err(ObjectError::InvalidArgument(format!(
                        "pack {path} is still {}",
                        if live {
                            "named by objects"
                        } else {
                            "being written"
                        }
                    )));
                }
                if self.lookup(path).is_err() {
                    return Err(ObjectError::InvalidArgument(format!("no pack {path}")));
                }
                self.objects.packs.remove(path);
                self.objects.trash.insert(path.clone(), ());
                Ok(OpReply::Done)
            }
            ObjectOp::EmptyTrash { paths } => {
                for p in paths {
                    if self.objects.trash.remove(p).is_some() {
                        // Already gone is fine: the file was the trash's alone.
                        let _ = self.apply(&Command::Delete { path: p.clone() });
                    }
                }
                Ok(OpReply::Done)
            }
            ObjectOp::CreateVolume { .. }
            | ObjectOp::SetVolumeAttr { .. }
            | ObjectOp::ResizeVolume { .. }
            | ObjectOp::DeleteVolume { .. }
            | ObjectOp::CreateSnapshot { .. }
            | ObjectOp::SnapshotReady { .. }
            | ObjectOp::DeleteSnapshot { .. } => idx.apply_volume(op),
            ObjectOp::AbortUpload {
                user, upload_id, ..
            } => {
                idx.upload(user, upload_id)?;
                let extents: Vec<Extent> = self
                    .objects
                    .take_upload(upload_id)
                    .into_iter()
                    .map(|p| p.extent)
                    .collect();
                self.free(&extents);
                Ok(OpReply::Done)
            }
        }
    }

    fn complete_upload(
        &mut self,
        user: &str,
        upload_id: &str,
        (bucket, key): (&String, &String),
        listed: &[(u32, String)],
        meta: &ObjectMeta,
        condition: Option<&PutCondition>,
    ) -> OpResult {
        let upload = match self.objects.upload(user, upload_id) {
            Ok(u) => u,
            Err(ObjectError::NoSuchUpload) => {
                // A retry of a completion that applied: the object carries the upload's id.
                let applied = |o: &ObjectMeta| o.put_id == meta.put_id && o.etag == meta.etag;
                let done = match bucket.is_empty() {
                    false => self
                        .objects
                        .object(bucket, key)
                        .is_some_and(|o| applied(&o)),
                    // Entries of gateways that did not name the object: look at every one.
                    true => self.objects.by_key.iter().any(|(_, o)| applied(&o)),
                };
                return match done {
                    true => Ok(OpReply::Done),
                    false => Err(ObjectError::NoSuchUpload),
                };
            }
            Err(e) => return Err(e),
        };
        if listed.is_empty() {
            return Err(ObjectError::InvalidArgument(
                "a completion lists at least one part".into(),
            ));
        }
        let mut chosen = Vec::with_capacity(listed.len());
        let mut prev = 0;
        for (i, (n, etag)) in listed.iter().enumerate() {
            if *n <= prev {
                return Err(ObjectError::InvalidPartOrder);
            }
            prev = *n;
            let p = self
                .objects
                .parts
                .get(&(upload_id.to_owned(), *n))
                .ok_or(ObjectError::InvalidPart(*n))?;
            if p.etag != etag.trim_matches('"') {
                return Err(ObjectError::InvalidPart(*n));
            }
            if i + 1 < listed.len() && p.size < MIN_PART_BYTES {
                return Err(ObjectError::EntityTooSmall(*n));
            }
            chosen.push(Arc::unwrap_or_clone(p));
        }
        if let Some(alg) = &upload.checksum_algorithm {
            // The gateway computed the object's checksum from these; they must be the parts'.
            let sums: Option<Vec<String>> = chosen
                .iter()
                .map(|p| p.checksums.get(alg).cloned())
                .collect();
            if sums.as_ref() != Some(&meta.part_checksums) {
                return Err(ObjectError::InvalidArgument(
                    "the completion's part checksums are not its parts'".into(),
                ));
            }
        }
        let (bucket, key) = (upload.bucket.clone(), upload.key.clone());
        self.objects.bucket(user, &bucket)?;
        if let Some(c) = condition {
            check_condition(self.objects.object(&bucket, &key).as_deref(), meta, c)?;
        }
        let parts = self.objects.take_upload(upload_id);
        let mut meta = meta.clone();
        meta.size = chosen.iter().map(|p| p.size).sum();
        meta.part_sizes = chosen.iter().map(|p| p.size).collect();
        meta.extents = chosen.iter().map(|p| p.extent.clone()).collect();
        // Parts not listed are dropped with the upload.
        let unlisted: Vec<Extent> = parts
            .into_iter()
            .filter(|p| !chosen.iter().any(|c| c.number == p.number))
            .map(|p| p.extent)
            .collect();
        self.free(&unlisted);
        // The chosen parts' extents move from the upload to the object: taken once already.
        for e in &meta.extents {
            self.release_pack(e);
        }
        Ok(OpReply::Object(self.install(&bucket, &key, meta)))
    }
}

mod check;
#[cfg(test)]
mod tests;
