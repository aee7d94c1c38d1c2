//! Listing a bucket's objects (ListObjectsV2 and ListObjects) and what every listing shares:
//! entries, common prefixes, `encoding-type=url`, `max-keys`.

use crate::convert::{etag, owner, timestamp};
use crate::data::{self, internal};
use crate::ops::Cairn;
use crate::query;
use cairn_rpc::object::{ListEntry, ListPage, ListRequest, MAX_LIST_KEYS, ObjectQuery, QueryReply};
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, s3_error};

/// A listing's objects, their keys encoded as the request asked.
fn list_objects(
    entries: Vec<ListEntry>,
    enc: impl Fn(String) -> String,
    fetch_owner: bool,
) -> Vec<Object> {
    entries
        .into_iter()
        .map(|e| Object {
            size: Some(e.size as i64),
            e_tag: Some(etag(&e.etag)),
            last_modified: Some(timestamp(e.mtime_ms)),
            storage_class: Some(ObjectStorageClass::from_static(
                ObjectStorageClass::STANDARD,
            )),
            owner: fetch_owner.then(|| owner(&e.owner)),
            key: Some(enc(e.key)),
            ..Default::default()
        })
        .collect()
}

/// A listing's common prefixes, encoded as the request asked.
pub(crate) fn common_prefixes(
    prefixes: Vec<String>,
    enc: impl Fn(String) -> String,
) -> Vec<CommonPrefix> {
    prefixes
        .into_iter()
        .map(|p| CommonPrefix {
            prefix: Some(enc(p)),
        })
        .collect()
}

/// `encoding-type=url`: keys and prefixes in the answer are percent-encoded.
pub(crate) fn encoder(encoding: Option<&EncodingType>) -> S3Result<impl Fn(String) -> String> {
    let url = match encoding.map(EncodingType::as_str) {
        None => false,
        Some(EncodingType::URL) => true,
        Some(other) => return Err(s3_error!(InvalidArgument, "unknown encoding type {other}")),
    };
    // What S3 leaves alone: unreserved characters and '/'.
    const SET: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~')
        .remove(b'/');
    Ok(move |s: String| match url {
        true => percent_encoding::utf8_percent_encode(&s, SET).to_string(),
        false => s,
    })
}

pub(crate) fn max_keys(m: Option<i32>) -> S3Result<u32> {
    match m {
        None => Ok(MAX_LIST_KEYS as u32),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(n) => Ok((n as u32).min(MAX_LIST_KEYS as u32)),
    }
}

impl Cairn {
    /// A page of a listing (objects, versions, uploads) from the index.
    pub(crate) async fn list(&self, q: ObjectQuery) -> S3Result<ListPage> {
        match query(&self.data.client, &q).await? {
            QueryReply::List(p) => Ok(p),
            _ => Err(internal("a listing answered with something else")),
        }
    }

    /// ListObjectsV2.
    pub(crate) async fn list_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let user = self.user(&req).await?;
        let input = req.input;
        let enc = encoder(input.encoding_type.as_ref())?;
        let encoding_type = input.encoding_type.clone();
        let max = max_keys(input.max_keys)?;
        let after = match &input.continuation_token {
            Some(t) => {
                let raw = data::base64_decode(t)
                    .ok_or_else(|| s3_error!(InvalidArgument, "bad continuation token"))?;
                String::from_utf8(raw)
                    .map_err(|_| s3_error!(InvalidArgument, "bad continuation token"))?
            }
            None => input.start_after.clone().unwrap_or_default(),
        };
        let prefix = input.prefix.clone().unwrap_or_default();
        let page = if max == 0 {
            ListPage::default()
        } else {
            self.list(ObjectQuery::ListObjects {
                user,
                bucket: input.bucket.clone(),
                list: ListRequest {
                    prefix: prefix.clone(),
                    delimiter: input.delimiter.clone().filter(|d| !d.is_empty()),
                    after,
                    max,
                },
            })
            .await?
        };
        let fetch_owner = input.fetch_owner.unwrap_or(false);
        let key_count = (page.entries.len() + page.prefixes.len()) as i32;
        let next = page
            .truncated
            .then(|| {
                page.last
                    .clone()
                    .map(|l| base64_simd::STANDARD.encode_to_string(l.as_bytes()))
            })
            .flatten();
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: Some(enc(prefix)),
            delimiter: input.delimiter.filter(|d| !d.is_empty()).map(&enc),
            max_keys: Some(max as i32),
            key_count: Some(key_count),
            is_truncated: Some(page.truncated),
            continuation_token: input.continuation_token,
            next_continuation_token: next,
            start_after: input.start_after.map(&enc),
            encoding_type,
            contents: Some(list_objects(page.entries, &enc, fetch_owner)),
            common_prefixes: Some(common_prefixes(page.prefixes, &enc)),
            ..Default::default()
        }))
    }

    /// ListObjects (version 1: markers instead of continuation tokens).
    pub(crate) async fn list_v1(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let user = self.user(&req).await?;
        let input = req.input;
        let enc = encoder(input.encoding_type.as_ref())?;
        let encoding_type = input.encoding_type.clone();
        let max = max_keys(input.max_keys)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let page = if max == 0 {
            ListPage::default()
        } else {
            self.list(ObjectQuery::ListObjects {
                user,
                bucket: input.bucket.clone(),
                list: ListRequest {
                    prefix: prefix.clone(),
                    delimiter: input.delimiter.clone().filter(|d| !d.is_empty()),
                    after: input.marker.clone().unwrap_or_default(),
                    max,
                },
            })
            .await?
        };
        // NextMarker is returned only with a delimiter (S3); clients use the last key otherwise.
        let next_marker = (page.truncated
            && input.delimiter.as_ref().is_some_and(|d| !d.is_empty()))
        .then(|| page.last.clone().map(&enc))
        .flatten();
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(input.bucket),
            // ListObjects (v1) answers its Prefix as sent, even with encoding-type=url (S3;
            // SDKs decode Marker, NextMarker, Delimiter, keys and common prefixes only).
            prefix: Some(prefix),
            marker: Some(enc(input.marker.unwrap_or_default())),
            delimiter: input.delimiter.filter(|d| !d.is_empty()).map(&enc),
            max_keys: Some(max as i32),
            is_truncated: Some(page.truncated),
            next_marker,
            encoding_type,
            contents: Some(list_objects(page.entries, &enc, true)),
            common_prefixes: Some(common_prefixes(page.prefixes, &enc)),
            ..Default::default()
        }))
    }
}
