//! Wake-ups: a new order ends an idle relay's back-off, so a trickle of orders does not wait for
//! the next poll. Real order and relay processes; the relay's own metrics show the wake-ups.

use std::time::Duration;

use crate::broker::TestBroker;
use crate::helpers::{
    Backend, OutboxProbe, TestDb, TestService, assert_eventually, connect_order_service, order,
};
use crate::otlp::start_receiver;

use idempost_testkit::wait::WAIT;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_order_wakes_the_idle_relay_and_the_relay_counts_the_wake_up() {
    let (endpoint, received, _receiver) = start_receiver().await;
    let db = TestDb::migrated(Backend::MariaDb).await;
    let conn = db.connect().await;
    let probe = OutboxProbe { conn: &conn };
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-test");
    broker.create_topic(&topic, 1).await;
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint), ("OTEL_METRIC_EXPORT_INTERVAL", "300".to_owned())];
    // The idle back-off may grow to ten minutes. Whether a given event was found by a wake-up or
    // by a poll depends on timing; the relay's wake-up counter shows that wake-ups arrived and
    // ended idle waits. What they save in latency is the benchmark's to show, not a test's.
    let (mut relay, relay_bound) = TestService::spawn_listening(
        "idempost-relay",
        &[
            format!("--database-url={}", db.url),
            format!("--brokers={}", broker.address()),
            format!("--topic={topic}"),
            "--listen=127.0.0.1:0".to_owned(),
            "--max-idle-poll=10min".to_owned(),
            "--wake-listen=127.0.0.1:0".to_owned(),
        ],
        &env,
    )
    .await;
    let wake_port = relay_bound.port("wake-listen");
    let (mut order_service, order_bound) = TestService::spawn_listening(
        "idempost-order",
        &[
            format!("--database-url={}", db.url),
            "--listen=127.0.0.1:0".to_owned(),
            "--admin-listen=127.0.0.1:0".to_owned(),
            format!("--wake-relays=127.0.0.1:{wake_port}"),
        ],
        &[],
    )
    .await;
    let order_port = order_bound.port("listen");
    let url = format!("http://127.0.0.1:{order_port}");
    let mut client = connect_order_service(&url).await;

    for i in 0..3 {
        let accepted = client.submit_order(order(3, &format!("wake-{i}"))).await.unwrap().into_inner();
        assert_eventually("the new order's event is published", WAIT, || async {
            probe.state(&accepted.event_id).await.status == "PUBLISHED"
        })
        .await;
    }
    assert_eventually("the relay reports its wake-ups", WAIT, || async {
        received.points().iter().any(|p| p.name == "idempost.relay.wakeups" && p.value >= 1.0)
    })
    .await;

    for service in [&mut order_service, &mut relay] {
        service.signal("TERM").await;
        assert!(service.wait(Duration::from_secs(20)).await.success());
    }
}
