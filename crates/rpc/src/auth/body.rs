//! Binding a call's proof to its body (docs/security.md): the digest a proof signs, the
//! client's [`Signed`] channel that reads each body and signs it, and the masters'
//! [`DigestLayer`] that reads it before the call is decoded.

use super::{Credential, HttpRequest};
use sha2::Sha256;
/// The largest call body the masters read (tonic's default largest message, 4 MiB, and its
/// frame prefix): a larger one is refused before it is buffered further.
pub const MAX_BODY: usize = (4 << 20) + 5;

/// The SHA-256 of a call's body as sent (a request extension the masters' [`DigestLayer`]
/// sets; [`Verifier::check`] binds the proof to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyDigest(pub [u8; 32]);

/// The digest of the body tonic sends for `msg` in a unary call: one uncompressed gRPC
/// frame, a zero flag byte, the length as a big-endian u32, the protobuf encoding.
pub fn body_digest<T: prost::Message>(msg: &T) -> BodyDigest {
    use sha2::Digest;
    let bytes = msg.encode_to_vec();
    let mut h = Sha256::new();
    h.update([0u8]);
    // gRPC's frame prefix is big-endian (the one place Cairn writes one).
    #[allow(clippy::big_endian_bytes)]
    h.update(u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
    h.update(&bytes);
    BodyDigest(h.finalize().into())
}

/// A channel that signs every call with a credential (the call's name is the last part of
/// its gRPC path, e.g. `Stat`).
#[derive(Clone)]
pub struct Signed {
    inner: tonic::transport::Channel,
    cred: Option<std::sync::Arc<Credential>>,
}

impl Signed {
    pub fn new(inner: tonic::transport::Channel, cred: Option<std::sync::Arc<Credential>>) -> Self {
        Self { inner, cred }
    }
}

impl tower_service::Service<HttpRequest> for Signed {
    type Response = <tonic::transport::Channel as tower_service::Service<HttpRequest>>::Response;
    type Error = tonic::codegen::StdError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: HttpRequest) -> Self::Future {
        // The channel made ready is the one that sends; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(c) = self.cred.clone() else {
            return Box::pin(async move { inner.call(req).await.map_err(Into::into) });
        };
        Box::pin(async move {
            use http_body_util::BodyExt;
            let (mut parts, body) = req.into_parts();
            let bytes = body.collect().await?.to_bytes();
            let method = parts.uri.path().rsplit('/').next().unwrap_or_default();
            let (k, v) = c.header(method, &digest(&bytes));
            parts.headers.insert(k, http::HeaderValue::from_str(&v)?);
            let req = HttpRequest::from_parts(parts, tonic::body::Body::new(full(bytes)));
            inner.call(req).await.map_err(Into::into)
        })
    }
}

fn digest(bytes: &[u8]) -> BodyDigest {
    use sha2::Digest;
    BodyDigest(Sha256::digest(bytes).into())
}

fn full(
    bytes: bytes::Bytes,
) -> http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, tonic::Status> {
    use http_body_util::BodyExt;
    http_body_util::Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The masters' side of [`Signed`]: reads each call's body (at most [`MAX_BODY`] bytes; a
/// larger one is refused with `RESOURCE_EXHAUSTED`), and leaves its [`BodyDigest`] in the
/// request's extensions for [`Verifier::check`].
#[derive(Clone, Copy, Default)]
pub struct DigestLayer;

impl<S> tower_layer::Layer<S> for DigestLayer {
    type Service = Digested<S>;
    fn layer(&self, inner: S) -> Digested<S> {
        Digested { inner }
    }
}

#[derive(Clone)]
pub struct Digested<S> {
    inner: S,
}

type HttpResponse = http::Response<tonic::body::Body>;

impl<S> tower_service::Service<HttpRequest> for Digested<S>
where
    S: tower_service::Service<HttpRequest, Response = HttpResponse> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = HttpResponse;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<HttpResponse, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: HttpRequest) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            use http_body_util::BodyExt;
            let (mut parts, body) = req.into_parts();
            let bytes = match http_body_util::Limited::new(body, MAX_BODY).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    let status = if e.is::<http_body_util::LengthLimitError>() {
                        tonic::Status::resource_exhausted(format!(
                            "a call body over {MAX_BODY} bytes"
                        ))
                    } else {
                        tonic::Status::cancelled(format!("reading the call's body: {e}"))
                    };
                    return Ok(status.into_http());
                }
            };
            parts.extensions.insert(digest(&bytes));
            inner
                .call(HttpRequest::from_parts(
                    parts,
                    tonic::body::Body::new(full(bytes)),
                ))
                .await
        })
    }
}
