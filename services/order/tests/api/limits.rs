//! Refuse before you spend: callers cannot starve the service of what its health, its other
//! callers or the process itself need.

use std::time::Duration;

use idempost_proto::v1::order_service_client::OrderServiceClient;
use idempost_testkit::order::order_process;
use sea_orm::{ConnectionTrait, TransactionTrait};
use tonic::codegen::{Bytes, http};
use tonic::transport::Channel;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::helpers::{Backend, TestDb, TestOrder, assert_eventually, order};
use crate::otlp::{Received, start_receiver};
use idempost_testkit::auth::{authenticated, tenant, with_token};
use idempost_testkit::health::health;

use idempost_testkit::wait::WAIT;

mod admin;
mod delivery;
mod health;

/// How long health would take to turn NOT_SERVING if its ping queued behind the callers' pool:
/// the ping's 2 s timeout after a 1 s check interval, three times over.
const HEALTH_WOULD_FAIL_WITHIN: Duration = Duration::from_secs(9);

/// Locks the `orders` table from a session of the test's own, so that every Reconcile blocks
/// while holding one of the service's pooled connections; SQL to undo it.
async fn lock_orders(app: &TestOrder) -> (sea_orm::DatabaseTransaction, &'static str) {
    let lock = app.conn.begin().await.unwrap();
    match app.conn.get_database_backend() {
        sea_orm::DbBackend::Postgres => {
            lock.execute_unprepared("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE").await.unwrap();
            (lock, "SELECT 1")
        }
        _ => {
            lock.execute_unprepared("LOCK TABLES orders WRITE").await.unwrap();
            (lock, "UNLOCK TABLES")
        }
    }
}

/// Sessions of this database waiting for the lock.
async fn waiting_for_the_lock(app: &TestOrder) -> i64 {
    let sql = match app.conn.get_database_backend() {
        sea_orm::DbBackend::Postgres => {
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        }
        _ => {
            "SELECT COUNT(*) FROM information_schema.processlist WHERE db = DATABASE() \
             AND state = 'Waiting for table metadata lock'"
        }
    };
    app.scalar_i64(sql).await
}

async fn health_stays_serving_while_callers_hold_every_pooled_connection(backend: Backend) {
    let app = TestOrder::spawn_with(backend, |settings| settings.db_max_connections = 2).await;
    let (lock, unlock) = lock_orders(&app).await;
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let mut client = app.client.clone();
            let request = idempost_proto::v1::ReconcileRequest { tenant_id: 1, request_id: format!("r-{i}") };
            tokio::spawn(async move { client.reconcile(request).await })
        })
        .collect();
    assert_eventually("both pooled connections wait behind the lock", WAIT, || async {
        waiting_for_the_lock(&app).await >= 2
    })
    .await;

    let until = tokio::time::Instant::now() + HEALTH_WOULD_FAIL_WITHIN;
    while tokio::time::Instant::now() < until {
        assert_eq!(
            health(app.port, "").await,
            Some(ServingStatus::Serving),
            "the database answers, so health says SERVING however busy the callers' pool is"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    lock.execute_unprepared(unlock).await.unwrap();
    lock.rollback().await.unwrap();
    for call in calls {
        // Each call ends (not found, or refused after waiting for a connection): none hangs.
        let _ = call.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_stays_serving_while_callers_hold_every_pooled_connection_on_mariadb() {
    health_stays_serving_while_callers_hold_every_pooled_connection(Backend::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_stays_serving_while_callers_hold_every_pooled_connection_on_postgres() {
    health_stays_serving_while_callers_hold_every_pooled_connection(Backend::Postgres).await;
}

/// A raw HTTP/2 connection to `port`: to send what no well-behaved gRPC client sends.
async fn raw_connection(port: u16) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send
}

/// A gRPC call to `path` that sends its headers (with `token`, if any) and never finishes its
/// body; the answer, and the open request stream to keep it stalled.
async fn stalled_call(
    send: &mut h2::client::SendRequest<Bytes>,
    path: &str,
    token: Option<&str>,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let mut request = http::Request::post(format!("http://127.0.0.1{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    futures::future::poll_fn(|cx| send.poll_ready(cx)).await.unwrap();
    send.send_request(request.body(()).unwrap(), false).unwrap()
}

/// A call to `path` whose request message declares `declared` bytes and sends only its length
/// prefix; the answer, and the open request stream to keep it stalled.
async fn declaring(
    send: &mut h2::client::SendRequest<Bytes>,
    path: &str,
    token: Option<&str>,
    declared: u32,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let (response, mut body) = stalled_call(send, path, token).await;
    let mut prefix = vec![0u8];
    prefix.extend_from_slice(&declared.to_be_bytes());
    crate::helpers::send_after_headers(&mut body, Bytes::from(prefix), false);
    (response, body)
}

/// A complete call to `path` with an empty request message; the answer.
async fn raw_call(
    send: &mut h2::client::SendRequest<Bytes>,
    path: &str,
) -> Result<(String, Bytes), h2::Error> {
    let request = http::Request::post(format!("http://127.0.0.1{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    futures::future::poll_fn(|cx| send.poll_ready(cx)).await?;
    let (response, mut body) = send.send_request(request, false)?;
    crate::helpers::send_after_headers(&mut body, Bytes::from_static(&[0, 0, 0, 0, 0]), true);
    grpc_answer(response).await
}

/// The `grpc-status` of an answer (in its headers when it is trailers-only, else in its
/// trailers) and its message bytes.
async fn grpc_answer(response: h2::client::ResponseFuture) -> Result<(String, Bytes), h2::Error> {
    let response = response.await?;
    if let Some(status) = response.headers().get("grpc-status") {
        return Ok((status.to_str().unwrap().to_owned(), Bytes::new()));
    }
    let mut body = response.into_body();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await?.unwrap_or_default();
    let status = trailers.get("grpc-status").map(|s| s.to_str().unwrap().to_owned()).unwrap_or_default();
    Ok((status, Bytes::from(data)))
}

async fn status_within(response: h2::client::ResponseFuture, wait: Duration) -> String {
    let answer =
        tokio::time::timeout(wait, grpc_answer(response)).await.expect("the call is answered in time");
    answer.unwrap().0
}

const SUBMIT: &str = "/idempost.v1.OrderService/SubmitOrder";
const RECONCILE: &str = "/idempost.v1.OrderService/Reconcile";
/// gRPC's codes as they travel in `grpc-status`.
const OK: &str = "0";
const DEADLINE_EXCEEDED: &str = "4";
const RESOURCE_EXHAUSTED: &str = "8";
const UNAUTHENTICATED: &str = "16";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundreds_of_stalled_streams_without_a_token_are_refused_at_once_and_starve_no_caller() {
    let (app, pki, _dir) = authenticated(Backend::Sqlite, |settings| {
        settings.security.listeners.max_concurrent_calls = Some(16);
        // Every stalled stream stays open to be answered (by default the 8th refusal closes its
        // connection: `peers::a_connection_is_closed_after_its_refused_calls_each_answered`).
        settings.security.listeners.max_refused_calls = 1000;
    })
    .await;
    let (mut stalled, mut connections) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        let mut connection = raw_connection(app.port).await;
        for _ in 0..100 {
            stalled.push(stalled_call(&mut connection, SUBMIT, None).await);
        }
        connections.push(connection);
    }

    let token = tenant(&pki, 7);
    let answer = app.client.clone().submit_order(with_token(order(7, "while-stalled"), &token)).await;
    assert!(answer.is_ok(), "the authenticated caller is served: {answer:?}");

    for (response, _open) in stalled {
        assert_eq!(status_within(response, WAIT).await, UNAUTHENTICATED, "refused before its body");
    }
    assert_eq!(app.count("orders").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_authenticated_body_that_never_finishes_ends_at_the_body_timeout_and_frees_its_permits() {
    let (app, pki, _dir) = authenticated(Backend::Sqlite, |settings| {
        let listeners = &mut settings.security.listeners;
        listeners.max_concurrent_calls = Some(2);
        listeners.max_calls_per_connection = Some(2);
        listeners.body_timeout = Duration::from_secs(1);
        // Far longer than the test waits: only the body timeout can end these calls.
        listeners.call_timeout = Duration::from_secs(600);
    })
    .await;
    let token = tenant(&pki, 7);
    let mut connection = raw_connection(app.port).await;
    let stalled = [
        stalled_call(&mut connection, SUBMIT, Some(&token)).await,
        stalled_call(&mut connection, SUBMIT, Some(&token)).await,
    ];

    for (response, _open) in stalled {
        assert_eq!(status_within(response, WAIT).await, DEADLINE_EXCEEDED);
    }
    let answer = app.client.clone().submit_order(with_token(order(7, "after-stall"), &token)).await;
    assert!(answer.is_ok(), "the permits were given back: {answer:?}");
    assert_eq!(app.count("orders").await, 1, "a stalled body wrote nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_connection_cannot_take_every_call_of_its_listener() {
    let (app, pki, _dir) = authenticated(Backend::Sqlite, |settings| {
        let listeners = &mut settings.security.listeners;
        listeners.max_concurrent_calls = Some(4);
        listeners.max_calls_per_connection = Some(2);
        listeners.body_timeout = Duration::from_secs(600);
        listeners.call_timeout = Duration::from_secs(600);
    })
    .await;
    let token = tenant(&pki, 7);
    let mut greedy = raw_connection(app.port).await;
    let mut calls = Vec::new();
    for _ in 0..3 {
        calls.push(stalled_call(&mut greedy, RECONCILE, Some(&token)).await);
    }
    let (answers, _open): (Vec<_>, Vec<_>) = calls.into_iter().unzip();

    // Which of the three the server takes last is up to its scheduler: that one is refused.
    let answers = answers.into_iter().map(|answer| Box::pin(grpc_answer(answer)));
    let first = tokio::time::timeout(WAIT, futures::future::select_all(answers)).await;
    let (refused, _, _still_open) = first.expect("one of the three is answered at once");
    assert_eq!(refused.unwrap().0, RESOURCE_EXHAUSTED, "the call past its connection's share is refused");

    let request = idempost_proto::v1::ReconcileRequest { tenant_id: 7, request_id: "other".into() };
    let answer = app.client.clone().reconcile(with_token(request, &token)).await.unwrap_err();
    assert_eq!(answer.code(), tonic::Code::NotFound, "another connection is still served: {answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_watch_streams_are_bounded_per_listener() {
    let app = TestOrder::spawn_with(Backend::Sqlite, |settings| {
        settings.security.listeners.max_watch_streams = 2;
    })
    .await;
    let mut health = HealthClient::new(app.channel().await);
    let watch = || HealthCheckRequest { service: String::new() };
    let mut first = health.watch(watch()).await.unwrap().into_inner();
    let second = health.watch(watch()).await.unwrap().into_inner();
    assert_eq!(first.message().await.unwrap().unwrap().status(), ServingStatus::Serving);

    let third = health.watch(watch()).await.unwrap_err();
    assert_eq!(third.code(), tonic::Code::ResourceExhausted, "{third:?}");
    let check = health.check(watch()).await.unwrap().into_inner();
    assert_eq!(check.status(), ServingStatus::Serving, "checks are still answered");

    drop(second);
    assert_eventually("a Watch is admitted again once one closed", WAIT, || {
        let mut health = health.clone();
        async move { health.watch(watch()).await.is_ok() }
    })
    .await;
}

/// How many connections the service shed for `reason` with `action`, as last exported.
fn shed(received: &Received, reason: &str, action: &str) -> f64 {
    received
        .points()
        .iter()
        .filter(|p| p.name == "idempost.listener.connections_shed")
        .filter(|p| p.attribute("idempost.shed.reason") == Some(reason))
        .filter(|p| p.attribute("idempost.shed.action") == Some(action))
        .map(|p| p.value)
        .fold(0.0, f64::max)
}

/// Whether the server closed `connection` without answering an HTTP/2 health check on it.
async fn closed_without_an_answer(connection: tokio::net::TcpStream) -> bool {
    let Ok((mut send, driver)) = h2::client::handshake(connection).await else { return true };
    tokio::spawn(async move {
        let _ = driver.await;
    });
    let answer = tokio::time::timeout(WAIT, raw_call(&mut send, "/grpc.health.v1.Health/Check")).await;
    !matches!(answer.expect("answered or closed in time"), Ok((status, _)) if status == OK)
}

/// The client connected before the shedding is still answered, and so is a new health probe.
async fn still_served(client: &OrderServiceClient<Channel>, port: u16) {
    let request = idempost_proto::v1::ReconcileRequest { tenant_id: 7, request_id: "x".into() };
    let answer = client.clone().reconcile(request).await;
    assert_eq!(answer.unwrap_err().code(), tonic::Code::NotFound, "the existing client is still served");
    assert_eventually("a new health probe is answered SERVING", WAIT, || async {
        health(port, "").await == Some(ServingStatus::Serving)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_past_the_cap_are_closed_and_counted_while_existing_clients_and_health_keep_working() {
    let (endpoint, received, _receiver) = start_receiver().await;
    let db = TestDb::migrated(Backend::Sqlite).await;
    let (_service, port) = order_process(&db, endpoint, &["--max-connections=2"], None).await;
    let url = format!("http://127.0.0.1:{port}");
    let client = crate::helpers::connect_order_service(&url).await;
    let _second = raw_connection(port).await;

    // Eight past the cap are kept for health checks only; the rest are closed at once.
    let mut extra = Vec::new();
    for _ in 0..20 {
        extra.push(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    // Every one is let in or shed before any is used: a connection answered and closed early
    // frees its slot, which one the service had not yet accepted would take.
    assert_eventually("the service let in or shed all twenty", WAIT, || async {
        shed(&received, "connections", "closed") + shed(&received, "connections", "health_only") >= 20.0
    })
    .await;
    let closed = futures::future::join_all(extra.into_iter().map(closed_without_an_answer)).await;
    assert!(closed.iter().filter(|c| **c).count() >= 12, "past the cap connections are closed: {closed:?}");
    assert_eventually("the shed connections are counted", WAIT, || async {
        shed(&received, "connections", "closed") >= 12.0
    })
    .await;

    still_served(&client, port).await;
    let mut overflow = raw_connection(port).await;
    let (status, _) = raw_call(&mut overflow, SUBMIT).await.unwrap();
    assert_eq!(status, RESOURCE_EXHAUSTED, "a connection past the cap serves health checks only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn near_its_open_file_limit_the_service_sheds_new_connections_and_health_still_answers() {
    let (endpoint, received, _receiver) = start_receiver().await;
    let db = TestDb::migrated(Backend::Sqlite).await;
    let (_service, port) = order_process(&db, endpoint, &[], Some(256)).await;
    let url = format!("http://127.0.0.1:{port}");
    let client = crate::helpers::connect_order_service(&url).await;

    // Far below --max-connections (512), so only the descriptor limit can shed them.
    let mut open = Vec::new();
    for _ in 0..300 {
        open.push(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    assert_eventually("connections shed near the descriptor limit are counted", WAIT, || async {
        shed(&received, "descriptors", "closed") >= 1.0
    })
    .await;

    still_served(&client, port).await;
}
