//! What `cairn up` tells a new user: the admin user's credentials and NBD certificate it
//! makes on the first start, and how to reach S3 and the volumes with the tools they know.

use super::ADMIN_CREDENTIALS;
use std::path::Path;

/// The admin user `cairn up` made (`admin`: an admin of the cluster and a user of its S3
/// gateway), from DIR/admin.credentials; made on the first start with the cluster secret.
pub(super) fn admin_credentials(
    dir: &Path,
    masters: &str,
    secret: &Path,
    tls: Option<cairn_rpc::tls::ClientTlsConfig>,
    data_tls: Option<&Path>,
) -> anyhow::Result<(String, String)> {
    let path = dir.join(ADMIN_CREDENTIALS);
    if let Ok(cairn_rpc::auth::Credential::User {
        access_key,
        secret_key,
    }) = cairn_rpc::auth::Credential::read(&path)
    {
        return Ok((access_key, secret_key));
    }
    let masters: Vec<String> = masters.split(',').map(str::to_owned).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let user = rt.block_on(async {
        let client = cairn_client::Client::with_options(
            &masters,
            cairn_client::ClientOptions {
                credential: Some(cairn_rpc::auth::Credential::Server {
                    secret: cairn_rpc::auth::ClusterSecret::read(secret)?,
                    who: "cairn-up".into(),
                }),
                tls,
                data_tls: data_tls.map(cairn_rpc::tls::data::connector).transpose()?,
                ..cairn_client::ClientOptions::default()
            },
        )
        .await?;
        cairn_s3::create_user(&client, "admin", true)
            .await
            .map_err(|e| anyhow::anyhow!(e))
    })?;
    // Written private, then renamed: a reader never sees half of it.
    let tmp = dir.join(format!("{ADMIN_CREDENTIALS}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let body = format!(
        "# Written by `cairn up`: the user admin, an admin of the cluster (the cairn CLI \
         reads this file from ./cairn-data) and a user of its S3 gateway (aws CLI \
         credentials file format).\n\
         [default]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
        user.access_key, user.secret_key
    );
    cairn_rpc::auth::write_private(&tmp, body.as_bytes())?;
    std::fs::rename(&tmp, &path)?;
    Ok((user.access_key, user.secret_key))
}

/// Where `cairn up` keeps the admin's NBD client certificate.
pub const ADMIN_NBD_CERT: &str = "nbd-admin";

/// The admin's client certificate for NBD over TLS (`DATA_DIR/nbd-admin`: the layout qemu and
/// libnbd read), issued and recorded on the first start; its directory.
pub(super) fn admin_nbd_cert(
    dir: &Path,
    masters: &str,
    secret: &Path,
    tls: Option<cairn_rpc::tls::ClientTlsConfig>,
    tls_dir: &Path,
) -> anyhow::Result<std::path::PathBuf> {
    let out = dir.join(ADMIN_NBD_CERT);
    if out.join(crate::tls::CLIENT_CERT).exists() {
        return Ok(out);
    }
    let tmp = dir.join(format!("{ADMIN_NBD_CERT}.tmp"));
    let _ = std::fs::remove_dir_all(&tmp);
    let fingerprint = crate::tls::issue_client_cert(tls_dir, "admin", 3650, &tmp)?;
    let masters: Vec<String> = masters.split(',').map(str::to_owned).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let m = cairn_rpc::Masters::new(&masters)?
            .credential(Some(cairn_rpc::auth::Credential::Server {
                secret: cairn_rpc::auth::ClusterSecret::read(secret)?,
                who: "cairn-up".into(),
            }))
            .tls(tls);
        let op = cairn_rpc::object::ObjectOp::AddUserCert {
            name: "admin".into(),
            fingerprint,
        };
        m.object_op(&op).await?.map_err(|e| anyhow::anyhow!("{e}"))
    })?;
    // Whole or not at all: the directory appears with its three files.
    std::fs::rename(&tmp, &out)?;
    Ok(out)
}

/// The tour's lines about NBD.
pub(super) fn print_nbd(
    addr: &str,
    insecure: bool,
    cert: impl FnOnce() -> anyhow::Result<std::path::PathBuf>,
) {
    let cli = cli_name();
    if insecure {
        println!(
            "cairn up: block volumes over plain NBD (--nbd-insecure) at nbd://{addr}/VOLUME\n\
             try: {cli} volume create vol1 --size 1g; \
             qemu-img convert -n -O raw disk.img nbd://{addr}/vol1; nbdinfo nbd://{addr}/vol1"
        );
        return;
    }
    match cert() {
        Ok(c) => {
            let c = c
                .strip_prefix(std::env::current_dir().unwrap_or_default())
                .unwrap_or(&c)
                .display()
                .to_string();
            println!(
                "cairn up: block volumes over NBD with TLS at nbds://{addr}/VOLUME; the admin's \
                 client certificate is in {c} (`{cli} user cert NAME --dir DIR` makes others)\n\
                 try: {cli} volume create vol1 --size 1g; \
                 nbdcopy disk.img 'nbds://{addr}/vol1?tls-certificates={c}'; \
                 nbdinfo 'nbds://{addr}/vol1?tls-certificates={c}'"
            );
        }
        Err(e) => eprintln!(
            "cairn up: no NBD client certificate for the admin ({e:#}); NBD is served over TLS \
             at nbds://{addr}/VOLUME",
        ),
    }
}

/// How a person at this shell runs this binary: `cairn` when that is it on PATH, else its
/// path (relative to the working directory when below it), as the hints print it.
pub(super) fn cli_name() -> String {
    let Ok(exe) = std::env::current_exe().and_then(std::fs::canonicalize) else {
        return "cairn".into();
    };
    let on_path = std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p)
            .any(|d| std::fs::canonicalize(d.join("cairn")).is_ok_and(|c| c == exe))
    });
    if on_path {
        return "cairn".into();
    }
    match std::env::current_dir().map(|cwd| exe.strip_prefix(cwd).map(Path::to_path_buf)) {
        Ok(Ok(rel)) => format!("./{}", rel.display()),
        _ => exe.display().to_string(),
    }
}

/// How to reach the S3 gateway: the admin's keys (the secret only to a terminal).
pub(super) fn print_s3(addr: &str, dir: &Path, (key, secret): &(String, String)) {
    // The secret key only to a person at a terminal: never into a log of this output.
    if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        println!(
            "cairn up: S3 at http://{addr} (region us-east-1), user admin; access key {key}, \
             secret key in {} (aws CLI format: AWS_SHARED_CREDENTIALS_FILE=that file)",
            dir.join(ADMIN_CREDENTIALS).display()
        );
        return;
    }
    println!(
        "cairn up: S3 at http://{addr} (region us-east-1), user admin; credentials in {}.\n\
         paste into a shell, then try: aws s3 mb s3://demo; aws s3 cp README.md s3://demo/; aws s3 ls s3://demo\n  \
         export AWS_ENDPOINT_URL=http://{addr}\n  \
         export AWS_ACCESS_KEY_ID={key}\n  \
         export AWS_SECRET_ACCESS_KEY={secret}\n  \
         export AWS_DEFAULT_REGION=us-east-1",
        dir.join(ADMIN_CREDENTIALS).display()
    );
}
