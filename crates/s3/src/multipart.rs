//! Multipart uploads: create, upload (and copy) parts, complete, abort, list.

use crate::checksum::{self, Sums, checksum_map, declared};
use crate::convert::{
    check_key, etag, headers_of, owner, part_number, put_condition, timestamp, user_meta,
};
use crate::data::{hex, internal};
use crate::listing::{encoder, max_keys};
use crate::ops::Cairn;
use crate::{HEX, change, now_ms, query, random_id};
use cairn_rpc::object::{
    Extent, ListRequest, ObjectMeta, ObjectOp, ObjectQuery, OpReply, Part, QueryReply, Upload,
};
use s3s::crypto::{Checksum as _, Md5};
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};
use std::collections::BTreeMap;
use std::time::Duration;

impl Cairn {
    async fn upload_of(
        &self,
        user: &str,
        upload_id: &str,
        bucket: &str,
        key: &str,
    ) -> S3Result<Upload> {
        let q = ObjectQuery::ListParts {
            user: user.to_owned(),
            upload_id: upload_id.to_owned(),
            after: 0,
            max: 1,
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        };
        match query(&self.data.client, &q).await? {
            QueryReply::Parts { upload, .. } if upload.bucket == bucket && upload.key == key => {
                Ok(upload)
            }
            QueryReply::Parts { .. } => Err(s3_error!(NoSuchUpload)),
            _ => Err(internal("ListParts answered with something else")),
        }
    }

    async fn put_part(&self, user: &str, upload: &Upload, part: Part) -> S3Result<()> {
        let extent = part.extent.clone();
        let op = ObjectOp::PutPart {
            user: user.to_owned(),
            upload_id: upload.id.clone(),
            part,
            bucket: upload.bucket.clone(),
            key: upload.key.clone(),
        };
        if let Err(e) = self.data.commit(&op).await {
            if e.code() != &S3ErrorCode::ServiceUnavailable {
                self.discard(std::slice::from_ref(&extent)).await;
            }
            return Err(e);
        }
        Ok(())
    }

    pub(crate) async fn start_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let user = self.user(&req).await?;
        let input = req.input;
        check_key(&input.key)?;
        let (checksum_algorithm, checksum_type) = checksum::upload_checksum(
            input.checksum_algorithm.as_ref(),
            input.checksum_type.as_ref(),
        )?;
        let upload = Upload {
            id: random_id(32, HEX),
            bucket: input.bucket.clone(),
            key: input.key.clone(),
            owner: user.clone(),
            initiated_ms: now_ms(),
            headers: headers_of(
                input.content_type.as_ref(),
                input.content_encoding.as_ref(),
                input.content_disposition.as_ref(),
                input.content_language.as_ref(),
                input.cache_control.as_ref(),
                input.expires.as_ref(),
            ),
            user_meta: user_meta(input.metadata),
            parts: BTreeMap::new(),
            checksum_algorithm: checksum_algorithm.clone(),
            checksum_type: checksum_type.clone(),
        };
        let id = upload.id.clone();
        change(&self.data.client, &ObjectOp::CreateUpload { user, upload }).await?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(id),
            checksum_algorithm: checksum_algorithm.map(ChecksumAlgorithm::from),
            checksum_type: checksum_type.map(ChecksumType::from),
            ..Default::default()
        }))
    }

    pub(crate) async fn put_upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let user = self.user(&req).await?;
        let input = req.input;
        let number = part_number(input.part_number)?;
        let upload = self
            .upload_of(&user, &input.upload_id, &input.bucket, &input.key)
            .await?;
        // Every part gets the upload's checksum, whether or not the client sent one.
        let algorithm = input.checksum_algorithm.clone().or_else(|| {
            upload
                .checksum_algorithm
                .clone()
                .map(ChecksumAlgorithm::from)
        });
        let sums = declared(
            input.checksum_crc32.clone(),
            input.checksum_crc32c.clone(),
            input.checksum_sha1.clone(),
            input.checksum_sha256.clone(),
            input.checksum_crc64nvme.clone(),
        );
        let name = format!("{}-{number}-{}", input.upload_id, random_id(8, HEX));
        let stored = self
            .store_checked(
                &input.bucket,
                &input.key,
                &name,
                input.body,
                algorithm.as_ref(),
                sums,
                input.content_md5.as_deref(),
                req.trailing_headers,
                true,
            )
            .await?;
        let c = stored.checksums.clone();
        let part = Part {
            number,
            size: stored.size,
            etag: stored.md5_hex.clone(),
            mtime_ms: now_ms(),
            extent: own_extent(stored.extents)?,
            checksums: checksum_map(&stored.checksums),
        };
        self.put_part(&user, &upload, part).await?;
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(etag(&stored.md5_hex)),
            checksum_crc32: c.checksum_crc32,
            checksum_crc32c: c.checksum_crc32c,
            checksum_sha1: c.checksum_sha1,
            checksum_sha256: c.checksum_sha256,
            checksum_crc64nvme: c.checksum_crc64nvme,
            ..Default::default()
        }))
    }

    pub(crate) async fn copy_upload_part(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let user = self.user(&req).await?;
        let input = req.input;
        let number = part_number(input.part_number)?;
        let upload = self
            .upload_of(&user, &input.upload_id, &input.bucket, &input.key)
            .await?;
        let algorithm = upload
            .checksum_algorithm
            .clone()
            .map(ChecksumAlgorithm::from);
        let hasher = checksum::hasher_for(algorithm.as_ref(), &Checksum::default())?;
        let (_, _, src) = self
            .copy_source(
                &user,
                &input.copy_source,
                input.copy_source_if_match.as_ref(),
                input.copy_source_if_none_match.as_ref(),
                input.copy_source_if_modified_since.as_ref(),
                input.copy_source_if_unmodified_since.as_ref(),
            )
            .await?;
        let range = match &input.copy_source_range {
            None => 0..src.size,
            Some(r) => {
                let r = r
                    .strip_prefix("bytes=")
                    .and_then(|r| r.split_once('-'))
                    .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
                    .ok_or_else(|| {
                        s3_error!(
                            InvalidArgument,
                            "x-amz-copy-source-range must be bytes=first-last"
                        )
                    })?;
                if r.0 > r.1 || r.1 >= src.size {
                    return Err(s3_error!(InvalidRange));
                }
                r.0..r.1 + 1
            }
        };
        let name = format!("{}-{number}-{}", input.upload_id, random_id(8, HEX));
        let body = self.data.read(&src.extents, range);
        let stored = self
            .data
            .store(&input.bucket, &input.key, &name, body, hasher, true)
            .await?;
        let part = Part {
            number,
            size: stored.size,
            etag: stored.md5_hex.clone(),
            mtime_ms: now_ms(),
            extent: own_extent(stored.extents)?,
            checksums: checksum_map(&stored.checksums),
        };
        let sums = Sums::of(&part.checksums);
        let mtime = part.mtime_ms;
        self.put_part(&user, &upload, part).await?;
        Ok(S3Response::new(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(etag(&stored.md5_hex)),
                last_modified: Some(timestamp(mtime)),
                checksum_crc32: sums.crc32,
                checksum_crc32c: sums.crc32c,
                checksum_sha1: sums.sha1,
                checksum_sha256: sums.sha256,
                checksum_crc64nvme: sums.crc64nvme,
            }),
            ..Default::default()
        }))
    }

    pub(crate) async fn complete_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let user = self.user(&req).await?;
        let input = req.input;
        let condition = put_condition(input.if_match.as_ref(), input.if_none_match.as_ref())?;
        let upload = match self
            .upload_of(&user, &input.upload_id, &input.bucket, &input.key)
            .await
        {
            Ok(u) => u,
            // Completed already (a client's retry, or a second completion): the object made
            // from it is the answer, as on AWS.
            Err(e) if *e.code() == S3ErrorCode::NoSuchUpload => {
                match self.head(&user, &input.bucket, &input.key).await {
                    Ok(o) if o.put_id == input.upload_id => {
                        return Ok(S3Response::new(completed(input.bucket, input.key, &o)));
                    }
                    _ => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        let listed = input
            .multipart_upload
            .and_then(|m| m.parts)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| s3_error!(MalformedXML, "the completion lists no parts"))?;
        let mut parts = Vec::with_capacity(listed.len());
        let mut md5s = Md5::new();
        for p in &listed {
            let n = part_number(
                p.part_number
                    .ok_or_else(|| s3_error!(MalformedXML, "a part without a number"))?,
            )?;
            let e = p
                .e_tag
                .as_ref()
                .ok_or_else(|| s3_error!(MalformedXML, "a part without an ETag"))?;
            let raw = e.value().trim_matches('"').to_owned();
            let bytes = (raw.len() == 32)
                .then(|| {
                    (0..16)
                        .map(|i| u8::from_str_radix(&raw[2 * i..2 * i + 2], 16).ok())
                        .collect::<Option<Vec<u8>>>()
                })
                .flatten()
                .ok_or_else(|| {
                    S3Error::with_message(
                        S3ErrorCode::InvalidPart,
                        format!("part {n}: malformed ETag"),
                    )
                })?;
            md5s.update(&bytes);
            parts.push((n, raw));
        }
        let etag_value = format!("{}-{}", hex(md5s.finalize().as_ref()), parts.len());
        let mut meta = ObjectMeta {
            etag: etag_value,
            mtime_ms: now_ms(),
            // A retried completion is recognised by the upload's id.
            put_id: input.upload_id.clone(),
            ..Default::default()
        };
        if let (Some(alg), Some(kind)) = (&upload.checksum_algorithm, &upload.checksum_type) {
            let declared = Sums {
                crc32: input.checksum_crc32.clone(),
                crc32c: input.checksum_crc32c.clone(),
                sha1: input.checksum_sha1.clone(),
                sha256: input.checksum_sha256.clone(),
                crc64nvme: input.checksum_crc64nvme.clone(),
            };
            let (object, part_sums) = completion_checksum(
                self,
                &user,
                &upload,
                alg,
                kind,
                &listed,
                &declared,
                input.checksum_type.as_ref(),
            )
            .await?;
            meta.checksums = BTreeMap::from([(alg.clone(), object)]);
            meta.checksum_type = Some(kind.clone());
            meta.part_checksums = part_sums;
        }
        meta.headers = upload.headers;
        meta.user_meta = upload.user_meta;
        let op = ObjectOp::CompleteUpload {
            user,
            upload_id: input.upload_id,
            bucket: input.bucket.clone(),
            key: input.key.clone(),
            parts,
            meta: meta.clone(),
            condition,
        };
        let o = match change(&self.data.client, &op).await? {
            OpReply::Object(o) => o,
            OpReply::Done | OpReply::Volume(_) => meta,
        };
        Ok(S3Response::new(completed(input.bucket, input.key, &o)))
    }

    pub(crate) async fn abort_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let user = self.user(&req).await?;
        let input = req.input;
        self.upload_of(&user, &input.upload_id, &input.bucket, &input.key)
            .await?;
        let op = ObjectOp::AbortUpload {
            user,
            upload_id: input.upload_id,
            bucket: input.bucket,
            key: input.key,
        };
        change(&self.data.client, &op).await?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    pub(crate) async fn uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let user = self.user(&req).await?;
        let input = req.input;
        let enc = encoder(input.encoding_type.as_ref())?;
        let encoding_type = input.encoding_type.clone();
        let max = max_keys(input.max_uploads)?.max(1);
        let after = match (&input.key_marker, &input.upload_id_marker) {
            (Some(k), Some(u)) => format!("{k}\0{u}"),
            // After every upload of the key.
            (Some(k), None) => format!("{k}\u{1}"),
            _ => String::new(),
        };
        let prefix = input.prefix.clone().unwrap_or_default();
        let page = self
            .list(ObjectQuery::ListUploads {
                user,
                bucket: input.bucket.clone(),
                list: ListRequest {
                    prefix: prefix.clone(),
                    delimiter: None,
                    after,
                    max,
                },
            })
            .await?;
        let last = page.entries.last().cloned();
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(input.bucket),
            prefix: Some(enc(prefix)),
            key_marker: input.key_marker,
            upload_id_marker: input.upload_id_marker,
            max_uploads: Some(max as i32),
            is_truncated: Some(page.truncated),
            next_key_marker: page
                .truncated
                .then(|| last.as_ref().map(|l| enc(l.key.clone())))
                .flatten(),
            next_upload_id_marker: page
                .truncated
                .then(|| last.as_ref().map(|l| l.upload_id.clone()))
                .flatten(),
            encoding_type,
            uploads: Some(
                page.entries
                    .into_iter()
                    .map(|e| MultipartUpload {
                        key: Some(enc(e.key)),
                        upload_id: Some(e.upload_id),
                        initiated: Some(timestamp(e.mtime_ms)),
                        owner: Some(owner(&e.owner)),
                        initiator: Some(Initiator {
                            display_name: Some(e.owner.clone()),
                            id: Some(e.owner),
                        }),
                        storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }

    pub(crate) async fn parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let user = self.user(&req).await?;
        let input = req.input;
        let after = match input.part_number_marker {
            None => 0,
            Some(m) => u32::try_from(m)
                .map_err(|_| s3_error!(InvalidArgument, "part-number-marker is not negative"))?,
        };
        let max = input.max_parts.unwrap_or(1000).clamp(1, 1000) as u32;
        let q = ObjectQuery::ListParts {
            user,
            upload_id: input.upload_id.clone(),
            after,
            max,
            bucket: input.bucket.clone(),
            key: input.key.clone(),
        };
        let QueryReply::Parts {
            upload,
            parts,
            truncated,
        } = query(&self.data.client, &q).await?
        else {
            return Err(internal("ListParts answered with something else"));
        };
        if upload.bucket != input.bucket || upload.key != input.key {
            return Err(s3_error!(NoSuchUpload));
        }
        let next = parts.last().map(|p| p.number as i32);
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            max_parts: Some(max as i32),
            is_truncated: Some(truncated),
            part_number_marker: input.part_number_marker,
            next_part_number_marker: truncated.then_some(next).flatten(),
            owner: Some(owner(&upload.owner)),
            initiator: Some(Initiator {
                display_name: Some(upload.owner.clone()),
                id: Some(upload.owner),
            }),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            parts: Some(
                parts
                    .into_iter()
                    .map(|p| s3s::dto::Part {
                        part_number: Some(p.number as i32),
                        size: Some(p.size as i64),
                        e_tag: Some(etag(&p.etag)),
                        last_modified: Some(timestamp(p.mtime_ms)),
                        checksum_crc32: p.checksums.get("CRC32").cloned(),
                        checksum_crc32c: p.checksums.get("CRC32C").cloned(),
                        checksum_sha1: p.checksums.get("SHA1").cloned(),
                        checksum_sha256: p.checksums.get("SHA256").cloned(),
                        checksum_crc64nvme: p.checksums.get("CRC64NVME").cloned(),
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }
}

/// What a completed upload answers (the first completion and any repeated one alike).
fn completed(bucket: String, key: String, o: &ObjectMeta) -> CompleteMultipartUploadOutput {
    let sums = Sums::of(&o.checksums);
    CompleteMultipartUploadOutput {
        location: Some(format!("/{bucket}/{key}")),
        bucket: Some(bucket),
        key: Some(key),
        e_tag: Some(etag(&o.etag)),
        checksum_crc32: sums.crc32,
        checksum_crc32c: sums.crc32c,
        checksum_sha1: sums.sha1,
        checksum_sha256: sums.sha256,
        checksum_crc64nvme: sums.crc64nvme,
        checksum_type: o.checksum_type.clone().map(ChecksumType::from),
        ..Default::default()
    }
}

/// Every part of an upload, by number (ListParts pages through them).
async fn all_parts(gw: &Cairn, user: &str, upload: &Upload) -> S3Result<BTreeMap<u32, Part>> {
    let mut parts = BTreeMap::new();
    let mut after = 0;
    loop {
        let q = ObjectQuery::ListParts {
            user: user.to_owned(),
            upload_id: upload.id.clone(),
            after,
            max: 1000,
            bucket: upload.bucket.clone(),
            key: upload.key.clone(),
        };
        let QueryReply::Parts {
            parts: page,
            truncated,
            ..
        } = query(&gw.data.client, &q).await?
        else {
            return Err(internal("ListParts answered with something else"));
        };
        after = page.last().map_or(after, |p| p.number);
        parts.extend(page.into_iter().map(|p| (p.number, p)));
        if !truncated {
            return Ok(parts);
        }
    }
}

/// The object checksum of a completion whose upload has a checksum algorithm: every listed
/// part's checksum as the client sent it must be the part's own, and the object's checksum
/// the client declared (if any) must be the one made from them. Returns the object's checksum
/// and the parts'.
#[allow(clippy::too_many_arguments)]
async fn completion_checksum(
    gw: &Cairn,
    user: &str,
    upload: &Upload,
    algorithm: &str,
    kind: &str,
    listed: &[CompletedPart],
    declared: &Sums,
    declared_type: Option<&ChecksumType>,
) -> S3Result<(String, Vec<String>)> {
    if declared_type.is_some_and(|t| !t.as_str().eq_ignore_ascii_case(kind)) {
        return Err(s3_error!(
            InvalidRequest,
            "the upload's checksum type is {kind}"
        ));
    }
    let stored = all_parts(gw, user, upload).await?;
    let mut parts = Vec::with_capacity(listed.len());
    for p in listed {
        let n = p.part_number.unwrap_or(0) as u32;
        let sent = Sums {
            crc32: p.checksum_crc32.clone(),
            crc32c: p.checksum_crc32c.clone(),
            sha1: p.checksum_sha1.clone(),
            sha256: p.checksum_sha256.clone(),
            crc64nvme: p.checksum_crc64nvme.clone(),
        };
        let Some(part) = stored.get(&n) else {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidPart,
                format!("part {n}: missing"),
            ));
        };
        // A part's checksum may be left out of the completion (the part's own is used), but
        // one that is given must be the part's.
        let own = part.checksums.get(algorithm);
        if own.is_none() || sent.get(algorithm).is_some_and(|s| Some(s) != own) {
            return Err(S3Error::with_message(
                S3ErrorCode::BadDigest,
                format!("part {n}: its {algorithm} checksum differs from the part's"),
            ));
        }
        parts.push((own.cloned().unwrap_or_default(), part.size));
    }
    let object = checksum::combine(algorithm, kind, &parts)?;
    if let Some(d) = declared.get(algorithm)
        && *d != object
    {
        return Err(S3Error::with_message(
            S3ErrorCode::BadDigest,
            format!("the object's {algorithm} checksum is {object}, not {d}"),
        ));
    }
    Ok((object, parts.into_iter().map(|(v, _)| v).collect()))
}

/// A part's one extent (parts always get files of their own).
fn own_extent(mut extents: Vec<Extent>) -> S3Result<Extent> {
    match (extents.pop(), extents.is_empty()) {
        (Some(e), true) => Ok(e),
        _ => Err(internal("a part was stored as other than one extent")),
    }
}

/// Aborts multipart uploads older than `max_age` (every gateway runs this; an abort that
/// another gateway did first just finds the upload gone).
pub async fn clean_uploads(gw: Cairn, max_age: Duration) {
    let every = (max_age / 10).clamp(Duration::from_secs(1), Duration::from_secs(600));
    loop {
        tokio::time::sleep(every).await;
        let q = ObjectQuery::StaleUploads {
            before_ms: now_ms().saturating_sub(max_age.as_millis() as u64),
            max: 100,
        };
        let Ok(QueryReply::Uploads(stale)) = query(&gw.data.client, &q).await else {
            continue;
        };
        for u in stale {
            let op = ObjectOp::AbortUpload {
                user: u.owner.clone(),
                upload_id: u.id.clone(),
                bucket: u.bucket.clone(),
                key: u.key.clone(),
            };
            match change(&gw.data.client, &op).await {
                Ok(_) => {
                    tracing::info!(upload = %u.id, bucket = %u.bucket, key = %u.key, "aborted an abandoned upload")
                }
                Err(e) => {
                    tracing::debug!(upload = %u.id, error = %e, "abandoned upload not aborted")
                }
            }
        }
    }
}
