//! Credentials that cannot be left in force or leak: JWKS revocation on a running service, and
//! the clients' refusal to send a token in plaintext to another host.

use std::time::Duration;

use outpost::client::BearerToken;
use outpost::proto::v1 as pb;
use serde_json::json;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::broker::free_port;
use crate::dependencies::assert_health;
use crate::helpers::{Backend, ServiceProcess, TestDb, assert_eventually, connect_order_service, reason};
use crate::otlp::start_receiver;
use crate::pki::{AUDIENCE, ISSUER, Pki};

const WAIT: Duration = Duration::from_secs(30);

/// Replaces `path` with `contents` by renaming a staged file into place, as deployment tools do.
fn publish(path: &std::path::Path, contents: &[u8]) {
    let staged = path.with_extension("staged");
    std::fs::write(&staged, contents).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_emptied_jwks_revokes_every_key_of_a_running_service_and_a_broken_one_keeps_the_last_good_keys() {
    let (endpoint, received, _receiver) = start_receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let db = TestDb::migrated(Backend::Sqlite).await;
    let port = free_port();
    let _service = ServiceProcess::spawn(
        "outpost-order",
        &[
            format!("--database-url={}", db.url),
            format!("--listen=127.0.0.1:{port}"),
            "--admin-listen=127.0.0.1:0".to_owned(),
            "--auth=jwt".to_owned(),
            format!("--auth-jwks={}", pki.jwks.display()),
            format!("--auth-issuer={ISSUER}"),
            format!("--auth-audience={AUDIENCE}"),
            "--reload-every=100ms".to_owned(),
        ],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint), ("OTEL_METRIC_EXPORT_INTERVAL", "300".to_owned())],
    );
    let client = connect_order_service(&format!("http://127.0.0.1:{port}")).await;
    let token = pki.token(json!({ "sub": "svc-tenant-7", "tenant_id": 7 })).unwrap();
    // A Reconcile of an unknown key: NOT_FOUND once the token is accepted, else its refusal.
    let ask = || {
        let (mut client, token) = (client.clone(), token.clone());
        async move {
            let mut request =
                tonic::Request::new(pb::ReconcileRequest { tenant_id: 0, request_id: "r".into() });
            BearerToken::new(&token).unwrap().apply(&mut request);
            let status = client.reconcile(request).await.unwrap_err();
            (status.code(), reason(&status))
        }
    };
    let gauge = |name: &'static str, value: f64, from: usize| {
        received.points().iter().skip(from).any(|p| p.name == name && p.value == value)
    };
    assert_eq!(ask().await.0, Code::NotFound, "the published key is trusted");
    assert_eventually("one signature key is in force", WAIT, || async {
        gauge("outpost.auth.jwks.keys", 1.0, 0)
    })
    .await;

    // Half a document: refused, said so in a gauge, and the key read before stays in force.
    publish(&pki.jwks, b"{\"keys\": [");
    assert_eventually("the broken file is reported stale", WAIT, || async {
        gauge("outpost.auth.jwks.stale", 1.0, 0)
    })
    .await;
    assert_eq!(ask().await.0, Code::NotFound, "the last good key still verifies");

    // An explicitly empty key set: every key is revoked at the next check, health still answers.
    let seen = received.points().len();
    publish(&pki.jwks, br#"{"keys": []}"#);
    assert_eventually("the revoked key verifies nothing", WAIT, || async {
        ask().await == (Code::Unauthenticated, "TOKEN_INVALID".to_owned())
    })
    .await;
    assert_eventually("no key is in force and the file is not stale", WAIT, || async {
        gauge("outpost.auth.jwks.keys", 0.0, seen) && gauge("outpost.auth.jwks.stale", 0.0, seen)
    })
    .await;
    assert_health("health answers without a key", port, "", ServingStatus::Serving).await;
}

