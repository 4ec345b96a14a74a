//! Callers with real credentials: an order service that checks JWTs or serves TLS from the test
//! kit's [`Pki`], tokens for tenants and operators, and requests that carry them.

use idempost::security::AuthSettings;
use idempost_client::{BearerToken, ClientTls};
use idempost_order::{Application, Settings};
use idempost_proto::v1::{self as pb, order_service_client::OrderServiceClient};
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

use crate::db::{Backend, TestDb};
use crate::in_process::InProcess;
use crate::order::TestOrder;
use crate::pki::{AUDIENCE, ISSUER, Pki};
use crate::status::reason;

/// The scope that makes a token an operator's.
pub const ADMIN: &str = "idempost:admin";

/// An order service with JWT authentication on plaintext loopback, and the keys to sign for it.
pub async fn authenticated(
    backend: Backend,
    adjust: impl FnOnce(&mut Settings),
) -> (TestOrder, Pki, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let jwks = pki.jwks.clone();
    let app = TestOrder::spawn_with(backend, |settings| {
        settings.security.auth = AuthSettings::jwt(jwks, ISSUER, AUDIENCE);
        adjust(settings);
    })
    .await;
    (app, pki, dir)
}

pub fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    BearerToken::new(token).unwrap().apply(&mut request);
    request
}

pub fn tenant(pki: &Pki, tenant_id: i64) -> String {
    pki.token(json!({ "sub": format!("svc-tenant-{tenant_id}"), "tenant_id": tenant_id })).unwrap()
}

pub fn operator(pki: &Pki, subject: &str) -> String {
    pki.token(json!({ "sub": subject, "scope": format!("openid {ADMIN}") })).unwrap()
}

/// `(code, ErrorInfo.reason)` of a refused call, checking the token is nowhere in the answer.
pub fn refusal<T: std::fmt::Debug>(
    answer: Result<tonic::Response<T>, tonic::Status>,
    token: &str,
) -> (Code, String) {
    let status = answer.unwrap_err();
    if !token.is_empty() {
        assert!(!format!("{status:?}").contains(token), "the token was echoed: {status:?}");
    }
    (status.code(), reason(&status))
}

/// The flags that make a service process check JWTs signed by `pki`'s key, as an operator would
/// give them.
pub fn jwt_flags(pki: &Pki) -> [String; 4] {
    [
        "--auth=jwt".to_owned(),
        format!("--auth-jwks={}", pki.jwks.display()),
        format!("--auth-issuer={ISSUER}"),
        format!("--auth-audience={AUDIENCE}"),
    ]
}

/// A running order service serving TLS with `pki`'s certificate over a fresh database, its
/// settings changed by `adjust` first; with its database, server and both ports.
pub async fn tls_service(
    backend: Backend,
    pki: &Pki,
    adjust: impl FnOnce(&mut Settings),
) -> (TestDb, InProcess, u16, u16) {
    tls_service_on(TestDb::migrated(backend).await, pki, adjust).await
}

/// An order service over `db` with TLS from `pki` on both listeners; `adjust` changes the
/// settings first.
pub async fn tls_service_on(
    db: TestDb,
    pki: &Pki,
    adjust: impl FnOnce(&mut Settings),
) -> (TestDb, InProcess, u16, u16) {
    let mut settings = Settings::for_database(&db.url);
    settings.security.listeners.tls_cert = Some(pki.cert.clone());
    settings.security.listeners.tls_key = Some(pki.key.clone());
    adjust(&mut settings);
    let app = Application::build(settings).await.unwrap();
    let (port, admin_port) = (app.port(), app.admin_port());
    (db, InProcess::spawn(|shutdown| app.run_until_stopped(shutdown)), port, admin_port)
}

/// A Reconcile through a fresh TLS connection: the handshake's and the call's outcome.
pub async fn reconcile_over(url: &str, tls: &ClientTls) -> Result<Code, String> {
    let channel: Channel = idempost_client::connect(url, tls).await.map_err(|e| e.to_string())?;
    let answer = OrderServiceClient::new(channel)
        .reconcile(pb::ReconcileRequest { tenant_id: 1, request_id: "nothing".into() })
        .await;
    match answer {
        Ok(_) => Ok(Code::Ok),
        Err(status) if status.code() == Code::NotFound => Ok(Code::NotFound),
        Err(status) => Err(format!("{status:?}")),
    }
}
