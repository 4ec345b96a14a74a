//! Rolling a service back, as the README describes it: a relay drained mid-backlog hands over to
//! the next one with nothing lost, and a consumer stopped and replaced keeps its dedup history, so
//! a full replay of the topic makes no second effect.

use std::collections::HashSet;
use std::time::Duration;

use crate::broker::{TestBroker, read_topic};
use idempost_consumer as consumer;

use crate::helpers::{
    Backend, InProcess, OutboxProbe, TestOrder, TestService, assert_eventually, on_every_backend, order,
};

/// Longer than the harness's `WAIT`: a drain after a broker outage, with backoff, on a loaded machine.
const SLOW_WAIT: Duration = Duration::from_secs(90);

on_every_backend!(
    a_relay_drained_mid_backlog_finishes_its_leases_and_the_next_one_publishes_the_rest,
    a_consumer_replaced_after_a_replay_of_the_whole_topic_makes_no_second_effect,
);

fn relay_args(app: &TestOrder, brokers: &str, topic: &str) -> Vec<String> {
    vec![
        format!("--database-url={}", app.db.url),
        format!("--brokers={brokers}"),
        format!("--topic={topic}"),
        "--batch-size=20".to_owned(),
        "--max-idle-poll=100ms".to_owned(),
        "--listen=127.0.0.1:0".to_owned(),
    ]
}

fn consumer_args(app: &TestOrder, brokers: &str, topic: &str, group: &str) -> Vec<String> {
    vec![
        format!("--database-url={}", app.db.url),
        format!("--brokers={brokers}"),
        format!("--topic={topic}"),
        format!("--group-id={group}"),
        "--consumer-name=notification-planner".to_owned(),
        "--kafka-option=session.timeout.ms=6000".to_owned(),
        "--kafka-option=heartbeat.interval.ms=500".to_owned(),
        "--listen=127.0.0.1:0".to_owned(),
    ]
}

async fn a_relay_drained_mid_backlog_finishes_its_leases_and_the_next_one_publishes_the_rest(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-rollback");
    broker.create_topic(&topic, 2).await;
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(600).await;

    let args = relay_args(&app, &broker.address(), &topic);
    let mut current = TestService::spawn("idempost-relay", &args, &[]);
    assert_eventually("the relay is under way", SLOW_WAIT, || async {
        probe.count_with_status("PUBLISHED").await >= 20
    })
    .await;
    current.signal("TERM").await;
    assert!(current.wait(Duration::from_secs(30)).await.success(), "the drain exits 0");
    // Its leases finished: nothing is left PUBLISHING for a lease to expire on, nothing was
    // deleted, and the rest simply waits.
    let published = probe.count_with_status("PUBLISHED").await;
    assert_eq!(probe.count_with_status("PUBLISHING").await, 0);
    assert_eq!(published + probe.count_with_status("PENDING").await, 600);

    // The previous version (here: the same binary) continues from the table.
    let mut previous = TestService::spawn("idempost-relay", &args, &[]);
    assert_eventually("the rest is published", SLOW_WAIT, || async {
        probe.count_with_status("PUBLISHED").await == 600
    })
    .await;
    previous.signal("TERM").await;
    assert!(previous.wait(Duration::from_secs(30)).await.success());
    let records = read_topic(&broker.address(), &topic, 600, SLOW_WAIT, Duration::from_millis(1500)).await;
    let seen: HashSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
    assert!(ids.iter().all(|id| seen.contains(id.as_str())), "every event reached the topic");
    app.stop().await;
}

async fn a_consumer_replaced_after_a_replay_of_the_whole_topic_makes_no_second_effect(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-rollback");
    broker.create_topic(&topic, 2).await;
    for i in 0..20 {
        app.submit(order(21, &format!("rollback-{i}"))).await.unwrap();
    }
    let mut relay = TestService::spawn("idempost-relay", &relay_args(&app, &broker.address(), &topic), &[]);
    let args = consumer_args(&app, &broker.address(), &topic, &format!("g-{topic}"));
    let mut current = TestService::spawn("idempost-consumer", &args, &[]);
    assert_eventually("every order has its job", SLOW_WAIT, || async {
        app.count("notification_job").await == 20
    })
    .await;
    current.signal("TERM").await;
    assert!(current.wait(Duration::from_secs(30)).await.success(), "the consumer stops cleanly");
    relay.signal("TERM").await;
    assert!(relay.wait(Duration::from_secs(30)).await.success());
    assert_eq!(app.count("consumed_event").await, 20, "the dedup history stays");

    // The previous version starts in a new group, as after an offset reset: every record of the
    // topic is delivered again, and each one meets its dedup row.
    // It runs in this process so the test can read its counters: the duplicates it reports are
    // the proof that the replay really arrived.
    let mut replay = consumer::Settings::new(&app.db.url, broker.address());
    replay.kafka.topic = topic.clone();
    replay.group_id = Some(format!("replay-{topic}"));
    replay.kafka.options =
        vec![("session.timeout.ms".into(), "6000".into()), ("heartbeat.interval.ms".into(), "500".into())];
    let previous = consumer::Application::build(replay).await.unwrap();
    let stats = previous.stats();
    let previous = InProcess::spawn(|shutdown| previous.run_until_stopped(shutdown));
    assert_eventually("the replay is absorbed", SLOW_WAIT, || async { stats.snapshot().duplicates >= 20 })
        .await;
    previous.stop().await;
    assert_eq!(stats.snapshot().consumed, 0, "{:?}", stats.snapshot());
    assert_eq!(app.count("notification_job").await, 20, "no second effect");
    assert_eq!(app.count("consumed_event").await, 20);
    app.stop().await;
}
