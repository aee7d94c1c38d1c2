//! The S3 operations, mapped onto the object index and FlatLogFiles.

use crate::checksum::{self, checksum_map, declared, hasher_for, with_trailers};
use crate::convert::{
    answered_sums, check_key, conditional_delete, etag, headers_of, owner, part_range,
    preconditions, put_condition, timestamp, user_meta,
};
use crate::data::{self, DataStore, Stored, internal};
use crate::{HEX, Users, change, now_ms, query, random_id};
use cairn_rpc::object::{
    Extent, ObjectMeta, ObjectOp, ObjectQuery, OpReply, PutCondition, QueryReply,
};
use s3s::checksum::ChecksumHasher;
use s3s::dto::*;
use s3s::{S3, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone)]
pub struct Cairn {
    pub data: Arc<DataStore>,
    pub(crate) users: Arc<Users>,
    pub region: String,
    /// (user, bucket) pairs the index recently said may be written: a PUT's early check
    /// skips the masters for them. Only an optimisation — the index checks every PUT again.
    pub(crate) writable:
        Arc<parking_lot::Mutex<std::collections::HashMap<(String, String), std::time::Instant>>>,
}

/// How long a bucket found writable is trusted by the early check.
const WRITABLE_TTL: Duration = Duration::from_secs(2);

impl Cairn {
    /// The user a signed request acts for in `bucket`; an anonymous request to a bucket that
    /// does not exist is told so (NoSuchBucket, as S3), otherwise refused.
    pub(crate) async fn user_in<T>(&self, req: &S3Request<T>, bucket: &str) -> S3Result<String> {
        if req.credentials.is_none() {
            let q = ObjectQuery::HeadBucket {
                user: String::new(),
                bucket: bucket.to_owned(),
            };
            if let Err(e) = query(&self.data.client, &q).await
                && *e.code() == S3ErrorCode::NoSuchBucket
            {
                return Err(e);
            }
        }
        self.user(req).await
    }

    pub(crate) async fn user<T>(&self, req: &S3Request<T>) -> S3Result<String> {
        let creds = req
            .credentials
            .as_ref()
            .ok_or_else(|| s3_error!(AccessDenied, "a signature is required"))?;
        match self.users.get(&creds.access_key).await? {
            Some(u) => Ok(u.name),
            None => Err(s3_error!(InvalidAccessKeyId)),
        }
    }

    pub(crate) async fn head(&self, user: &str, bucket: &str, key: &str) -> S3Result<ObjectMeta> {
        let q = ObjectQuery::HeadObject {
            user: user.to_owned(),
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        };
        match query(&self.data.client, &q).await? {
            QueryReply::Object(o) => Ok(o),
            _ => Err(internal("HeadObject answered with something else")),
        }
    }

    /// The bucket exists and is the user's (asked of the masters at most every
    /// [`WRITABLE_TTL`] per pair).
    async fn check_writable(&self, user: &str, bucket: &str) -> S3Result<()> {
        let pair = (user.to_owned(), bucket.to_owned());
        if self
            .writable
            .lock()
            .get(&pair)
            .is_some_and(|at| at.elapsed() < WRITABLE_TTL)
        {
            return Ok(());
        }
        let q = ObjectQuery::HeadBucket {
            user: user.to_owned(),
            bucket: bucket.to_owned(),
        };
        query(&self.data.client, &q).await?;
        let mut w = self.writable.lock();
        if w.len() > 10_000 {
            w.clear();
        }
        w.insert(pair, std::time::Instant::now());
        Ok(())
    }

    /// Stores a body and, if its digests check out, returns it; otherwise frees what was
    /// written and fails.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn store_checked(
        &self,
        bucket: &str,
        key: &str,
        own_name: &str,
        body: Option<StreamingBlob>,
        algorithm: Option<&ChecksumAlgorithm>,
        declared_sums: Checksum,
        content_md5: Option<&str>,
        trailers: Option<s3s::TrailingHeaders>,
        force_own_file: bool,
    ) -> S3Result<Stored> {
        let hasher = hasher_for(algorithm, &declared_sums)?;
        let body = body
            .unwrap_or_else(|| StreamingBlob::wrap::<_, std::io::Error>(futures::stream::empty()));
        let stored = self
            .data
            .store(bucket, key, own_name, body, hasher, force_own_file)
            .await?;
        let sums = with_trailers(declared_sums, trailers)?;
        if let Err(e) = data::verify(&stored, content_md5, &sums) {
            self.discard(&stored.extents).await;
            return Err(e);
        }
        Ok(stored)
    }

    /// Deletes extents no index entry names (a refused PUT's data). Pack bytes stay as dead
    /// bytes for compaction.
    pub(crate) async fn discard(&self, extents: &[Extent]) {
        for e in extents.iter().filter(|e| !e.shared) {
            if let Err(err) = self.data.client.delete(&e.path).await {
                tracing::warn!(path = %e.path, error = %err, "could not delete refused data");
            }
        }
    }

    /// Puts an object's index entry; frees the data if the index refuses it.
    async fn commit_object(
        &self,
        user: &str,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
        condition: Option<PutCondition>,
    ) -> S3Result<ObjectMeta> {
        let extents = meta.extents.clone();
        let op = ObjectOp::PutObject {
            user: user.to_owned(),
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            meta,
            condition,
        };
        match self.data.commit(&op).await {
            Ok(OpReply::Object(o)) => Ok(o),
            Ok(OpReply::Done | OpReply::Volume(_)) => {
                Err(internal("a PUT answered without its object"))
            }
            Err(e) => {
                if e.code() != &S3ErrorCode::ServiceUnavailable {
                    self.discard(&extents).await;
                }
                Err(e)
            }
        }
    }

    /// The source of a copy: its meta, after the copy-source conditions.
    pub(crate) async fn copy_source(
        &self,
        user: &str,
        src: &CopySource,
        if_match: Option<&ETagCondition>,
        if_none_match: Option<&ETagCondition>,
        if_modified_since: Option<&Timestamp>,
        if_unmodified_since: Option<&Timestamp>,
    ) -> S3Result<(String, String, ObjectMeta)> {
        let CopySource::Bucket { bucket, key, .. } = src else {
            return Err(s3_error!(
                NotImplemented,
                "copies from access points are not supported"
            ));
        };
        let o = self.head(user, bucket, key).await?;
        preconditions(
            &o,
            if_match,
            if_none_match,
            if_modified_since,
            if_unmodified_since,
        )
        .map_err(|e| {
            // A copy answers a failed condition with 412 either way.
            if e.code() == &S3ErrorCode::NotModified {
                s3_error!(PreconditionFailed)
            } else {
                e
            }
        })?;
        Ok((bucket.to_string(), key.to_string(), o))
    }
}

#[async_trait::async_trait]
impl S3 for Cairn {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let user = self.user(&req).await?;
        let bucket = req.input.bucket;
        if !cairn_rpc::object::valid_bucket_name(&bucket) {
            return Err(s3_error!(
                InvalidBucketName,
                "{bucket}: a bucket name is 3 to 63 lower-case letters, digits, dots and \
                 hyphens, beginning and ending with a letter or digit"
            ));
        }
        let op = ObjectOp::CreateBucket {
            user,
            bucket: bucket.clone(),
            now_ms: now_ms(),
        };
        match change(&self.data.client, &op).await {
            Ok(_) => {}
            // us-east-1 answers a re-creation of one's own bucket with success (AWS's legacy
            // rule, which clients rely on); other regions with BucketAlreadyOwnedByYou.
            Err(e)
                if *e.code() == S3ErrorCode::BucketAlreadyOwnedByYou
                    && self.region == "us-east-1" => {}
            Err(e) => return Err(e),
        }
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(format!("/{bucket}")),
        }))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let user = self.user(&req).await?;
        let op = ObjectOp::DeleteBucket {
            user,
            bucket: req.input.bucket,
        };
        change(&self.data.client, &op).await?;
        Ok(S3Response::new(DeleteBucketOutput {}))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        let user = self.user(&req).await?;
        let q = ObjectQuery::HeadBucket {
            user,
            bucket: req.input.bucket,
        };
        query(&self.data.client, &q).await?;
        Ok(S3Response::new(HeadBucketOutput {
            bucket_region: Some(self.region.clone()),
            ..Default::default()
        }))
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let user = self.user(&req).await?;
        let q = ObjectQuery::ListBuckets { user: user.clone() };
        let QueryReply::Buckets(list) = query(&self.data.client, &q).await? else {
            return Err(internal("ListBuckets answered with something else"));
        };
        let input = req.input;
        let prefix = input.prefix.clone().unwrap_or_default();
        // The token is the last name answered (base64), as opaque to clients as S3's.
        let after = match &input.continuation_token {
            Some(t) => data::base64_decode(t)
                .and_then(|raw| String::from_utf8(raw).ok())
                .ok_or_else(|| s3_error!(InvalidArgument, "bad continuation token"))?,
            None => String::new(),
        };
        let max = match input.max_buckets {
            None => usize::MAX,
            Some(n) if (1..=10_000).contains(&n) => n as usize,
            Some(_) => {
                return Err(s3_error!(InvalidArgument, "max-buckets is 1 to 10000"));
            }
        };
        let mut list: Vec<_> = list
            .into_iter()
            .filter(|b| b.name.starts_with(&prefix) && b.name > after)
            .collect();
        list.sort_by(|a, b| a.name.cmp(&b.name));
        let more = list.len() > max;
        list.truncate(max);
        let token = more
            .then(|| list.last())
            .flatten()
            .map(|b| base64_simd::STANDARD.encode_to_string(b.name.as_bytes()));
        let buckets = list
            .into_iter()
            .map(|b| Bucket {
                name: Some(b.name),
                creation_date: Some(timestamp(b.created_ms)),
                bucket_region: Some(self.region.clone()),
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(owner(&user)),
            continuation_token: token,
            prefix: input.prefix,
        }))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let user = self.user(&req).await?;
        let q = ObjectQuery::HeadBucket {
            user,
            bucket: req.input.bucket,
        };
        query(&self.data.client, &q).await?;
        // us-east-1 is answered as an empty constraint, as S3 does.
        let constraint = (self.region != "us-east-1")
            .then(|| BucketLocationConstraint::from(self.region.clone()));
        Ok(S3Response::new(GetBucketLocationOutput {
            location_constraint: constraint,
        }))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let user = self.user_in(&req, &req.input.bucket).await?;
        if req
            .headers
            .get("content-md5")
            .is_some_and(|v| v.as_bytes().iter().all(u8::is_ascii_whitespace))
        {
            return Err(s3_error!(InvalidDigest, "Content-MD5 is empty"));
        }
        let input = req.input;
        check_key(&input.key)?;
        let condition = put_condition(input.if_match.as_ref(), input.if_none_match.as_ref())?;
        let put_id = random_id(24, HEX);
        let sums = declared(
            input.checksum_crc32.clone(),
            input.checksum_crc32c.clone(),
            input.checksum_sha1.clone(),
            input.checksum_sha256.clone(),
            input.checksum_crc64nvme.clone(),
        );
        // Refuse early what the index would refuse after the bytes are written.
        self.check_writable(&user, &input.bucket).await?;
        let stored = self
            .store_checked(
                &input.bucket,
                &input.key,
                &put_id,
                input.body,
                input.checksum_algorithm.as_ref(),
                sums,
                input.content_md5.as_deref(),
                req.trailing_headers,
                false,
            )
            .await?;
        let meta = ObjectMeta {
            size: stored.size,
            etag: stored.md5_hex.clone(),
            mtime_ms: now_ms(),
            put_id,
            headers: headers_of(
                input.content_type.as_ref(),
                input.content_encoding.as_ref(),
                input.content_disposition.as_ref(),
                input.content_language.as_ref(),
                input.cache_control.as_ref(),
                input.expires.as_ref(),
            ),
            user_meta: user_meta(input.metadata),
            checksums: checksum_map(&stored.checksums),
            extents: stored.extents,
            ..Default::default()
        };
        let o = self
            .commit_object(&user, &input.bucket, &input.key, meta, condition)
            .await?;
        let c = &stored.checksums;
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(etag(&o.etag)),
            checksum_crc32: c.checksum_crc32.clone(),
            checksum_crc32c: c.checksum_crc32c.clone(),
            checksum_sha1: c.checksum_sha1.clone(),
            checksum_sha256: c.checksum_sha256.clone(),
            checksum_crc64nvme: c.checksum_crc64nvme.clone(),
            ..Default::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let user = self.user_in(&req, &req.input.bucket).await?;
        let input = req.input;
        let o = self.head(&user, &input.bucket, &input.key).await?;
        preconditions(
            &o,
            input.if_match.as_ref(),
            input.if_none_match.as_ref(),
            input.if_modified_since.as_ref(),
            input.if_unmodified_since.as_ref(),
        )?;
        let (range, partial, part) = match (input.part_number, input.range) {
            (Some(_), Some(_)) => {
                return Err(s3_error!(
                    InvalidRequest,
                    "Range and partNumber cannot both be given"
                ));
            }
            (Some(n), None) => {
                let (range, i) = part_range(&o, n)?;
                (range, !o.part_sizes.is_empty(), Some(i))
            }
            (None, Some(r)) => (r.check(o.size)?, true, None),
            (None, None) => (0..o.size, false, None),
        };
        let len = range.end - range.start;
        let body = self.data.read(&o.extents, range.clone());
        let h = |name: &str| o.headers.get(name).cloned();
        let full = range.start == 0 && range.end == o.size;
        let (sums, checksum_type) = answered_sums(
            &o,
            part,
            full,
            checksum::wanted(input.checksum_mode.as_ref()),
        );
        let output = GetObjectOutput {
            body: Some(StreamingBlob::wrap(body)),
            content_length: Some(len as i64),
            content_range: partial.then(|| {
                format!(
                    "bytes {}-{}/{}",
                    range.start,
                    range.end.saturating_sub(1),
                    o.size
                )
            }),
            accept_ranges: Some("bytes".into()),
            e_tag: Some(etag(&o.etag)),
            last_modified: Some(timestamp(o.mtime_ms)),
            metadata: (!o.user_meta.is_empty()).then(|| o.user_meta.clone().into_iter().collect()),
            content_type: input.response_content_type.or_else(|| h("content-type")),
            content_encoding: input
                .response_content_encoding
                .or_else(|| h("content-encoding")),
            content_disposition: input
                .response_content_disposition
                .or_else(|| h("content-disposition")),
            content_language: input
                .response_content_language
                .or_else(|| h("content-language")),
            cache_control: input.response_cache_control.or_else(|| h("cache-control")),
            expires: input
                .response_expires
                .or_else(|| h("expires").and_then(|v| v.parse().ok()).map(timestamp)),
            parts_count: (!o.part_sizes.is_empty()).then_some(o.part_sizes.len() as i32),
            checksum_crc32: sums.crc32,
            checksum_crc32c: sums.crc32c,
            checksum_sha1: sums.sha1,
            checksum_sha256: sums.sha256,
            checksum_crc64nvme: sums.crc64nvme,
            checksum_type,
            ..Default::default()
        };
        let mut resp = S3Response::new(output);
        if partial {
            resp.status = Some(http::StatusCode::PARTIAL_CONTENT);
        }
        Ok(resp)
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let user = self.user_in(&req, &req.input.bucket).await?;
        let input = req.input;
        let o = self.head(&user, &input.bucket, &input.key).await?;
        preconditions(
            &o,
            input.if_match.as_ref(),
            input.if_none_match.as_ref(),
            input.if_modified_since.as_ref(),
            input.if_unmodified_since.as_ref(),
        )?;
        let (len, part) = match input.part_number {
            Some(n) => {
                let (range, i) = part_range(&o, n)?;
                (range.end - range.start, Some(i))
            }
            None => (o.size, None),
        };
        let (sums, checksum_type) = answered_sums(
            &o,
            part,
            true,
            checksum::wanted(input.checksum_mode.as_ref()),
        );
        let h = |name: &str| o.headers.get(name).cloned();
        Ok(S3Response::new(HeadObjectOutput {
            content_length: Some(len as i64),
            accept_ranges: Some("bytes".into()),
            e_tag: Some(etag(&o.etag)),
            last_modified: Some(timestamp(o.mtime_ms)),
            metadata: (!o.user_meta.is_empty()).then(|| o.user_meta.clone().into_iter().collect()),
            content_type: h("content-type"),
            content_encoding: h("content-encoding"),
            content_disposition: h("content-disposition"),
            content_language: h("content-language"),
            cache_control: h("cache-control"),
            expires: h("expires").and_then(|v| v.parse().ok()).map(timestamp),
            parts_count: (!o.part_sizes.is_empty()).then_some(o.part_sizes.len() as i32),
            checksum_crc32: sums.crc32,
            checksum_crc32c: sums.crc32c,
            checksum_sha1: sums.sha1,
            checksum_sha256: sums.sha256,
            checksum_crc64nvme: sums.crc64nvme,
            checksum_type,
            ..Default::default()
        }))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let user = self.user_in(&req, &req.input.bucket).await?;
        check_key(&req.input.key)?;
        let i = &req.input;
        if i.if_match.is_some()
            || i.if_match_last_modified_time.is_some()
            || i.if_match_size.is_some()
        {
            return Err(conditional_delete());
        }
        let op = ObjectOp::DeleteObject {
            user,
            bucket: req.input.bucket,
            key: req.input.key,
        };
        change(&self.data.client, &op).await?;
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let user = self.user(&req).await?;
        let input = req.input;
        if input.delete.objects.len() > 1000 {
            return Err(s3_error!(MalformedXML, "at most 1000 keys per request"));
        }
        let quiet = input.delete.quiet.unwrap_or(false);
        // Concurrent deletes share the masters' batches.
        let results = futures::future::join_all(input.delete.objects.into_iter().map(|id| {
            let op = ObjectOp::DeleteObject {
                user: user.clone(),
                bucket: input.bucket.clone(),
                key: id.key.clone(),
            };
            async move {
                let conditional =
                    id.e_tag.is_some() || id.last_modified_time.is_some() || id.size.is_some();
                let r = match check_key(&id.key) {
                    Ok(()) if conditional => Err(conditional_delete()),
                    Ok(()) => change(&self.data.client, &op).await.map(|_| ()),
                    Err(e) => Err(e),
                };
                (id.key, r)
            }
        }))
        .await;
        let (mut deleted, mut errors) = (Vec::new(), Vec::new());
        for (key, r) in results {
            match r {
                Ok(()) if !quiet => deleted.push(DeletedObject {
                    key: Some(key),
                    ..Default::default()
                }),
                Ok(()) => {}
                Err(e) => errors.push(Error {
                    code: Some(e.code().as_str().to_owned()),
                    key: Some(key),
                    message: e.message().map(str::to_owned),
                    version_id: None,
                }),
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: Some(errors),
            ..Default::default()
        }))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let user = self.user(&req).await?;
        let input = req.input;
        check_key(&input.key)?;
        let (sb, sk, src) = self
            .copy_source(
                &user,
                &input.copy_source,
                input.copy_source_if_match.as_ref(),
                input.copy_source_if_none_match.as_ref(),
                input.copy_source_if_modified_since.as_ref(),
                input.copy_source_if_unmodified_since.as_ref(),
            )
            .await?;
        let replace = input
            .metadata_directive
            .as_ref()
            .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        if !replace && sb == input.bucket && sk == input.key {
            return Err(s3_error!(
                InvalidRequest,
                "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata."
            ));
        }
        // The gateway copies the bytes inside the cluster; none go through the client.
        let put_id = random_id(24, HEX);
        let body = self.data.read(&src.extents, 0..src.size);
        let mut hasher = ChecksumHasher::default();
        for alg in src.checksums.keys() {
            match alg.as_str() {
                "CRC32" => hasher.crc32 = Some(Default::default()),
                "CRC32C" => hasher.crc32c = Some(Default::default()),
                "SHA1" => hasher.sha1 = Some(Default::default()),
                "SHA256" => hasher.sha256 = Some(Default::default()),
                "CRC64NVME" => hasher.crc64nvme = Some(Default::default()),
                _ => {}
            }
        }
        let stored = self
            .data
            .store(&input.bucket, &input.key, &put_id, body, hasher, false)
            .await?;
        // A copy of a multipart object is a single-part object with the source's bytes.
        if src.part_sizes.is_empty() && stored.md5_hex != src.etag {
            self.discard(&stored.extents).await;
            return Err(internal("the copy's bytes do not match the source's ETag"));
        }
        let (headers, user_meta) = if replace {
            (
                headers_of(
                    input.content_type.as_ref(),
                    input.content_encoding.as_ref(),
                    input.content_disposition.as_ref(),
                    input.content_language.as_ref(),
                    input.cache_control.as_ref(),
                    input.expires.as_ref(),
                ),
                user_meta(input.metadata),
            )
        } else {
            (src.headers.clone(), src.user_meta.clone())
        };
        let meta = ObjectMeta {
            size: stored.size,
            etag: stored.md5_hex.clone(),
            mtime_ms: now_ms(),
            put_id,
            headers,
            user_meta,
            checksums: checksum_map(&stored.checksums),
            extents: stored.extents,
            ..Default::default()
        };
        let o = self
            .commit_object(&user, &input.bucket, &input.key, meta, None)
            .await?;
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(etag(&o.etag)),
                last_modified: Some(timestamp(o.mtime_ms)),
                checksum_crc32: o.checksums.get("CRC32").cloned(),
                checksum_crc32c: o.checksums.get("CRC32C").cloned(),
                checksum_sha256: o.checksums.get("SHA256").cloned(),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        self.attributes(req).await
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let user = self.user(&req).await?;
        self.versions(user, req.input).await
    }

    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        let user = self.user(&req).await?;
        let q = ObjectQuery::HeadBucket {
            user,
            bucket: req.input.bucket,
        };
        query(&self.data.client, &q).await?;
        Ok(S3Response::new(crate::versions::versioning()))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        self.list_v2(req).await
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        self.list_v1(req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.start_upload(req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.put_upload_part(req).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        self.copy_upload_part(req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        self.complete_upload(req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.abort_upload(req).await
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        self.uploads(req).await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        self.parts(req).await
    }
}
