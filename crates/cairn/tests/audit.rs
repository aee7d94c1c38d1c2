//! Audit logs (issue 38 §6, docs/security.md "Audit"): the masters record every accepted
//! mutating call and every refusal; the S3 gateway records every request. (The NBD server's
//! connects, refusals, opens and closes are checked in block.rs beside its TLS test.)

mod common;
#[path = "../src/s3client.rs"]
#[allow(dead_code)]
mod s3client;

use cairn_client::CreateOptions;
use cairn_rpc::auth::Credential;
use common::{Cluster, has};
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_and_the_gateway_record_who_did_what() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let root = cl.client().await;
    let alice = common::create_user(&masters, "alice");
    let user_client = |cred: Credential| {
        let masters = masters.clone();
        async move {
            cairn_client::Client::with_options(
                &masters,
                cairn_client::ClientOptions {
                    credential: Some(cred),
                    retry_for: Duration::from_secs(3),
                    ..Default::default()
                },
            )
            .await
            .unwrap()
        }
    };

    // Accepted: root makes a directory alice may not write; refused: alice writes in it; a
    // wrong secret is refused before anything runs.
    root.mkdir_with("/locked", true, None, Some(0o755))
        .await
        .unwrap();
    let as_alice = user_client(Credential::User {
        access_key: alice.access.clone(),
        secret_key: alice.secret.clone(),
    })
    .await;
    assert!(
        as_alice
            .create("/locked/x", CreateOptions::default())
            .await
            .is_err()
    );
    assert!(
        as_alice
            .create("/home-alice", CreateOptions::default())
            .await
            .is_err(),
        "alice wrote in the root directory"
    );
    let forged = user_client(Credential::User {
        access_key: alice.access.clone(),
        secret_key: "not-her-secret".into(),
    })
    .await;
    assert!(forged.stat("/").await.is_err());

    let audit = dir.path().join("master-1/audit");
    common::audit_until(&audit, "of the mkdir", |l| {
        has(
            l,
            &[
                ("call", json!("Mkdir")),
                ("target", json!("/locked")),
                ("result", json!("ok")),
            ],
        )
    });
    let lines = common::audit_until(&audit, "of alice's refused create", |l| {
        has(
            l,
            &[
                ("call", json!("Create")),
                ("principal", json!("user:alice")),
                ("target", json!("/locked/x")),
                ("result", json!("permission-denied")),
            ],
        )
    });
    let root_mkdir = lines.iter().find(|l| l["call"] == "Mkdir").unwrap();
    assert!(
        root_mkdir["principal"]
            .as_str()
            .is_some_and(|p| p.starts_with("server:")),
        "{root_mkdir}"
    );
    assert!(
        root_mkdir["addr"]
            .as_str()
            .is_some_and(|a| a.starts_with("127.0.0.1:"))
    );
    common::audit_until(&audit, "of the forged proof", |l| {
        has(
            l,
            &[
                ("call", json!("Stat")),
                ("result", json!("refused")),
                ("claimed", json!(format!("user:{}", alice.access))),
            ],
        )
    });
    // No secret in the audit log.
    let text: String = lines.iter().map(|l| l.to_string()).collect();
    assert!(
        !text.contains(&alice.secret),
        "a secret key in the audit log"
    );

    // The gateway's access log, and the masters' record of what it did for alice.
    let access = dir.path().join("s3-access");
    let gw = common::gateway_with(
        &masters,
        "127.0.0.1:0",
        &["--access-log-dir", access.to_str().unwrap()],
    );
    let s3 = s3client::S3Bucket::new(
        &format!("http://{}", gw.addr),
        "alices",
        &alice.access,
        &alice.secret,
        2,
    )
    .unwrap();
    s3.create_bucket().await.unwrap();
    s3.put("photos/a b.jpg", bytes::Bytes::from_static(b"twelve bytes"))
        .await
        .unwrap();
    assert!(s3.get_opt("missing").await.unwrap().is_none());
    let lines = common::audit_until(&access, "of alice's PUT and 404", |l| {
        has(
            l,
            &[
                ("method", json!("PUT")),
                ("bucket", json!("alices")),
                ("key", json!("photos/a b.jpg")),
                ("user", json!("alice")),
                ("status", json!(200)),
                ("bytes_in", json!(12)),
            ],
        ) && has(
            l,
            &[
                ("method", json!("GET")),
                ("key", json!("missing")),
                ("status", json!(404)),
                ("error", json!("NoSuchKey")),
            ],
        )
    });
    assert!(
        lines
            .iter()
            .all(|l| l["service"] == "s3" && l["request_id"].is_string() && l["ms"].is_u64()),
        "{lines:#?}"
    );
    common::audit_until(&audit, "of the gateway's PutObject for alice", |l| {
        has(
            l,
            &[
                ("call", json!("PutObject")),
                ("via", json!("Batch")),
                ("on_behalf", json!("alice")),
                ("target", json!("alices/photos/a b.jpg")),
                ("result", json!("ok")),
            ],
        )
    });
    drop(gw);
}
