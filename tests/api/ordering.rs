//! Per-order order under faults: the relay never publishes an order's version n + 1 before its
//! version n was confirmed, whatever fails (a refused publish and its backoff, FAILED and a
//! redrive, relays killed mid-batch and their leases taken over), and other orders keep flowing.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sea_orm::{ConnectionTrait as _, DatabaseConnection, DbBackend, TransactionTrait as _};

use crate::broker::{Record, TestBroker, read_topic};
use crate::helpers::{Backend, OutboxProbe, TestOrder, assert_eventually, on_every_backend, order};
use idempost_testkit::consumer::{TestConsumer, consumer_settings};
use idempost_testkit::ordering::{Expected, change_payload, expected, read_model};
use idempost_testkit::relay::{TestRelay, relay_args, relay_settings};

/// Longer than the harness's `WAIT`: this file waits on runs of thousands of events or on a Node
/// toolchain, which take that long on a loaded two-core machine.
const SLOW_WAIT: Duration = Duration::from_secs(120);
const SETTLE: Duration = Duration::from_millis(1500);

fn topic() -> String {
    idempost_testkit::topic::unique("idempost-test")
}

/// Writes PENDING outbox rows for versions `versions` of every order in `orders`, as the order
/// service's transactions would have (one per change, so the versions of an order are written in
/// order), version by version across the orders, each chunk in a transaction. Versions of
/// `last` end the order. As the order service does, a version whose previous version is still
/// unpublished is written `held_back`, read under a lock on that previous version's row, so
/// that a relay marking it meanwhile either waits for this transaction or is seen as done.
/// Answers the event ids by (order, version).
pub(crate) async fn seed_changes(
    conn: &DatabaseConnection,
    orders: &[i64],
    versions: std::ops::RangeInclusive<i64>,
    last: i64,
) -> HashMap<(i64, i64), String> {
    let backend = conn.get_database_backend();
    let mut ids = HashMap::new();
    for version in versions {
        for chunk in orders.chunks(100) {
            let txn = conn.begin().await.unwrap();
            let behind = unpublished_previous_versions(&txn, chunk, version).await;
            let (mut rows, mut values) = (Vec::new(), Vec::<sea_orm::Value>::new());
            for &order_id in chunk {
                let event_id = uuid::Uuid::now_v7().to_string();
                let (event_type, payload) = change_payload(order_id, version, last, &event_id);
                rows.push("(?, 'order', ?, ?, ?, ?, 'PENDING', 0, ?, ?)");
                values.extend([
                    event_id.clone().into(),
                    order_id.to_string().into(),
                    event_type.into(),
                    version.into(),
                    payload.into(),
                    chrono::Utc::now().into(),
                    behind.contains(&order_id).into(),
                ]);
                ids.insert((order_id, version), event_id);
            }
            let sql = format!(
                "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, event_version, \
                 payload, status, attempts, created_at, held_back) VALUES {}",
                rows.join(", ")
            );
            txn.execute_raw(idempost_testkit::sql::statement(backend, &sql, values)).await.unwrap();
            txn.commit().await.unwrap();
        }
    }
    ids
}

/// The orders of `orders` whose version `version - 1` has an outbox row not yet PUBLISHED, read
/// under a lock on those rows. SQLite has no row locks: a write that changes nothing first makes
/// the transaction the one writer, as the order service's compare-and-set does.
async fn unpublished_previous_versions(
    txn: &sea_orm::DatabaseTransaction,
    orders: &[i64],
    version: i64,
) -> std::collections::HashSet<i64> {
    let backend = txn.get_database_backend();
    let keys = vec!["?"; orders.len()].join(", ");
    let lock = if backend == DbBackend::Sqlite {
        txn.execute_unprepared("UPDATE outbox_event SET held_back = held_back WHERE 1 = 0").await.unwrap();
        ""
    } else {
        " FOR UPDATE"
    };
    let sql = format!(
        "SELECT aggregate_id, status FROM outbox_event WHERE aggregate_type = 'order' \
         AND aggregate_id IN ({keys}) AND event_version = ?{lock}"
    );
    let values: Vec<sea_orm::Value> =
        orders.iter().map(|id| id.to_string().into()).chain([(version - 1).into()]).collect();
    txn.query_all_raw(idempost_testkit::sql::statement(backend, &sql, values))
        .await
        .unwrap()
        .iter()
        .filter(|row| row.try_get_by_index::<String>(1).unwrap() != "PUBLISHED")
        .map(|row| row.try_get_by_index::<String>(0).unwrap().parse().unwrap())
        .collect()
}

/// Each order's versions in the order the topic holds them.
pub(crate) fn versions_by_order(records: &[Record]) -> BTreeMap<i64, Vec<i64>> {
    let mut by_order: BTreeMap<i64, Vec<(i32, i64, i64)>> = BTreeMap::new();
    for record in records {
        let order_id: i64 = record.header("aggregate_id").parse().unwrap();
        let version: i64 = record.header("event_version").parse().unwrap();
        by_order.entry(order_id).or_default().push((record.partition, record.offset, version));
    }
    by_order
        .into_iter()
        .map(|(order_id, mut seen)| {
            let partitions: std::collections::HashSet<i32> = seen.iter().map(|s| s.0).collect();
            assert_eq!(partitions.len(), 1, "order {order_id} is on one partition: {seen:?}");
            seen.sort();
            (order_id, seen.into_iter().map(|(_, _, version)| version).collect())
        })
        .collect()
}

/// The topic's promise for one order: versions 1..=last, non-decreasing, each one at most one
/// above its predecessor; a version may repeat (a re-sent record) only before the next appears.
pub(crate) fn assert_in_order(order_id: i64, versions: &[i64], last: i64) {
    assert_eq!(versions.first(), Some(&1), "order {order_id} starts at version 1: {versions:?}");
    for pair in versions.windows(2) {
        assert!(
            pair[1] == pair[0] || pair[1] == pair[0] + 1,
            "order {order_id}: version {} after {} on the topic: {versions:?}",
            pair[1],
            pair[0]
        );
    }
    assert_eq!(versions.last(), Some(&last), "order {order_id} is complete: {versions:?}");
}

async fn status_of(probe: &OutboxProbe<'_>, event_id: &str) -> (String, i32) {
    let state = probe.state(event_id).await;
    (state.status, state.attempts)
}

#[cfg(feature = "failpoints")]
on_every_backend!(an_order_whose_first_event_is_refused_holds_back_only_its_own_later_events);

/// Proof (a): order 501's events are refused by the broker (a failpoint in the publisher), so its
/// version 1 backs off, spends its attempts and ends FAILED. Its versions 2 and 3 are never
/// claimed meanwhile, while every event of five other orders is published. After the refusal
/// ends and version 1 is redriven, the topic holds 501's versions 1 < 2 < 3.
#[cfg(feature = "failpoints")]
async fn an_order_whose_first_event_is_refused_holds_back_only_its_own_later_events(backend: Backend) {
    use idempost::backlog::{Redrive, RedriveAudit};

    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 2).await;
    let probe = OutboxProbe { conn: &app.conn };
    let orders: Vec<i64> = (501..=506).collect();
    let ids = seed_changes(&app.conn, &orders, 1..=3, 3).await;
    crate::helpers::arm("RELAY_PUBLISH_REJECTED_FOR_AGGREGATE", "return(501)");
    let mut settings = relay_settings(&app.db.url, &broker.address(), &topic);
    settings.max_attempts = 3;
    settings.workers = 2;
    let relay = TestRelay::spawn(settings).await;

    let others: Vec<&String> =
        ids.iter().filter(|((order_id, _), _)| *order_id != 501).map(|(_, id)| id).collect();
    assert_eventually("every other order's events are published", SLOW_WAIT, || async {
        let mut all = true;
        for id in &others {
            all &= probe.state(id).await.status == "PUBLISHED";
        }
        all
    })
    .await;
    assert_eventually("order 501's version 1 ends FAILED after its attempts", SLOW_WAIT, || async {
        status_of(&probe, &ids[&(501, 1)]).await.0 == "FAILED"
    })
    .await;
    // Versions 2 and 3 were never claimed: no attempt, still PENDING.
    for version in [2, 3] {
        assert_eq!(
            status_of(&probe, &ids[&(501, version)]).await,
            ("PENDING".to_owned(), 0),
            "order 501's version {version} waits behind version 1"
        );
    }

    fail::remove("RELAY_PUBLISH_REJECTED_FOR_AGGREGATE");
    let audit =
        RedriveAudit { requested_by: "test".to_owned(), reason: "the broker takes it now".to_owned() };
    assert_eq!(
        idempost::backlog::redrive(&app.conn, &ids[&(501, 1)], &audit).await.unwrap(),
        Redrive::Redriven
    );
    assert_eventually("order 501's versions are published after the redrive", SLOW_WAIT, || async {
        probe.count_with_status("PUBLISHED").await == 18
    })
    .await;
    relay.stop().await;

    let offsets: Vec<i64> = {
        let mut offsets = Vec::new();
        for version in 1..=3 {
            offsets.push(probe.state(&ids[&(501, version)]).await.offset.unwrap());
        }
        offsets
    };
    assert!(offsets[0] < offsets[1] && offsets[1] < offsets[2], "marked offsets {offsets:?}");
    let records = read_topic(&broker.address(), &topic, 18, SLOW_WAIT, SETTLE).await;
    let by_order = versions_by_order(&records);
    assert_eq!(by_order[&501], vec![1, 2, 3], "order 501 on the topic");
    for order_id in orders {
        assert_in_order(order_id, &by_order[&order_id], 3);
    }
}

on_every_backend!(four_relay_processes_killed_and_restarted_keep_every_orders_versions_in_order);

/// Orders in proof (b), and the versions of each: the 500 x 20 = 10,000 events.
const ORDERS: i64 = 500;
const CHANGES: i64 = 20;
/// Relay processes, and how many times one of them is SIGKILLed and replaced during the run.
const RELAYS: usize = 4;
const KILLS: usize = 6;

/// Proof (b): four relay processes (two loops each, 8 s leases) drain 500 orders x 20 changes;
/// one of them is SIGKILLed and replaced each time another eighth of the events is published,
/// and the second half of every order's versions is written after the first kill (before the
/// start on SQLite, whose one writer the test's insert would wait for behind eight relay loops
/// and a consumer). On the topic
/// every order's versions are complete and in order, and a consumer's read model ends at every
/// order's last version.
async fn four_relay_processes_killed_and_restarted_keep_every_orders_versions_in_order(backend: Backend) {
    use crate::helpers::TestService;

    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 4).await;
    let probe = OutboxProbe { conn: &app.conn };
    let orders: Vec<i64> = (1..=ORDERS).collect();
    let written_first = if backend == Backend::Sqlite { CHANGES } else { CHANGES / 2 };
    seed_changes(&app.conn, &orders, 1..=written_first, CHANGES).await;
    let mut settings = relay_settings(&app.db.url, &broker.address(), &topic);
    // Room for a loaded machine: a send that times out makes Tansu fail the producer until it
    // is rebuilt, which slows the run without testing anything more.
    settings.lease = Duration::from_secs(14);
    settings.delivery_timeout = Duration::from_secs(5);
    settings.lease_margin = Duration::from_secs(2);
    let mut args = relay_args(&settings);
    args.push("--workers=2".to_owned());
    let spawn = || TestService::spawn("idempost-relay", &args, &[]);
    let mut relays: Vec<TestService> = (0..RELAYS).map(|_| spawn()).collect();
    let consumer = TestConsumer::spawn(consumer_settings(
        &app.db.url,
        &broker.address(),
        &topic,
        &format!("ordering-{}", uuid::Uuid::new_v4().simple()),
    ))
    .await;

    let total = ORDERS * CHANGES;
    for kill in 0..KILLS {
        let threshold = total * (kill as i64 + 1) / (KILLS as i64 + 2);
        assert_eventually(&format!("{threshold} events published"), SLOW_WAIT, || async {
            probe.count_with_status("PUBLISHED").await >= threshold
        })
        .await;
        let victim = kill % RELAYS;
        relays[victim].kill().await;
        relays[victim] = spawn();
        if kill == 0 && written_first < CHANGES {
            seed_changes(&app.conn, &orders, written_first + 1..=CHANGES, CHANGES).await;
        }
    }
    assert_eventually("every event published", SLOW_WAIT, || async {
        probe.count_with_status("PUBLISHED").await == total
    })
    .await;

    let records = read_topic(&broker.address(), &topic, total as usize, SLOW_WAIT, SETTLE).await;
    let by_order = versions_by_order(&records);
    assert_eq!(by_order.len(), ORDERS as usize);
    for (order_id, versions) in &by_order {
        assert_in_order(*order_id, versions, CHANGES);
    }
    let want: BTreeMap<i64, Expected> = orders.iter().map(|&id| (id, expected(id, CHANGES))).collect();
    let name = idempost_consumer::Settings::new(&app.db.url, broker.address()).consumer_name;
    let caught_up =
        crate::helpers::eventually(SLOW_WAIT, || async { read_model(&app.conn, &name).await == want }).await;
    let seen = read_model(&app.conn, &name).await;
    consumer.stop().await;
    for relay in &mut relays {
        relay.kill().await;
    }
    assert!(
        caught_up,
        "the read model differs from the orders' last versions: {:?}",
        differences(&seen, &want)
    );
}

/// Where the read model differs from what it should be (at most ten orders).
fn differences(
    seen: &BTreeMap<i64, Expected>,
    want: &BTreeMap<i64, Expected>,
) -> Vec<(i64, Option<Expected>, Expected)> {
    want.iter()
        .filter(|(id, w)| seen.get(id) != Some(w))
        .take(10)
        .map(|(id, w)| (*id, seen.get(id).cloned(), w.clone()))
        .collect()
}

on_every_backend!(
    a_change_committed_while_its_previous_version_is_unpublished_waits_held_back_until_that_version_is_marked
);

/// The claim reads only events that may be their order's next: an amendment committed while
/// version 1 is in flight is written held back and no claim takes it; the mark of version 1
/// releases it in the mark's transaction and the next claim takes it; a cancellation committed
/// once version 2 is published is claimable at once.
async fn a_change_committed_while_its_previous_version_is_unpublished_waits_held_back_until_that_version_is_marked(
    backend: Backend,
) {
    use idempost_relay::{Delivery, Fenced, Outbox, WorkerId};

    use idempost_testkit::order::{amend, cancel};

    let app = TestOrder::spawn(backend).await;
    let order_id = app.submit(order(7, "held-1")).await.unwrap().order_id;
    let outbox = Outbox::new(app.db.connect().await);
    let worker = WorkerId::generate();
    let lease = Duration::from_secs(30);
    let delivery = Delivery { topic: "t".into(), partition: 0, offset: 1 };
    let v1 = outbox.claim(&worker, lease, 10).await.unwrap();
    assert_eq!(v1.len(), 1, "version 1 is claimed");

    let v2 = app.amend(amend("held-2", order_id, 1, 3)).await.unwrap().event_id;
    assert!(held_back(&app.conn, &v2).await, "version 1 was PUBLISHING when version 2 committed");
    assert!(outbox.claim(&worker, lease, 10).await.unwrap().is_empty(), "version 2 waits");
    let marked = outbox.mark_published(&v1[0].event_id, &v1[0].lease_token, &delivery).await.unwrap();
    assert_eq!(marked, Fenced::Done(()));
    assert!(!held_back(&app.conn, &v2).await, "the mark of version 1 released version 2");
    let claimed = outbox.claim(&worker, lease, 10).await.unwrap();
    assert_eq!(claimed.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>(), [v2.as_str()]);
    let marked = outbox.mark_published(&v2, &claimed[0].lease_token, &delivery).await.unwrap();
    assert_eq!(marked, Fenced::Done(()));

    let v3 = app.cancel(cancel("held-3", order_id, 2)).await.unwrap().event_id;
    assert!(!held_back(&app.conn, &v3).await, "version 2 was PUBLISHED when version 3 committed");
    let claimed = outbox.claim(&worker, lease, 10).await.unwrap();
    assert_eq!(claimed.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>(), [v3.as_str()]);
}

/// Whether the outbox row of `event_id` is held back.
async fn held_back(conn: &DatabaseConnection, event_id: &str) -> bool {
    let backend = conn.get_database_backend();
    let sql = "SELECT held_back FROM outbox_event WHERE event_id = ?";
    let row = conn
        .query_one_raw(idempost_testkit::sql::statement(backend, sql, vec![event_id.into()]))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no outbox row {event_id}"));
    row.try_get_by_index(0).unwrap()
}

#[cfg(feature = "failpoints")]
on_every_backend!(
    a_relay_with_two_producers_has_two_batches_at_the_broker_and_a_failed_batch_lets_no_version_overtake
);

/// Two loops over two producers (`--producers 2`, the default): the first two batches are held
/// until both are with the publisher, then go to the broker together (with one producer the
/// second waits for the first one's confirms, and they never meet). The third batch's producer
/// then turns fatal (a failpoint), so that whole batch fails while the other producer's batches
/// go on; its events are released, their orders' later versions wait, and once the producer is
/// replaced every order's versions are on the topic in order.
#[cfg(feature = "failpoints")]
async fn a_relay_with_two_producers_has_two_batches_at_the_broker_and_a_failed_batch_lets_no_version_overtake(
    backend: Backend,
) {
    use std::sync::Arc;

    use idempost::failpoint::RELAY_PRODUCER_FATAL;
    use idempost_relay::{KafkaPublisher, Relay, RetryPolicy, Tuning};

    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 3).await;
    let probe = OutboxProbe { conn: &app.conn };
    let orders: Vec<i64> = (1..=200).collect();
    let ids = seed_changes(&app.conn, &orders, 1..=3, 3).await;
    // Room for a loaded machine: the hold and the send together stay well inside the timeout.
    let kafka = KafkaPublisher::new(&broker.address(), topic.clone(), Duration::from_secs(10), &[])
        .unwrap()
        .with_producers(2)
        .unwrap();
    let publisher = Overlapping::new(kafka);
    let tuning = Tuning {
        batch_size: 50,
        lease: Duration::from_secs(20),
        delivery_timeout: Duration::from_secs(10),
        lease_margin: Duration::from_secs(2),
        retry: RetryPolicy {
            max_attempts: 10,
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_millis(500),
        },
        max_idle_poll: Duration::from_millis(100),
    };
    let outbox = idempost_relay::open_outbox(&app.db.url, 4).await.unwrap();
    let relay = Arc::new(Relay::new(outbox, publisher, tuning));
    // Claims start at 10 events: the first two batches pass, the third one's first send turns
    // its producer fatal, and every send of that batch fails with it.
    crate::helpers::arm(RELAY_PRODUCER_FATAL, "20*off->1*return");

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let loops: Vec<_> = (0..2)
        .map(|_| {
            let (relay, stopped) = (Arc::clone(&relay), stopped.clone());
            tokio::spawn(async move { relay.run(stopped).await })
        })
        .collect();
    assert_eventually("every event is PUBLISHED", SLOW_WAIT, || async {
        probe.count_with_status("PUBLISHED").await == 600
    })
    .await;
    stop.send(true).unwrap();
    for running in loops {
        running.await.unwrap().expect("the relay replaced its producer instead of stopping");
    }

    assert!(relay_publisher_overlapped(&relay), "two batches were with the broker at once");
    assert_eq!(relay.producer_rebuilds(), 1, "the fatal producer was replaced once");
    let mut retried = 0;
    for id in ids.values() {
        retried += usize::from(probe.state(id).await.attempts >= 2);
    }
    assert!(retried >= 10, "the failed batch's events were published on a later attempt: {retried}");
    for &order_id in &orders {
        let mut offsets = Vec::new();
        for version in 1..=3 {
            offsets.push(probe.state(&ids[&(order_id, version)]).await.offset.unwrap());
        }
        assert!(offsets.is_sorted(), "order {order_id}: marked offsets {offsets:?}");
    }
    let records = read_topic(&broker.address(), &topic, 600, SLOW_WAIT, SETTLE).await;
    let by_order = versions_by_order(&records);
    assert_eq!(by_order.len(), orders.len());
    for (order_id, versions) in &by_order {
        assert_in_order(*order_id, versions, 3);
    }
}

#[cfg(feature = "failpoints")]
fn relay_publisher_overlapped(relay: &idempost_relay::Relay<Overlapping>) -> bool {
    *relay.publisher().overlapped.borrow()
}

/// A Kafka publisher of two producers that holds every send until both producers have a batch,
/// and remembers whether they ever had. A hold that lasts 5 s ends every hold, so that a relay
/// whose batches never meet still publishes and the test fails on what it asserts.
#[cfg(feature = "failpoints")]
struct Overlapping {
    inner: idempost_relay::KafkaPublisher,
    in_flight: [std::sync::atomic::AtomicUsize; 2],
    overlapped: tokio::sync::watch::Sender<bool>,
    gave_up: std::sync::atomic::AtomicBool,
}

#[cfg(feature = "failpoints")]
impl Overlapping {
    fn new(inner: idempost_relay::KafkaPublisher) -> Self {
        Self {
            inner,
            in_flight: Default::default(),
            overlapped: tokio::sync::watch::Sender::new(false),
            gave_up: Default::default(),
        }
    }
}

#[cfg(feature = "failpoints")]
impl idempost_relay::Publisher for Overlapping {
    fn lanes(&self) -> usize {
        self.inner.lanes()
    }

    fn publish(
        &self,
        event: &idempost_relay::ClaimedEvent,
        lane: usize,
        hand_over_by: tokio::time::Instant,
    ) -> impl Future<Output = Result<idempost_relay::Delivery, idempost_relay::PublishError>> + Send {
        use std::sync::atomic::Ordering::SeqCst;
        let lane = lane % 2;
        self.in_flight[lane].fetch_add(1, SeqCst);
        if self.in_flight.iter().all(|n| n.load(SeqCst) > 0) {
            self.overlapped.send_replace(true);
        }
        // Built now, sent at its first poll: after the hold.
        let send = self.inner.publish(event, lane, hand_over_by);
        let mut overlapped = self.overlapped.subscribe();
        async move {
            if !self.gave_up.load(SeqCst) {
                let met =
                    tokio::time::timeout(Duration::from_secs(5), overlapped.wait_for(|both| *both)).await;
                self.gave_up.fetch_or(met.is_err(), SeqCst);
            }
            let sent = send.await;
            self.in_flight[lane].fetch_sub(1, SeqCst);
            sent
        }
    }

    fn fatal_error(&self) -> Option<String> {
        self.inner.fatal_error()
    }

    fn recover(&self, lane: usize, rejecting: bool) -> Result<Option<String>, String> {
        self.inner.recover(lane, rejecting)
    }
}
