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
