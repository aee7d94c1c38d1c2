//! Connection-limit flags of the masters, the S3 gateway and the NBD server (the chunkserver
//! has its own, with its defaults): each overrides one field of the service's
//! [`cairn_rpc::admission::Limits`] (docs/security.md "Resource limits").

use cairn_rpc::admission::Limits;

#[derive(clap::Args, Debug, Clone, Default)]
pub struct ConnectionArgs {
    /// Connections that proved who they are, at once, in all (default 4096).
    #[arg(long)]
    max_connections: Option<usize>,
    /// Proven connections at once from one address (default 1024).
    #[arg(long)]
    max_connections_per_peer: Option<usize>,
    /// Milliseconds a connection has, from its accept, to prove who it is (a valid call,
    /// access key or certificate); until then it holds one of the few slots for unproven
    /// connections.
    #[arg(long)]
    proof_timeout_ms: Option<u64>,
    /// Unproven connections at once, in all.
    #[arg(long)]
    max_unproven: Option<usize>,
    /// Unproven connections at once from one address.
    #[arg(long)]
    max_unproven_per_peer: Option<usize>,
}

impl ConnectionArgs {
    /// `l` with the flags given.
    pub fn apply(&self, mut l: Limits) -> Limits {
        if let Some(v) = self.max_connections {
            l.max_connections = v.max(1);
        }
        if let Some(v) = self.max_connections_per_peer {
            l.max_connections_per_peer = v.max(1);
        }
        if let Some(v) = self.proof_timeout_ms {
            l.proof_timeout = std::time::Duration::from_millis(v.max(1));
        }
        if let Some(v) = self.max_unproven {
            l.max_unproven = v.max(1);
        }
        if let Some(v) = self.max_unproven_per_peer {
            l.max_unproven_per_peer = v.max(1);
        }
        l
    }
}
