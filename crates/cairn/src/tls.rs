//! `cairn tls init DIR`: a cluster CA and a server certificate signed by it (rcgen, ECDSA
//! P-256), in the layout `cairn_rpc::tls` reads: `ca.pem`, `ca.key` (keep it offline in a real
//! deployment: it signs new servers), `node.pem`, `node.key`.

use cairn_rpc::tls::{CA, NODE_CERT, NODE_KEY};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::Path;

/// The CA's private key.
pub const CA_KEY: &str = "ca.key";

#[derive(clap::Args)]
pub struct InitArgs {
    /// The directory to make (it must not hold certificates yet).
    dir: std::path::PathBuf,
    /// Names and addresses the servers are reached at (SANs of node.pem); default
    /// `127.0.0.1` and `localhost`.
    #[arg(long = "host")]
    hosts: Vec<String>,
}

#[derive(clap::Subcommand)]
pub enum TlsCommand {
    /// Make a cluster CA and a server certificate signed by it.
    Init(InitArgs),
}

pub fn run(c: TlsCommand) -> anyhow::Result<()> {
    let TlsCommand::Init(a) = c;
    let hosts = if a.hosts.is_empty() {
        vec!["127.0.0.1".to_string(), "localhost".to_string()]
    } else {
        a.hosts
    };
    init(&a.dir, &hosts)?;
    println!(
        "{}: ca.pem (give it to clients), node.pem and node.key (servers' --tls-dir), ca.key \
         (keep it safe)",
        a.dir.display()
    );
    Ok(())
}

/// Makes `dir` with a new CA and a certificate for `hosts` signed by it.
///
/// # Errors
/// `dir` already holds a CA, a host is not a valid name, or a file cannot be written.
pub fn init(dir: &Path, hosts: &[String]) -> anyhow::Result<()> {
    anyhow::ensure!(
        !dir.join(CA).exists(),
        "{}: already holds a CA (remove it to make a new one)",
        dir.display()
    );
    std::fs::create_dir_all(dir)?;
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "Cairn cluster CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, &ca_key);

    let node_key = KeyPair::generate()?;
    let mut node = CertificateParams::new(hosts.to_vec())?;
    node.distinguished_name
        .push(DnType::CommonName, "Cairn server");
    node.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    node.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let node_cert = node.signed_by(&node_key, &issuer)?;

    write(dir, CA, ca_cert.pem().as_bytes(), 0o644)?;
    write(dir, CA_KEY, ca_key.serialize_pem().as_bytes(), 0o600)?;
    write(dir, NODE_CERT, node_cert.pem().as_bytes(), 0o644)?;
    write(dir, NODE_KEY, node_key.serialize_pem().as_bytes(), 0o600)?;
    Ok(())
}

fn write(dir: &Path, name: &str, body: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let p = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&p)
        .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    f.write_all(body)?;
    f.sync_all()?;
    Ok(())
}
