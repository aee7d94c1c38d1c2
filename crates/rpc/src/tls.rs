//! TLS for the control plane (docs/security.md, "TLS"): rustls with the ring provider, through
//! tonic. A TLS directory holds the cluster's CA certificate and this node's certificate and
//! key, PEM (`cairn tls init` or `cairn up --tls` makes one):
//!
//! | file | what | who needs it |
//! |---|---|---|
//! | `ca.pem` | the CA that signed every server's certificate | everyone (clients check servers with it) |
//! | `node.pem`, `node.key` | a server's certificate (its addresses as SANs) and key | masters |
//!
//! Clients check the master's certificate against `ca.pem` and the address they dialled.

use std::path::{Path, PathBuf};
pub use tonic::transport::{ClientTlsConfig, ServerTlsConfig};

/// The CA certificate's file name in a TLS directory.
pub const CA: &str = "ca.pem";
/// A server's certificate.
pub const NODE_CERT: &str = "node.pem";
/// A server's private key (mode 0600).
pub const NODE_KEY: &str = "node.key";

/// Why a TLS directory could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("{path}: {source} (make a TLS directory with `cairn tls init DIR`)")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn read(dir: &Path, name: &str) -> Result<Vec<u8>, TlsError> {
    let path = dir.join(name);
    std::fs::read(&path).map_err(|source| TlsError::Io { path, source })
}

/// What a master serves with: its certificate and key from `dir`.
///
/// # Errors
/// A file is missing or unreadable (a malformed one fails when the server starts).
pub fn server_config(dir: &Path) -> Result<ServerTlsConfig, TlsError> {
    let identity =
        tonic::transport::Identity::from_pem(read(dir, NODE_CERT)?, read(dir, NODE_KEY)?);
    Ok(ServerTlsConfig::new().identity(identity))
}

/// What a client checks masters with: the CA in `dir`.
///
/// # Errors
/// `ca.pem` is missing or unreadable.
pub fn client_config(dir: &Path) -> Result<ClientTlsConfig, TlsError> {
    Ok(ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(read(dir, CA)?)))
}

/// TLS on the data plane (chunkserver frames, docs/security.md "TLS"): the same directory's
/// files, used directly through rustls (the frames are not gRPC).
pub mod data {
    use super::{CA, NODE_CERT, NODE_KEY, TlsError, read};
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use std::path::Path;
    use std::sync::Arc;
    pub use tokio_rustls::{TlsAcceptor, client, server};

    /// A client's TLS configuration for chunkservers (a `tokio_rustls::TlsConnector` that
    /// prints as what it is).
    #[derive(Clone)]
    pub struct TlsConnector(pub tokio_rustls::TlsConnector);

    impl std::fmt::Debug for TlsConnector {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("TlsConnector(cluster CA)")
        }
    }

    fn bad(dir: &Path, name: &str, what: impl std::fmt::Display) -> TlsError {
        TlsError::Io {
            path: dir.join(name),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string()),
        }
    }

    /// ring's suites, AES-128-GCM first: the data plane moves bulk bytes, and AES-128 is
    /// the fastest of them with AES-NI (~10 % over AES-256) at a strength nobody doubts.
    fn provider() -> Arc<tokio_rustls::rustls::crypto::CryptoProvider> {
        use tokio_rustls::rustls::CipherSuite;
        let mut p = tokio_rustls::rustls::crypto::ring::default_provider();
        p.cipher_suites
            .sort_by_key(|s| s.suite() != CipherSuite::TLS13_AES_128_GCM_SHA256);
        Arc::new(p)
    }

    /// This node's certificate chain and key from `dir`.
    fn node_identity(
        dir: &Path,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
        let pem = read(dir, NODE_CERT)?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(dir, NODE_CERT, e))?;
        let key = PrivateKeyDer::from_pem_slice(&read(dir, NODE_KEY)?)
            .map_err(|e| bad(dir, NODE_KEY, e))?;
        Ok((certs, key))
    }

    /// The cluster CA of `dir` as the only root.
    fn ca_roots(dir: &Path) -> Result<tokio_rustls::rustls::RootCertStore, TlsError> {
        let mut roots = tokio_rustls::rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&read(dir, CA)?) {
            let c = c.map_err(|e| bad(dir, CA, e))?;
            roots.add(c).map_err(|e| bad(dir, CA, e))?;
        }
        Ok(roots)
    }

    /// A chunkserver's data-plane TLS: what it accepts connections with and what it dials
    /// its peers with (repair and conversion).
    #[derive(Clone)]
    pub struct ServerTls {
        pub acceptor: TlsAcceptor,
        pub connector: TlsConnector,
    }

    impl std::fmt::Debug for ServerTls {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("ServerTls(node certificate, cluster CA)")
        }
    }

    /// [`acceptor`] and [`connector`] of `dir`.
    ///
    /// # Errors
    /// As theirs.
    pub fn server_tls(dir: &Path) -> Result<ServerTls, TlsError> {
        Ok(ServerTls {
            acceptor: acceptor(dir)?,
            connector: connector(dir)?,
        })
    }

    /// What a chunkserver accepts data connections with: its certificate and key from `dir`.
    ///
    /// # Errors
    /// A file is missing, unreadable or malformed.
    pub fn acceptor(dir: &Path) -> Result<TlsAcceptor, TlsError> {
        let (certs, key) = node_identity(dir)?;
        let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(dir, NODE_CERT, e))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| bad(dir, NODE_KEY, e))?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }

    /// What the NBD server accepts TLS with (after NBD_OPT_STARTTLS): TLS 1.3 only, its
    /// certificate and key from `dir`, and a client certificate signed by the CA in `dir`
    /// required of every client (`cairn user cert` issues them; the server then asks the
    /// masters whose it is).
    ///
    /// # Errors
    /// A file is missing, unreadable or malformed.
    pub fn client_auth_acceptor(dir: &Path) -> Result<TlsAcceptor, TlsError> {
        use tokio_rustls::rustls;
        let (certs, key) = node_identity(dir)?;
        let roots = ca_roots(dir)?;
        let provider = provider();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(|e| bad(dir, CA, e))?;
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| bad(dir, NODE_CERT, e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .map_err(|e| bad(dir, NODE_KEY, e))?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }

    /// What a client (or a chunkserver repairing a peer) checks chunkservers with: the CA in
    /// `dir`. The name checked is the address dialled (chunkserver certificates carry their
    /// addresses as SANs, `cairn tls init --host`).
    ///
    /// # Errors
    /// `ca.pem` is missing, unreadable or malformed.
    pub fn connector(dir: &Path) -> Result<TlsConnector, TlsError> {
        let roots = ca_roots(dir)?;
        let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(dir, CA, e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(TlsConnector(tokio_rustls::TlsConnector::from(Arc::new(
            config,
        ))))
    }
}
