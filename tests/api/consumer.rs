//! The consumer against real databases and a real broker: one notification job per event,
//! however often the event is delivered, and no acknowledgement before the local commit.

use std::sync::Arc;
use std::time::Duration;

use outpost::consumer::{self, ConsumerStats};
use outpost::proto::v1 as pb;
use prost::Message;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sea_orm::{ConnectionTrait, Statement};

use crate::broker::TestBroker;
use crate::helpers::{
    Backend, InProcess, ServiceProcess, TestApp, assert_eventually, on_every_backend, order,
};

const WAIT: Duration = Duration::from_secs(60);

fn topic() -> String {
    format!("outpost-test-{}", uuid::Uuid::new_v4().simple())
}

pub(crate) fn consumer_settings(
    app: &TestApp,
    brokers: &str,
    topic: &str,
    group: &str,
) -> consumer::Settings {
    let mut settings = consumer::Settings::new(&app.db.url, brokers);
    settings.topic = topic.to_owned();
    settings.group_id = Some(group.to_owned());
    settings.backoff_max = Duration::from_millis(300);
    settings.shutdown_grace = Duration::from_secs(5);
    settings.kafka_options = fast_group_options();
    settings
}

/// A dead member leaves the group after seconds, not the default 45 s.
fn fast_group_options() -> Vec<(String, String)> {
    vec![("session.timeout.ms".into(), "6000".into()), ("heartbeat.interval.ms".into(), "500".into())]
}

/// A consumer running in this process, with its counters.
struct RunningConsumer {
    stats: Arc<ConsumerStats>,
    service: InProcess,
}

impl RunningConsumer {
    async fn start(settings: consumer::Settings) -> Self {
        let app = consumer::Application::build(settings).await.unwrap();
        let stats = app.stats();
        Self { stats, service: InProcess::spawn(|shutdown| app.run_until_stopped(shutdown)) }
    }

    async fn stop(self) {
        self.service.stop().await;
    }
}

/// An OrderAccepted record as the relay would publish it.
pub(crate) fn event_record(order_id: i64) -> (String, Vec<u8>) {
    let event_id = uuid::Uuid::now_v7().to_string();
    let payload = pb::OrderAccepted {
        event_id: event_id.clone(),
        event_version: 1,
        order_id,
        tenant_id: 7,
        request_id: format!("req-{order_id}"),
        customer_id: "c".to_owned(),
        currency: "EUR".to_owned(),
        line_items: order(7, "x").line_items,
        total_minor: 3299,
        accepted_at: None,
    }
    .encode_to_vec();
    (event_id, payload)
}

pub(crate) async fn produce(brokers: &str, topic: &str, key: &str, payload: &[u8], event_id: Option<&str>) {
    let producer: FutureProducer = ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    let mut headers =
        OwnedHeaders::new().insert(Header { key: "event_type", value: Some("outpost.v1.OrderAccepted") });
    if let Some(event_id) = event_id {
        headers = headers.insert(Header { key: "event_id", value: Some(event_id) });
    }
    let record = FutureRecord::to(topic).key(key).payload(payload).headers(headers);
    producer.send(record, Duration::from_secs(10)).await.map_err(|(e, _)| e).unwrap();
}

async fn rows(app: &TestApp, table: &str, event_id: &str) -> i64 {
    let backend = app.conn.get_database_backend();
    let placeholder = if backend == sea_orm::DbBackend::Postgres { "$1" } else { "?" };
    let sql = format!("SELECT COUNT(*) FROM {table} WHERE event_id = {placeholder}");
    let row = app
        .conn
        .query_one_raw(Statement::from_sql_and_values(backend, sql, [event_id.into()]))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index::<i64>(0).unwrap()
}

on_every_backend!(
    orders_flow_through_relay_and_consumer_into_exactly_one_notification_job_each,
    a_redelivered_event_yields_one_job_and_the_duplicate_branch_really_runs,
    records_fetched_together_commit_together_with_one_job_each_and_a_copy_among_them_is_absorbed,
    a_consumer_killed_after_its_commit_and_before_the_offset_commit_deduplicates_the_redelivery,
    a_failure_on_another_constraint_is_not_acknowledged_and_leaves_no_consumed_row,
    a_poison_record_is_dead_lettered_and_later_records_are_still_processed,
    two_consumers_in_one_group_share_the_partitions_and_no_event_yields_two_jobs,
    offsets_of_committed_work_are_committed_on_shutdown,
);

async fn orders_flow_through_relay_and_consumer_into_exactly_one_notification_job_each(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 3).await;
    let mut relay_settings = outpost::relay::Settings::new(&app.db.url, broker.address());
    relay_settings.topic = topic.clone();
    relay_settings.max_idle_poll = Duration::from_millis(100);
    let relay = relay::Application::build(relay_settings).await.unwrap();
    let relay = InProcess::spawn(|shutdown| relay.run_until_stopped(shutdown));
    let consumer = RunningConsumer::start(consumer_settings(&app, &broker.address(), &topic, "g1")).await;

    let mut accepted = Vec::new();
    for i in 0..10 {
        accepted.push(app.submit(order(7, &format!("req-{i}"))).await.unwrap());
    }
    assert_eventually("ten notification jobs exist", WAIT, || async {
        app.count("notification_job").await == 10
    })
    .await;

    for answer in &accepted {
        assert_eq!(rows(&app, "notification_job", &answer.event_id).await, 1);
        assert_eq!(rows(&app, "consumed_event", &answer.event_id).await, 1);
        let job_order = app
            .scalar_i64(&format!(
                "SELECT order_id FROM notification_job WHERE event_id = '{}'",
                answer.event_id
            ))
            .await;
        assert_eq!(job_order, answer.order_id);
    }
    consumer.stop().await;
    relay.stop().await;
}

use outpost::relay;

async fn a_redelivered_event_yields_one_job_and_the_duplicate_branch_really_runs(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let (event_id, payload) = event_record(42);
    for _ in 0..3 {
        produce(&broker.address(), &topic, "42", &payload, Some(&event_id)).await;
    }

    let consumer = RunningConsumer::start(consumer_settings(&app, &broker.address(), &topic, "g1")).await;
    assert_eventually("all three deliveries are handled", WAIT, || async {
        let stats = consumer.stats.snapshot();
        stats.consumed + stats.duplicates >= 3
    })
    .await;

    let stats = consumer.stats.snapshot();
    assert_eq!(rows(&app, "consumed_event", &event_id).await, 1);
    assert_eq!(rows(&app, "notification_job", &event_id).await, 1);
    assert_eq!((stats.consumed, stats.duplicates), (1, 2), "{stats:?}");
    assert!(stats.handled > 1, "handle attempts exceed consumed rows: the duplicates really arrived");
    consumer.stop().await;
}

async fn records_fetched_together_commit_together_with_one_job_each_and_a_copy_among_them_is_absorbed(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    // Everything is on the topic before the consumer starts, so its first fetch brings many.
    let mut ids = Vec::new();
    for order_id in 1..=40 {
        let (event_id, payload) = event_record(order_id);
        produce(&broker.address(), &topic, &order_id.to_string(), &payload, Some(&event_id)).await;
        if order_id == 20 {
            // A copy of an event next to it, as a relay's republish would put it.
            produce(&broker.address(), &topic, "20", &payload, Some(&event_id)).await;
        }
        ids.push(event_id);
    }

    let consumer = RunningConsumer::start(consumer_settings(&app, &broker.address(), &topic, "g1")).await;
    assert_eventually("all 41 deliveries are handled", WAIT, || async {
        let stats = consumer.stats.snapshot();
        stats.consumed + stats.duplicates >= 41
    })
    .await;

    let stats = consumer.stats.snapshot();
    assert_eq!((stats.consumed, stats.duplicates), (40, 1), "{stats:?}");
    assert!(stats.batched > 1, "records were committed together: {stats:?}");
    assert_eq!(app.count("consumed_event").await, 40);
    assert_eq!(app.count("notification_job").await, 40);
    for event_id in &ids {
        assert_eq!(rows(&app, "notification_job", event_id).await, 1);
    }
    consumer.stop().await;
}

#[cfg(feature = "failpoints")]
async fn a_consumer_killed_after_its_commit_and_before_the_offset_commit_deduplicates_the_redelivery(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let (event_id, payload) = event_record(42);
    produce(&broker.address(), &topic, "42", &payload, Some(&event_id)).await;
    let args = vec![
        format!("--database-url={}", app.db.url),
        format!("--brokers={}", broker.address()),
        format!("--topic={topic}"),
        "--group-id=g1".to_owned(),
        "--listen=127.0.0.1:0".to_owned(),
    ]
    .into_iter()
    .chain(fast_group_options().into_iter().map(|(k, v)| format!("--kafka-option={k}={v}")))
    .collect::<Vec<_>>();

    // The consumer commits, then hangs before storing the offset; it is killed there.
    let hung = ServiceProcess::spawn(
        "outpost-consumer",
        &args,
        &[("FAILPOINTS", "AFTER_CONSUMER_COMMIT_BEFORE_MESSAGE_ACK=sleep(600000)".into())],
    );
    assert_eventually("the first consumer committed its transaction", WAIT, || async {
        rows(&app, "consumed_event", &event_id).await == 1
    })
    .await;
    hung.signal("KILL").await;

    let consumer = RunningConsumer::start(consumer_settings(&app, &broker.address(), &topic, "g1")).await;
    assert_eventually("the event is redelivered and recognised", WAIT, || async {
        consumer.stats.snapshot().duplicates == 1
    })
    .await;
    assert_eq!(rows(&app, "consumed_event", &event_id).await, 1);
    assert_eq!(rows(&app, "notification_job", &event_id).await, 1);
    assert_eq!(consumer.stats.snapshot().consumed, 0);
    consumer.stop().await;
}

#[cfg(not(feature = "failpoints"))]
async fn a_consumer_killed_after_its_commit_and_before_the_offset_commit_deduplicates_the_redelivery(
    _: Backend,
) {
}

async fn a_failure_on_another_constraint_is_not_acknowledged_and_leaves_no_consumed_row(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let (event_id, payload) = event_record(42);
    // A job row for the event already exists without a consumed_event row: the job insert hits
    // notification_job's primary key, which is not uq_consumed_event_identity.
    app.conn
        .execute_unprepared(&format!(
            "INSERT INTO notification_job (event_id, order_id, source_version, status, created_at) \
             VALUES ('{event_id}', 1, 1, 'PENDING', '2026-01-01 00:00:00')"
        ))
        .await
        .unwrap();
    produce(&broker.address(), &topic, "42", &payload, Some(&event_id)).await;

    let consumer = RunningConsumer::start(consumer_settings(&app, &broker.address(), &topic, "g1")).await;
    assert_eventually("the message fails repeatedly", WAIT, || async {
        consumer.stats.snapshot().failures >= 3
    })
    .await;
    let stats = consumer.stats.snapshot();
    assert_eq!((stats.consumed, stats.duplicates), (0, 0), "never taken for already consumed: {stats:?}");
    assert_eq!(rows(&app, "consumed_event", &event_id).await, 0, "the dedup row was rolled back");

    // Not acknowledged: once the conflict is cleared, the same delivery succeeds.
    app.conn
        .execute_unprepared(&format!("DELETE FROM notification_job WHERE event_id = '{event_id}'"))
        .await
        .unwrap();
    assert_eventually("the retried message commits", WAIT, || async {
        consumer.stats.snapshot().consumed == 1
    })
    .await;
    assert_eq!(rows(&app, "consumed_event", &event_id).await, 1);
    consumer.stop().await;

    // A value too long for its column (servers enforce lengths; SQLite does not).
    if backend != Backend::Sqlite {
        let mut settings = consumer_settings(&app, &broker.address(), &topic, "g2");
        settings.consumer_name = "n".repeat(200);
        let long_named = RunningConsumer::start(settings).await;
        assert_eventually("the too-long name fails repeatedly", WAIT, || async {
            long_named.stats.snapshot().failures >= 2
        })
        .await;
        let stats = long_named.stats.snapshot();
        assert_eq!((stats.consumed, stats.duplicates), (0, 0), "{stats:?}");
        assert_eq!(rows(&app, "consumed_event", &event_id).await, 1, "only the earlier consumer's row");
        long_named.stop().await;
    }
}

async fn a_poison_record_is_dead_lettered_and_later_records_are_still_processed(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let poison = b"\xff\xfe not a protobuf message".to_vec();
    produce(&broker.address(), &topic, "13", &poison, Some("poison-1")).await;
    let (event_id, payload) = event_record(42);
    produce(&broker.address(), &topic, "42", &payload, Some(&event_id)).await;

    let consumer = RunningConsumer::start(consumer_settings(&app, &broker.address(), &topic, "g1")).await;
    assert_eventually("the record after the poison is consumed", WAIT, || async {
        rows(&app, "notification_job", &event_id).await == 1
    })
    .await;

    assert_eq!(consumer.stats.snapshot().dead_lettered, 1);
    let backend_kind = app.conn.get_database_backend();
    let row = app
        .conn
        .query_one_raw(Statement::from_string(
            backend_kind,
            "SELECT topic, partition_id, offset_id, payload, event_id, error, consumer_name FROM dead_letter",
        ))
        .await
        .unwrap()
        .expect("a dead letter");
    assert_eq!(row.try_get_by_index::<String>(0).unwrap(), topic);
    assert_eq!(row.try_get_by_index::<i32>(1).unwrap(), 0);
    assert_eq!(row.try_get_by_index::<i64>(2).unwrap(), 0);
    assert_eq!(row.try_get_by_index::<Vec<u8>>(3).unwrap(), poison, "raw bytes kept");
    assert_eq!(row.try_get_by_index::<Option<String>>(4).unwrap().as_deref(), Some("poison-1"));
    assert!(!row.try_get_by_index::<String>(5).unwrap().is_empty());
    assert_eq!(row.try_get_by_index::<String>(6).unwrap(), consumer::DEFAULT_CONSUMER_NAME);
    consumer.stop().await;
}

async fn two_consumers_in_one_group_share_the_partitions_and_no_event_yields_two_jobs(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 4).await;
    let first = RunningConsumer::start(consumer_settings(&app, &broker.address(), &topic, "shared")).await;
    let second = RunningConsumer::start(consumer_settings(&app, &broker.address(), &topic, "shared")).await;
    assert_eventually("both instances hold partitions", WAIT, || async {
        let (a, b) = (first.stats.snapshot(), second.stats.snapshot());
        a.assigned_partitions > 0
            && b.assigned_partitions > 0
            && a.assigned_partitions + b.assigned_partitions == 4
    })
    .await;

    let mut ids = Vec::new();
    for order_id in 1..=40 {
        let (event_id, payload) = event_record(order_id);
        produce(&broker.address(), &topic, &order_id.to_string(), &payload, Some(&event_id)).await;
        // Every fourth event is delivered twice.
        if order_id % 4 == 0 {
            produce(&broker.address(), &topic, &order_id.to_string(), &payload, Some(&event_id)).await;
        }
        ids.push(event_id);
    }
    assert_eventually("forty jobs exist", WAIT, || async { app.count("notification_job").await == 40 }).await;

    assert_eq!(app.count("consumed_event").await, 40);
    for id in &ids {
        assert_eq!(rows(&app, "notification_job", id).await, 1);
    }
    let (a, b) = (first.stats.snapshot(), second.stats.snapshot());
    assert_eq!(a.consumed + b.consumed, 40, "{a:?} {b:?}");
    assert!(a.handled > 0 && b.handled > 0, "both instances took partitions: {a:?} {b:?}");
    first.stop().await;
    second.stop().await;
}

async fn offsets_of_committed_work_are_committed_on_shutdown(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    for order_id in 1..=5 {
        let (event_id, payload) = event_record(order_id);
        produce(&broker.address(), &topic, &order_id.to_string(), &payload, Some(&event_id)).await;
    }
    let first = RunningConsumer::start(consumer_settings(&app, &broker.address(), &topic, "g1")).await;
    assert_eventually("five events are consumed", WAIT, || async { first.stats.snapshot().consumed == 5 })
        .await;
    first.stop().await;

    let (event_id, payload) = event_record(6);
    produce(&broker.address(), &topic, "6", &payload, Some(&event_id)).await;
    let second = RunningConsumer::start(consumer_settings(&app, &broker.address(), &topic, "g1")).await;
    assert_eventually("the new event is consumed", WAIT, || async {
        rows(&app, "notification_job", &event_id).await == 1
    })
    .await;

    let stats = second.stats.snapshot();
    assert_eq!((stats.handled, stats.duplicates), (1, 0), "nothing committed was redelivered: {stats:?}");
    second.stop().await;
}
