//! CloudEvents on the wire, end to end: a structured-mode relay's records (the JSON envelope) are
//! unwrapped and applied by the consumer, and so are a binary-mode relay's written without the
//! legacy headers that the `ce_*` headers repeat. The official SDKs read both modes in the clients' suites
//! (`python.rs`, `typescript.rs`), over the same published topics (the test kit's `cloudevents`).
//! MariaDB, the reference database, is enough: the consumer sees only Kafka.

use std::collections::BTreeMap;

use idempost_relay::CloudEventsMode;
use idempost_testkit::cloudevents::{PublishedTopic, published_in, published_with};
use idempost_testkit::consumer::{TestConsumer, consumer_settings};
use idempost_testkit::ordering::{Expected, read_model};
use idempost_testkit::wait::WAIT;

use crate::broker::TestBroker;
use crate::helpers::assert_eventually;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_structured_mode_relays_records_are_unwrapped_and_applied_by_the_consumer() {
    let broker = TestBroker::start().await;
    let topic = published_in(&broker, CloudEventsMode::Structured).await;
    let records =
        crate::broker::read_topic(&broker.address(), &topic.name, 4, WAIT, std::time::Duration::ZERO).await;
    assert!(
        records.iter().all(|r| r.header("content-type").starts_with("application/cloudevents+json")
            && r.value.starts_with(b"{")
            && r.header("ce_id").is_empty()),
        "every record is an envelope, its attributes inside it"
    );
    applied_as_the_orders_left_them(&broker, topic, "ce-structured").await;
}

/// `--legacy-headers false`: the records carry `ce_id`, `ce_type`, `ce_subject` and no
/// `event_id`, `event_type` or `aggregate_id` (a broker that stores every header pays for three
/// fewer), and the consumer applies them as it does records with both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_binary_mode_relays_records_without_the_legacy_headers_are_applied_by_the_consumer() {
    let broker = TestBroker::start().await;
    let topic = published_with(&broker, CloudEventsMode::Binary, false).await;
    let records =
        crate::broker::read_topic(&broker.address(), &topic.name, 4, WAIT, std::time::Duration::ZERO).await;
    for event in &topic.events {
        let record =
            records.iter().find(|r| r.header("ce_id") == event.event_id).expect("the event's record");
        assert_eq!(
            (record.header("ce_type"), record.header("ce_subject")),
            (event.event_type, event.order_id.to_string().as_str()),
            "{record:?}"
        );
        for legacy in ["event_id", "event_type", "aggregate_id", "traceparent"] {
            assert!(!record.headers.contains_key(legacy), "no {legacy} header: {record:?}");
        }
        assert_eq!(record.header("event_version"), event.version.to_string());
    }
    applied_as_the_orders_left_them(&broker, topic, "ce-lean").await;
}

/// Runs a consumer named `name` over `topic` until its read model shows both orders as the order
/// service left them (the first amended, the second cancelled), each event consumed once and none
/// dead-lettered; then stops everything.
async fn applied_as_the_orders_left_them(broker: &TestBroker, topic: PublishedTopic, name: &str) {
    let mut settings = consumer_settings(&topic.app.db.url, &broker.address(), &topic.name, name);
    settings.consumer_name = name.to_owned();
    let consumer = TestConsumer::spawn(settings).await;
    let app = &topic.app;
    let (first, second) = (topic.events[0].order_id, topic.events[1].order_id);
    let amended_total = app.scalar_i64(&format!("SELECT total FROM orders WHERE id = {first}")).await;
    let cancelled_total = app.scalar_i64(&format!("SELECT total FROM orders WHERE id = {second}")).await;
    let want = BTreeMap::from([
        (first, Expected { version: 2, status: "ACCEPTED".to_owned(), total: amended_total }),
        (second, Expected { version: 2, status: "CANCELLED".to_owned(), total: cancelled_total }),
    ]);
    assert_eventually("the read model shows both orders as the order service left them", WAIT, || async {
        read_model(&app.conn, name).await == want
    })
    .await;
    for event in &topic.events {
        assert_eq!(app.rows_for_event("consumed_event", &event.event_id).await, 1, "{event:?}");
    }
    assert_eq!(app.count("dead_letter").await, 0, "no record was poison");
    consumer.stop().await;
    topic.app.stop().await;
}
