//! Records in each CloudEvents content mode for the tests that read them with other stacks' SDKs
//! (the Python and TypeScript clients' suites) and with the consumer: an order service whose
//! events a relay in one mode published to a fresh topic, and what it published.

use idempost_relay::CloudEventsMode;

use crate::broker::TestBroker;
use crate::db::Backend;
use crate::order::{TestOrder, amend, cancel, order};
use crate::outbox::OutboxProbe;
use crate::relay::{TestRelay, relay_defaults};
use crate::wait::{WAIT, assert_eventually};

/// One event the relay published, as a reader must see it.
#[derive(Debug, Clone)]
pub struct Published {
    pub event_id: String,
    pub event_type: &'static str,
    pub order_id: i64,
    pub version: i64,
}

/// A topic a relay in one mode filled, over the order service (MariaDB) that wrote its events.
#[derive(Debug)]
pub struct PublishedTopic {
    pub app: TestOrder,
    pub name: String,
    pub events: Vec<Published>,
}

/// Two orders (one amended, one cancelled: each event type once or twice) published by a relay in
/// `mode` to a fresh topic of `broker`; the relay is stopped once all four are PUBLISHED.
pub async fn published_in(broker: &TestBroker, mode: CloudEventsMode) -> PublishedTopic {
    published_with(broker, mode, true).await
}

/// [`published_in`] by a relay that writes the legacy headers a `ce_*` header repeats only when
/// `legacy_headers` (its `--legacy-headers`).
pub async fn published_with(
    broker: &TestBroker,
    mode: CloudEventsMode,
    legacy_headers: bool,
) -> PublishedTopic {
    let app = TestOrder::spawn(Backend::MariaDb).await;
    let name = crate::topic::unique("idempost-test-ce");
    broker.create_topic(&name, 3).await;
    let first = app.submit(order(7, "req-ce-1")).await.unwrap();
    let second = app.submit(order(7, "req-ce-2")).await.unwrap();
    let amended = app.amend(amend("amend-ce-1", first.order_id, 1, 3)).await.unwrap();
    let cancelled = app.cancel(cancel("cancel-ce-2", second.order_id, 1)).await.unwrap();
    let event = |event_id: String, event_type, order_id, version| Published {
        event_id,
        event_type,
        order_id,
        version,
    };
    let events = vec![
        event(first.event_id, "idempost.v1.OrderAccepted", first.order_id, 1),
        event(second.event_id, "idempost.v1.OrderAccepted", second.order_id, 1),
        event(amended.event_id, "idempost.v1.OrderAmended", first.order_id, 2),
        event(cancelled.event_id, "idempost.v1.OrderCancelled", second.order_id, 2),
    ];
    let mut settings = relay_defaults(&app.db.url, &broker.address(), &name);
    settings.cloudevents_mode = mode;
    settings.legacy_headers = legacy_headers;
    let relay = TestRelay::spawn(settings).await;
    let probe = OutboxProbe { conn: &app.conn };
    assert_eventually("the relay published all four events", WAIT, || async {
        probe.count_with_status("PUBLISHED").await == 4
    })
    .await;
    relay.stop().await;
    PublishedTopic { app, name, events }
}
