//! The call timeout covers the answer's delivery: a caller that never reads its answer (an
//! HTTP/2 window left at zero) keeps the call's permit no longer than the call timeout, and then
//! loses the stream with its connection.

use std::time::Duration;

use tokio::task::JoinHandle;
use tonic::codegen::{Bytes, http};
use tonic_health::pb::HealthCheckRequest;

use super::SUBMIT;
use crate::helpers::{Backend, TestOrder, assert_eventually, order};
use idempost_testkit::wait::WAIT;

/// A raw HTTP/2 connection to `port` that never gives the server a window to send an answer's
/// message in; its driver ends when the server closes the connection.
async fn never_reading(port: u16) -> (h2::client::SendRequest<Bytes>, JoinHandle<()>) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (send, connection) = h2::client::Builder::new().initial_window_size(0).handshake(tcp).await.unwrap();
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    (send, driver)
}

/// A complete call to `path` with `message`; the answer's headers (which flow control does not
/// hold back).
async fn call_with(
    send: &mut h2::client::SendRequest<Bytes>,
    path: &str,
    message: &impl prost::Message,
) -> http::Response<h2::RecvStream> {
    let request = http::Request::post(format!("http://127.0.0.1{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    futures::future::poll_fn(|cx| send.poll_ready(cx)).await.unwrap();
    let (response, mut body) = send.send_request(request, false).unwrap();
    let message = message.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&message);
    body.send_data(Bytes::from(framed), true).unwrap();
    tokio::time::timeout(WAIT, response).await.expect("the answer's headers arrive").unwrap()
}

/// Whether a Reconcile on the harness's own connection is served (not refused for a permit).
async fn served(app: &TestOrder) -> bool {
    let request = idempost_proto::v1::ReconcileRequest { tenant_id: 7, request_id: "other".into() };
    let answer = app.client.clone().reconcile(request).await;
    !matches!(answer, Err(status) if status.code() == tonic::Code::ResourceExhausted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_caller_that_never_reads_its_answer_holds_its_permit_only_until_the_call_timeout() {
    let app = TestOrder::spawn_with(Backend::Sqlite, |settings| {
        let listeners = &mut settings.security.listeners;
        listeners.max_concurrent_calls = Some(1);
        listeners.max_calls_per_connection = Some(1);
        // Room for the checks below on a loaded machine before the permit is given back.
        listeners.call_timeout = Duration::from_secs(5);
    })
    .await;
    let (mut reader, driver) = never_reading(app.port).await;
    let answer = call_with(&mut reader, SUBMIT, &order(7, "never-read")).await;
    assert_eq!(answer.status(), http::StatusCode::OK);
    assert!(!served(&app).await, "the unread answer holds the listener's only permit");
    assert_eq!(app.count("orders").await, 1, "the call took effect; only its answer waits");

    assert_eventually("another caller is served once the call timeout passed", WAIT, || served(&app)).await;
    tokio::time::timeout(WAIT, driver).await.expect("the reader's connection is closed").unwrap();
    let unread = tokio::time::timeout(WAIT, answer.into_body().data()).await.expect("the stream ends");
    assert!(matches!(unread, Some(Err(_))), "the answer was never delivered: {unread:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_health_check_whose_answer_is_never_read_ends_with_its_connection_at_the_call_timeout() {
    let app = TestOrder::spawn_with(Backend::Sqlite, |settings| {
        settings.security.listeners.call_timeout = Duration::from_secs(1);
    })
    .await;
    let (mut reader, driver) = never_reading(app.port).await;
    let answer = call_with(&mut reader, "/grpc.health.v1.Health/Check", &HealthCheckRequest::default()).await;
    assert_eq!(answer.status(), http::StatusCode::OK);
    tokio::time::timeout(WAIT, driver).await.expect("the connection is closed at the call timeout").unwrap();
}
