//! Service credentials (issue 38 §1, docs/security.md "Service credentials"): the S3 gateway
//! and the NBD server prove keys of their own, and the masters let each work in its namespace
//! only.

mod common;
#[path = "../src/s3client.rs"]
#[allow(dead_code)]
mod s3client;

use cairn_client::{Client, ClientOptions, CreateOptions};
use cairn_rpc::ErrorKind as K;
use cairn_rpc::auth::{ClusterSecret, Credential, Service, ServiceKey};
use cairn_rpc::object::{ObjectOp, ObjectQuery, QueryReply};
use cairn_rpc::pb;
use common::{Cluster, has};
use serde_json::json;
use std::time::Duration;

fn kind<T>(r: Result<T, cairn_client::Error>) -> K {
    match r {
        Err(cairn_client::Error::Meta(e)) => e.kind,
        Err(e) => panic!("expected a masters' refusal, got {e}"),
        Ok(_) => panic!("expected a masters' refusal, got success"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_work_in_their_namespace_only() {
    let dir = tempfile::tempdir().unwrap();
    let cl = Cluster::start(dir.path(), 1, 3).await;
    let masters = cl.master_addrs();
    let root = cl.client().await;
    let alice = common::create_user(&masters, "alice");
    root.mkdir("/home", false).await.unwrap();
    let mut w = root
        .create("/home/secret", CreateOptions::default())
        .await
        .unwrap();
    w.append(b"the cluster's own").await.unwrap();
    w.close().await.unwrap();
    let client = |credential: Credential| {
        let masters = masters.clone();
        async move {
            Client::with_options(
                &masters,
                ClientOptions {
                    credential: Some(credential),
                    retry_for: Duration::from_secs(3),
                    ..Default::default()
                },
            )
            .await
            .unwrap()
        }
    };
    let s3_file = common::service_key(dir.path(), &masters, "s3");
    let nbd_file = common::service_key(dir.path(), &masters, "block");
    let (svc, key) = ServiceKey::read(&s3_file).unwrap();
    assert_eq!(svc, Service::S3);
    let s3 = client(Credential::Service {
        service: Service::S3,
        key,
    })
    .await;
    let (svc, key) = ServiceKey::read(&nbd_file).unwrap();
    assert_eq!(svc, Service::Block);
    let nbd = client(Credential::Service {
        service: Service::Block,
        key,
    })
    .await;

    // Below its root: anything.
    s3.mkdir("/.s3/test", true).await.unwrap();
    let mut w = s3
        .create("/.s3/test/f", CreateOptions::default())
        .await
        .unwrap();
    w.append(b"object bytes").await.unwrap();
    w.close().await.unwrap();
    assert_eq!(
        s3.read("/.s3/test/f", 0, 12).await.unwrap(),
        b"object bytes"
    );
    s3.rename("/.s3/test/f", "/.s3/test/g").await.unwrap();
    s3.set_attr("/.s3/test", Some(0o700), None).await.unwrap();
    nbd.mkdir("/.block/test", true).await.unwrap();
    // Elsewhere: nothing.
    assert_eq!(
        kind(s3.read("/home/secret", 0, 4).await),
        K::PermissionDenied
    );
    assert_eq!(kind(s3.stat("/home/secret").await), K::PermissionDenied);
    assert_eq!(kind(s3.list("/").await), K::PermissionDenied);
    assert_eq!(kind(s3.mkdir("/.block/x", true).await), K::PermissionDenied);
    assert_eq!(kind(nbd.mkdir("/.s3/x", true).await), K::PermissionDenied);
    assert_eq!(kind(nbd.delete("/home/secret").await), K::PermissionDenied);
    assert_eq!(
        kind(s3.rename("/.s3/test/g", "/stolen").await),
        K::PermissionDenied
    );
    assert_eq!(
        kind(s3.set_attr("/.s3/test", None, Some("alice")).await),
        K::PermissionDenied,
        "no owner changes"
    );
    // The object index: each its own part.
    let user = ObjectQuery::User {
        access_key: alice.access.clone(),
    };
    match s3.masters().object_query(&user).await.unwrap() {
        Ok(cairn_rpc::object::QueryReply::User(Some(u))) => assert_eq!(u.secret_key, alice.secret),
        other => panic!("the gateway could not read a user's key: {other:?}"),
    }
    assert_eq!(
        nbd.masters().object_query(&user).await.unwrap_err().kind,
        K::PermissionDenied,
        "no secret keys for the NBD server"
    );
    assert_eq!(
        s3.masters()
            .object_query(&ObjectQuery::Users)
            .await
            .unwrap_err()
            .kind,
        K::PermissionDenied
    );
    assert!(
        nbd.masters()
            .object_query(&ObjectQuery::Volumes)
            .await
            .is_ok()
    );
    let delete_alice = ObjectOp::DeleteUser {
        name: "alice".into(),
    };
    for c in [&s3, &nbd] {
        assert_eq!(
            c.masters().object_op(&delete_alice).await.unwrap_err().kind,
            K::PermissionDenied
        );
    }
    // Servers' and operators' calls: refused.
    let x = cl.server_id(0).await;
    let drain = s3
        .masters()
        .call(|mut c| async move {
            c.set_server_state(pb::ServerStateRequest {
                server_id: x,
                state: "draining".into(),
            })
            .await
        })
        .await
        .unwrap_err();
    assert_eq!(drain.kind, K::PermissionDenied);
    let register = nbd
        .masters()
        .call(|mut c| async move {
            c.register(pb::RegisterRequest {
                server_id: 99,
                addr: "127.0.0.1:1".into(),
                ..Default::default()
            })
            .await
        })
        .await
        .unwrap_err();
    assert_eq!(register.kind, K::PermissionDenied);
    // A key of another cluster: not even a service.
    let stranger = client(Credential::Service {
        service: Service::S3,
        key: ServiceKey::derive(&ClusterSecret::generate(), Service::S3),
    })
    .await;
    assert_eq!(kind(stranger.stat("/.s3").await), K::Unauthenticated);
    // Canary: the cluster itself still reads everything.
    assert_eq!(
        root.read("/.s3/test/g", 0, 12).await.unwrap(),
        b"object bytes"
    );

    // The services run with their keys (the tests' environment also names the cluster
    // secret: the key wins) and serve their users.
    let gw = common::gateway_with(
        &masters,
        "127.0.0.1:0",
        &["--service-key-file", s3_file.to_str().unwrap()],
    );
    let bucket = s3client::S3Bucket::new(
        &format!("http://{}", gw.addr),
        "alices",
        &alice.access,
        &alice.secret,
        1,
    )
    .unwrap();
    bucket.create_bucket().await.unwrap();
    bucket
        .put("k", bytes::Bytes::from_static(b"twelve bytes"))
        .await
        .unwrap();
    assert_eq!(&bucket.get("k").await.unwrap()[..], b"twelve bytes");
    let nbd_server = common::nbd::server(
        &masters,
        &["--service-key-file", nbd_file.to_str().unwrap()],
    );
    common::run_ok(common::cairn().args([
        "volume",
        "create",
        "vol",
        "--size",
        "16m",
        "--cluster",
        &masters.join(","),
    ]));
    // On a user's behalf: the masters apply the user's rights to what the NBD server asks
    // for them, and the gateway acts for users they know only.
    let set = |mode: u16, owner: Option<&str>| ObjectOp::SetVolumeAttr {
        name: "vol".into(),
        mode: Some(mode),
        owner: owner.map(str::to_owned),
    };
    root.masters()
        .object_op(&set(0o600, None))
        .await
        .unwrap()
        .unwrap();
    let vol_for = |user: &str| ObjectQuery::VolumeFor {
        name: "vol".into(),
        user: user.into(),
    };
    let volumes_for = ObjectQuery::VolumesFor {
        user: "alice".into(),
    };
    let names = |r: cairn_rpc::object::QueryResult| match r {
        Ok(QueryReply::Volumes(vs)) => vs.into_iter().map(|v| v.name).collect::<Vec<_>>(),
        other => panic!("a list of volumes: {other:?}"),
    };
    let denied = Err(cairn_rpc::object::ObjectError::AccessDenied);
    assert_eq!(
        nbd.masters().object_query(&vol_for("alice")).await.unwrap(),
        denied,
        "alice may not open a volume of mode 0600 she does not own"
    );
    assert!(names(nbd.masters().object_query(&volumes_for).await.unwrap()).is_empty());
    root.masters()
        .object_op(&set(0o600, Some("alice")))
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        nbd.masters().object_query(&vol_for("alice")).await.unwrap(),
        Ok(QueryReply::Volume(v)) if v.name == "vol"
    ));
    assert_eq!(
        names(nbd.masters().object_query(&volumes_for).await.unwrap()),
        ["vol"]
    );
    assert_eq!(
        nbd.masters().object_query(&vol_for("ghost")).await.unwrap(),
        denied,
        "no rights for a user the masters do not know"
    );
    let ghost_bucket = ObjectOp::CreateBucket {
        user: "ghost".into(),
        bucket: "ghosts".into(),
        now_ms: 0,
    };
    assert_eq!(
        s3.masters()
            .object_op(&ghost_bucket)
            .await
            .unwrap_err()
            .kind,
        K::PermissionDenied,
        "the gateway acts for users the masters know only"
    );
    let addr = nbd_server.addr.clone();
    tokio::task::spawn_blocking(move || {
        let mut v = common::nbd::Raw::open(&addr, "vol").unwrap();
        let block = common::nbd::block_of(7);
        let n = block.len() as u32;
        assert_eq!(v.call(common::nbd::WRITE, 0, 0, n, &block).unwrap().0, 0);
        assert_eq!(v.call(common::nbd::FLUSH, 0, 0, 0, &[]).unwrap().0, 0);
        let (err, data) = v.call(common::nbd::READ, 0, 0, n, &[]).unwrap();
        assert_eq!((err, data), (0, block));
    })
    .await
    .unwrap();
    // The masters saw the services as themselves, not as servers.
    let audit = dir.path().join("master-1/audit");
    common::audit_until(&audit, "of the services' calls", |l| {
        has(l, &[("principal", json!("service:s3"))])
            && has(l, &[("principal", json!("service:block"))])
    });
}
