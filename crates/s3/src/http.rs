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
//! - An error s3s wrote without a message gets S3's sentence for its code.
//! - GetObjectAttributes' ETag loses the quotes s3s puts on every XML ETag (S3 sends it bare).
//! - A request body from which no byte arrives for [`BODY_IDLE`] while the gateway waits for
//!   one fails (the request ends with an error and its connection closes): a client that
//!   declared a length and stopped sending holds nothing for long. Headers are bounded by
//!   hyper's header read timeout ([`HEADER_READ_TIMEOUT`], set where connections are served).

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};
use s3s::Body;
use s3s::service::S3Service;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a request body may send nothing while the gateway waits for its bytes (the
/// default of `Options::body_idle`).
pub const BODY_IDLE: std::time::Duration = std::time::Duration::from_secs(20);
/// How long a client has to send a request's headers once it started them.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A request body that fails when no frame arrives for `idle` while it is being read. The
/// clock runs only while the gateway waits for bytes (not while it looks up the user or
/// writes what it read).
struct IdleBody {
    inner: hyper::body::Incoming,
    idle: std::time::Duration,
    timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// Bytes of body received (for the access log).
    received: Arc<std::sync::atomic::AtomicU64>,
}

impl http_body::Body for IdleBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        use std::future::Future;
        use std::task::Poll;
        let this = &mut *self;
        match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(r) => {
                this.timer = None;
                if let Some(Ok(f)) = &r
                    && let Some(d) = f.data_ref()
                {
                    this.received
                        .fetch_add(d.len() as u64, std::sync::atomic::Ordering::Relaxed);
                }
                Poll::Ready(r.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let idle = this.idle;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        metrics::counter!("cairn_s3_body_timeouts_total").increment(1);
                        Poll::Ready(Some(Err(Box::new(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("no bytes of the request body for {idle:?}"),
                        )))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The longest body accepted without a declared length.
pub const UNSIZED_BODY_MAX: usize = 64 << 20;
/// The most memory held by bodies without a declared length, over all requests.
pub const UNSIZED_BODY_BUDGET: usize = 256 << 20;
/// S3's longest presigned-URL lifetime: seven days.
pub const MAX_EXPIRES_SECS: i64 = 7 * 24 * 3600;
/// Error bodies longer than this are passed on as they are (s3s's are a few hundred bytes).
const ERROR_BODY_MAX: usize = 64 << 10;
/// A GetObjectAttributes answer lists at most 1 000 parts: well under this.
const ATTRIBUTES_BODY_MAX: usize = 4 << 20;

#[derive(Clone)]
pub struct Front {
    s3: S3Service,
    /// Bytes of [`UNSIZED_BODY_BUDGET`], one permit per byte (a permit per MiB would round).
    unsized_bytes: Arc<Semaphore>,
    body_idle: std::time::Duration,
    access_log: cairn_rpc::audit::Audit,
    /// The user of an access key, if known (for the access log).
    names: Names,
    /// Whether an access key is a user's, asked of the masters if need be.
    known: Known,
}

/// Whether an access key is a user's (the gateway's cache, else the masters).
pub type Known = Arc<
    dyn Fn(String) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>
        + Send
        + Sync,
>;

/// The connection slot a request came on (cairn_rpc::admission), in its extensions: a
/// request whose signature checks proves it (`Access`, lib.rs).
#[derive(Clone)]
pub struct ConnSlot(pub Arc<cairn_rpc::admission::Slot>);

/// The user an access key belongs to, if the gateway knows it.
pub type Names = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

type Response = http::Response<Body>;

impl Front {
    pub fn new(
        s3: S3Service,
        body_idle: std::time::Duration,
        access_log: cairn_rpc::audit::Audit,
        names: Names,
        known: Known,
    ) -> Self {
        Self {
            s3,
            unsized_bytes: Arc::new(Semaphore::new(UNSIZED_BODY_BUDGET)),
            body_idle,
            access_log,
            names,
            known,
        }
    }

    /// Serves one request.
    ///
    /// # Errors
    /// Only what s3s itself cannot answer (hyper then drops the connection).
    pub async fn serve(
        self,
        mut req: http::Request<hyper::body::Incoming>,
        peer: Option<std::net::SocketAddr>,
        slot: Option<Arc<cairn_rpc::admission::Slot>>,
    ) -> Result<Response, s3s::HttpError> {
        let id = request_id();
        if let Some(slot) = &slot {
            req.extensions_mut().insert(ConnSlot(slot.clone()));
        }
        let seen = self
            .access_log
            .is_on()
            .then(|| crate::access::Seen::of(&req, peer));
        let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let req = req.map(|inner| {
            Body::http_body_unsync(IdleBody {
                inner,
                idle: self.body_idle,
                timer: None,
                received: received.clone(),
            })
        });
        let attributes = req.method() == Method::GET
            && req
                .uri()
                .query()
                .is_some_and(|q| query_value(q, "attributes").is_some());
        let resp = match self.before(req, slot.as_deref()).await {
            // The permit (if any) is held until s3s has consumed the buffered body.
            Ok((req, _permit)) => self.s3.call(req).await?,
            Err(resp) => resp,
        };
        let resp = if attributes {
            unquoted_etag(resp).await
        } else {
            resp
        };
        let resp = after(resp, &id).await;
        if let Some(seen) = seen {
            let code = resp
                .body()
                .bytes()
                .filter(|_| resp.status().is_client_error() || resp.status().is_server_error())
                .and_then(|b| crate::access::error_code(&b));
            let user = seen.access_key.as_deref().and_then(|k| (self.names)(k));
            self.access_log.record(seen.record(
                user,
                resp.status(),
                code,
                received.load(std::sync::atomic::Ordering::Relaxed),
                resp.headers(),
                &id,
            ));
        }
        Ok(resp)
    }

    /// What is answered here, or the request as s3s should see it.
    async fn before(
        &self,
        mut req: http::Request<Body>,
        slot: Option<&cairn_rpc::admission::Slot>,
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
        // The body is read before s3s checks the signature: on a connection that has not
        // proven itself yet, only for a user's access key (a stranger's connection would be
        // cut at its deadline or byte budget anyway, mid-body).
        if let Some(slot) = slot.filter(|s| !s.is_proven()) {
            let key = crate::access::access_key(req.headers(), req.uri().query());
            let known = match key {
                Some(k) => (self.known)(k).await,
                None => false,
            };
            if !known {
                return Err(error(
                    StatusCode::FORBIDDEN,
                    "AccessDenied",
                    "a body without Content-Length needs a user's access key",
                ));
            }
            if !slot.prove() {
                return Err(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "SlowDown",
                    "every connection slot of this gateway is taken",
                ));
            }
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

/// GetObjectAttributes answers its ETag without quotes (S3), where s3s writes every XML ETag
/// with them.
async fn unquoted_etag(mut resp: Response) -> Response {
    if resp.status() != StatusCode::OK {
        return resp;
    }
    let Ok(body) = resp.body_mut().store_all_limited(ATTRIBUTES_BODY_MAX).await else {
        return resp;
    };
    let Ok(text) = std::str::from_utf8(&body) else {
        return resp;
    };
    let fixed = text
        .replace("<ETag>\"", "<ETag>")
        .replace("\"</ETag>", "</ETag>");
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(fixed.len()));
    *resp.body_mut() = Body::from(fixed);
    resp
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
    let Some(with_id) = completed_error(&body, id) else {
        return resp;
    };
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(with_id.len()));
    *resp.body_mut() = Body::from(with_id);
    resp
}

/// An `<Error>` document with what it lacks added: a `<Message>` (S3's sentence for its code)
/// and the `<RequestId>`. None if it lacks neither or is not one.
fn completed_error(body: &[u8], id: &str) -> Option<Bytes> {
    let mut text = std::str::from_utf8(body).ok()?.to_owned();
    let end = text.rfind("</Error>")?;
    let mut changed = false;
    if !text.contains("<Message>")
        && let Some(code_end) = text.find("</Code>")
    {
        let code_start = text.find("<Code>")? + "<Code>".len();
        let message = default_message(&text[code_start..code_end]);
        text.insert_str(
            code_end + "</Code>".len(),
            &format!("<Message>{message}</Message>"),
        );
        changed = true;
    }
    if !text.contains("<RequestId>") {
        let end = text.rfind("</Error>").unwrap_or(end);
        text.insert_str(end, &format!("<RequestId>{id}</RequestId>"));
        changed = true;
    }
    changed.then(|| Bytes::from(text))
}

/// S3's own sentence for an error code, for errors s3s answers without a message (its
/// parsers and signature checks), so that no client shows "Unknown".
fn default_message(code: &str) -> &'static str {
    match code {
        "AccessDenied" => "Access Denied.",
        "BadDigest" => "The Content-MD5 or checksum you specified did not match what we received.",
        "BucketAlreadyExists" => "The requested bucket name is not available.",
        "BucketAlreadyOwnedByYou" => {
            "The bucket you tried to create already exists, and you own it."
        }
        "BucketNotEmpty" => "The bucket you tried to delete is not empty.",
        "EntityTooLarge" => "Your proposed upload exceeds the maximum allowed object size.",
        "EntityTooSmall" => "Your proposed upload is smaller than the minimum allowed object size.",
        "IncompleteBody" => {
            "You did not provide the number of bytes specified by the Content-Length HTTP header."
        }
        "InternalError" => "We encountered an internal error. Please try again.",
        "InvalidAccessKeyId" => "The AWS access key ID you provided does not exist in our records.",
        "InvalidArgument" => "Invalid argument.",
        "InvalidBucketName" => "The specified bucket is not valid.",
        "InvalidDigest" => "The Content-MD5 or checksum you specified is not valid.",
        "InvalidObjectName" => "The specified object name is not valid.",
        "InvalidPart" => "One or more of the specified parts could not be found.",
        "InvalidPartOrder" => "The list of parts was not in ascending order.",
        "InvalidRange" => "The requested range cannot be satisfied.",
        "InvalidRequest" => "The request is not valid.",
        "InvalidURI" => "Couldn't parse the specified URI.",
        "KeyTooLongError" => "Your key is too long.",
        "MalformedXML" => {
            "The XML you provided was not well-formed or did not validate against our published schema."
        }
        "MethodNotAllowed" => "The specified method is not allowed against this resource.",
        "MissingContentLength" => "You must provide the Content-Length HTTP header.",
        "MissingSecurityHeader" => "Your request is missing a required header.",
        "NoSuchBucket" => "The specified bucket does not exist.",
        "NoSuchKey" => "The specified key does not exist.",
        "NoSuchUpload" => "The specified multipart upload does not exist.",
        "NoSuchVersion" => "The specified version does not exist.",
        "NotImplemented" => {
            "A header or operation you provided implies functionality that is not implemented."
        }
        "PreconditionFailed" => "At least one of the preconditions you specified did not hold.",
        "RequestTimeTooSkewed" => {
            "The difference between the request time and the server's time is too large."
        }
        "ServiceUnavailable" => "Please reduce your request rate.",
        "SignatureDoesNotMatch" => {
            "The request signature we calculated does not match the signature you provided. Check your key and signing method."
        }
        "SlowDown" => "Please reduce your request rate.",
        "XAmzContentSHA256Mismatch" => {
            "The provided 'x-amz-content-sha256' header does not match what was computed."
        }
        _ => "The request failed.",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_gains_its_message_and_request_id_once() {
        let body = b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code></Error>";
        let out = completed_error(body, "ABC").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>The specified key \
             does not exist.</Message><RequestId>ABC</RequestId></Error>"
        );
        assert!(completed_error(&out, "ABC").is_none());
        assert!(completed_error(b"<ListBucketResult/>", "ABC").is_none());
        // A message of its own is kept.
        let own = b"<Error><Code>InvalidArgument</Code><Message>why</Message></Error>";
        let out = completed_error(own, "X").unwrap();
        assert!(
            std::str::from_utf8(&out)
                .unwrap()
                .contains("<Message>why</Message><RequestId>X")
        );
    }

    #[test]
    fn query_values_are_found_by_exact_name() {
        let q = "X-Amz-Algorithm=AWS4&X-Amz-Expires=-7&X-Amz-ExpiresX=1";
        assert_eq!(query_value(q, "X-Amz-Expires"), Some("-7"));
        assert_eq!(query_value(q, "Expires"), None);
        assert_eq!(query_value("a&b=1", "a"), Some(""));
    }
}
