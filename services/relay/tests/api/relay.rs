//! The relay against real databases and a real broker: every event reaches the topic at least
//! once, and none is marked PUBLISHED before the broker confirmed it.

use std::collections::HashSet;
use std::time::Duration;

use idempost_relay::{
    self as relay, Blame, ClaimedEvent, Fenced, Outbox, Released, StepOutcome, Tuning, WorkerId,
};
use idempost_relay::{KafkaPublisher, Relay, RetryPolicy};

use crate::broker::{Record, TestBroker, read_topic};
use crate::helpers::{
    Backend, OutboxProbe, TestOrder, TestService, assert_eventually, eventually, on_every_backend, order,
};
use idempost::entity::outbox_event;
use idempost_testkit::relay::{TestRelay, relay_args, relay_settings};
use sea_orm::EntityTrait as _;

use idempost_testkit::wait::WAIT;
const SETTLE: Duration = Duration::from_millis(1500);

fn topic() -> String {
    idempost_testkit::topic::unique("idempost-test")
}

/// Flags for a relay process with the default lease timings: on two shared cores a step may take
/// seconds, and a lease lost to a slow machine would be a duplicate, which the tests that use
/// these count as a failure.
fn ordinary_relay_args(app: &TestOrder, brokers: &str, topic: &str) -> Vec<String> {
    let mut settings = relay_settings(&app.db.url, brokers, topic);
    settings.lease = Duration::from_secs(30);
    settings.delivery_timeout = Duration::from_secs(10);
    settings.lease_margin = Duration::from_secs(5);
    relay_args(&settings)
}

async fn all_published(probe: &OutboxProbe<'_>, total: i64) -> bool {
    probe.count_with_status("PUBLISHED").await == total
}

on_every_backend!(
    orders_reach_the_topic_with_key_value_and_headers_and_end_published,
    two_relay_processes_drain_a_backlog_of_a_thousand_events,
    a_relay_stalled_past_its_lease_loses_the_event_and_its_late_mark_changes_nothing,
    while_the_broker_is_unreachable_nothing_is_published_and_no_attempt_is_spent,
    an_event_that_keeps_failing_ends_failed_and_redrive_returns_it,
    two_claims_by_one_worker_are_fenced_apart_so_the_stale_ones_mark_and_release_change_nothing,
    callers_submitting_at_8_16_and_64_at_once_while_two_relays_drain_see_no_rolled_back_and_no_deadlock,
    one_statement_marks_and_releases_only_the_rows_whose_claim_still_holds_them_each_with_its_own_values,
    a_claim_takes_expired_leases_first_then_the_oldest_due_events_up_to_its_size_each_counted_and_leased,
    a_relay_stopped_during_a_backlog_publishes_and_marks_every_batch_it_claimed_and_leaves_no_lease,
    two_relays_draining_one_backlog_publish_every_event_mark_each_once_and_log_no_deadlock,
    four_relays_draining_one_backlog_publish_every_event_mark_each_once_and_log_no_deadlock,
);

// What only a failpoint can stage: not compiled without them, so no test passes untested.
#[cfg(feature = "failpoints")]
on_every_backend!(
    a_late_loop_whose_publish_was_confirmed_does_not_mark_what_another_loop_of_its_relay_claimed_again,
    a_late_loop_whose_publish_failed_does_not_release_what_another_loop_of_its_relay_claimed_again,
    a_relay_delayed_past_its_lease_by_a_failpoint_confirms_late_and_marks_nothing,
    a_relay_stalled_between_claim_and_publish_past_its_publishing_budget_publishes_nothing,
    a_relay_killed_after_claiming_leaves_its_events_to_another_relay,
    a_relay_that_died_between_confirm_and_mark_publishes_the_event_again,
);

async fn two_relays_draining_one_backlog_publish_every_event_mark_each_once_and_log_no_deadlock(
    backend: Backend,
) {
    relays_drain_one_backlog(backend, 2).await;
}

async fn four_relays_draining_one_backlog_publish_every_event_mark_each_once_and_log_no_deadlock(
    backend: Backend,
) {
    relays_drain_one_backlog(backend, 4).await;
}

/// `relays` relay processes (two loops each, adaptive batches) drain one 2,000-event backlog.
async fn relays_drain_one_backlog(backend: Backend, relays: usize) {
    const EVENTS: usize = 2_000;
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 4).await;
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(EVENTS).await;
    let args = ordinary_relay_args(&app, &broker.address(), &topic);
    let logs = tempfile::tempdir().unwrap();
    let mut running = Vec::new();
    for n in 0..relays {
        running.push(MeteredRelay::spawn(&args, logs.path(), n).await);
    }
    assert_eventually("every event is PUBLISHED", Duration::from_secs(120), || {
        all_published(&probe, EVENTS as i64)
    })
    .await;

    let mut counts = Vec::new();
    for relay in running {
        counts.push(relay.stop().await);
    }
    assert_no_lock_trouble(&counts, &app.conn).await;
    // Every relay took part: the drain really ran them side by side.
    assert!(counts.iter().all(|c| c.published > 0.0), "a relay published nothing: {counts:#?}");
    let claimed_again = app.scalar_i64("SELECT COUNT(*) FROM outbox_event WHERE attempts <> 1").await;
    assert_eq!(claimed_again, 0, "every event was claimed once, so marked once");
    let records = read_topic(&broker.address(), &topic, EVENTS, WAIT, SETTLE).await;
    let seen: HashSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
    assert!(ids.iter().all(|id| seen.contains(id.as_str())), "every event reached the topic");
    // Claimed once each (above), so no relay sent an event twice. The topic may still hold a
    // copy more: librdkafka resends a request whose answer timed out, which a loaded machine
    // causes and Tansu 0.6 does not deduplicate. That is a duplicate, never a loss.
    assert_eq!(seen.len(), EVENTS, "only the seeded events reached the topic");
}

async fn one_statement_marks_and_releases_only_the_rows_whose_claim_still_holds_them_each_with_its_own_values(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(6).await;
    let outbox = Outbox::new(app.db.connect().await);
    let (relay_a, relay_b) = (WorkerId::generate(), WorkerId::generate());
    // Relay A claims the three oldest events for long and the next three briefly. In this
    // order, a slow machine cannot let the short lease expire before the long claim is made
    // (a claim takes expired leases first, which would hand A its own rows again).
    let held = outbox.claim(&relay_a, Duration::from_secs(30), 3).await.unwrap();
    let lost = outbox.claim(&relay_a, Duration::from_millis(300), 3).await.unwrap();
    // Relay B takes the last three over once A's short lease has expired.
    let taken_over = claim_once_expired(&outbox, &relay_b).await;
    assert_eq!(
        taken_over.iter().map(|e| &e.event_id).collect::<Vec<_>>(),
        ids[3..].iter().collect::<Vec<_>>()
    );
    let taken_over_states: Vec<_> =
        futures::future::join_all(ids[3..].iter().map(|id| probe.state(id))).await;

    // A marks all six in one call, the lost ones interleaved with the held ones.
    let deliveries: Vec<idempost_relay::Delivery> = (0..6)
        .map(|i| idempost_relay::Delivery { topic: "t".into(), partition: i % 3, offset: 100 + i64::from(i) })
        .collect();
    let mine = [&held[0], &lost[0], &held[1], &lost[1], &held[2], &lost[2]];
    let marks: Vec<_> = mine
        .iter()
        .zip(&deliveries)
        .map(|(event, delivery)| (event.event_id.as_str(), &event.lease_token, delivery))
        .collect();
    let outcomes = outbox.mark_all_published(&marks).await.unwrap();
    use Fenced::{Done, LeaseLost};
    assert_eq!(outcomes, [Done(()), LeaseLost, Done(()), LeaseLost, Done(()), LeaseLost]);
    for (event, delivery) in mine.iter().zip(&deliveries).step_by(2) {
        let state = probe.state(&event.event_id).await;
        assert_eq!(
            (state.status.as_str(), state.partition, state.offset, state.lease_owner),
            ("PUBLISHED", Some(delivery.partition), Some(delivery.offset), None),
            "each row got its own partition and offset"
        );
    }
    let after: Vec<_> = futures::future::join_all(ids[3..].iter().map(|id| probe.state(id))).await;
    assert_eq!(after, taken_over_states, "rows another claim holds are untouched");

    // Releases likewise: B's own rows go back with their own errors; A's stale one does not.
    let retry = quick_retry(12);
    let failures = [
        (&taken_over[0], "error 0", Blame::Event),
        (&lost[1], "stale", Blame::Event),
        (&taken_over[2], "error 2", Blame::Event),
    ];
    let released = outbox.release_all(&failures, &retry).await.unwrap();
    assert!(
        matches!(released[..], [Done(Released::RetryAt(_)), LeaseLost, Done(Released::RetryAt(_))]),
        "{released:?}"
    );
    for (id, error) in [(&ids[3], "error 0"), (&ids[5], "error 2")] {
        let state = probe.state(id).await;
        assert_eq!(
            (state.status.as_str(), state.last_error.as_deref(), state.lease_owner),
            ("PENDING", Some(error), None)
        );
    }
    assert_eq!(probe.state(&ids[4]).await, taken_over_states[1], "the stale release changed nothing");
}

async fn a_claim_takes_expired_leases_first_then_the_oldest_due_events_up_to_its_size_each_counted_and_leased(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    let probe = OutboxProbe { conn: &app.conn };
    let mut ids = probe.seed(3).await;
    let outbox = Outbox::new(app.db.connect().await);
    let (relay_a, relay_b) = (WorkerId::generate(), WorkerId::generate());
    let brief = outbox.claim(&relay_a, Duration::from_millis(300), 2).await.unwrap();
    assert_eq!(brief.iter().map(|e| &e.event_id).collect::<Vec<_>>(), ids[..2].iter().collect::<Vec<_>>());
    // Two newer events: a claim that took due events first would take these and the third.
    ids.extend(probe.seed(2).await);
    let expired_at = brief.iter().map(|e| e.lease_until).max().unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while idempost::db::now(&app.conn).await.unwrap() <= expired_at {
        assert!(tokio::time::Instant::now() < deadline, "the database clock never passed the lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let claimed = outbox.claim(&relay_b, Duration::from_secs(30), 3).await.unwrap();
    let claimed_at = idempost::db::now(&app.conn).await.unwrap();
    assert_eq!(
        claimed.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>(),
        [ids[0].as_str(), ids[1].as_str(), ids[2].as_str()],
        "both expired leases, then the oldest due event, oldest first"
    );
    assert_eq!(claimed.iter().map(|e| e.attempts).collect::<Vec<_>>(), [2, 2, 1], "every claim counts");
    let token = &claimed[0].lease_token;
    assert!(token.as_str().starts_with(relay_b.as_str()), "{token} is relay B's");
    for event in &claimed {
        assert_eq!(&event.lease_token, token, "one claim, one fence");
        let lease_left = (event.lease_until - claimed_at).to_std().unwrap_or_default();
        assert!(
            lease_left > Duration::from_secs(25),
            "leased for 30 s by the database clock: {lease_left:?}"
        );
        let state = probe.state(&event.event_id).await;
        assert_eq!(
            (state.status.as_str(), state.attempts, state.lease_owner.as_deref()),
            ("PUBLISHING", event.attempts, Some(token.as_str()))
        );
    }
    let next = outbox.claim(&relay_b, Duration::from_secs(30), 1).await.unwrap();
    assert_eq!(next.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>(), [ids[3].as_str()]);
    assert_eq!(probe.state(&ids[4]).await.status, "PENDING", "a claim takes no more than its size");
}

async fn a_relay_stopped_during_a_backlog_publishes_and_marks_every_batch_it_claimed_and_leaves_no_lease(
    backend: Backend,
) {
    const EVENTS: usize = 400;
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(EVENTS).await;
    let mut settings = relay_settings(&app.db.url, &broker.address(), &topic);
    // Small batches: the stop finds batches in flight in both loops.
    settings.batch_size = 20;
    let relay = TestRelay::spawn(settings).await;
    assert_eventually("the relay marked its first batches", WAIT, || async {
        probe.count_with_status("PUBLISHED").await >= 40
    })
    .await;
    relay.stop().await;

    assert_eq!(probe.count_with_status("PUBLISHING").await, 0, "no claim was left to its lease");
    let published = probe.count_with_status("PUBLISHED").await;
    assert_eq!(published + probe.count_with_status("PENDING").await, EVENTS as i64);
    let records = read_topic(&broker.address(), &topic, published as usize, WAIT, SETTLE).await;
    assert_eq!(records.len() as i64, published, "each claimed event was published once and marked");
    let seen: HashSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
    for id in &ids {
        let state = probe.state(id).await;
        if state.status == "PUBLISHED" {
            assert!(seen.contains(id.as_str()) && state.attempts == 1, "{id}: {state:?}");
        } else {
            assert_eq!(state.attempts, 0, "{id} was claimed but not published: {state:?}");
        }
    }
}

/// A relay process exporting its metrics to a receiver of its own; its log goes to a file, read
/// only to explain a failure.
struct MeteredRelay {
    process: TestService,
    received: crate::otlp::Received,
    _receiver: tokio::task::JoinHandle<()>,
}

/// What one relay counted over its run, as it exported it at its exit.
#[derive(Debug)]
struct RelayCounts {
    published: f64,
    lease_losses: f64,
    lock_conflicts: f64,
    /// Claims that waited out the claim gate (MariaDB) and claimed without it.
    gate_timeouts: f64,
    /// Its warnings and errors, for the failure message (read through `Debug` only).
    #[allow(dead_code)]
    warnings: Vec<String>,
}

impl RelayCounts {
    /// Deadlocks, lock-wait timeouts and lost leases the relay met: none when its statements
    /// never wait on each other's rows.
    fn lock_trouble(&self) -> f64 {
        self.lease_losses + self.lock_conflicts
    }
}

/// Fails unless every relay met no lock trouble; the message carries the server's account of
/// its latest deadlock, which names both statements (the relays' logs name only their own).
async fn assert_no_lock_trouble(counts: &[RelayCounts], conn: &sea_orm::DatabaseConnection) {
    if counts.iter().any(|c| c.lock_trouble() != 0.0) {
        let deadlock = idempost_testkit::db::latest_deadlock(conn).await;
        panic!("a relay met lock trouble: {counts:#?}\n{deadlock}");
    }
}

impl MeteredRelay {
    async fn spawn(args: &[String], dir: &std::path::Path, n: usize) -> Self {
        let (endpoint, received, receiver) = crate::otlp::start_receiver().await;
        let env = [
            // Warnings and errors, and each event's claim and mark.
            ("RUST_LOG", "warn,idempost_relay::worker=info".to_owned()),
            ("NO_COLOR", "1".to_owned()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_METRIC_EXPORT_INTERVAL", "300".to_owned()),
        ];
        let log = dir.join(format!("relay-{n}.log"));
        Self {
            process: TestService::spawn_logged("idempost-relay", args, &env, log),
            received,
            _receiver: receiver,
        }
    }

    /// The largest value exported for the counter `name` (a cumulative sum).
    fn counter(&self, name: &str) -> f64 {
        self.received.points().iter().filter(|p| p.name == name).map(|p| p.value).fold(0.0, f64::max)
    }

    /// SIGTERM, a clean exit (which flushes its metrics), and what it counted.
    async fn stop(mut self) -> RelayCounts {
        self.process.signal("TERM").await;
        let exit = self.process.wait(Duration::from_secs(40)).await;
        assert!(exit.success(), "the relay exits 0 after SIGTERM: {exit:?}");
        let log = self.process.log();
        let warnings = log
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .take(20)
            .map(str::to_owned)
            .collect();
        RelayCounts {
            published: self.counter("idempost.relay.published"),
            lease_losses: self.counter("idempost.relay.lease_losses"),
            lock_conflicts: self.counter("idempost.relay.lock_conflicts"),
            gate_timeouts: self.counter("idempost.relay.claim_gate_timeouts"),
            warnings,
        }
    }
}

async fn callers_submitting_at_8_16_and_64_at_once_while_two_relays_drain_see_no_rolled_back_and_no_deadlock(
    backend: Backend,
) {
    use futures::StreamExt as _;

    let app = TestOrder::spawn_with(backend, |settings| settings.db_max_connections = 32).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 4).await;
    let probe = OutboxProbe { conn: &app.conn };
    // A backlog, so that both relays are claiming and marking from the first submission on.
    const BACKLOG: i64 = 600;
    probe.seed(BACKLOG as usize).await;
    let args = ordinary_relay_args(&app, &broker.address(), &topic);
    let logs = tempfile::tempdir().unwrap();
    let relays =
        [MeteredRelay::spawn(&args, logs.path(), 1).await, MeteredRelay::spawn(&args, logs.path(), 2).await];
    assert_eventually("the relays are publishing", WAIT, || async {
        probe.count_with_status("PUBLISHED").await > 0
    })
    .await;

    let mut submitted = 0i64;
    for (callers, orders) in [(8usize, 160usize), (16, 240), (64, 400)] {
        let published_before = probe.count_with_status("PUBLISHED").await;
        let outcomes: Vec<_> = futures::stream::iter(0..orders)
            .map(|i| app.submit(order(7, &format!("c{callers}-{i}"))))
            .buffer_unordered(callers)
            .collect()
            .await;
        let published_after = probe.count_with_status("PUBLISHED").await;
        let failed: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
        assert!(
            failed.is_empty(),
            "{callers} callers: {} of {orders} failed: {:?}",
            failed.len(),
            failed.first()
        );
        assert!(
            published_after > published_before,
            "the relays published while {callers} callers submitted ({published_before} -> {published_after})"
        );
        submitted += orders as i64;
    }
    let total = BACKLOG + submitted;
    assert_eventually("every event is PUBLISHED", Duration::from_secs(120), || all_published(&probe, total))
        .await;
    let mut counts = Vec::new();
    for relay in relays {
        counts.push(relay.stop().await);
    }
    assert_no_lock_trouble(&counts, &app.conn).await;
    let claimed_again = app.scalar_i64("SELECT COUNT(*) FROM outbox_event WHERE attempts <> 1").await;
    assert_eq!(claimed_again, 0, "every event was claimed once and marked once; the relays: {counts:#?}");
}

async fn orders_reach_the_topic_with_key_value_and_headers_and_end_published(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 3).await;
    let mut accepted = Vec::new();
    for i in 0..5 {
        accepted.push(app.submit(order(7, &format!("req-{i}"))).await.unwrap());
    }

    let relay = TestRelay::spawn(relay_settings(&app.db.url, &broker.address(), &topic)).await;
    let probe = OutboxProbe { conn: &app.conn };
    assert_eventually("every event is PUBLISHED", WAIT, || all_published(&probe, 5)).await;
    relay.stop().await;

    let records = read_topic(&broker.address(), &topic, 5, WAIT, SETTLE).await;
    assert_eq!(records.len(), 5, "one record per event when nothing failed");
    for answer in &accepted {
        let record =
            records.iter().find(|r| r.header("event_id") == answer.event_id).expect("event on the topic");
        let (_, payload) = app.outbox_row(&answer.event_id).await.unwrap();
        assert_eq!(record.key, answer.order_id.to_string().into_bytes(), "key = aggregate id");
        assert_eq!(record.value, payload, "value = stored payload, verbatim");
        assert_eq!(record.header("event_type"), "idempost.v1.OrderAccepted");
        assert_eq!(record.header("event_version"), "1");
        assert_eq!(record.header("aggregate_type"), "order");
        assert_eq!(record.header("aggregate_id"), answer.order_id.to_string());
        assert_eq!(record.header("content-type"), idempost::contract::CONTENT_TYPE);
        assert_cloudevents_binary(record, &app, &answer.event_id, answer.order_id).await;
        let state = probe.state(&answer.event_id).await;
        assert!(state.published && state.lease_owner.is_none() && state.attempts == 1, "{state:?}");
        assert_eq!((state.partition, state.offset), (Some(record.partition), Some(record.offset)));
    }
}

/// The CloudEvents 1.0 Kafka binding's binary mode on `record`, the relay's default: every
/// attribute a `ce_*` header with the event's value (the data content type is `content-type`).
async fn assert_cloudevents_binary(record: &Record, app: &TestOrder, event_id: &str, order_id: i64) {
    let row = outbox_event::Entity::find_by_id(event_id).one(&app.conn).await.unwrap().unwrap();
    assert_eq!(record.header("ce_specversion"), "1.0");
    assert_eq!(record.header("ce_id"), event_id);
    assert_eq!(record.header("ce_source"), idempost::contract::CLOUDEVENTS_SOURCE);
    assert_eq!(record.header("ce_type"), "idempost.v1.OrderAccepted");
    assert_eq!(record.header("ce_subject"), order_id.to_string());
    let time = chrono::DateTime::parse_from_rfc3339(record.header("ce_time")).expect("ce_time is RFC 3339");
    assert_eq!(time, row.created_at, "ce_time is when the order service wrote the event");
    assert_eq!(record.header("ce_traceparent"), record.header("traceparent"), "the tracing extension");
    assert_eq!(record.header("ce_tracestate"), record.header("tracestate"));
}

async fn two_relay_processes_drain_a_backlog_of_a_thousand_events(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 4).await;
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(1_000).await;

    let mut settings = relay_settings(&app.db.url, &broker.address(), &topic);
    settings.batch_size = 50;
    let args = relay_args(&settings);
    let mut relays =
        [TestService::spawn("idempost-relay", &args, &[]), TestService::spawn("idempost-relay", &args, &[])];
    assert_eventually("all 1000 events are PUBLISHED", Duration::from_secs(120), || {
        all_published(&probe, 1_000)
    })
    .await;

    // SIGTERM drains and exits 0.
    for relay in &mut relays {
        relay.signal("TERM").await;
        assert!(relay.wait(Duration::from_secs(15)).await.success());
    }
    let records = read_topic(&broker.address(), &topic, 1_000, WAIT, SETTLE).await;
    let seen: HashSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
    assert!(ids.iter().all(|id| seen.contains(id.as_str())), "every event reached the topic");
}

async fn a_relay_stalled_past_its_lease_loses_the_event_and_its_late_mark_changes_nothing(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(1).await;
    let event_id = &ids[0];
    let outbox = Outbox::new(app.db.connect().await);
    let publisher =
        || KafkaPublisher::new(&broker.address(), topic.clone(), Duration::from_secs(3), &[]).unwrap();
    let tuning = Tuning {
        batch_size: 10,
        lease: Duration::from_millis(800),
        delivery_timeout: Duration::from_secs(10),
        lease_margin: Duration::ZERO,
        retry: RetryPolicy {
            max_attempts: 10,
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1),
        },
        max_idle_poll: Duration::from_millis(100),
    };
    let old = Relay::new(outbox.clone(), publisher(), tuning.clone());
    let new = Relay::new(outbox.clone(), publisher(), tuning.clone());

    // The old owner claims, then its lease runs out before it gets to publish.
    let claimed = outbox.claim(old.owner(), tuning.lease, 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eventually("the new relay claims the expired lease", WAIT, || async {
        matches!(new.step().await.unwrap(), StepOutcome::Worked(report) if report.published == 1)
    })
    .await;
    let after_new = probe.state(event_id).await;
    assert_eq!(after_new.status, "PUBLISHED");

    // The old owner now confirms late: its owner-fenced mark must change nothing.
    let delivery = idempost_relay::Delivery { topic: topic.clone(), partition: 0, offset: 999 };
    let stale = &claimed[0].lease_token;
    assert_eq!(outbox.mark_published(event_id, stale, &delivery).await.unwrap(), Fenced::LeaseLost);
    assert_eq!(probe.state(event_id).await, after_new, "the new owner's result is intact");

    // While a newer owner still holds the lease, a stale worker cannot touch it either.
    let more = probe.seed(1).await;
    let first = outbox.claim(old.owner(), Duration::from_millis(300), 10).await.unwrap();
    assert_eq!(first.len(), 1);
    let second = claim_once_expired(&outbox, new.owner()).await;
    let stale = &first[0].lease_token;
    assert_eq!(outbox.mark_published(&more[0], stale, &delivery).await.unwrap(), Fenced::LeaseLost);
    let released = outbox.release(&first[0], "late failure", &tuning.retry).await.unwrap();
    assert_eq!(released, Fenced::LeaseLost);
    let state = probe.state(&more[0]).await;
    assert_eq!(state.status, "PUBLISHING");
    assert_eq!(state.lease_owner.as_deref(), Some(second[0].lease_token.as_str()));
    assert_eq!(state.last_error, None);
}

/// Claims for `worker` with a 30 s lease as soon as something is claimable: an expired lease
/// becomes claimable only once it has passed by the database clock.
async fn claim_once_expired(outbox: &Outbox, worker: &WorkerId) -> Vec<ClaimedEvent> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let claimed = outbox.claim(worker, Duration::from_secs(30), 10).await.unwrap();
        if !claimed.is_empty() {
            return claimed;
        }
        assert!(tokio::time::Instant::now() < deadline, "the expired lease was never claimed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Loop A of a relay steps apart ([`step_apart`]), claims `event_id` and is held before
/// publishing; once its lease has expired, loop B of the same relay (its worker id) claims it
/// again, and only then does loop A go on. Returns loop A's step, loop B's claim and the row as
/// loop B holds it.
///
/// Loop A is held, not delayed by a sleep: had it gone on before loop B's claim, its lease
/// would still have been its own, and its mark or release would rightly have taken.
#[cfg(feature = "failpoints")]
async fn another_loop_takes_over(
    app: &TestOrder,
    publisher: impl FnOnce() -> KafkaPublisher + Send + 'static,
    tuning: Tuning,
    outbox: &Outbox,
    probe: &OutboxProbe<'_>,
    event_id: &str,
) -> (tokio::sync::oneshot::Receiver<StepOutcome>, Vec<ClaimedEvent>, crate::helpers::OutboxState) {
    let mut held = crate::helpers::hold(idempost::failpoint::DURING_CONCURRENT_CLAIM);
    let (worker, loop_a) = step_apart(app, publisher, tuning).await;
    held.reached("loop A has claimed and stops before publishing", WAIT).await;
    let loop_b = claim_once_expired(outbox, &worker).await;
    let held_by_b = probe.state(event_id).await;
    held.release();
    (loop_a, loop_b, held_by_b)
}

/// A slow relay (a runtime of its own, see [`step_apart`]) claims `event_id` and is held at
/// `DURING_CONCURRENT_CLAIM` before publishing, until a fast relay has taken its expired lease and
/// published. Answers the hold (still holding), the slow relay's step, and the row as the fast
/// relay left it.
#[cfg(feature = "failpoints")]
async fn overtaken_while_held(
    app: &TestOrder,
    probe: &OutboxProbe<'_>,
    outbox: &Outbox,
    publisher: impl Fn() -> KafkaPublisher + Send + 'static,
    fast_tuning: Tuning,
    slow_tuning: Tuning,
    event_id: &str,
) -> (
    idempost_testkit::failpoint::Held,
    tokio::sync::oneshot::Receiver<StepOutcome>,
    crate::helpers::OutboxState,
) {
    let mut held = crate::helpers::hold(idempost::failpoint::DURING_CONCURRENT_CLAIM);
    let fast = Relay::new(outbox.clone(), publisher(), fast_tuning);
    let (slow_owner, slow_step) = step_apart(app, publisher, slow_tuning).await;
    held.reached("the slow relay has claimed and stops before publishing", WAIT).await;
    let holder = probe.state(event_id).await.lease_owner;
    assert!(holder.as_deref().is_some_and(|t| t.starts_with(slow_owner.as_str())), "{holder:?}");
    // The fast relay's claim succeeds only once the slow relay's lease has expired.
    assert_eventually("the fast relay takes the expired lease and publishes", WAIT, || async {
        matches!(fast.step().await.unwrap(), StepOutcome::Worked(report) if report.published == 1)
    })
    .await;
    (held, slow_step, probe.state(event_id).await)
}

/// One step of a relay with a thread, a runtime and a database pool of its own, as a relay in
/// another process has; returns its worker id and, once the step has ended, its outcome.
///
/// A failpoint that holds or sleeps blocks its thread. On a worker of the test's own runtime
/// that could stall the runtime's I/O driver and timers too (the blocked worker may be the one
/// that polled them last, the others asleep), so the test itself could not claim, query or
/// time out until the relay went on.
#[cfg(feature = "failpoints")]
async fn step_apart(
    app: &TestOrder,
    publisher: impl FnOnce() -> KafkaPublisher + Send + 'static,
    tuning: Tuning,
) -> (WorkerId, tokio::sync::oneshot::Receiver<StepOutcome>) {
    let database_url = app.db.url.clone();
    let (owner, owner_rx) = tokio::sync::oneshot::channel();
    let (done, done_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let outbox = Outbox::new(idempost::db::connect(&database_url, 4).await.unwrap());
            let relay = Relay::new(outbox, publisher(), tuning);
            owner.send(relay.owner().clone()).unwrap();
            let _ = done.send(relay.step().await.unwrap());
        });
    });
    (owner_rx.await.expect("the relay apart started"), done_rx)
}

fn quick_retry(max_attempts: i32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        backoff_base: Duration::from_millis(100),
        backoff_max: Duration::from_secs(1),
    }
}

async fn two_claims_by_one_worker_are_fenced_apart_so_the_stale_ones_mark_and_release_change_nothing(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(2).await;
    let outbox = Outbox::new(app.db.connect().await);
    // One relay, two loops: both claim under the same worker id, as `--workers 2` does.
    let worker = WorkerId::generate();
    // One attempt allowed, so a stale release that took effect would end the event FAILED.
    let retry = quick_retry(1);

    let loop_a = outbox.claim(&worker, Duration::from_millis(300), 10).await.unwrap();
    assert_eq!(loop_a.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>(), ids);
    let loop_b = claim_once_expired(&outbox, &worker).await;
    assert_eq!(loop_b.len(), 2, "loop B claimed both events again after loop A's lease expired");
    assert_ne!(loop_a[0].lease_token, loop_b[0].lease_token, "every claim has its own fence");
    let held_by_b = [probe.state(&ids[0]).await, probe.state(&ids[1]).await];
    assert!(held_by_b.iter().all(|s| s.status == "PUBLISHING" && s.attempts == 2), "{held_by_b:?}");

    // Loop A's late outcomes: the first event failed for its last allowed time, the second was
    // confirmed. Neither may touch what loop B holds.
    let late = idempost_relay::Delivery { topic: "t".into(), partition: 0, offset: 999 };
    assert_eq!(outbox.release(&loop_a[0], "late failure", &retry).await.unwrap(), Fenced::LeaseLost);
    let late_marks = outbox
        .mark_all_published(&[(loop_a[1].event_id.as_str(), &loop_a[1].lease_token, &late)])
        .await
        .unwrap();
    assert_eq!(late_marks, [Fenced::LeaseLost]);
    assert_eq!(
        [probe.state(&ids[0]).await, probe.state(&ids[1]).await],
        held_by_b,
        "the stale loop changed nothing"
    );

    // Loop B's own outcomes still land.
    let delivery = idempost_relay::Delivery { topic: "t".into(), partition: 1, offset: 7 };
    assert_eq!(
        outbox.mark_published(&loop_b[1].event_id, &loop_b[1].lease_token, &delivery).await.unwrap(),
        Fenced::Done(())
    );
    let released = outbox.release(&loop_b[0], "broker said no", &quick_retry(12)).await.unwrap();
    assert!(matches!(released, Fenced::Done(Released::RetryAt(_))), "{released:?}");
    let marked = probe.state(&ids[1]).await;
    assert_eq!((marked.status.as_str(), marked.partition, marked.offset), ("PUBLISHED", Some(1), Some(7)));
    let pending = probe.state(&ids[0]).await;
    assert_eq!((pending.status.as_str(), pending.last_error.as_deref()), ("PENDING", Some("broker said no")));
}

#[cfg(feature = "failpoints")]
async fn a_late_loop_whose_publish_failed_does_not_release_what_another_loop_of_its_relay_claimed_again(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    // Nothing listens there: every publish fails, after the delivery timeout.
    let broker = TestBroker::reserve();
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(1).await;
    let outbox = Outbox::new(app.db.connect().await);
    let brokers = broker.address();
    let publisher = move || KafkaPublisher::new(&brokers, topic(), Duration::from_millis(1500), &[]).unwrap();
    let tuning = Tuning {
        batch_size: 10,
        lease: Duration::from_millis(300),
        delivery_timeout: Duration::from_millis(1500),
        lease_margin: Duration::ZERO,
        retry: quick_retry(1),
        max_idle_poll: Duration::from_millis(100),
    };
    // Loop A's publish fails only after loop B has claimed the event again.
    let (loop_a, loop_b, held_by_b) =
        another_loop_takes_over(&app, publisher, tuning, &outbox, &probe, &ids[0]).await;
    assert_eq!(held_by_b.lease_owner.as_deref(), Some(loop_b[0].lease_token.as_str()));

    let StepOutcome::Worked(report) = loop_a.await.unwrap() else { panic!("loop A had claimed") };
    assert_eq!((report.failed, report.released, report.lease_lost), (0, 0, 1), "{report:?}");
    assert_eq!(probe.state(&ids[0]).await, held_by_b, "loop A's late release changed nothing");
}

#[cfg(feature = "failpoints")]
async fn a_relay_killed_after_claiming_leaves_its_events_to_another_relay(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 2).await;
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(20).await;
    let args = relay_args(&relay_settings(&app.db.url, &broker.address(), &topic));

    // This relay claims, then hangs before publishing until it is killed. One loop: with two,
    // the loop that committed first may hold the newer events while the other's claim of the
    // oldest is still open (seen on MariaDB, whose claim takes several round trips).
    let mut stalled_args = args.clone();
    stalled_args.push("--workers=1".to_owned());
    let stalled = TestService::spawn(
        "idempost-relay",
        &stalled_args,
        &[("FAILPOINTS", "DURING_CONCURRENT_CLAIM=sleep(600000)".into())],
    );
    assert_eventually("the first relay holds leases", WAIT, || async {
        probe.count_with_status("PUBLISHING").await > 0
    })
    .await;
    let leased_to_first = probe.state(&ids[0]).await.lease_owner.expect("a lease owner");
    stalled.signal("KILL").await;

    let logs = tempfile::tempdir().unwrap();
    let rescuer = MeteredRelay::spawn(&args, logs.path(), 2).await;
    if !eventually(WAIT, || all_published(&probe, 20)).await {
        let mut states = Vec::new();
        for id in &ids {
            states.push(probe.state(id).await);
        }
        panic!(
            "the second relay did not publish every event in {WAIT:?}: {states:#?}\nits log:\n{}",
            rescuer.process.log()
        );
    }
    assert!(leased_to_first.contains(&format!("/{}/", stalled.pid())), "{leased_to_first}");
    let records = read_topic(&broker.address(), &topic, 20, WAIT, SETTLE).await;
    let seen: HashSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
    assert!(ids.iter().all(|id| seen.contains(id.as_str())));
}

async fn while_the_broker_is_unreachable_nothing_is_published_and_no_attempt_is_spent(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let mut broker = TestBroker::reserve();
    let topic = topic();
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(3).await;
    let mut settings = relay_settings(&app.db.url, &broker.address(), &topic);
    // Long enough for a first publish to a freshly started broker on a loaded machine.
    settings.delivery_timeout = Duration::from_secs(2);
    settings.lease = Duration::from_secs(7);
    settings.lease_margin = Duration::from_secs(1);
    // One attempt allowed: were an unreachable broker to spend attempts, the first failure
    // would end the event FAILED. It must not, however long the outage lasts.
    settings.max_attempts = 1;
    let relay = TestRelay::spawn(settings).await;

    let failed_again = || async {
        let mut all = true;
        for id in &ids {
            let state = probe.state(id).await;
            assert!(!state.published, "published without a broker: {state:?}");
            assert_ne!(state.status, "FAILED", "an unreachable broker spent the attempt: {state:?}");
            if state.status == "PENDING" {
                assert_eq!(state.attempts, 0, "released without spending an attempt: {state:?}");
            }
            all &= state.last_error.is_some();
        }
        all
    };
    assert_eventually("every event failed once", WAIT, failed_again).await;
    // Clear the errors: the relay writes them again only by failing (and releasing) again.
    use sea_orm::ConnectionTrait as _;
    app.conn.execute_unprepared("UPDATE outbox_event SET last_error = NULL").await.unwrap();
    assert_eventually("every event failed at least twice", WAIT, failed_again).await;
    assert_eq!(probe.count_with_status("PUBLISHED").await, 0);

    broker.run().await;
    broker.create_topic(&topic, 1).await;
    assert_eventually("the backlog drains once the broker is back", WAIT, || all_published(&probe, 3)).await;
    relay.stop().await;
    let records = read_topic(&broker.address(), &topic, 3, WAIT, SETTLE).await;
    assert!(records.len() >= 3);
}

#[cfg(feature = "failpoints")]
async fn a_relay_that_died_between_confirm_and_mark_publishes_the_event_again(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let accepted = app.submit(order(7, "req-1")).await.unwrap();
    let probe = OutboxProbe { conn: &app.conn };
    let args = relay_args(&relay_settings(&app.db.url, &broker.address(), &topic));

    let mut crashing = TestService::spawn(
        "idempost-relay",
        &args,
        &[("FAILPOINTS", "AFTER_BROKER_CONFIRM_BEFORE_MARK_PUBLISHED=return(abort)".into())],
    );
    let exit = crashing.wait(WAIT).await;
    assert!(!exit.success(), "the relay crashed right after the confirm");
    let first_copy = read_topic(&broker.address(), &topic, 1, WAIT, Duration::ZERO).await;
    assert_eq!(first_copy[0].header("event_id"), accepted.event_id);
    assert_eq!(probe.state(&accepted.event_id).await.status, "PUBLISHING", "confirmed but never marked");

    let _second = TestService::spawn("idempost-relay", &args, &[]);
    assert_eventually("the event is published again and marked", WAIT, || all_published(&probe, 1)).await;
    let records = read_topic(&broker.address(), &topic, 2, WAIT, SETTLE).await;
    let copies = records.iter().filter(|r| r.header("event_id") == accepted.event_id).count();
    assert_eq!(copies, 2, "the duplicate is on the topic: at least once, never exactly once");
}

async fn an_event_that_keeps_failing_ends_failed_and_redrive_returns_it(backend: Backend) {
    use sea_orm::ConnectionTrait as _;
    let app = TestOrder::spawn(backend).await;
    let mut broker = TestBroker::reserve();
    let topic = topic();
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(1).await;
    // A record this relay's producer refuses by itself (larger than its message.max.bytes): the
    // event, not the broker, is to blame, so each failure spends an attempt.
    let backend_kind = app.conn.get_database_backend();
    let placeholder = if backend_kind == sea_orm::DbBackend::Postgres { "$1" } else { "?" };
    app.conn
        .execute_raw(sea_orm::Statement::from_sql_and_values(
            backend_kind,
            format!("UPDATE outbox_event SET payload = {placeholder}"),
            [vec![b'x'; 4_000].into()],
        ))
        .await
        .unwrap();
    let mut settings = relay_settings(&app.db.url, &broker.address(), &topic);
    settings.delivery_timeout = Duration::from_millis(500);
    settings.lease = Duration::from_secs(4);
    settings.lease_margin = Duration::from_millis(500);
    settings.max_attempts = 2;
    let mut refusing = settings.clone();
    refusing.kafka.options = vec![("message.max.bytes".into(), "1000".into())];
    let relay = TestRelay::spawn(refusing).await;

    assert_eventually("the event is FAILED", WAIT, || async {
        probe.state(&ids[0]).await.status == "FAILED"
    })
    .await;
    let failed = probe.state(&ids[0]).await;
    assert_eq!(failed.attempts, 2);
    assert!(failed.last_error.as_ref().is_some_and(|e| e.to_lowercase().contains("too large")), "{failed:?}");
    relay.stop().await;

    // The operator's command, as a real process.
    let mut redrive = TestService::spawn(
        "idempost-relay",
        &[
            format!("--database-url={}", settings.database.url),
            "redrive".to_owned(),
            ids[0].clone(),
            "--reason=broker fixed".to_owned(),
            "--requested-by=oncall".to_owned(),
        ],
        &[],
    );
    assert!(redrive.wait(WAIT).await.success());
    let redriven = probe.state(&ids[0]).await;
    assert_eq!((redriven.status.as_str(), redriven.attempts), ("PENDING", 0));
    // The command's redrive is audited like the AdminService's, in the same transaction.
    let audited = format!(
        "SELECT COUNT(*) FROM admin_audit WHERE action = 'REDRIVE' AND actor = 'oncall' \
         AND reason = 'broker fixed' AND event_id = '{}'",
        ids[0]
    );
    assert_eq!(app.scalar_i64(&audited).await, 1, "one REDRIVE audit row");

    broker.run().await;
    broker.create_topic(&topic, 1).await;
    // A relay with ordinary timings: a first publish to a fresh broker may take longer than the
    // 500 ms the failing phase allowed.
    let relay = TestRelay::spawn(relay_settings(&app.db.url, &broker.address(), &topic)).await;
    assert_eventually("the redriven event is published", WAIT, || all_published(&probe, 1)).await;
    relay.stop().await;
}

#[cfg(feature = "failpoints")]
async fn a_relay_delayed_past_its_lease_by_a_failpoint_confirms_late_and_marks_nothing(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(1).await;
    let outbox = Outbox::new(app.db.connect().await);
    let (brokers, to) = (broker.address(), topic.clone());
    let publisher = move || KafkaPublisher::new(&brokers, to.clone(), Duration::from_secs(3), &[]).unwrap();
    let tuning = Tuning {
        batch_size: 10,
        lease: Duration::from_millis(1000),
        delivery_timeout: Duration::from_secs(10),
        lease_margin: Duration::ZERO,
        retry: RetryPolicy {
            max_attempts: 10,
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1),
        },
        max_idle_poll: Duration::from_millis(100),
    };
    // The slow relay is held between its claim and its publish until the fast relay has taken
    // the event over. It used to sleep 3 s there on a worker of this test's runtime, which could
    // stop the runtime's I/O and timers with it (see `step_apart`): the fast relay then claimed
    // only once the sleep was over, racing the slow relay's publish and mark, and on a loaded
    // machine the slow relay won and marked under its own lease, expired but not yet taken.
    let (held, slow_step, after_fast) =
        overtaken_while_held(&app, &probe, &outbox, publisher, tuning.clone(), tuning, &ids[0]).await;

    // Past its lease and overtaken, the slow relay goes on: it publishes and its mark is fenced.
    held.release();
    let StepOutcome::Worked(late) = slow_step.await.unwrap() else { panic!("the slow relay had claimed") };
    assert_eq!((late.published, late.lease_lost), (0, 1), "{late:?}");
    assert_eq!(probe.state(&ids[0]).await, after_fast, "the late mark changed nothing");
    let records = read_topic(&broker.address(), &topic, 2, WAIT, SETTLE).await;
    assert_eq!(records.len(), 2, "the late confirm is a duplicate on the topic, not a loss");
}

/// The publishing budget counts from before the claim: a relay stalled after its claim (a
/// paused process, a starved thread) for longer than its delivery timeout wakes with nothing
/// left to publish with. Had it published then, its copy would land after whatever another relay
/// published meanwhile, and for an order that is an old version after newer ones.
#[cfg(feature = "failpoints")]
async fn a_relay_stalled_between_claim_and_publish_past_its_publishing_budget_publishes_nothing(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(1).await;
    let outbox = Outbox::new(app.db.connect().await);
    let (brokers, to) = (broker.address(), topic.clone());
    let publisher = move || KafkaPublisher::new(&brokers, to.clone(), Duration::from_secs(3), &[]).unwrap();
    let fast_tuning = Tuning {
        batch_size: 10,
        lease: Duration::from_millis(1000),
        delivery_timeout: Duration::from_secs(10),
        lease_margin: Duration::ZERO,
        retry: quick_retry(10),
        max_idle_poll: Duration::from_millis(100),
    };
    // The slow relay may publish for half its lease: by the time its lease has expired and the
    // fast relay has claimed the event, that time is spent whatever the machine's load.
    let slow_tuning = Tuning { delivery_timeout: Duration::from_millis(500), ..fast_tuning.clone() };
    let (held, slow_step, after_fast) =
        overtaken_while_held(&app, &probe, &outbox, publisher, fast_tuning, slow_tuning, &ids[0]).await;

    held.release();
    let StepOutcome::Worked(late) = slow_step.await.unwrap() else { panic!("the slow relay had claimed") };
    assert_eq!((late.published, late.lease_lost), (0, 1), "its failed sends' release was fenced: {late:?}");
    assert_eq!(probe.state(&ids[0]).await, after_fast, "the stalled relay changed nothing");
    let records = read_topic(&broker.address(), &topic, 1, WAIT, SETTLE).await;
    assert_eq!(records.len(), 1, "only the fast relay's copy reached the topic");
    assert_eq!(records[0].header("event_id"), ids[0]);
}

#[cfg(feature = "failpoints")]
async fn a_late_loop_whose_publish_was_confirmed_does_not_mark_what_another_loop_of_its_relay_claimed_again(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(1).await;
    let outbox = Outbox::new(app.db.connect().await);
    let (brokers, to) = (broker.address(), topic.clone());
    let publisher = move || KafkaPublisher::new(&brokers, to, Duration::from_secs(3), &[]).unwrap();
    let tuning = Tuning {
        batch_size: 10,
        lease: Duration::from_millis(500),
        delivery_timeout: Duration::from_secs(10),
        lease_margin: Duration::ZERO,
        retry: quick_retry(10),
        max_idle_poll: Duration::from_millis(100),
    };
    // Loop B still holds the lease when loop A's confirm arrives.
    let (loop_a, loop_b, held_by_b) =
        another_loop_takes_over(&app, publisher, tuning, &outbox, &probe, &ids[0]).await;

    let StepOutcome::Worked(report) = loop_a.await.unwrap() else { panic!("loop A had claimed") };
    assert_eq!((report.published, report.lease_lost), (0, 1), "{report:?}");
    assert_eq!(probe.state(&ids[0]).await, held_by_b, "loop A's late mark changed nothing");
    let records = read_topic(&broker.address(), &topic, 1, WAIT, Duration::ZERO).await;
    assert_eq!(records[0].header("event_id"), ids[0], "loop A's publish did reach the broker");
    let delivery =
        idempost_relay::Delivery { topic, partition: records[0].partition, offset: records[0].offset };
    let marked = outbox.mark_published(&ids[0], &loop_b[0].lease_token, &delivery).await.unwrap();
    assert_eq!(marked, Fenced::Done(()), "loop B's lease was intact");
}

/// A claim prepared while the outbox was nearly empty must not keep that plan (a sequential scan
/// of the whole table behind a hash join) once the outbox has grown: PostgreSQL caches a generic
/// plan after five runs of a prepared statement, so the relay's connections plan every run.
#[tokio::test]
async fn the_relays_postgresql_connections_plan_every_claim_for_the_outbox_as_it_is_now() {
    use sea_orm::{ConnectionTrait as _, DbBackend, Statement};

    let app = TestOrder::spawn(Backend::Postgres).await;
    // One connection: the claims, the flushes and the counters below are all its own.
    let outbox = relay::open_outbox(&app.db.url, 1).await.unwrap();
    let db = outbox.connection();
    let sql = |text: &str| Statement::from_string(DbBackend::Postgres, text.to_owned());
    let shown = db.query_one_raw(sql("SHOW plan_cache_mode")).await.unwrap().unwrap();
    assert_eq!(shown.try_get_by_index::<String>(0).unwrap(), "force_custom_plan");
    // Nor bitmap scans, which never prune the dead entries of leases long expired.
    let shown = db.query_one_raw(sql("SHOW enable_bitmapscan")).await.unwrap().unwrap();
    assert_eq!(shown.try_get_by_index::<String>(0).unwrap(), "off");
    // Sequential scans of the outbox so far, this connection's own counts flushed first.
    let seq_scans = || async {
        db.execute_raw(sql("SELECT pg_stat_force_next_flush()")).await.unwrap();
        let row = db
            .query_one_raw(sql("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'outbox_event'"))
            .await
            .unwrap()
            .unwrap();
        row.try_get_by_index::<i64>(0).unwrap()
    };

    // More than five claims while the outbox is empty: the runs after which a generic plan sticks.
    let worker = WorkerId::generate();
    for _ in 0..8 {
        assert!(outbox.claim(&worker, Duration::from_secs(30), 10).await.unwrap().is_empty());
    }
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(5000).await;
    let before = seq_scans().await;
    let claimed = outbox.claim(&worker, Duration::from_secs(30), 10).await.unwrap();
    let after = seq_scans().await;

    let claimed: Vec<&str> = claimed.iter().map(|event| event.event_id.as_str()).collect();
    assert_eq!(claimed, ids[..10].iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(after, before, "the claim scanned the whole outbox of 5,000 events");
}

/// The relay's MariaDB sessions run at READ COMMITTED from the start (its claims, marks and
/// releases take no gap locks, and no transaction spends a round trip setting the level), and a
/// claim and a mark on them lease and publish exactly what they say.
#[tokio::test]
async fn the_relays_mariadb_connections_run_at_read_committed_and_claim_and_mark_on_them() {
    use sea_orm::{ConnectionTrait as _, DbBackend, Statement};

    let app = TestOrder::spawn(Backend::MariaDb).await;
    let outbox = relay::open_outbox(&app.db.url, 1).await.unwrap();
    let shown = outbox
        .connection()
        .query_one_raw(Statement::from_string(DbBackend::MySql, "SELECT @@tx_isolation"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(shown.try_get_by_index::<String>(0).unwrap(), "READ-COMMITTED");

    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(3).await;
    let claimed = outbox.claim(&WorkerId::generate(), Duration::from_secs(30), 2).await.unwrap();
    assert_eq!(claimed.iter().map(|e| &e.event_id).collect::<Vec<_>>(), ids[..2].iter().collect::<Vec<_>>());
    let delivery = idempost_relay::Delivery { topic: "t".into(), partition: 1, offset: 7 };
    let marks: Vec<_> = claimed.iter().map(|e| (e.event_id.as_str(), &e.lease_token, &delivery)).collect();
    assert_eq!(outbox.mark_all_published(&marks).await.unwrap(), [Fenced::Done(()); 2]);
    assert_eq!(probe.state(&ids[0]).await.status, "PUBLISHED");
    assert_eq!(probe.state(&ids[2]).await.status, "PENDING", "a claim takes no more than its size");
}

/// A MariaDB claim in progress must not hold up the mark of an event another loop has in flight:
/// a locking read of the expired leases stopped at the first lease still running and kept that
/// row's index entry locked until the claim committed, so under load every mark waited for the
/// other loop's claim (the bench's lock waits at 1,516 orders/s).
#[cfg(feature = "failpoints")]
#[tokio::test]
async fn a_mariadb_claim_in_progress_does_not_hold_up_the_mark_of_an_event_in_flight() {
    let app = TestOrder::spawn(Backend::MariaDb).await;
    let outbox = relay::open_outbox(&app.db.url, 4).await.unwrap();
    let probe = OutboxProbe { conn: &app.conn };
    let ids = probe.seed(2).await;
    let in_flight = outbox.claim(&WorkerId::generate(), Duration::from_secs(30), 1).await.unwrap();
    assert_eq!(in_flight.iter().map(|e| &e.event_id).collect::<Vec<_>>(), [&ids[0]]);

    let mut held = crate::helpers::hold(idempost::failpoint::INSIDE_RELAY_CLAIM_BEFORE_COMMIT);
    // The held claim runs apart, on a thread, runtime and pool of its own (see `step_apart`).
    let (claimed_tx, claim) = tokio::sync::oneshot::channel();
    let database_url = app.db.url.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let outbox = relay::open_outbox(&database_url, 1).await.unwrap();
            let _ = claimed_tx.send(outbox.claim(&WorkerId::generate(), Duration::from_secs(30), 1).await);
        });
    });
    held.reached("the second claim holds its rows", WAIT).await;
    let delivery = idempost_relay::Delivery { topic: "t".into(), partition: 0, offset: 1 };
    let marks = [(ids[0].as_str(), &in_flight[0].lease_token, &delivery)];
    // Far longer than a mark takes, far shorter than InnoDB's lock wait timeout (50 s).
    let marked = tokio::time::timeout(Duration::from_secs(15), outbox.mark_all_published(&marks)).await;
    assert!(
        matches!(marked, Ok(Ok(ref outcomes)) if outcomes == &[Fenced::Done(())]),
        "the mark of the event in flight waited for another claim: {marked:?}"
    );
    held.release();
    let claimed = claim.await.unwrap().unwrap();
    assert_eq!(
        claimed.iter().map(|e| &e.event_id).collect::<Vec<_>>(),
        [&ids[1]],
        "the second claim took the next event"
    );
    assert_eq!(probe.state(&ids[0]).await.status, "PUBLISHED");
}

/// MariaDB claims pass one at a time through a named lock per database (the claim gate), which
/// only throttles: while something else holds it (here the test, as a relay stalled inside its
/// claim would), a relay's claims wait out the gate's wait, claim without it, and count it.
#[tokio::test]
async fn a_mariadb_relay_that_cannot_get_the_claim_gate_claims_without_it_and_counts_it() {
    use sea_orm::sqlx::{self, Connection as _};

    const EVENTS: usize = 20;
    let app = TestOrder::spawn(Backend::MariaDb).await;
    let mut holder = sqlx::MySqlConnection::connect(&app.db.url).await.unwrap();
    let taken: i64 =
        sqlx::query_scalar("SELECT GET_LOCK(CONCAT('idempost.relay.claim.', MD5(DATABASE())), 0)")
            .fetch_one(&mut holder)
            .await
            .unwrap();
    assert_eq!(taken, 1, "the test holds the claim gate");
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let probe = OutboxProbe { conn: &app.conn };
    probe.seed(EVENTS).await;
    let logs = tempfile::tempdir().unwrap();
    let args = ordinary_relay_args(&app, &broker.address(), &topic);
    let relay = MeteredRelay::spawn(&args, logs.path(), 0).await;
    assert_eventually("every event is PUBLISHED", WAIT, || all_published(&probe, EVENTS as i64)).await;

    let counts = relay.stop().await;
    assert!(counts.gate_timeouts >= 1.0, "the relay's claims waited on the gate the test held: {counts:#?}");
    assert_no_lock_trouble(std::slice::from_ref(&counts), &app.conn).await;
    let claimed_again = app.scalar_i64("SELECT COUNT(*) FROM outbox_event WHERE attempts <> 1").await;
    assert_eq!(claimed_again, 0, "every event was claimed once");
    holder.close().await.unwrap();
}

#[tokio::test]
async fn a_lease_not_longer_than_the_delivery_timeout_is_refused_at_start() {
    let app = TestOrder::spawn(Backend::Sqlite).await;
    let args = [
        format!("--database-url={}", app.db.url),
        "--lease=5s".to_owned(),
        "--delivery-timeout=10s".to_owned(),
    ];
    let output = tokio::process::Command::new(crate::helpers::service_binary("idempost-relay"))
        .env(idempost::failpoint::ALLOW_FAILPOINTS, "1")
        .args(&args)
        .output()
        .await
        .unwrap();

    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("lease") && stderr.contains("delivery timeout"), "{stderr}");
}
