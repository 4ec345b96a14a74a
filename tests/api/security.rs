//! Secure by default, through real servers and real gRPC clients: TLS on the listeners (mutual
//! TLS when asked), bearer tokens checked against a JWKS that can rotate, the tenant taken from
//! the token, operators recognised by scope (on the order service's and the consumer's admin
//! services alike), and a bounded number of calls in flight.

use std::time::Duration;

use idempost::security::AuthSettings;
use idempost_client::ClientTls;
use idempost_order::{Application, Settings};
use idempost_proto::v1::{
    self as pb, admin_service_client::AdminServiceClient,
    consumer_admin_service_client::ConsumerAdminServiceClient,
};
use sea_orm::{ConnectionTrait, TransactionTrait};
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

use crate::helpers::{
    Backend, InProcess, TestDb, TestOrder, TestService, assert_eventually, metadata, on_every_backend, order,
    reason,
};
use crate::pki::{self, AUDIENCE, ISSUER, Pki};
use idempost_testkit::auth::jwt_flags;
use idempost_testkit::auth::{
    authenticated, operator, reconcile_over, refusal, tenant, tls_service, with_token,
};

use idempost_testkit::wait::WAIT;

async fn nothing_written(app: &TestOrder) {
    assert_eq!(app.count("orders").await, 0, "a refused call wrote an order");
    assert_eq!(app.count("outbox_event").await, 0, "a refused call wrote an event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_refused_caller_gets_its_exact_reason_and_writes_nothing() {
    let (app, pki, _dir) = authenticated(Backend::Sqlite, |_| {}).await;
    let mut orders = app.client.clone();
    let mut admin = app.admin.clone();
    let now = jsonwebtoken::get_current_timestamp();

    let missing = orders.submit_order(order(7, "refused")).await;
    assert_eq!(refusal(missing, ""), (Code::Unauthenticated, "TOKEN_MISSING".into()));

    let garbage = "not.a.jwt";
    let answer = orders.submit_order(with_token(order(7, "refused"), garbage)).await;
    assert_eq!(refusal(answer, garbage), (Code::Unauthenticated, "TOKEN_INVALID".into()));

    // Expired an hour ago: far beyond the leeway.
    let expired = pki.token(json!({ "sub": "late", "tenant_id": 7, "exp": now - 3600 })).unwrap();
    let answer = orders.submit_order(with_token(order(7, "refused"), &expired)).await;
    assert_eq!(refusal(answer, &expired), (Code::Unauthenticated, "TOKEN_EXPIRED".into()));

    let not_yet = pki.token(json!({ "sub": "early", "tenant_id": 7, "nbf": now + 3600 })).unwrap();
    let answer = orders.submit_order(with_token(order(7, "refused"), &not_yet)).await;
    assert_eq!(refusal(answer, &not_yet), (Code::Unauthenticated, "TOKEN_INVALID".into()));

    let forged = pki::token_from_unknown_key("key-1", json!({ "sub": "forger", "tenant_id": 7 })).unwrap();
    let answer = orders.submit_order(with_token(order(7, "refused"), &forged)).await;
    assert_eq!(refusal(answer, &forged), (Code::Unauthenticated, "TOKEN_INVALID".into()));

    let elsewhere = pki.token(json!({ "sub": "other", "tenant_id": 7, "aud": "another-service" })).unwrap();
    let answer = orders.submit_order(with_token(order(7, "refused"), &elsewhere)).await;
    assert_eq!(refusal(answer, &elsewhere), (Code::Unauthenticated, "TOKEN_INVALID".into()));

    let other_issuer =
        pki.token(json!({ "sub": "other", "tenant_id": 7, "iss": "https://evil.example" })).unwrap();
    let answer = orders.submit_order(with_token(order(7, "refused"), &other_issuer)).await;
    assert_eq!(refusal(answer, &other_issuer), (Code::Unauthenticated, "TOKEN_INVALID".into()));

    let eight = tenant(&pki, 8);
    let answer = orders.submit_order(with_token(order(7, "refused"), &eight)).await;
    let status = answer.as_ref().map(|_| ()).unwrap_err().clone();
    assert_eq!(refusal(answer, &eight), (Code::PermissionDenied, "TENANT_MISMATCH".into()));
    assert_eq!(metadata(&status, "request_id").as_deref(), Some("refused"));

    // An operator token names no tenant: it cannot submit for one.
    let ops = operator(&pki, "alice");
    let answer = orders.submit_order(with_token(order(7, "refused"), &ops)).await;
    assert_eq!(refusal(answer, &ops), (Code::PermissionDenied, "TENANT_MISMATCH".into()));

    let seven = tenant(&pki, 7);
    let redrive = pb::RedriveRequest {
        event_id: uuid::Uuid::new_v4().to_string(),
        requested_by: "mallory".into(),
        reason: "because".into(),
    };
    let answer = admin.redrive(with_token(redrive.clone(), &seven)).await;
    assert_eq!(refusal(answer, &seven), (Code::PermissionDenied, "SCOPE_MISSING".into()));
    let answer = admin.purge(with_token(pb::PurgeRequest::default(), &seven)).await;
    assert_eq!(refusal(answer, &seven), (Code::PermissionDenied, "SCOPE_MISSING".into()));
    let answer = admin.list_backlog(with_token(pb::ListBacklogRequest::default(), &seven)).await;
    assert_eq!(refusal(answer, &seven), (Code::PermissionDenied, "SCOPE_MISSING".into()));
    let answer = admin.redrive(redrive).await;
    assert_eq!(refusal(answer, ""), (Code::Unauthenticated, "TOKEN_MISSING".into()));

    nothing_written(&app).await;

    // A request whose tenant_id is 0 acts for the token's tenant.
    let accepted = orders.submit_order(with_token(order(0, "accepted"), &seven)).await.unwrap().into_inner();
    let stored = app
        .scalar_i64(&format!(
            "SELECT tenant_id FROM orders WHERE acceptance_event_id = '{}'",
            accepted.event_id
        ))
        .await;
    assert_eq!(stored, 7);
    app.stop().await;
}

async fn tenants_see_only_their_own_orders_and_operators_see_all(backend: Backend) {
    let (app, pki, _dir) = authenticated(backend, |_| {}).await;
    let mut orders = app.client.clone();
    let mut admin = app.admin.clone();
    let (seven, eight, ops) = (tenant(&pki, 7), tenant(&pki, 8), operator(&pki, "alice"));
    let accepted =
        orders.submit_order(with_token(order(0, "shared-key"), &seven)).await.unwrap().into_inner();
    let key = |tenant_id| pb::ReconcileRequest { tenant_id, request_id: "shared-key".into() };
    let find = |tenant_id| pb::FindByBusinessKeyRequest { tenant_id, request_id: "shared-key".into() };
    let timeline = || pb::GetEventTimelineRequest { event_id: accepted.event_id.clone() };

    // Tenant 8 asks about tenant 7's order every way there is.
    let answer = orders.reconcile(with_token(key(7), &eight)).await;
    assert_eq!(refusal(answer, &eight), (Code::PermissionDenied, "TENANT_MISMATCH".into()));
    let answer = orders.reconcile(with_token(key(0), &eight)).await;
    assert_eq!(refusal(answer, &eight), (Code::NotFound, "ORDER_NOT_FOUND".into()));
    let answer = admin.find_by_business_key(with_token(find(7), &eight)).await;
    assert_eq!(refusal(answer, &eight), (Code::PermissionDenied, "TENANT_MISMATCH".into()));
    let answer = admin.find_by_business_key(with_token(find(0), &eight)).await;
    assert_eq!(refusal(answer, &eight), (Code::NotFound, "ORDER_NOT_FOUND".into()));
    let answer = admin.get_event_timeline(with_token(timeline(), &eight)).await;
    assert_eq!(refusal(answer, &eight), (Code::NotFound, "EVENT_NOT_FOUND".into()));
    // Nor can it overwrite or replay it: the same request id is its own, separate key.
    let answer = orders.submit_order(with_token(order(7, "shared-key"), &eight)).await;
    assert_eq!(refusal(answer, &eight), (Code::PermissionDenied, "TENANT_MISMATCH".into()));

    // Tenant 7 sees its own.
    let own = orders.reconcile(with_token(key(0), &seven)).await.unwrap().into_inner();
    assert_eq!(own.event_id, accepted.event_id);
    let own = admin.get_event_timeline(with_token(timeline(), &seven)).await.unwrap().into_inner();
    assert_eq!(own.timeline.unwrap().order.unwrap().tenant_id, 7);

    // The operator sees every tenant's.
    let found = orders.reconcile(with_token(key(7), &ops)).await.unwrap().into_inner();
    assert_eq!(found.event_id, accepted.event_id);
    let found = admin.find_by_business_key(with_token(find(7), &ops)).await.unwrap().into_inner();
    assert_eq!(found.timeline.unwrap().event_id, accepted.event_id);
    let found = admin.get_event_timeline(with_token(timeline(), &ops)).await.unwrap().into_inner();
    assert_eq!(found.timeline.unwrap().order.unwrap().tenant_id, 7);
    let backlog = admin.list_backlog(with_token(pb::ListBacklogRequest::default(), &ops)).await.unwrap();
    assert_eq!(backlog.into_inner().stats.unwrap().pending, 1);

    assert_eq!(app.count("orders").await, 1);
    app.stop().await;
}

on_every_backend!(tenants_see_only_their_own_orders_and_operators_see_all);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_acts_only_for_the_tokens_tenant_and_an_operator_token_changes_nothing() {
    use idempost_testkit::order::{amend, cancel};
    let (app, pki, _dir) = authenticated(Backend::Sqlite, |_| {}).await;
    let mut orders = app.client.clone();
    let (seven, eight, ops) = (tenant(&pki, 7), tenant(&pki, 8), operator(&pki, "alice"));
    let order_id =
        orders.submit_order(with_token(order(0, "submit-1"), &seven)).await.unwrap().into_inner().order_id;
    let mine = |request: pb::AmendOrderRequest| pb::AmendOrderRequest { tenant_id: 0, ..request };

    let answer = orders.amend_order(mine(amend("amend-x", order_id, 1, 3))).await;
    assert_eq!(refusal(answer, ""), (Code::Unauthenticated, "TOKEN_MISSING".into()));
    // Tenant 8 naming tenant 7 is refused; naming no tenant, it has no such order.
    let answer = orders.amend_order(with_token(amend("amend-x", order_id, 1, 3), &eight)).await;
    assert_eq!(refusal(answer, &eight), (Code::PermissionDenied, "TENANT_MISMATCH".into()));
    let answer = orders.amend_order(with_token(mine(amend("amend-x", order_id, 1, 3)), &eight)).await;
    assert_eq!(refusal(answer, &eight), (Code::NotFound, "ORDER_NOT_FOUND".into()));
    let cancel_mine = pb::CancelOrderRequest { tenant_id: 0, ..cancel("cancel-x", order_id, 1) };
    let answer = orders.cancel_order(with_token(cancel_mine.clone(), &eight)).await;
    assert_eq!(refusal(answer, &eight), (Code::NotFound, "ORDER_NOT_FOUND".into()));
    // The operator scope reads every tenant's, but writes for none.
    let answer = orders.cancel_order(with_token(cancel("cancel-x", order_id, 1), &ops)).await;
    assert_eq!(refusal(answer, &ops), (Code::PermissionDenied, "TENANT_MISMATCH".into()));
    assert_eq!(app.count("outbox_event").await, 1, "no refused change wrote anything");

    let amended =
        orders.amend_order(with_token(mine(amend("amend-1", order_id, 1, 3)), &seven)).await.unwrap();
    assert_eq!(amended.into_inner().version, 2);
    let found = orders
        .reconcile(with_token(pb::ReconcileRequest { tenant_id: 7, request_id: "amend-1".into() }, &ops))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((found.operation(), found.current_version), (pb::OrderOperation::Amend, 2));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redrive_records_the_tokens_subject_and_keeps_the_typed_name_as_a_note() {
    let (app, pki, _dir) = authenticated(Backend::Sqlite, |_| {}).await;
    let accepted =
        app.client.clone().submit_order(with_token(order(0, "to-fail"), &tenant(&pki, 7))).await.unwrap();
    let event_id = accepted.into_inner().event_id;
    app.conn
        .execute_unprepared(&format!(
            "UPDATE outbox_event SET status = 'FAILED', attempts = 10 WHERE event_id = '{event_id}'"
        ))
        .await
        .unwrap();

    let request = pb::RedriveRequest {
        event_id: event_id.clone(),
        requested_by: "somebody-else".into(),
        reason: "broker fixed".into(),
    };
    let redriven =
        app.admin.clone().redrive(with_token(request, &operator(&pki, "alice@ops"))).await.unwrap();
    let row = redriven.into_inner().outbox.unwrap();
    assert_eq!(row.status, "PENDING");
    assert_eq!(row.last_redriven_by, "alice@ops");
    assert_eq!(row.last_redrive_reason, "broker fixed (requested_by note: somebody-else)");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_jwks_rotated_while_the_service_runs_takes_effect_without_a_restart() {
    let (app, mut pki, _dir) = authenticated(Backend::Sqlite, |settings| {
        settings.security.listeners.reload_every = Duration::from_millis(100);
    })
    .await;
    let before = tenant(&pki, 7);
    app.client
        .clone()
        .reconcile(with_token(pb::ReconcileRequest { tenant_id: 0, request_id: "r".into() }, &before))
        .await
        .unwrap_err()
        .code()
        .eq(&Code::NotFound)
        .then_some(())
        .expect("the first key is trusted");

    pki.rotate("key-2").unwrap();
    let after = tenant(&pki, 7);
    let client = app.client.clone();
    assert_eventually("the new key is trusted and the old one is not", WAIT, || {
        let mut client = client.clone();
        let (before, after) = (before.clone(), after.clone());
        async move {
            let ask = || pb::ReconcileRequest { tenant_id: 0, request_id: "r".into() };
            let old = client.reconcile(with_token(ask(), &before)).await.unwrap_err();
            let new = client.reconcile(with_token(ask(), &after)).await.unwrap_err();
            reason(&old) == "TOKEN_INVALID" && new.code() == Code::NotFound
        }
    })
    .await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_handshakes_succeed_with_the_right_ca_and_fail_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let stranger = Pki::make(other_dir.path()).unwrap();
    let (_db, server, port, admin_port) = tls_service(Backend::Sqlite, &pki, |_| {}).await;

    let trusted = ClientTls { ca_file: Some(pki.ca.clone()), identity: None };
    for host in ["localhost", "127.0.0.1"] {
        let url = format!("https://{host}:{port}");
        assert_eq!(reconcile_over(&url, &trusted).await, Ok(Code::NotFound), "{url}");
    }
    let admin = idempost_client::connect(&format!("https://localhost:{admin_port}"), &trusted).await.unwrap();
    let backlog = AdminServiceClient::new(admin).list_backlog(pb::ListBacklogRequest::default()).await;
    assert!(backlog.is_ok(), "{backlog:?}");

    let wrong_ca = ClientTls { ca_file: Some(stranger.ca.clone()), identity: None };
    let refused = reconcile_over(&format!("https://localhost:{port}"), &wrong_ca).await;
    assert!(refused.is_err(), "a server certificate from an unknown CA was accepted");
    let plaintext = reconcile_over(&format!("http://127.0.0.1:{port}"), &ClientTls::default()).await;
    assert!(plaintext.is_err(), "plaintext reached a TLS listener");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_tls_refuses_a_client_without_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let (_db, server, port, _) =
        tls_service(Backend::Sqlite, &pki, |s| s.security.listeners.tls_client_ca = Some(pki.ca.clone()))
            .await;
    let url = format!("https://localhost:{port}");

    let anonymous = ClientTls { ca_file: Some(pki.ca.clone()), identity: None };
    assert!(reconcile_over(&url, &anonymous).await.is_err(), "a client without a certificate got through");
    let identified = ClientTls {
        ca_file: Some(pki.ca.clone()),
        identity: Some((pki.client_cert.clone(), pki.client_key.clone())),
    };
    assert_eq!(reconcile_over(&url, &identified).await, Ok(Code::NotFound));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_the_concurrency_limit_callers_are_refused_at_once_and_the_others_still_answered() {
    let app = TestOrder::spawn_with(Backend::Postgres, |settings| {
        settings.security.listeners.max_concurrent_calls = Some(2);
        // Both held calls share the test's one connection.
        settings.security.listeners.max_calls_per_connection = Some(2);
    })
    .await;
    // Hold every write: the two calls the limit allows stay in flight until the lock goes.
    let lock = app.conn.begin().await.unwrap();
    lock.execute_unprepared("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE").await.unwrap();
    let held: Vec<_> = ["held-1", "held-2"]
        .into_iter()
        .map(|id| {
            let mut client = app.client.clone();
            tokio::spawn(async move { client.submit_order(order(5, id)).await })
        })
        .collect();
    let conn = app.conn.clone();
    assert_eventually("both allowed calls wait on the lock", WAIT, || {
        let conn = conn.clone();
        async move {
            let sql = "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
            let row = conn
                .query_one_raw(sea_orm::Statement::from_string(sea_orm::DbBackend::Postgres, sql))
                .await
                .unwrap()
                .unwrap();
            row.try_get_by_index::<i64>(0).unwrap() == 2
        }
    })
    .await;

    // The lock is still held, so this answer cannot have waited for a database connection.
    let shed = app.client.clone().submit_order(order(5, "shed")).await.unwrap_err();
    assert_eq!((shed.code(), reason(&shed).as_str()), (Code::ResourceExhausted, "OVERLOADED"), "{shed:?}");
    // Health is always admitted: a busy instance is not reported dead.
    let health = tonic_health::pb::health_client::HealthClient::new(app.channel().await)
        .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status(), tonic_health::pb::health_check_response::ServingStatus::Serving);
    let shed_again =
        app.client.clone().reconcile(pb::ReconcileRequest { tenant_id: 5, request_id: "x".into() }).await;
    assert_eq!(shed_again.unwrap_err().code(), Code::ResourceExhausted);
    // The admin listener has its own limit and keeps answering.
    assert!(app.admin.clone().list_backlog(pb::ListBacklogRequest::default()).await.is_ok());
    assert!(held.iter().all(|call| !call.is_finished()), "a held call finished while the lock was held");

    lock.rollback().await.unwrap();
    for call in held {
        let accepted = call.await.unwrap().unwrap().into_inner();
        assert!(!accepted.replayed);
    }
    assert_eq!(app.count("orders").await, 2, "only the two admitted calls wrote");
    let after = app.client.clone().submit_order(order(5, "after")).await;
    assert!(after.is_ok(), "the service still answers once load is back: {after:?}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listener_other_hosts_can_reach_refuses_plaintext_and_auth_none() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let db = TestDb::migrated(Backend::Sqlite).await;
    let everywhere: std::net::SocketAddr = "0.0.0.0:0".parse().unwrap();

    // Refused before anything is bound.
    let mut unauthenticated = Settings::for_database(&db.url);
    unauthenticated.admin_listen = everywhere;
    let error = Application::build(unauthenticated).await.unwrap_err().to_string();
    assert!(error.contains("--auth none is accepted only when every listener is loopback"), "{error}");

    let mut plaintext = Settings::for_database(&db.url);
    plaintext.listen = everywhere;
    plaintext.security.auth = AuthSettings::jwt(&pki.jwks, ISSUER, AUDIENCE);
    let error = Application::build(plaintext).await.unwrap_err().to_string();
    assert!(error.contains("is not a loopback address and no --tls-cert/--tls-key is set"), "{error}");

    let mut no_jwks = Settings::for_database(&db.url);
    no_jwks.security.auth =
        AuthSettings { auth_jwks: None, ..AuthSettings::jwt(&pki.jwks, ISSUER, AUDIENCE) };
    let error = Application::build(no_jwks).await.unwrap_err().to_string();
    assert!(error.contains("--auth jwt needs --auth-jwks"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_service_refuses_plaintext_other_hosts_can_reach_before_connecting_to_anything() {
    // The "database" and the "broker": a port that takes connections into its backlog and never
    // answers, so a service that connected first would wait there and report that instead.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    silent.set_nonblocking(true).unwrap();
    let port = silent.local_addr().unwrap().port();
    let database_url = format!("postgres://postgres@127.0.0.1:{port}/nothing");
    let brokers = format!("127.0.0.1:{port}");
    let everywhere: std::net::SocketAddr = "0.0.0.0:0".parse().unwrap();

    let mut relay = idempost_relay::Settings::new(&database_url, &brokers);
    relay.listen = everywhere;
    let error = idempost_relay::Application::build(relay).await.unwrap_err().to_string();
    assert!(error.contains("is not a loopback address and no --tls-cert/--tls-key is set"), "{error}");

    // The consumer serves its admin service on that listener too, so it needs real callers
    // (--auth none is refused off loopback before this check, which is not what this test shows).
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let mut consumer = idempost_consumer::Settings::new(&database_url, &brokers);
    consumer.listen = everywhere;
    consumer.auth = AuthSettings::jwt(&pki.jwks, ISSUER, AUDIENCE);
    let error = idempost_consumer::Application::build(consumer).await.unwrap_err().to_string();
    assert!(error.contains("is not a loopback address and no --tls-cert/--tls-key is set"), "{error}");

    let mut order = Settings::for_database(&database_url);
    order.listen = everywhere;
    order.security.auth = AuthSettings::jwt(&pki.jwks, ISSUER, AUDIENCE);
    let error = Application::build(order).await.unwrap_err().to_string();
    assert!(error.contains("is not a loopback address and no --tls-cert/--tls-key is set"), "{error}");

    let attempt = silent.accept();
    assert!(
        matches!(&attempt, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "something connected before the policy was checked: {attempt:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_certificate_replaced_while_the_service_runs_is_served_to_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let (_db, server, port, _) = tls_service(Backend::Sqlite, &pki, |s| {
        s.security.listeners.reload_every = Duration::from_millis(100)
    })
    .await;
    let url = format!("https://localhost:{port}");
    let old = ClientTls { ca_file: Some(pki.ca.clone()), identity: None };
    assert_eq!(reconcile_over(&url, &old).await, Ok(Code::NotFound));

    // A new CA and certificate are renamed over the served files.
    let next_dir = tempfile::tempdir().unwrap();
    let next = Pki::make(next_dir.path()).unwrap();
    std::fs::rename(&next.key, &pki.key).unwrap();
    std::fs::rename(&next.cert, &pki.cert).unwrap();
    let new = ClientTls { ca_file: Some(next.ca.clone()), identity: None };
    assert_eventually("new connections get the new certificate", WAIT, || {
        let (url, old, new) = (url.clone(), old.clone(), new.clone());
        async move {
            reconcile_over(&url, &new).await == Ok(Code::NotFound)
                && reconcile_over(&url, &old).await.is_err()
        }
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_service_log_never_contains_a_token_it_was_sent() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let db = TestDb::migrated(Backend::Sqlite).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut args = vec![
        format!("--database-url={}", db.url),
        format!("--listen=127.0.0.1:{port}"),
        "--admin-listen=127.0.0.1:0".to_owned(),
    ];
    args.extend(jwt_flags(&pki));
    let env = [("RUST_LOG", "trace".to_owned())];
    let mut service = TestService::spawn_logged("idempost-order", &args, &env, dir.path().join("order.log"));
    let mut client = crate::helpers::connect_order_service(&format!("http://127.0.0.1:{port}")).await;

    let now = jsonwebtoken::get_current_timestamp();
    let expired = pki.token(json!({ "sub": "late", "tenant_id": 7, "exp": now - 3600 })).unwrap();
    let forged = pki::token_from_unknown_key("key-1", json!({ "sub": "forger", "tenant_id": 7 })).unwrap();
    let (good, other) = (tenant(&pki, 7), tenant(&pki, 8));
    let tokens = [&expired, &forged, &good, &other];
    client.submit_order(with_token(order(0, "logged"), &good)).await.unwrap();
    for token in tokens {
        let _ = client.submit_order(with_token(order(7, "logged-2"), token)).await;
        let _ = client
            .reconcile(with_token(pb::ReconcileRequest { tenant_id: 7, request_id: "x".into() }, token))
            .await;
    }
    let _ = client.submit_order(with_token(order(7, "garbage"), "garbage-token-value")).await;
    service.kill().await;

    let logged = service.log();
    assert!(logged.contains("call refused"), "the refusals were not logged at all:\n{logged}");
    for token in tokens {
        // Any of a JWT's three parts would give it away; the signature is unique to the token.
        let signature = token.rsplit('.').next().unwrap();
        assert!(!logged.contains(signature), "a token reached the log");
    }
    assert!(!logged.contains("garbage-token-value"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_past_the_server_deadline_ends_deadline_exceeded_and_commits_nothing() {
    let app = TestOrder::spawn_with(Backend::Postgres, |settings| {
        settings.security.listeners.call_timeout = Duration::from_millis(500);
    })
    .await;
    let lock = app.conn.begin().await.unwrap();
    lock.execute_unprepared("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE").await.unwrap();

    // The client sets no deadline of its own: the server's ends the call, with the code gRPC
    // gives a passed deadline (tonic's own server timeout would say CANCELLED).
    let answer = app.client.clone().submit_order(order(5, "too-slow")).await.unwrap_err();
    assert_eq!(answer.code(), Code::DeadlineExceeded, "{answer:?}");

    lock.rollback().await.unwrap();
    // The abandoned transaction never committed: Reconcile finds nothing, as the safe caller
    // protocol expects after a call whose deadline passed.
    let missing = app.reconcile(5, "too-slow").await.unwrap_err();
    assert_eq!(reason(&missing), "ORDER_NOT_FOUND");
    assert_eq!(app.count("orders").await, 0);
    assert_eq!(app.count("outbox_event").await, 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempostctl_reads_the_admin_listener_over_tls_with_an_operator_token_only() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let jwks = pki.jwks.clone();
    let (_db, server, _, admin_port) =
        tls_service(Backend::Sqlite, &pki, |s| s.security.auth = AuthSettings::jwt(jwks, ISSUER, AUDIENCE))
            .await;
    let url = format!("--admin-url=https://localhost:{admin_port}");
    let operator_file = dir.path().join("operator.jwt");
    std::fs::write(&operator_file, operator(&pki, "alice")).unwrap();
    let tenant_token = tenant(&pki, 7);

    let ctl = |args: Vec<String>, token: Option<&str>| {
        let mut command = tokio::process::Command::new(crate::helpers::service_binary("idempostctl"));
        command.args(args).env_remove("IDEMPOST_TOKEN").env_remove("IDEMPOST_TOKEN_FILE");
        if let Some(token) = token {
            command.env("IDEMPOST_TOKEN", token);
        }
        async move {
            let output = command.output().await.unwrap();
            let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
            (output.status.success(), text(output.stdout), text(output.stderr))
        }
    };
    let ca = format!("--ca-file={}", pki.ca.display());
    let with_file = format!("--token-file={}", operator_file.display());

    let (ok, stdout, stderr) =
        ctl(vec![url.clone(), ca.clone(), with_file, "--json".into(), "backlog".into()], None).await;
    assert!(ok, "{stderr}");
    assert!(stdout.contains("\"stats\""), "{stdout}");
    let (ok, _, stderr) = ctl(vec![url.clone(), ca.clone(), "backlog".into()], Some(&tenant_token)).await;
    assert!(!ok && stderr.contains("PermissionDenied") && stderr.contains("SCOPE_MISSING"), "{stderr}");
    assert!(!stderr.contains(&tenant_token), "idempostctl printed the token");
    let (ok, _, stderr) = ctl(vec![url.clone(), ca, "backlog".into()], None).await;
    assert!(!ok && stderr.contains("TOKEN_MISSING"), "{stderr}");
    let (ok, _, stderr) = ctl(vec![url, "backlog".into()], Some(&tenant_token)).await;
    assert!(!ok, "a TLS listener answered idempostctl without a CA: {stderr}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reflection_switched_off_is_off_on_the_admin_listener_too_and_on_by_default_on_loopback() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest,
    };
    let list = || ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let reflect = |port: u16| async move {
        let channel =
            Channel::from_shared(format!("http://127.0.0.1:{port}")).unwrap().connect().await.unwrap();
        match ServerReflectionClient::new(channel)
            .server_reflection_info(futures::stream::iter([list()]))
            .await
        {
            Ok(answers) => answers.into_inner().message().await.unwrap().map(|_| Code::Ok),
            Err(status) => Some(status.code()),
        }
    };
    for (reflection, expected) in [(Some(false), Code::Unimplemented), (None, Code::Ok)] {
        let app =
            TestOrder::spawn_with(Backend::Sqlite, |settings| settings.security.auth.reflection = reflection)
                .await;
        assert_eq!(reflect(app.port).await, Some(expected), "public listener, --reflection {reflection:?}");
        assert_eq!(
            reflect(app.admin_port).await,
            Some(expected),
            "admin listener, --reflection {reflection:?}"
        );
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_consumers_admin_service_checks_tokens_like_the_order_service_and_answers_operators_only() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let db = TestDb::migrated(Backend::Sqlite).await;
    let broker = crate::broker::TestBroker::start().await;
    let settings = jwt_consumer_settings(&db, &broker, &pki);
    let consumer = idempost_consumer::Application::build(settings).await.unwrap();
    let port = consumer.port();
    let consumer = InProcess::spawn(|shutdown| consumer.run_until_stopped(shutdown));
    let mut admin = ConsumerAdminServiceClient::connect(format!("http://127.0.0.1:{port}")).await.unwrap();
    let (seven, ops) = (tenant(&pki, 7), operator(&pki, "alice"));
    let timeline = || pb::GetConsumerTimelineRequest { event_id: uuid::Uuid::now_v7().to_string() };
    let purge = || pb::PurgeConsumedRequest { dry_run: true, ..Default::default() };

    let answer = admin.get_consumer_timeline(timeline()).await;
    assert_eq!(refusal(answer, ""), (Code::Unauthenticated, "TOKEN_MISSING".into()));
    let answer = admin.get_consumer_timeline(with_token(timeline(), "not.a.token")).await;
    assert_eq!(refusal(answer, "not.a.token"), (Code::Unauthenticated, "TOKEN_INVALID".into()));
    // The consumer's tables do not know tenants: a tenant's token reads nothing there.
    let answer = admin.get_consumer_timeline(with_token(timeline(), &seven)).await;
    assert_eq!(refusal(answer, &seven), (Code::PermissionDenied, "SCOPE_MISSING".into()));
    let answer = admin.purge_consumed(with_token(purge(), &seven)).await;
    assert_eq!(refusal(answer, &seven), (Code::PermissionDenied, "SCOPE_MISSING".into()));
    let answer = admin.list_dead_letters(with_token(pb::ListDeadLettersRequest::default(), &seven)).await;
    assert_eq!(refusal(answer, &seven), (Code::PermissionDenied, "SCOPE_MISSING".into()));

    let found = admin.get_consumer_timeline(with_token(timeline(), &ops)).await.unwrap().into_inner();
    assert!(found.timeline.unwrap().consumers.is_empty());
    let purged = admin.purge_consumed(with_token(purge(), &ops)).await.unwrap().into_inner();
    assert_eq!(purged.consumed_rows, 0);
    // Health on the same listener stays open to probes without a token.
    assert!(idempost_testkit::health::health(port, "").await.is_some(), "health answers without a token");
    consumer.stop().await;
}

/// A consumer on `db` and `broker` in a group of its own that accepts the tokens `pki` signs.
fn jwt_consumer_settings(
    db: &TestDb,
    broker: &crate::broker::TestBroker,
    pki: &Pki,
) -> idempost_consumer::Settings {
    let mut settings = idempost_consumer::Settings::new(&db.url, broker.address());
    settings.group_id = Some(format!("security-{}", uuid::Uuid::new_v4().simple()));
    settings.shutdown_grace = Duration::from_secs(5);
    settings.auth = AuthSettings::jwt(pki.jwks.clone(), ISSUER, AUDIENCE);
    settings
}

/// A call to the consumer's ConsumerAdminService `method` on `port` with `token`, whose request
/// message declares `declared` bytes and never arrives: the `grpc-status` it is answered with.
async fn consumer_call_declaring(port: u16, method: &str, token: &str, declared: u32) -> Option<String> {
    use futures::StreamExt as _;
    use http_body_util::StreamBody;
    use hyper::body::{Bytes, Frame};

    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(tcp);
    let (mut send, connection) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io).await.unwrap();
    tokio::spawn(connection);
    let mut prefix = vec![0u8];
    prefix.extend_from_slice(&declared.to_be_bytes());
    let first = Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(prefix)));
    let body = StreamBody::new(futures::stream::iter([first]).chain(futures::stream::pending()));
    let request =
        hyper::Request::post(format!("http://127.0.0.1:{port}/idempost.v1.ConsumerAdminService/{method}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("authorization", format!("Bearer {token}"))
            .body(body)
            .unwrap();
    let answer = tokio::time::timeout(WAIT, send.send_request(request)).await.expect("answered at once");
    answer.unwrap().headers().get("grpc-status").map(|status| status.to_str().unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_consumers_admin_service_refuses_tenants_and_oversized_requests_before_reading_them() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let db = TestDb::migrated(Backend::Sqlite).await;
    let broker = crate::broker::TestBroker::start().await;
    let mut settings = jwt_consumer_settings(&db, &broker, &pki);
    // Far longer than the test waits: only the admission or the message limit can answer.
    settings.security.body_timeout = Duration::from_secs(600);
    settings.security.call_timeout = Duration::from_secs(600);
    let consumer = idempost_consumer::Application::build(settings).await.unwrap();
    let port = consumer.port();
    let consumer = InProcess::spawn(|shutdown| consumer.run_until_stopped(shutdown));
    let (seven, ops) = (tenant(&pki, 7), operator(&pki, "alice"));

    for method in ["ListDeadLetters", "PurgeConsumed", "ReleaseParkedGap"] {
        let status = consumer_call_declaring(port, method, &seven, 1024 * 1024).await;
        assert_eq!(status.as_deref(), Some("7"), "{method}: PERMISSION_DENIED before the body");
    }
    let status = consumer_call_declaring(port, "ListDeadLetters", &ops, 100 * 1024).await;
    assert_eq!(status.as_deref(), Some("11"), "OUT_OF_RANGE past 64 KiB, before the body");
    consumer.stop().await;
}
