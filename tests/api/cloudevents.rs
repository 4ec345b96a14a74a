//! CloudEvents on the wire, read by clients this project did not write: records the relay
//! publishes in binary and in structured mode, parsed from a real broker by the official
//! CloudEvents SDKs (Python's `cloudevents` with confluent-kafka, the npm `cloudevents` with
//! kafkajs), and a structured-mode topic applied end to end by the consumer. MariaDB, the
//! reference database, is enough: the SDKs and the consumer see only Kafka.

use std::collections::BTreeMap;

use idempost::contract::{CLOUDEVENTS_SOURCE, CONTENT_TYPE};
use idempost_relay::CloudEventsMode;
use idempost_testkit::consumer::{TestConsumer, consumer_settings};
use idempost_testkit::order::{amend, cancel};
use idempost_testkit::ordering::{Expected, read_model};
use idempost_testkit::python::{run_python, text};
use idempost_testkit::relay::{TestRelay, relay_defaults};
use idempost_testkit::wait::WAIT;
use serde_json::{Value, json};

use crate::broker::TestBroker;
use crate::helpers::{Backend, OutboxProbe, TestOrder, assert_eventually, order};

/// One event the relay published, as the SDKs must show it.
#[derive(Debug, Clone)]
struct Published {
    event_id: String,
    event_type: &'static str,
    order_id: i64,
    version: i64,
}

/// An order service whose events (two orders: one amended, one cancelled) a relay in `mode`
/// published to a fresh topic of `broker`, and what it published.
struct Topic {
    app: TestOrder,
    name: String,
    events: Vec<Published>,
}

async fn published_in(broker: &TestBroker, mode: CloudEventsMode) -> Topic {
    let app = TestOrder::spawn(Backend::MariaDb).await;
    let name = idempost_testkit::topic::unique("idempost-test-ce");
    broker.create_topic(&name, 3).await;
    let first = app.submit(order(7, "req-ce-1")).await.unwrap();
    let second = app.submit(order(7, "req-ce-2")).await.unwrap();
    let amended = app.amend(amend("amend-ce-1", first.order_id, 1, 3)).await.unwrap();
    let cancelled = app.cancel(cancel("cancel-ce-2", second.order_id, 1)).await.unwrap();
    let events = vec![
        Published {
            event_id: first.event_id,
            event_type: "idempost.v1.OrderAccepted",
            order_id: first.order_id,
            version: 1,
        },
        Published {
            event_id: second.event_id,
            event_type: "idempost.v1.OrderAccepted",
            order_id: second.order_id,
            version: 1,
        },
        Published {
            event_id: amended.event_id,
            event_type: "idempost.v1.OrderAmended",
            order_id: first.order_id,
            version: 2,
        },
        Published {
            event_id: cancelled.event_id,
            event_type: "idempost.v1.OrderCancelled",
            order_id: second.order_id,
            version: 2,
        },
    ];
    let mut settings = relay_defaults(&app.db.url, &broker.address(), &name);
    settings.cloudevents_mode = mode;
    let relay = TestRelay::spawn(settings).await;
    let probe = OutboxProbe { conn: &app.conn };
    assert_eventually("the relay published all four events", WAIT, || async {
        probe.count_with_status("PUBLISHED").await == 4
    })
    .await;
    relay.stop().await;
    Topic { app, name, events }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_cloudevents_sdk_reads_binary_and_structured_records_and_their_payloads_decode() {
    let broker = TestBroker::start().await;
    for mode in [CloudEventsMode::Binary, CloudEventsMode::Structured] {
        let topic = published_in(&broker, mode).await;
        let args = [
            format!("--brokers={}", broker.address()),
            format!("--topic={}", topic.name),
            "--max-records=4".to_owned(),
            "--timeout=60".to_owned(),
        ];
        let run = run_python("cloudevents_read.py", &args, "").await;
        assert!(run.status.success(), "{mode:?}: {run}");
        let read = run.of_type("cloudevent");
        assert_eq!(read.len(), 4, "{mode:?}: every record parses as a CloudEvent: {run}");
        let mode_name = format!("{mode:?}").to_lowercase();
        for event in &topic.events {
            let line = read
                .iter()
                .find(|line| line["id"] == event.event_id.as_str())
                .unwrap_or_else(|| panic!("{mode:?}: no CloudEvent with id {}: {run}", event.event_id));
            assert_eq!(text(&line["mode"]), mode_name);
            assert_eq!(text(&line["specversion"]), "1.0");
            assert_eq!(text(&line["source"]), CLOUDEVENTS_SOURCE);
            assert_eq!(text(&line["ce_type"]), event.event_type);
            assert_eq!(text(&line["subject"]), event.order_id.to_string());
            assert_eq!(text(&line["key"]), event.order_id.to_string(), "the key stays the order id");
            assert_eq!(text(&line["datacontenttype"]), CONTENT_TYPE);
            assert!(line["time"].as_str().is_some_and(|t| t.starts_with("20")), "{line}");
            let data = &line["data"];
            assert_eq!(
                text(&data["message"]),
                event.event_type,
                "the data decodes to the message its type names"
            );
            assert_eq!(text(&data["event_id"]), event.event_id);
            assert_eq!(data["order_id"].as_i64(), Some(event.order_id));
            assert_eq!(data["event_version"].as_i64(), Some(event.version));
        }
        topic.app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_typescript_cloudevents_sdk_reads_binary_and_structured_records_from_the_broker() {
    let broker = TestBroker::start().await;
    let binary = published_in(&broker, CloudEventsMode::Binary).await;
    let structured = published_in(&broker, CloudEventsMode::Structured).await;
    let expected = |topic: &Topic| -> Value {
        topic
            .events
            .iter()
            .map(|e| json!({"id": e.event_id, "type": e.event_type, "orderId": e.order_id.to_string(), "version": e.version.to_string()}))
            .collect()
    };
    let vars = [
        ("IDEMPOST_CE_BROKERS", broker.address()),
        (
            "IDEMPOST_CE_TOPICS",
            json!({
                "binary": {"topic": binary.name, "events": expected(&binary)},
                "structured": {"topic": structured.name, "events": expected(&structured)},
            })
            .to_string(),
        ),
    ];
    crate::typescript::node_test("test/service/cloudevents.test.ts", &vars).await;
    binary.app.stop().await;
    structured.app.stop().await;
}

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
