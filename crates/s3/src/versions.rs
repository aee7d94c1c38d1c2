//! Versioning as an unversioned bucket answers it: S3 clients and test fixtures (ceph's
//! s3-tests empties every bucket with ListObjectVersions) ask for versions of buckets that
//! never had versioning turned on. Such a bucket has one version per key, whose id is `null`
//! (as on AWS before versioning is enabled), and no delete markers; `GetBucketVersioning`
//! answers with no status. Turning versioning on is not supported (docs/object.md).

use crate::convert::{etag, owner, timestamp};
use crate::listing::{common_prefixes, encoder, max_keys};
use crate::ops::Cairn;
use cairn_rpc::object::{ListRequest, ObjectQuery};
use s3s::dto::*;
use s3s::{S3Response, S3Result};

/// The version id of every object of an unversioned bucket.
pub const NULL_VERSION: &str = "null";

impl Cairn {
    /// ListObjectVersions: the bucket's keys as their `null` versions. A key marker lists
    /// after that key (with a version id marker too: each key has only the one version, so
    /// the versions after it are the next keys').
    pub(crate) async fn versions(
        &self,
        user: String,
        input: ListObjectVersionsInput,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let enc = encoder(input.encoding_type.as_ref())?;
        let max = max_keys(input.max_keys)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        if let Some(v) = &input.version_id_marker
            && input.key_marker.is_none()
        {
            return Err(s3s::s3_error!(
                InvalidArgument,
                "a version-id-marker ({v}) needs a key-marker"
            ));
        }
        let page = self
            .list(ObjectQuery::ListObjects {
                user,
                bucket: input.bucket.clone(),
                list: ListRequest {
                    prefix: prefix.clone(),
                    delimiter: input.delimiter.clone().filter(|d| !d.is_empty()),
                    after: input.key_marker.clone().unwrap_or_default(),
                    max: max.max(1),
                },
            })
            .await?;
        let page = if max == 0 {
            cairn_rpc::object::ListPage {
                truncated: !page.entries.is_empty() || !page.prefixes.is_empty(),
                ..Default::default()
            }
        } else {
            page
        };
        let next_key = page.truncated.then(|| page.last.clone()).flatten();
        let next_version = next_key
            .as_ref()
            .filter(|k| page.entries.iter().any(|e| &&e.key == k))
            .map(|_| NULL_VERSION.to_owned());
        Ok(S3Response::new(ListObjectVersionsOutput {
            name: Some(input.bucket),
            prefix: Some(enc(prefix)),
            delimiter: input.delimiter.filter(|d| !d.is_empty()).map(&enc),
            key_marker: Some(enc(input.key_marker.unwrap_or_default())),
            version_id_marker: Some(input.version_id_marker.unwrap_or_default()),
            next_key_marker: next_key.map(&enc),
            next_version_id_marker: next_version,
            max_keys: Some(max as i32),
            is_truncated: Some(page.truncated),
            encoding_type: input.encoding_type.clone(),
            versions: Some(
                page.entries
                    .into_iter()
                    .map(|e| ObjectVersion {
                        key: Some(enc(e.key)),
                        version_id: Some(NULL_VERSION.to_owned()),
                        is_latest: Some(true),
                        size: Some(e.size as i64),
                        e_tag: Some(etag(&e.etag)),
                        last_modified: Some(timestamp(e.mtime_ms)),
                        storage_class: Some(ObjectVersionStorageClass::from_static(
                            ObjectVersionStorageClass::STANDARD,
                        )),
                        owner: Some(owner(&e.owner)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            common_prefixes: Some(common_prefixes(page.prefixes, &enc)),
            ..Default::default()
        }))
    }
}

/// GetBucketVersioning: the bucket exists and is the caller's; versioning was never turned
/// on, so the configuration has no status (as AWS answers for such a bucket).
pub(crate) fn versioning() -> GetBucketVersioningOutput {
    GetBucketVersioningOutput::default()
}
