//! GetObjectAttributes: an object's ETag, checksum, parts, storage class and size without its
//! body.

use crate::checksum::Sums;
use crate::convert::{etag, timestamp};
use crate::ops::Cairn;
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, s3_error};

impl Cairn {
    pub(crate) async fn attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        let user = self.user_in(&req, &req.input.bucket).await?;
        let input = req.input;
        if input.version_id.as_deref().is_some_and(|v| v != "null") {
            return Err(s3_error!(
                NoSuchVersion,
                "objects have only their null version (versioning is not supported)"
            ));
        }
        let o = self.head(&user, &input.bucket, &input.key).await?;
        // The header is a comma-separated list; s3s may hand it over as one element.
        let want = |a: &str| {
            input
                .object_attributes
                .iter()
                .flat_map(|x| x.as_str().split(','))
                .any(|x| x.trim().eq_ignore_ascii_case(a))
        };
        let mut out = GetObjectAttributesOutput {
            last_modified: Some(timestamp(o.mtime_ms)),
            ..Default::default()
        };
        if want(ObjectAttributes::ETAG) {
            // Without quotes, as S3 answers it here.
            out.e_tag = Some(etag(&o.etag));
        }
        if want(ObjectAttributes::OBJECT_SIZE) {
            out.object_size = Some(o.size as i64);
        }
        if want(ObjectAttributes::STORAGE_CLASS) {
            out.storage_class = Some(StorageClass::from_static(StorageClass::STANDARD));
        }
        if want(ObjectAttributes::CHECKSUM) && !o.checksums.is_empty() {
            let sums = Sums::of(&o.checksums);
            out.checksum = Some(Checksum {
                checksum_crc32: sums.crc32,
                checksum_crc32c: sums.crc32c,
                checksum_sha1: sums.sha1,
                checksum_sha256: sums.sha256,
                checksum_crc64nvme: sums.crc64nvme,
                checksum_type: Some(ChecksumType::from(
                    o.checksum_type
                        .clone()
                        .unwrap_or_else(|| ChecksumType::FULL_OBJECT.to_owned()),
                )),
            });
        }
        if want(ObjectAttributes::OBJECT_PARTS) && !o.part_sizes.is_empty() {
            let after = input.part_number_marker.unwrap_or(0).max(0) as usize;
            let max = input.max_parts.unwrap_or(1000).clamp(1, 1000) as usize;
            let alg = o.checksums.keys().next().cloned();
            let parts: Vec<ObjectPart> = o
                .part_sizes
                .iter()
                .enumerate()
                .skip(after)
                .take(max)
                .map(|(i, size)| {
                    let sums = match (&alg, o.part_checksums.get(i)) {
                        (Some(a), Some(v)) => Sums::one(a, v.clone()),
                        _ => Sums::default(),
                    };
                    ObjectPart {
                        part_number: Some(i as i32 + 1),
                        size: Some(*size as i64),
                        checksum_crc32: sums.crc32,
                        checksum_crc32c: sums.crc32c,
                        checksum_sha1: sums.sha1,
                        checksum_sha256: sums.sha256,
                        checksum_crc64nvme: sums.crc64nvme,
                    }
                })
                .collect();
            let last = after + parts.len();
            let truncated = last < o.part_sizes.len();
            out.object_parts = Some(GetObjectAttributesParts {
                total_parts_count: Some(o.part_sizes.len() as i32),
                part_number_marker: input.part_number_marker,
                next_part_number_marker: truncated.then_some(last as i32),
                max_parts: Some(max as i32),
                is_truncated: Some(truncated),
                parts: Some(parts),
            });
        }
        Ok(S3Response::new(out))
    }
}
