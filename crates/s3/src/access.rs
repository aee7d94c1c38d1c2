//! The gateway's access log (docs/security.md "Audit"): one JSON line per request — time,
//! client address, access key and user, method, bucket, key, status, S3 error code, bytes in
//! and out, milliseconds, request id — through [`cairn_rpc::audit::Audit`] (a file per day,
//! the newest kept, never waited on).

use http::{HeaderMap, Method, StatusCode};
use percent_encoding::percent_decode_str;
use std::net::SocketAddr;

/// What the log says of one request, gathered before s3s sees it.
pub(crate) struct Seen {
    pub addr: Option<SocketAddr>,
    pub method: Method,
    pub bucket: Option<String>,
    pub key: Option<String>,
    pub access_key: Option<String>,
    pub began: std::time::Instant,
}

impl Seen {
    pub fn of<B>(req: &http::Request<B>, addr: Option<SocketAddr>) -> Self {
        let (bucket, key) = bucket_key(req.uri().path());
        Self {
            addr,
            method: req.method().clone(),
            bucket,
            key,
            access_key: access_key(req.headers(), req.uri().query()),
            began: std::time::Instant::now(),
        }
    }

    /// The log line for the answer.
    pub fn record(
        &self,
        user: Option<String>,
        status: StatusCode,
        code: Option<String>,
        bytes_in: u64,
        headers: &HeaderMap,
        request_id: &str,
    ) -> serde_json::Value {
        serde_json::json!({
            "service": "s3",
            "addr": self.addr.map(|a| a.to_string()),
            "access_key": self.access_key,
            "user": user,
            "method": self.method.as_str(),
            "bucket": self.bucket,
            "key": self.key,
            "status": status.as_u16(),
            "error": code,
            "bytes_in": bytes_in,
            "bytes_out": headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0),
            "ms": self.began.elapsed().as_millis() as u64,
            "request_id": request_id,
        })
    }
}

/// Bucket and key of a path-style request path, decoded.
fn bucket_key(path: &str) -> (Option<String>, Option<String>) {
    let path = path.strip_prefix('/').unwrap_or(path);
    let (b, k) = path.split_once('/').unwrap_or((path, ""));
    let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
    (
        (!b.is_empty()).then(|| decode(b)),
        (!k.is_empty()).then(|| decode(k)),
    )
}

/// The access key a request is signed with (SigV4 header or presigned query), unchecked.
pub(crate) fn access_key(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    let from_header = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split("Credential=").nth(1))
        .and_then(|c| c.split('/').next());
    let from_query = || {
        query?.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == "X-Amz-Credential").then_some(v)
        })
    };
    let raw = from_header.map(str::to_owned).or_else(|| {
        let v = percent_decode_str(from_query()?)
            .decode_utf8_lossy()
            .into_owned();
        v.split('/').next().map(str::to_owned)
    })?;
    Some(raw.chars().take(128).collect())
}

/// The `<Code>` of an S3 error document.
pub(crate) fn error_code(body: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(body).ok()?;
    let from = s.find("<Code>")? + "<Code>".len();
    let to = from + s[from..].find("</Code>")?;
    Some(s[from..to].chars().take(64).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_key_and_access_key_are_read_from_the_request() {
        assert_eq!(
            bucket_key("/photos/2026/a%20b.jpg"),
            (Some("photos".into()), Some("2026/a b.jpg".into()))
        );
        assert_eq!(bucket_key("/photos"), (Some("photos".into()), None));
        assert_eq!(bucket_key("/"), (None, None));
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            "AWS4-HMAC-SHA256 Credential=CKALICE/20261127/us-east-1/s3/aws4_request, \
             SignedHeaders=host, Signature=00"
                .parse()
                .unwrap(),
        );
        assert_eq!(access_key(&h, None).as_deref(), Some("CKALICE"));
        let q = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=CKBOB%2F20261127%2Fus-east-1%2Fs3%2Faws4_request";
        assert_eq!(
            access_key(&HeaderMap::new(), Some(q)).as_deref(),
            Some("CKBOB")
        );
        assert_eq!(access_key(&HeaderMap::new(), None), None);
        assert_eq!(
            error_code(b"<Error><Code>NoSuchKey</Code><Message>x</Message></Error>").as_deref(),
            Some("NoSuchKey")
        );
    }
}
