//! The object index's reads that need only the index (listings, heads, uploads, packs,
//! gateways); those that need the namespace too are [`State::query_objects`].

use super::*;

impl ObjectIndex {
    /// Answers a read.
    pub fn query(&self, q: &ObjectQuery) -> QueryResult {
        match q {
            ObjectQuery::User { access_key } => {
                Ok(QueryReply::User(self.users.get(access_key).cloned()))
            }
            ObjectQuery::ListBuckets { user } => Ok(QueryReply::Buckets(
                self.buckets
                    .iter()
                    .filter(|(_, b)| b.owner == *user)
                    .map(|(name, b)| self.info(name, b))
                    .collect(),
            )),
            ObjectQuery::HeadBucket { user, bucket } => Ok(QueryReply::Bucket(
                self.info(bucket, self.bucket(user, bucket)?),
            )),
            ObjectQuery::HeadObject { user, bucket, key } => {
                self.bucket(user, bucket)?;
                let o = self.object(bucket, key).ok_or(ObjectError::NoSuchKey)?;
                Ok(QueryReply::Object((*o).clone()))
            }
            ObjectQuery::ListObjects { user, bucket, list } => {
                let b = self.bucket(user, bucket)?;
                let seek = |lower: Bound<&String>| self.seek(bucket, lower);
                Ok(QueryReply::List(list_keys(seek, list, |key, o| {
                    ListEntry {
                        key: key.clone(),
                        size: o.size,
                        etag: o.etag.clone(),
                        mtime_ms: o.mtime_ms,
                        upload_id: String::new(),
                        owner: b.owner.clone(),
                    }
                })))
            }
            ObjectQuery::ListUploads { user, bucket, list } => {
                self.bucket(user, bucket)?;
                // Uploads are few and short-lived: gathered per call, keyed "key\0id" so the
                // same listing code pages through them in (key, upload id) order.
                let by_key: BTreeMap<String, Arc<Upload>> = self
                    .uploads
                    .values()
                    .filter(|u| u.bucket == *bucket && u.key.starts_with(&list.prefix))
                    .map(|u| (format!("{}\0{}", u.key, u.id), u))
                    .collect();
                let seek = |lower: Bound<&String>| {
                    by_key
                        .range::<String, _>((lower, Bound::Unbounded))
                        .next()
                        .map(|(k, u)| (k.clone(), u.clone()))
                };
                Ok(QueryReply::List(list_keys(seek, list, |_, u| ListEntry {
                    key: u.key.clone(),
                    size: 0,
                    etag: String::new(),
                    mtime_ms: u.initiated_ms,
                    upload_id: u.id.clone(),
                    owner: u.owner.clone(),
                })))
            }
            ObjectQuery::ListParts {
                user,
                upload_id,
                after,
                max,
                ..
            } => {
                let u = self.upload(user, upload_id)?;
                let max = (*max as usize).clamp(1, MAX_LIST_KEYS);
                let mut parts: Vec<Part> = self
                    .parts_of(upload_id, after.saturating_add(1))
                    .map(Arc::unwrap_or_clone)
                    .take(max + 1)
                    .collect();
                let truncated = parts.len() > max;
                parts.truncate(max);
                let mut upload = (*u).clone();
                upload.parts.clear();
                Ok(QueryReply::Parts {
                    upload,
                    parts,
                    truncated,
                })
            }
            ObjectQuery::Locate { bucket, key } => {
                self.buckets.get(bucket).ok_or(ObjectError::NoSuchBucket)?;
                let o = self.object(bucket, key).ok_or(ObjectError::NoSuchKey)?;
                Ok(QueryReply::Object((*o).clone()))
            }
            ObjectQuery::CompactionCandidates { .. } => Err(ObjectError::InvalidArgument(
                "compaction candidates are answered with the namespace".into(),
            )),
            ObjectQuery::Volume { name } => self
                .volumes
                .get(name)
                .cloned()
                .map(QueryReply::Volume)
                .ok_or(ObjectError::NoSuchVolume),
            ObjectQuery::Layout { bucket } => {
                self.buckets.get(bucket).ok_or(ObjectError::NoSuchBucket)?;
                Ok(QueryReply::Layout(self.shards_of(bucket)))
            }
            ObjectQuery::Volumes => Ok(QueryReply::Volumes(
                self.volumes.values().cloned().collect(),
            )),
            ObjectQuery::VolumeFor { name, user } => {
                let v = self.volumes.get(name).ok_or(ObjectError::NoSuchVolume)?;
                let u = self.user_named(user).ok_or(ObjectError::AccessDenied)?;
                match v.access(&u.name, u.admin) {
                    VolumeAccess::None => Err(ObjectError::AccessDenied),
                    _ => Ok(QueryReply::Volume(v.clone())),
                }
            }
            ObjectQuery::VolumesFor { user } => {
                let u = self.user_named(user).ok_or(ObjectError::AccessDenied)?;
                Ok(QueryReply::Volumes(
                    self.volumes
                        .values()
                        .filter(|v| v.access(&u.name, u.admin) != VolumeAccess::None)
                        .cloned()
                        .collect(),
                ))
            }
            ObjectQuery::Trash { max } => Ok(QueryReply::Trash(
                self.trash
                    .iter()
                    .take(*max as usize)
                    .map(|(p, _)| p)
                    .collect(),
            )),
            ObjectQuery::Unnamed { paths } => {
                let mut left: std::collections::BTreeSet<&String> = paths.iter().collect();
                for (_, o) in self.by_key.iter() {
                    for e in &o.extents {
                        left.remove(&e.path);
                    }
                }
                for p in self.parts.values() {
                    left.remove(&p.extent.path);
                }
                // Freed files are the trash's to delete.
                Ok(QueryReply::Unnamed(
                    left.into_iter()
                        .filter(|p| !self.trash.contains_key(*p))
                        .cloned()
                        .collect(),
                ))
            }
            ObjectQuery::CertUser { fingerprint } => Ok(QueryReply::User(
                self.users
                    .values()
                    .find(|u| u.certs.iter().any(|c| c == fingerprint))
                    .map(|u| User {
                        secret_key: String::new(),
                        ..u.clone()
                    }),
            )),
            ObjectQuery::Users => Ok(QueryReply::Users(
                self.users
                    .values()
                    .map(|u| User {
                        secret_key: String::new(),
                        ..u.clone()
                    })
                    .collect(),
            )),
            ObjectQuery::Gateways => {
                let (buckets, objects, uploads) = self.totals();
                Ok(QueryReply::Gateways {
                    gateways: self.gateways.values().cloned().collect(),
                    buckets,
                    objects,
                    uploads,
                    trash: self.trash.len(),
                })
            }
            ObjectQuery::StaleUploads { before_ms, max } => Ok(QueryReply::Uploads(
                self.uploads
                    .values()
                    .filter(|u| u.initiated_ms < *before_ms)
                    .take(*max as usize)
                    .map(|u| {
                        let mut u = (*u).clone();
                        u.parts.clear();
                        u
                    })
                    .collect(),
            )),
        }
    }
}
