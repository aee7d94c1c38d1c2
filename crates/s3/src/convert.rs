//! Between S3's types and the object index's: errors, times, ETags, keys, the headers an
//! object keeps, conditions and preconditions, parts and the checksums an answer carries.

use crate::checksum::Sums;
use cairn_rpc::object::{MAX_KEY_BYTES, MAX_PARTS, ObjectError, ObjectMeta, PutCondition};
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Result, s3_error};
use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

pub fn s3_err(e: ObjectError) -> S3Error {
    use S3ErrorCode as C;
    let code = match &e {
        ObjectError::NoSuchBucket => C::NoSuchBucket,
        ObjectError::BucketAlreadyOwnedByYou => C::BucketAlreadyOwnedByYou,
        ObjectError::BucketAlreadyExists => C::BucketAlreadyExists,
        ObjectError::BucketNotEmpty => C::BucketNotEmpty,
        ObjectError::NoSuchKey => C::NoSuchKey,
        ObjectError::NoSuchUpload => C::NoSuchUpload,
        ObjectError::InvalidPart(_) => C::InvalidPart,
        ObjectError::InvalidPartOrder => C::InvalidPartOrder,
        ObjectError::EntityTooSmall(_) => C::EntityTooSmall,
        ObjectError::AccessDenied => C::AccessDenied,
        ObjectError::UserExists => C::InvalidArgument,
        ObjectError::InvalidArgument(_) => C::InvalidArgument,
        ObjectError::PreconditionFailed => C::PreconditionFailed,
        // The gateway wrote the data for a layout that changed: a client's retry is routed
        // anew.
        ObjectError::Moved(_) => C::ServiceUnavailable,
        // The data went to a pack compaction retired; the client's retry goes to a new one.
        ObjectError::PackRetired(_) => C::ServiceUnavailable,
        // Volumes are not S3's; a gateway never asks about them.
        ObjectError::NoSuchVolume
        | ObjectError::VolumeExists
        | ObjectError::NoSuchSnapshot
        | ObjectError::SnapshotExists
        | ObjectError::InUse(_) => C::InternalError,
    };
    S3Error::with_message(code, e.to_string())
}

pub(crate) fn timestamp(ms: u64) -> Timestamp {
    Timestamp::from(UNIX_EPOCH + Duration::from_millis(ms))
}

pub(crate) fn ms_of(t: &Timestamp) -> u64 {
    let odt: time::OffsetDateTime = t.clone().into();
    (odt.unix_timestamp_nanos() / 1_000_000).max(0) as u64
}

pub(crate) fn etag(e: &str) -> ETag {
    ETag::Strong(e.to_owned())
}

pub(crate) fn check_key(key: &str) -> S3Result<()> {
    if key.is_empty() {
        return Err(s3_error!(InvalidArgument, "the key is empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(s3_error!(KeyTooLongError, "keys are at most 1024 bytes"));
    }
    Ok(())
}

/// The system headers an object keeps, from a PUT's (or copy's, or upload's) input.
pub(crate) fn headers_of(
    content_type: Option<&String>,
    content_encoding: Option<&String>,
    content_disposition: Option<&String>,
    content_language: Option<&String>,
    cache_control: Option<&String>,
    expires: Option<&Timestamp>,
) -> BTreeMap<String, String> {
    let mut h = BTreeMap::new();
    for (name, v) in [
        ("content-type", content_type),
        ("content-encoding", content_encoding),
        ("content-disposition", content_disposition),
        ("content-language", content_language),
        ("cache-control", cache_control),
    ] {
        let Some(v) = v else { continue };
        let v = if name == "content-encoding" {
            // aws-chunked is how the body travelled, not how the object is encoded (S3).
            let kept: Vec<&str> = v
                .split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty() && !e.eq_ignore_ascii_case("aws-chunked"))
                .collect();
            if kept.is_empty() {
                continue;
            }
            kept.join(", ")
        } else {
            v.clone()
        };
        h.insert(name.to_owned(), v);
    }
    if let Some(t) = expires {
        h.insert("expires".to_owned(), ms_of(t).to_string());
    }
    h
}

pub(crate) fn user_meta(m: Option<Metadata>) -> BTreeMap<String, String> {
    m.map(|m| m.into_iter().collect()).unwrap_or_default()
}

/// A conditional write's condition (PUT or CompleteMultipartUpload with If-Match or
/// If-None-Match), checked by the masters where the write is ordered.
pub(crate) fn put_condition(
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
) -> S3Result<Option<PutCondition>> {
    let value = |c: &ETagCondition| match c {
        ETagCondition::Any => "*".to_owned(),
        ETagCondition::ETag(e) => e.value().to_owned(),
    };
    match (if_match, if_none_match) {
        (Some(_), Some(_)) => Err(s3_error!(
            NotImplemented,
            "If-Match and If-None-Match cannot both be given to a write"
        )),
        (Some(c), None) => Ok(Some(PutCondition::IfMatch(value(c)))),
        (None, Some(c)) => Ok(Some(PutCondition::IfNoneMatch(value(c)))),
        (None, None) => Ok(None),
    }
}

/// Evaluates If-Match / If-None-Match / If-Modified-Since / If-Unmodified-Since (RFC 7232
/// order: a failed If-Match is 412 before anything else; If-None-Match wins over
/// If-Modified-Since).
pub(crate) fn preconditions(
    o: &ObjectMeta,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
    if_modified_since: Option<&Timestamp>,
    if_unmodified_since: Option<&Timestamp>,
) -> S3Result<()> {
    let matches = |c: &ETagCondition| match c {
        ETagCondition::Any => true,
        ETagCondition::ETag(e) => e.value() == o.etag,
    };
    let secs = o.mtime_ms / 1000;
    if let Some(c) = if_match {
        if !matches(c) {
            return Err(s3_error!(PreconditionFailed));
        }
    } else if let Some(t) = if_unmodified_since
        && secs > ms_of(t) / 1000
    {
        return Err(s3_error!(PreconditionFailed));
    }
    let not_modified = || {
        // A 304 names the version the client has (RFC 7232 §4.1).
        let mut e = S3Error::with_message(S3ErrorCode::NotModified, "Not Modified");
        let mut h = http::HeaderMap::new();
        if let Ok(v) = http::HeaderValue::from_str(&format!("\"{}\"", o.etag)) {
            h.insert(http::header::ETAG, v);
        }
        let lm = time::OffsetDateTime::from_unix_timestamp((o.mtime_ms / 1000) as i64)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc2822)
                    .ok()
            });
        if let Some(v) = lm.and_then(|v| http::HeaderValue::from_str(&v).ok()) {
            h.insert(http::header::LAST_MODIFIED, v);
        }
        e.set_headers(h);
        e
    };
    if let Some(c) = if_none_match {
        if matches(c) {
            return Err(not_modified());
        }
    } else if let Some(t) = if_modified_since
        && secs <= ms_of(t) / 1000
    {
        return Err(not_modified());
    }
    Ok(())
}

pub(crate) fn owner(name: &str) -> Owner {
    Owner {
        display_name: Some(name.to_owned()),
        id: Some(name.to_owned()),
    }
}

/// Deletes with conditions are refused rather than done unconditionally.
pub(crate) fn conditional_delete() -> S3Error {
    s3_error!(
        NotImplemented,
        "conditional deletes (If-Match, If-Match-Last-Modified-Time, If-Match-Size) are not supported"
    )
}

/// The bytes of part `n` (1-based) of an object, and its index. A single-part object is its
/// own part 1. A part past the last is InvalidPart (400), as ceph/s3-tests holds S3 to.
pub(crate) fn part_range(o: &ObjectMeta, n: i32) -> S3Result<(std::ops::Range<u64>, usize)> {
    let n = part_number(n)? as usize;
    let count = o.part_sizes.len().max(1);
    if n > count {
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidPart,
            format!("the object has {count} parts; there is no part {n}"),
        ));
    }
    if o.part_sizes.is_empty() {
        return Ok((0..o.size, 0));
    }
    let start: u64 = o.part_sizes[..n - 1].iter().sum();
    Ok((start..start + o.part_sizes[n - 1], n - 1))
}

/// The checksums a GET or HEAD answers: none unless asked (`x-amz-checksum-mode`) or for a
/// byte range; a multipart object's part's own for `partNumber`; the object's otherwise.
pub(crate) fn answered_sums(
    o: &ObjectMeta,
    part: Option<usize>,
    whole: bool,
    wanted: bool,
) -> (Sums, Option<ChecksumType>) {
    if !wanted || o.checksums.is_empty() {
        return (Sums::default(), None);
    }
    let kind = o
        .checksum_type
        .clone()
        .unwrap_or_else(|| ChecksumType::FULL_OBJECT.to_owned());
    match part {
        Some(i) if !o.part_sizes.is_empty() => {
            match (o.checksums.keys().next(), o.part_checksums.get(i)) {
                (Some(alg), Some(v)) => (Sums::one(alg, v.clone()), Some(ChecksumType::from(kind))),
                _ => (Sums::default(), None),
            }
        }
        _ if whole => (Sums::of(&o.checksums), Some(ChecksumType::from(kind))),
        _ => (Sums::default(), None),
    }
}

pub(crate) fn part_number(n: i32) -> S3Result<u32> {
    if n < 1 || n as u32 > MAX_PARTS {
        return Err(s3_error!(InvalidArgument, "part numbers are 1 to 10000"));
    }
    Ok(n as u32)
}
