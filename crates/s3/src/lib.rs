//! Cairn's object service: an S3-compatible gateway on FlatLogFiles (docs/object.md).
//!
//! The protocol (routing, XML, SigV4 header and query signing, presigned URLs, aws-chunked
//! bodies) is s3s's; this crate maps S3 operations onto the masters' object index
//! ([`cairn_rpc::object`]) and object bytes onto FlatLogFiles ([`data`], [`pack`]). A gateway
//! keeps no state a restart would lose: every acknowledged PUT is durable in the cluster, so
//! any number of gateways may serve one cluster.

mod access;
mod attributes;
mod checksum;
pub mod compact;
mod convert;
pub mod data;
mod http;
pub use http::{BODY_IDLE, HEADER_READ_TIMEOUT};
mod listing;
mod multipart;
mod ops;
pub mod pack;
mod versions;

use cairn_client::Client;
use cairn_rpc::object::{ObjectOp, ObjectQuery, OpReply, QueryReply, User};
use parking_lot::Mutex;
use s3s::auth::{S3Auth, SecretKey};
use s3s::{S3Error, S3ErrorCode, S3Result, s3_error};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where the gateway keeps its files in the Cairn namespace.
pub const ROOT_DIR: &str = "/.s3";

/// Gateway settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Bodies up to this size are packed into shared logs; larger ones get files of their own.
    pub pack_max_bytes: usize,
    /// A pack is closed past this length.
    pub pack_bytes: u64,
    /// Pack writers (packs open at once).
    pub pack_lanes: usize,
    /// Multipart uploads older than this are aborted by the cleaner.
    pub upload_max_age: Duration,
    /// The region the gateway answers with.
    pub region: String,
    /// `HOST:PORT` clients reach this gateway at (default: the bound address).
    pub advertise: Option<String>,
    /// Pack compaction.
    pub compact: compact::CompactOptions,
    /// A request body that sends nothing this long while the gateway waits for it fails.
    pub body_idle: Duration,
    /// Where each request is recorded (crate::access); off by default.
    pub access_log: cairn_rpc::audit::Audit,
    /// Connection slots (docs/security.md "Resource limits"): a connection is proven by a
    /// request whose signature checks.
    pub connections: cairn_rpc::admission::Limits,
}

/// The gateway's connection limits by default: strangers send headers only before they
/// prove themselves (1 MiB).
pub fn default_connection_limits() -> cairn_rpc::admission::Limits {
    cairn_rpc::admission::Limits {
        max_unproven: 256,
        max_unproven_per_peer: 32,
        ..Default::default()
    }
}

const CONNECTION_METRICS: cairn_rpc::admission::Names = cairn_rpc::admission::Names {
    open: "cairn_s3_connections",
    unproven: "cairn_s3_connections_unproven",
    refused: "cairn_s3_connections_refused_total",
};

impl Default for Options {
    fn default() -> Self {
        Self {
            pack_max_bytes: 1 << 20,
            pack_bytes: 256 << 20,
            pack_lanes: 1,
            upload_max_age: Duration::from_secs(7 * 24 * 3600),
            region: "us-east-1".into(),
            advertise: None,
            compact: compact::CompactOptions::default(),
            body_idle: http::BODY_IDLE,
            access_log: cairn_rpc::audit::Audit::off(),
            connections: default_connection_limits(),
        }
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A random id of `n` characters from `alphabet`.
pub fn random_id(n: usize, alphabet: &[u8]) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..n)
        .map(|_| alphabet[rng.random_range(0..alphabet.len())] as char)
        .collect()
}

const HEX: &[u8] = b"0123456789abcdef";

/// A new user's credentials: a 20-character access key and a 40-character secret, the shape
/// of AWS's.
pub fn new_user(name: &str, admin: bool) -> User {
    const UPPER: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    const SECRET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    User {
        name: name.to_owned(),
        access_key: format!("CK{}", random_id(18, UPPER)),
        secret_key: random_id(40, SECRET),
        created_ms: now_ms(),
        admin,
        certs: Vec::new(),
    }
}

/// Users by access key, asked of the masters and kept for a few seconds.
struct Users {
    client: Client,
    cache: Mutex<HashMap<String, (Option<User>, Instant)>>,
}

const USER_TTL: Duration = Duration::from_secs(5);

impl Users {
    /// The name of the user with `access_key`, if this gateway knows it (for its access log).
    fn cached_name(&self, access_key: &str) -> Option<String> {
        self.cache
            .lock()
            .get(access_key)
            .and_then(|(u, _)| u.as_ref().map(|u| u.name.clone()))
    }

    async fn get(&self, access_key: &str) -> S3Result<Option<User>> {
        if let Some((u, at)) = self.cache.lock().get(access_key)
            && at.elapsed() < USER_TTL
        {
            return Ok(u.clone());
        }
        let q = ObjectQuery::User {
            access_key: access_key.to_owned(),
        };
        let user = match query(&self.client, &q).await? {
            QueryReply::User(u) => u,
            _ => {
                return Err(data::internal(
                    "the masters answered a user query with something else",
                ));
            }
        };
        let mut cache = self.cache.lock();
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(access_key.to_owned(), (user.clone(), Instant::now()));
        Ok(user)
    }
}

struct Auth(Arc<Users>);

/// Lets unsigned requests reach the operations, each of which refuses them (`AccessDenied`)
/// after saying whether the bucket exists (`NoSuchBucket`, as S3 answers anonymous callers).
/// s3s's default check refuses them all with AccessDenied before the bucket is looked at.
struct Access;

#[async_trait::async_trait]
impl s3s::access::S3Access for Access {
    async fn check(&self, cx: &mut s3s::access::S3AccessContext<'_>) -> S3Result<()> {
        // Called once the signature has checked (credentials present): that proves the
        // connection (cairn_rpc::admission).
        if cx.credentials().is_some()
            && let Some(http::ConnSlot(slot)) = cx.extensions_mut().get::<http::ConnSlot>()
            && !slot.prove()
        {
            return Err(s3_error!(
                SlowDown,
                "every connection slot of this gateway is taken"
            ));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl S3Auth for Auth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.0.get(access_key).await? {
            Some(u) => Ok(SecretKey::from(u.secret_key)),
            None => Err(s3_error!(InvalidAccessKeyId)),
        }
    }
}

/// The masters' answer to a read, with the index's refusals as S3 errors.
pub(crate) async fn query(client: &Client, q: &ObjectQuery) -> S3Result<QueryReply> {
    match client.masters().object_query(q).await {
        Ok(r) => r.map_err(convert::s3_err),
        Err(e) => Err(meta_err(e)),
    }
}

/// A change through the masters, with the index's refusals as S3 errors.
async fn change(client: &Client, op: &ObjectOp) -> S3Result<OpReply> {
    match client.masters().object_op(op).await {
        Ok(r) => r.map_err(convert::s3_err),
        Err(e) => Err(meta_err(e)),
    }
}

pub(crate) fn meta_err(e: cairn_rpc::MetaError) -> S3Error {
    use cairn_rpc::ErrorKind as K;
    let code = match e.kind {
        // A full cluster is 503 as well: space may come back (deletes, compaction, new servers).
        K::NotLeader | K::Unavailable | K::NoServers | K::NoSpace | K::Reclaiming => {
            S3ErrorCode::ServiceUnavailable
        }
        _ => S3ErrorCode::InternalError,
    };
    S3Error::with_message(code, e.to_string())
}

/// Creates a user of the cluster and its object service through the masters (`cairn user
/// create`); only servers and admins may.
///
/// # Errors
/// The masters are unreachable or refuse the caller, or the name is taken.
pub async fn create_user(client: &Client, name: &str, admin: bool) -> Result<User, String> {
    let user = new_user(name, admin);
    match client
        .masters()
        .object_op(&ObjectOp::CreateUser { user: user.clone() })
        .await
    {
        Ok(Ok(_)) => Ok(user),
        Ok(Err(e)) => Err(format!("user {name}: {e}")),
        Err(e) => Err(e.to_string()),
    }
}

/// Tells the masters this gateway serves `endpoint`, now and every
/// [`cairn_rpc::object::GATEWAY_HEARTBEAT_MS`] (`cairn status` lists gateways from it).
async fn heartbeat(client: Client, endpoint: String) {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let started_ms = now_ms();
    loop {
        let gateway = cairn_rpc::object::Gateway {
            endpoint: endpoint.clone(),
            host: host.clone(),
            pid: std::process::id(),
            started_ms,
            seen_ms: now_ms(),
        };
        if let Err(e) = change(&client, &ObjectOp::GatewaySeen { gateway }).await {
            tracing::warn!(error = %e, "could not tell the masters about this gateway");
        }
        tokio::time::sleep(Duration::from_millis(
            cairn_rpc::object::GATEWAY_HEARTBEAT_MS,
        ))
        .await;
    }
}

/// A running gateway.
pub struct Gateway {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Gateway {
    /// Binds `listen` and serves S3 on it for the cluster `client` reaches.
    ///
    /// # Errors
    /// The address cannot be bound, or the gateway's directories cannot be made.
    pub async fn start(client: Client, listen: &str, opts: Options) -> anyhow::Result<Self> {
        // Objects are readable through S3 only, by their bucket's owner: the gateway's files
        // are the cluster's and their root is closed to users (docs/security.md).
        client.mkdir_with(ROOT_DIR, true, None, Some(0o700)).await?;
        client.set_attr(ROOT_DIR, Some(0o700), None).await?;
        let writer_id = format!("{:x}-{}", now_ms(), random_id(6, HEX));
        let places = data::Places::new(
            client.clone(),
            pack::PackOptions {
                dir: format!("{ROOT_DIR}/packs"),
                writer_id,
                lanes: opts.pack_lanes,
                pack_bytes: opts.pack_bytes,
            },
        );
        // The root's data directory is made now (a gateway that cannot is not started).
        places
            .dir(ROOT_DIR)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let users = Arc::new(Users {
            client: client.clone(),
            cache: Mutex::default(),
        });
        let data = Arc::new(data::DataStore {
            client: client.clone(),
            places,
            pack_max: opts.pack_max_bytes,
            reading: data::Reading::default(),
        });
        tokio::spawn(compact::run(data.clone(), opts.compact.clone()));
        let gw = ops::Cairn {
            data,
            users: users.clone(),
            region: opts.region.clone(),
            writable: Arc::default(),
        };
        tokio::spawn(multipart::clean_uploads(gw.clone(), opts.upload_max_age));
        let mut builder = s3s::service::S3ServiceBuilder::new(gw);
        builder.set_auth(Auth(users.clone()));
        builder.set_access(Access);
        let names = {
            let users = users.clone();
            Arc::new(move |key: &str| users.cached_name(key))
        };
        let known: http::Known = {
            let users = users.clone();
            Arc::new(move |key: String| {
                let users = users.clone();
                Box::pin(async move { matches!(users.get(&key).await, Ok(Some(_))) })
            })
        };
        let front = http::Front::new(
            builder.build(),
            opts.body_idle,
            opts.access_log,
            names,
            known,
        );
        let conns =
            cairn_rpc::admission::Admission::new(opts.connections.clone(), CONNECTION_METRICS);
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let endpoint = format!(
            "http://{}",
            opts.advertise.clone().unwrap_or_else(|| addr.to_string())
        );
        tokio::spawn(heartbeat(client.clone(), endpoint));
        let task = tokio::spawn(async move {
            let mut http =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            // Headers started and not finished within the timeout close the connection.
            http.http1()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(http::HEADER_READ_TIMEOUT);
            loop {
                let (socket, peer) = match listener.accept().await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Strangers get a small pool of slots and a short time (cairn_rpc::admission).
                let Some(slot) = conns.admit(peer, false) else {
                    continue;
                };
                let _ = socket.set_nodelay(true);
                let front = front.clone();
                let http = http.clone();
                tokio::spawn(async move {
                    let socket = cairn_rpc::admission::Guarded::new(socket, slot);
                    let slot = socket.slot().clone();
                    let io = hyper_util::rt::TokioIo::new(socket);
                    let service = hyper::service::service_fn(move |req| {
                        front.clone().serve(req, Some(peer), Some(slot.clone()))
                    });
                    if let Err(e) = http.serve_connection(io, service).await {
                        tracing::debug!(error = %e, "connection ended");
                    }
                });
            }
        });
        Ok(Self { addr, task })
    }

    /// Serves until the task ends (it does not, unless aborted).
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}
