//! The HTTP front of the gateway: what happens to a request before s3s parses it and to a
//! response after s3s wrote it.
//!
//! - Every response carries a request id (`x-amz-request-id`, and `x-amz-id-2` as S3 sends
//!   both); an error's XML body names the same id in `<RequestId>`, so a client's log and the
//!   gateway's log meet.
//! - `OPTIONS` (a CORS preflight) is answered here: Cairn has no CORS configuration, so a
//!   preflight without `Origin` is 400 and one with it 403, as S3 answers for a bucket
//!   without CORS.
//! - A presigned URL's `X-Amz-Expires` must be 0 to 604 800 seconds (a week, S3's limit);
//!   outside that the URL is refused with 403 before anything else.
//! - A body sent with `Transfer-Encoding: chunked` and no `Content-Length` (nor aws-chunked's
//!   decoded length) is read into memory, up to [`UNSIZED_BODY_MAX`], so that s3s can check
//!   its signature's payload hash; the gateway holds at most [`UNSIZED_BODY_BUDGET`] of such
//!   bodies at once. A longer one is refused with 411 MissingContentLength.

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};
use s3s::Body;
use s3s::service::S3Service;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The longest body accepted without a declared length.
pub const UNSIZED_BODY_MAX: usize = 64 << 20;
/// The most memory held by bodies without a declared length, over all requests.
pub const UNSIZED_BODY_BUDGET: usize = 256 << 20;
/// S3's longest presigned-URL lifetime: seven days.
pub const MAX_EXPIRES_SECS: i64 = 7 * 24 * 3600;
/// Error bodies longer than this are passed on as they are (s3s's are a few hundred bytes).
const ERROR_BODY_MAX: usize = 64 << 10;

#[derive(Clone)]
pub struct Front {
    s3: S3Service,
    /// Bytes of [`UNSIZED_BODY_BUDGET`], one permit per byte (a permit per MiB would round).
    unsized_bytes: Arc<Semaphore>,
}

type Response = http::Response<Body>;

impl Front {
    pub fn new(s3: S3Service) -> Self {
        Self {
            s3,
            unsized_bytes: Arc::new(Semaphore::new(UNSIZED_BODY_BUDGET)),
        }
    }

    /// Serves one request.
    ///
    /// # Errors
    /// Only what s3s itself cannot answer (hyper then drops the connection).
    pub async fn serve(
        self,
        req: http::Request<hyper::body::Incoming>,
    ) -> Result<Response, s3s::HttpError> {
        let id = request_id();
        let req = req.map(Body::from);
        let resp = match self.before(req).await {
            // The permit (if any) is held until s3s has consumed the buffered body.
            Ok((req, _permit)) => self.s3.call(req).await?,
            Err(resp) => resp,
        };
        Ok(after(resp, &id).await)
    }

    /// What is answered here, or the request as s3s should see it.
    async fn before(
        &self,
        mut req: http::Request<Body>,
    ) -> Result<(http::Request<Body>, Option<OwnedSemaphorePermit>), Response> {
        if req.method() == Method::OPTIONS {
            return Err(if req.headers().contains_key(header::ORIGIN) {
                error(
                    StatusCode::FORBIDDEN,
                    "AccessForbidden",
                    "CORSResponse: CORS is not enabled for this bucket.",
                )
            } else {
                error(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "Insufficient information. Origin request header needed.",
                )
            });
        }
        if let Some(q) = req.uri().query()
            && let Some(v) = query_value(q, "X-Amz-Expires")
            && !v
                .parse::<i64>()
                .is_ok_and(|s| (0..=MAX_EXPIRES_SECS).contains(&s))
        {
            return Err(error(
                StatusCode::FORBIDDEN,
                "AccessDenied",
                &format!(
                    "X-Amz-Expires is {v}: a presigned URL lives 0 to {MAX_EXPIRES_SECS} seconds"
                ),
            ));
        }
        if !unsized_body(&req) {
            return Ok((req, None));
        }
        let Ok(permit) = self
            .unsized_bytes
            .clone()
            .acquire_many_owned(UNSIZED_BODY_MAX as u32)
            .await
        else {
            return Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "the gateway is stopping",
            ));
        };
        // Read one byte past the limit, to tell "at the limit" from "over it".
        match req.body_mut().store_all_limited(UNSIZED_BODY_MAX + 1).await {
            Ok(b) if b.len() <= UNSIZED_BODY_MAX => {
                req.headers_mut()
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(b.len()));
                req.headers_mut().remove(header::TRANSFER_ENCODING);
                Ok((req, Some(permit)))
            }
            Ok(_) | Err(_) => Err(error(
                StatusCode::LENGTH_REQUIRED,
                "MissingContentLength",
                &format!(
                    "a body without Content-Length is accepted up to {UNSIZED_BODY_MAX} \
                             bytes; send Content-Length, or aws-chunked encoding"
                ),
            )),
        }
    }
}

/// A body whose length nothing declares: chunked, without Content-Length or aws-chunked's
/// `x-amz-decoded-content-length` (s3s streams that one itself).
fn unsized_body(req: &http::Request<Body>) -> bool {
    let h = req.headers();
    let chunked = h.get_all(header::TRANSFER_ENCODING).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.to_ascii_lowercase().contains("chunked"))
    });
    chunked
        && !h.contains_key(header::CONTENT_LENGTH)
        && !h.contains_key("x-amz-decoded-content-length")
}

/// The value of `name` in a query string (undecoded; the names this looks for are plain).
fn query_value<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name).then_some(v)
    })
}

/// 16 upper-case hex digits, as S3's request ids.
fn request_id() -> String {
    crate::random_id(16, b"0123456789ABCDEF")
}

/// An S3 error answered by the front itself.
fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{}</Message></Error>",
        xml_escape(message)
    );
    let mut resp = http::Response::new(Body::from(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    resp
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Puts the request id on the response, and into an error's XML.
async fn after(mut resp: Response, id: &str) -> Response {
    let value = HeaderValue::from_str(id).expect("hex is a valid header value");
    resp.headers_mut().insert("x-amz-request-id", value.clone());
    resp.headers_mut().insert("x-amz-id-2", value);
    let is_error = resp.status().is_client_error() || resp.status().is_server_error();
    let is_xml = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("xml"));
    if !is_error || !is_xml {
        return resp;
    }
    let Ok(body) = resp.body_mut().store_all_limited(ERROR_BODY_MAX).await else {
        return resp;
    };
    let Some(with_id) = with_request_id(&body, id) else {
        return resp;
    };
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(with_id.len()));
    *resp.body_mut() = Body::from(with_id);
    resp
}

/// An `<Error>` document with `<RequestId>` added, if it has none.
fn with_request_id(body: &[u8], id: &str) -> Option<Bytes> {
    let text = std::str::from_utf8(body).ok()?;
    if text.contains("<RequestId>") {
        return None;
    }
    let at = text.rfind("</Error>")?;
    Some(Bytes::from(format!(
        "{}<RequestId>{id}</RequestId>{}",
        &text[..at],
        &text[at..]
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_gains_its_request_id_once() {
        let body = b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code></Error>";
        let out = with_request_id(body, "ABC").unwrap();
        assert_eq!(
            &out[..],
            b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><RequestId>ABC</RequestId></Error>"
        );
        assert!(with_request_id(&out, "ABC").is_none());
        assert!(with_request_id(b"<ListBucketResult/>", "ABC").is_none());
    }

    #[test]
    fn query_values_are_found_by_exact_name() {
        let q = "X-Amz-Algorithm=AWS4&X-Amz-Expires=-7&X-Amz-ExpiresX=1";
        assert_eq!(query_value(q, "X-Amz-Expires"), Some("-7"));
        assert_eq!(query_value(q, "Expires"), None);
        assert_eq!(query_value("a&b=1", "a"), Some(""));
    }
}
