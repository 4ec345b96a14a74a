//! CloudEvents on the wire, end to end: a structured-mode relay's records (the JSON envelope) are
//! unwrapped and applied by the consumer. The official SDKs read both modes in the clients' suites
//! (`python.rs`, `typescript.rs`), over the same published topics (the test kit's `cloudevents`).
//! MariaDB, the reference database, is enough: the consumer sees only Kafka.

use std::collections::BTreeMap;

use idempost_relay::CloudEventsMode;
use idempost_testkit::cloudevents::published_in;
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
    let mut settings = consumer_settings(&topic.app.db.url, &broker.address(), &topic.name, "ce-structured");
    settings.consumer_name = "ce-structured".to_owned();
    let consumer = TestConsumer::spawn(settings).await;
    let app = &topic.app;
    let (first, second) = (topic.events[0].order_id, topic.events[1].order_id);
    let amended_total = app.scalar_i64(&format!("SELECT total FROM orders WHERE id = {first}")).await;
    let cancelled_total = app.scalar_i64(&format!("SELECT total FROM orders WHERE id = {second}")).await;
    let want = BTreeMap::from([
        (first, Expected { version: 2, status: "ACCEPTED".to_owned(), total: amended_total }),
        (second, Expected { version: 2, status: "CANCELLED".to_owned(), total: cancelled_total }),
    ]);
    assert_eventually("the read model shows both orders as the envelopes left them", WAIT, || async {
        read_model(&app.conn, "ce-structured").await == want
    })
    .await;
    for event in &topic.events {
        assert_eq!(app.rows_for_event("consumed_event", &event.event_id).await, 1, "{event:?}");
    }
    assert_eq!(app.count("dead_letter").await, 0, "no envelope was poison");
    consumer.stop().await;
    topic.app.stop().await;
}
