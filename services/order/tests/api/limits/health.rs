//! Health and reflection need no token, so what they may cost is bounded without one: a tiny
//! request, the body timeout, and a few Watch streams per connection.

use std::time::Duration;

use idempost_testkit::order::order_process;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use super::{declaring, raw_connection, status_within};
use crate::helpers::{Backend, TestDb, TestOrder, assert_eventually};
use crate::otlp::start_receiver;
use idempost_testkit::wait::WAIT;

const CHECK: &str = "/grpc.health.v1.Health/Check";
const REFLECTION: &str = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
const OUT_OF_RANGE: &str = "11";
const DEADLINE_EXCEEDED: &str = "4";
/// tonic's default message limit: what a health check could declare before.
const FOUR_MIB: u32 = 4 * 1024 * 1024;

/// The resident memory of process `pid`, in KiB.
fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_checks_declaring_four_mebibyte_messages_are_refused_at_once_and_cost_no_memory() {
    let (endpoint, _received, _receiver) = start_receiver().await;
    let db = TestDb::migrated(Backend::Sqlite).await;
    let (service, port) = order_process(&db, endpoint, &[], None).await;
    let pid = service.pid().unwrap();
    let before = resident_kib(pid);

    let mut connection = raw_connection(port).await;
    let mut stalled = Vec::new();
    for _ in 0..64 {
        stalled.push(declaring(&mut connection, CHECK, None, FOUR_MIB).await);
    }
    for (response, _open) in stalled {
        assert_eq!(status_within(response, WAIT).await, OUT_OF_RANGE, "refused before any of it is read");
    }
    let grown = resident_kib(pid).saturating_sub(before);
    assert!(grown < 16 * 1024, "64 refused health checks grew the service by {grown} KiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_health_check_whose_body_never_finishes_ends_at_the_body_timeout() {
    let app = TestOrder::spawn_with(Backend::Sqlite, |settings| {
        let listeners = &mut settings.security.listeners;
        listeners.body_timeout = Duration::from_secs(1);
        listeners.call_timeout = Duration::from_secs(600);
    })
    .await;
    let mut connection = raw_connection(app.port).await;
    let (response, _open) = declaring(&mut connection, CHECK, None, 10).await;
    assert_eq!(status_within(response, WAIT).await, DEADLINE_EXCEEDED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reflection_request_over_four_kibibytes_ends_its_stream_at_once() {
    let app = TestOrder::spawn_with(Backend::Sqlite, |settings| {
        settings.security.listeners.body_timeout = Duration::from_secs(600);
    })
    .await;
    let mut connection = raw_connection(app.port).await;
    let (response, _open) = declaring(&mut connection, REFLECTION, None, 64 * 1024).await;
    let answer = tokio::time::timeout(WAIT, super::grpc_answer(response)).await;
    let (_status, message) = answer.expect("the stream ends at once").unwrap();
    assert!(message.is_empty(), "nothing of the request was answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_watch_streams_are_bounded_per_connection() {
    let app = TestOrder::spawn(Backend::Sqlite).await;
    let watch = || HealthCheckRequest { service: String::new() };
    let mut health = HealthClient::new(app.channel().await);
    let mut open = Vec::new();
    for _ in 0..4 {
        open.push(health.watch(watch()).await.unwrap().into_inner());
    }
    let fifth = health.watch(watch()).await.unwrap_err();
    assert_eq!(fifth.code(), tonic::Code::ResourceExhausted, "{fifth:?}");
    let check = health.check(watch()).await.unwrap().into_inner();
    assert_eq!(check.status(), ServingStatus::Serving, "checks are still answered");

    // The listener's bound (32) is not reached: another connection may watch.
    let mut other = HealthClient::new(app.channel().await);
    assert!(other.watch(watch()).await.is_ok(), "another connection's Watch is admitted");
    drop(open.pop());
    assert_eventually("a Watch is admitted again once one on this connection closed", WAIT, || {
        let mut health = health.clone();
        async move { health.watch(watch()).await.is_ok() }
    })
    .await;
}
