//! A small S3 client for one bucket: rusty-s3 presigns SigV4 URLs (the payload unsigned),
//! hyper sends them over keep-alive HTTP/1.1 connections. `cairn bench s3` drives gateways
//! with it, and the nemesis test (which includes this file by path) verifies through it.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};
use std::time::Duration;

/// How long a presigned URL stays valid: longer than any request takes.
const SIGN_FOR: Duration = Duration::from_secs(3600);

pub struct S3Bucket {
    http: HttpClient<HttpConnector, Full<Bytes>>,
    bucket: Bucket,
    creds: Credentials,
}

/// An S3 answer other than success: the HTTP status and the error document.
#[derive(Debug)]
pub struct S3Error {
    pub status: u16,
    pub body: String,
}

impl std::fmt::Display for S3Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP {}: {}", self.status, self.body)
    }
}

impl std::error::Error for S3Error {}

impl S3Bucket {
    /// A client of bucket `name` at `endpoint` (`http://HOST:PORT`), path-style, region
    /// us-east-1, keeping up to `connections` idle connections.
    pub fn new(
        endpoint: &str,
        name: &str,
        access_key: &str,
        secret_key: &str,
        connections: usize,
    ) -> anyhow::Result<Self> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Ok(Self {
            http: HttpClient::builder(TokioExecutor::new())
                .pool_max_idle_per_host(connections)
                .build(connector),
            bucket: Bucket::new(
                endpoint.parse()?,
                UrlStyle::Path,
                name.to_owned(),
                "us-east-1",
            )?,
            creds: Credentials::new(access_key, secret_key),
        })
    }

    /// Sends one request; an answer that is not 2xx is an [`S3Error`] inside the error.
    async fn send(&self, method: &str, url: url::Url, body: Bytes) -> anyhow::Result<Bytes> {
        let req = http::Request::builder()
            .method(method)
            .uri(url.as_str())
            .body(Full::new(body))?;
        let resp = self.http.request(req).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            return Err(S3Error {
                status: status.as_u16(),
                body: String::from_utf8_lossy(&bytes).into_owned(),
            }
            .into());
        }
        Ok(bytes)
    }

    pub async fn create_bucket(&self) -> anyhow::Result<()> {
        let url = self.bucket.create_bucket(&self.creds).sign(SIGN_FOR);
        self.send("PUT", url, Bytes::new()).await.map(|_| ())
    }

    pub async fn delete_bucket(&self) -> anyhow::Result<()> {
        let url = self.bucket.delete_bucket(&self.creds).sign(SIGN_FOR);
        self.send("DELETE", url, Bytes::new()).await.map(|_| ())
    }

    pub async fn put(&self, key: &str, body: Bytes) -> anyhow::Result<()> {
        let url = self
            .bucket
            .put_object(Some(&self.creds), key)
            .sign(SIGN_FOR);
        self.send("PUT", url, body).await.map(|_| ())
    }

    pub async fn get(&self, key: &str) -> anyhow::Result<Bytes> {
        let url = self
            .bucket
            .get_object(Some(&self.creds), key)
            .sign(SIGN_FOR);
        self.send("GET", url, Bytes::new()).await
    }

    /// GET, with a missing key (404) as `None`.
    pub async fn get_opt(&self, key: &str) -> anyhow::Result<Option<Bytes>> {
        match self.get(key).await {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.downcast_ref::<S3Error>().is_some_and(|s| s.status == 404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn delete(&self, key: &str) -> anyhow::Result<()> {
        let url = self
            .bucket
            .delete_object(Some(&self.creds), key)
            .sign(SIGN_FOR);
        self.send("DELETE", url, Bytes::new()).await.map(|_| ())
    }

    /// Lists the whole bucket in pages of 1 000 (ListObjectsV2); returns how many keys it saw.
    pub async fn list_all(&self) -> anyhow::Result<usize> {
        let mut token: Option<String> = None;
        let mut n = 0;
        loop {
            let mut a = self.bucket.list_objects_v2(Some(&self.creds));
            a.with_max_keys(1000);
            if let Some(t) = &token {
                a.with_continuation_token(t.clone());
            }
            let body = self.send("GET", a.sign(SIGN_FOR), Bytes::new()).await?;
            let page =
                rusty_s3::actions::ListObjectsV2::parse_response(std::str::from_utf8(&body)?)
                    .map_err(|e| anyhow::anyhow!("listing: {e:?}"))?;
            n += page.contents.len();
            match page.next_continuation_token {
                Some(t) => token = Some(t),
                None => return Ok(n),
            }
        }
    }
}
