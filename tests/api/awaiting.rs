//! The hooks for users' own integration tests against real services: the Rust client's
//! `await_published` and `await_consumed`, and `idempostctl wait` with its exit codes. An event
//! is awaited until published and until consumed by a named consumer; a wait with no relay
//! running times out; a FAILED, dead-lettered or parked event ends the wait with its own answer;
//! another tenant's event is not revealed. (The Python and TypeScript clients' await tests are in
//! their own suites, python.rs and typescript.rs.)

use std::time::Duration;

use chrono::Utc;
use idempost::security::AuthSettings;
use idempost_client::{AdminEndpoint, AwaitError, BearerToken, await_consumed, await_published};
use idempost_consumer::DEFAULT_CONSUMER_NAME;
use idempost_testkit::auth::{authenticated, operator, tenant, with_token};
use idempost_testkit::consumer::{TestConsumer, consumer_settings};
use idempost_testkit::pipeline::Pipeline;
use idempost_testkit::pki::{AUDIENCE, ISSUER};
use idempost_testkit::set_aside::{dead_letter, fail_event};
use sea_orm::{ConnectionTrait, Value};
use tonic::Code;
use tonic::transport::Channel;

use crate::broker::TestBroker;
use crate::helpers::{Backend, TestOrder, assert_eventually, on_every_backend, order, service_binary};
use idempost_testkit::wait::WAIT;

/// Long enough for a pipeline on a busy machine; the waits end as soon as the event is there.
const LONG: Duration = Duration::from_secs(60);
/// What a wait that must time out is given.
const SHORT: Duration = Duration::from_secs(2);

async fn endpoint(port: u16, token: Option<&str>) -> AdminEndpoint {
    let channel = Channel::from_shared(format!("http://127.0.0.1:{port}")).unwrap().connect().await.unwrap();
    AdminEndpoint::new(channel, token.map(|t| BearerToken::new(t).unwrap()))
}

/// Runs `sql`, written with `?` placeholders, on the database `conn` is connected to.
async fn exec(conn: &sea_orm::DatabaseConnection, sql: &str, values: Vec<Value>) {
    let statement = idempost_testkit::sql::statement(conn.get_database_backend(), sql, values);
    conn.execute_raw(statement).await.unwrap();
}

fn topic() -> String {
    idempost_testkit::topic::unique("idempost-await")
}

/// `idempostctl` with `args`: its exit code and what it printed.
async fn idempostctl(args: &[&str]) -> (i32, String, String) {
    let output =
        tokio::process::Command::new(service_binary("idempostctl")).args(args).output().await.unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code().unwrap(), text(&output.stdout), text(&output.stderr))
}

on_every_backend!(an_event_is_awaited_until_published_and_until_consumed_by_a_named_consumer);

async fn an_event_is_awaited_until_published_and_until_consumed_by_a_named_consumer(backend: Backend) {
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let pipeline = Pipeline::spawn(backend, &broker.address(), &topic, "await-1").await;
    let accepted = pipeline.order.submit(order(7, "await-1")).await.unwrap();
    let admin = endpoint(pipeline.order.admin_port, None).await;
    let consumer = endpoint(pipeline.consumer.port, None).await;

    let published = await_published(&admin, &accepted.event_id, LONG).await.unwrap();
    let consumed = await_consumed(&consumer, &accepted.event_id, DEFAULT_CONSUMER_NAME, LONG).await.unwrap();

    assert_eq!(
        (published.event_id.as_str(), published.outbox_status.as_str()),
        (accepted.event_id.as_str(), "PUBLISHED")
    );
    assert_eq!(consumed.consumer_name, DEFAULT_CONSUMER_NAME);
    assert_eq!(pipeline.order.rows_for_event("notification_job", &accepted.event_id).await, 1);

    // The command line says the same, with exit code 0.
    let urls = [
        format!("--admin-url=http://127.0.0.1:{}", pipeline.order.admin_port),
        format!("--consumer-admin-url=http://127.0.0.1:{}", pipeline.consumer.port),
    ];
    let (code, out, err) =
        idempostctl(&[&urls[0], "--json", "wait", "--published", &accepted.event_id]).await;
    assert_eq!(code, 0, "{err}");
    let out: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (out["eventId"].as_str(), out["state"].as_str()),
        (Some(accepted.event_id.as_str()), Some("PUBLISHED"))
    );
    let consumed_args =
        [urls[1].as_str(), "wait", "--consumed", &accepted.event_id, "--consumer", DEFAULT_CONSUMER_NAME];
    let (code, out, err) = idempostctl(&consumed_args).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("consumed by"), "{out}");
    pipeline.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_no_relay_running_a_wait_times_out_and_says_what_it_saw_last() {
    let app = TestOrder::spawn(Backend::Sqlite).await;
    let accepted = app.submit(order(7, "no-relay-1")).await.unwrap();
    let admin = endpoint(app.admin_port, None).await;
    let unknown = uuid::Uuid::now_v7().to_string();

    let pending = await_published(&admin, &accepted.event_id, SHORT).await.unwrap_err();
    let never = await_published(&admin, &unknown, SHORT).await.unwrap_err();

    let AwaitError::TimedOut { last_state, timeout, .. } = pending else { panic!("{pending:?}") };
    assert_eq!((last_state.as_str(), timeout), ("PENDING", SHORT));
    let AwaitError::TimedOut { last_state, .. } = never else { panic!("{never:?}") };
    assert_eq!(last_state, "UNKNOWN");
    let admin_url = format!("--admin-url=http://127.0.0.1:{}", app.admin_port);
    let (code, _, err) =
        idempostctl(&[&admin_url, "wait", "--published", &accepted.event_id, "--timeout=1s"]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("still PENDING"), "{err}");
    let (code, _, err) = idempostctl(&[&admin_url, "wait", "--published", "not-an-id", "--timeout=1s"]).await;
    assert_eq!(code, 1, "an invalid id is a failed call, not a timeout: {err}");
    assert!(err.contains("INVALID_REQUEST"), "{err}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_dead_lettered_or_parked_event_ends_the_wait_with_its_own_answer() {
    let app = TestOrder::spawn(Backend::Sqlite).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let consumer =
        TestConsumer::spawn(consumer_settings(&app.db.url, &broker.address(), &topic, "await-2")).await;
    let failed = app.submit(order(7, "failed-1")).await.unwrap().event_id;
    // The relay gave up on it (as after --max-attempts), without a relay running here.
    exec(
        &app.conn,
        "UPDATE outbox_event SET status = 'FAILED', last_error = 'broker said no' WHERE event_id = ?",
        vec![failed.clone().into()],
    )
    .await;
    let dead = dead_letter(&app.conn, DEFAULT_CONSUMER_NAME, &topic).await;
    let parked = uuid::Uuid::now_v7().to_string();
    exec(
        &app.conn,
        "INSERT INTO consumed_event (consumer_name, event_id, consumed_at) VALUES (?, ?, ?)",
        vec![DEFAULT_CONSUMER_NAME.into(), parked.clone().into(), Utc::now().into()],
    )
    .await;
    exec(
        &app.conn,
        "INSERT INTO parked_event (consumer_name, event_id, order_id, version, event_type, payload, reason, parked_at) \
         VALUES (?, ?, 99, 3, 'idempost.v1.OrderAmended', ?, 'waits for version 2', ?)",
        vec![DEFAULT_CONSUMER_NAME.into(), parked.clone().into(), b"x".to_vec().into(), Utc::now().into()],
    )
    .await;
    let admin = endpoint(app.admin_port, None).await;
    let consumer_admin = endpoint(consumer.port, None).await;

    let failed_wait = await_published(&admin, &failed, LONG).await.unwrap_err();
    let dead_wait = await_consumed(&consumer_admin, &dead, DEFAULT_CONSUMER_NAME, LONG).await.unwrap_err();
    let parked_wait = await_consumed(&consumer_admin, &parked, "", LONG).await.unwrap_err();
    let other_name = await_consumed(&consumer_admin, &dead, "someone-else", SHORT).await.unwrap_err();

    assert!(
        matches!(&failed_wait, AwaitError::Failed { event_id } if *event_id == failed),
        "{failed_wait:?}"
    );
    let AwaitError::DeadLettered { error, consumer_name, .. } = dead_wait else { panic!("{dead_wait:?}") };
    assert_eq!((error.as_str(), consumer_name.as_str()), ("cannot decode", DEFAULT_CONSUMER_NAME));
    let AwaitError::Parked { reason, consumer_name, .. } = parked_wait else { panic!("{parked_wait:?}") };
    assert_eq!((reason.as_str(), consumer_name.as_str()), ("waits for version 2", DEFAULT_CONSUMER_NAME));
    let AwaitError::TimedOut { last_state, .. } = other_name else { panic!("{other_name:?}") };
    assert_eq!(last_state, "NOT_CONSUMED", "another consumer name's records are its own");

    // The command line's exit code 4 says "set aside", 3 "timed out".
    let admin_url = format!("--admin-url=http://127.0.0.1:{}", app.admin_port);
    let consumer_url = format!("--consumer-admin-url=http://127.0.0.1:{}", consumer.port);
    let (code, _, err) = idempostctl(&[&admin_url, "wait", "--published", &failed]).await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("FAILED"), "{err}");
    let name = DEFAULT_CONSUMER_NAME;
    let (code, _, err) = idempostctl(&[&consumer_url, "wait", "--consumed", &dead, "--consumer", name]).await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("dead-lettered") && err.contains("cannot decode"), "{err}");
    let (code, _, err) =
        idempostctl(&[&consumer_url, "wait", "--consumed", &parked, "--consumer", name]).await;
    assert_eq!(code, 4, "{err}");
    let unknown = uuid::Uuid::now_v7().to_string();
    let args = [consumer_url.as_str(), "wait", "--consumed", &unknown, "--consumer", name, "--timeout=1s"];
    let (code, _, err) = idempostctl(&args).await;
    assert_eq!(code, 3, "{err}");
    consumer.stop().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_tenants_event_is_answered_like_an_unknown_one_and_the_consumer_side_needs_an_operator() {
    let (app, pki, _dir) = authenticated(Backend::Sqlite, |_| {}).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let mut settings = consumer_settings(&app.db.url, &broker.address(), &topic, "await-3");
    settings.auth = AuthSettings::jwt(pki.jwks.clone(), ISSUER, AUDIENCE);
    let consumer = TestConsumer::spawn(settings).await;
    let (own, other, operator) = (tenant(&pki, 1), tenant(&pki, 2), operator(&pki, "ops"));
    let accepted =
        app.client.clone().submit_order(with_token(order(1, "mine-1"), &own)).await.unwrap().into_inner();
    fail_event(&app.conn, &accepted.event_id).await;

    let as_owner =
        await_published(&endpoint(app.admin_port, Some(&own)).await, &accepted.event_id, LONG).await;
    let as_other =
        await_published(&endpoint(app.admin_port, Some(&other)).await, &accepted.event_id, SHORT).await;
    let as_operator =
        await_published(&endpoint(app.admin_port, Some(&operator)).await, &accepted.event_id, LONG).await;
    let consumer_side =
        await_consumed(&endpoint(consumer.port, Some(&own)).await, &accepted.event_id, "", SHORT).await;

    assert!(matches!(as_owner, Err(AwaitError::Failed { .. })), "{as_owner:?}");
    assert!(matches!(as_operator, Err(AwaitError::Failed { .. })), "{as_operator:?}");
    // Exactly what an unknown event answers: the wait runs out, having seen nothing.
    let Err(AwaitError::TimedOut { last_state, .. }) = as_other else { panic!("{as_other:?}") };
    assert_eq!(last_state, "UNKNOWN");
    let Err(AwaitError::Call(status)) = consumer_side else { panic!("{consumer_side:?}") };
    assert_eq!(status.code(), Code::PermissionDenied);
    consumer.stop().await;
    app.stop().await;
}

/// The bounds: waiting calls never hold every permit of the listener, and a call never outlives
/// the listener's call timeout however long it asks to wait.
mod bounds {
    use idempost_proto::v1 as pb;
    use tokio::time::Instant;

    use super::*;

    fn ask(event_id: &str, seconds: i64) -> pb::AwaitPublishedRequest {
        let wait = Some(prost_types::Duration { seconds, nanos: 0 });
        pb::AwaitPublishedRequest { event_id: event_id.to_owned(), wait }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn past_a_quarter_of_the_listeners_calls_a_wait_answers_at_once_and_says_when_to_call_again() {
        // Four calls on the admin listener: one may wait, the others must still be answered.
        let app =
            TestOrder::spawn_with(Backend::Sqlite, |s| s.security.listeners.max_concurrent_calls = Some(4))
                .await;
        let unknown = uuid::Uuid::now_v7().to_string();
        // The holder takes the one waiter's place for 8 s, calling again (as the clients do) while
        // a probe below holds it for an instant.
        let holder = {
            let mut admin = app.admin.clone();
            let unknown = unknown.clone();
            tokio::spawn(async move {
                loop {
                    let reply = admin.await_published(ask(&unknown, 8)).await.unwrap().into_inner();
                    match reply.retry_after.and_then(|after| Duration::try_from(after).ok()) {
                        Some(after) => tokio::time::sleep(after).await,
                        None => return reply,
                    }
                }
            })
        };
        let probe = |wait: Duration| {
            let mut admin = app.admin.clone();
            let ask = pb::AwaitPublishedRequest {
                event_id: unknown.clone(),
                wait: Some(prost_types::Duration::try_from(wait).unwrap()),
            };
            async move { admin.await_published(ask).await.unwrap().into_inner() }
        };
        assert_eventually("the holder waits in the only waiter's place", WAIT, || async {
            probe(Duration::from_millis(1)).await.retry_after.is_some()
        })
        .await;

        let started = Instant::now();
        let refused_wait = probe(Duration::from_secs(3)).await;
        let took = started.elapsed();
        let timeline = app
            .admin
            .clone()
            .get_event_timeline(pb::GetEventTimelineRequest { event_id: unknown.clone() })
            .await;

        assert_eq!(refused_wait.state(), pb::PublishState::Waiting);
        assert!(took < Duration::from_secs(2), "answered at once, not after a wait: {took:?}");
        assert_eq!(refused_wait.retry_after, Some(prost_types::Duration { seconds: 0, nanos: 500_000_000 }));
        assert_eq!(timeline.unwrap_err().code(), Code::NotFound, "other calls are still served");
        let held = holder.await.unwrap();
        assert_eq!((held.state(), held.known, held.retry_after), (pb::PublishState::Waiting, false, None));
        app.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_wait_ends_inside_the_listeners_call_timeout_instead_of_being_cut_by_it() {
        let app = TestOrder::spawn_with(Backend::Sqlite, |s| {
            s.security.listeners.call_timeout = Duration::from_secs(4)
        })
        .await;
        let unknown = uuid::Uuid::now_v7().to_string();

        let started = Instant::now();
        let reply = app.admin.clone().await_published(ask(&unknown, 600)).await;
        let took = started.elapsed();

        let reply = reply.expect("answered WAITING, not DEADLINE_EXCEEDED").into_inner();
        assert_eq!(reply.state(), pb::PublishState::Waiting);
        // Three quarters of the call timeout, leaving the last read a second.
        assert!(took >= Duration::from_millis(2900) && took < Duration::from_secs(4), "{took:?}");
        app.stop().await;
    }
}
