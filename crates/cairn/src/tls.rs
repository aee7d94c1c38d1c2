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
    let ca = ca_params()?;
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

/// The CA's parameters, as `init` makes it: what signing with its key needs (its name, key
/// usages and key identifier method) is these, so a certificate signed later names it as its
/// issuer exactly.
fn ca_params() -> anyhow::Result<CertificateParams> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "Cairn cluster CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(ca)
}

/// The files `cairn user cert` writes, in the layout qemu's `tls-creds-x509` (endpoint=client)
/// and libnbd's `tls-certificates=` read.
pub const CLIENT_CA: &str = "ca-cert.pem";
pub const CLIENT_CERT: &str = "client-cert.pem";
pub const CLIENT_KEY: &str = "client-key.pem";

/// A client certificate for user `name`, signed by the CA in `tls_dir` (its `ca.pem` and
/// `ca.key`), valid for `days`, written into the new directory `out` with the CA's
/// certificate. Returns the certificate's fingerprint (`cairn_rpc::object::cert_fingerprint`).
///
/// # Errors
/// The CA's files are missing or are not a CA `cairn tls init` made (the certificate would
/// not verify against `ca.pem`: checked before anything is written), or `out` holds
/// certificates already.
pub fn issue_client_cert(
    tls_dir: &Path,
    name: &str,
    days: u32,
    out: &Path,
) -> anyhow::Result<String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, UnixTime};
    let read = |f: &str| {
        std::fs::read_to_string(tls_dir.join(f)).map_err(|e| {
            anyhow::anyhow!(
                "{}: {e} (client certificates are signed with the cluster CA's key: run this                  where `cairn tls init` or `cairn up` made it, or pass --tls-dir)",
                tls_dir.join(f).display()
            )
        })
    };
    let ca_pem = read(CA)?;
    let ca_key = KeyPair::from_pem(&read(CA_KEY)?)?;
    let issuer = Issuer::new(ca_params()?, &ca_key);
    let key = KeyPair::generate()?;
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name.push(DnType::CommonName, name);
    p.distinguished_name
        .push(DnType::OrganizationName, "Cairn user");
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - time::Duration::minutes(5);
    p.not_after = now + time::Duration::days(i64::from(days.max(1)));
    let cert = p.signed_by(&key, &issuer)?;

    // It must verify against ca.pem as the NBD server will check it.
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c?)?;
    }
    let verifier = tokio_rustls::rustls::server::WebPkiClientVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        std::sync::Arc::new(tokio_rustls::rustls::crypto::ring::default_provider()),
    )
    .build()?;
    verifier
        .verify_client_cert(cert.der(), &[], UnixTime::now())
        .map_err(|e| {
            anyhow::anyhow!(
                "{}: the certificate made with this CA's key does not verify against its ca.pem                  ({e}); was it made by `cairn tls init`?",
                tls_dir.display()
            )
        })?;

    anyhow::ensure!(
        !out.join(CLIENT_CERT).exists(),
        "{}: holds a client certificate already (give another --dir)",
        out.display()
    );
    std::fs::create_dir_all(out)?;
    if !out.join(CLIENT_CA).exists() {
        write(out, CLIENT_CA, ca_pem.as_bytes(), 0o644)?;
    }
    write(out, CLIENT_CERT, cert.pem().as_bytes(), 0o644)?;
    write(out, CLIENT_KEY, key.serialize_pem().as_bytes(), 0o600)?;
    Ok(cairn_rpc::object::cert_fingerprint(cert.der()))
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
