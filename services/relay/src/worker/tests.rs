//! The relay's step against a fake publisher on an embedded SQLite outbox: claim, publish,
//! mark or release, with no broker and no database server.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use idempost_migration::MigratorTrait as _;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};

use super::*;
use crate::publisher::PublishError;

/// What the fake broker answers for one event.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Confirm,
    /// Refuses this record: the event is to blame.
    Refuse,
    /// Unreachable: the broker is to blame.
    Unreachable,
    /// Never answers.
    Hang,
    /// Confirms after this long.
    Late(Duration),
}

/// A publisher that answers from a script (default: confirm) and remembers what it was sent.
#[derive(Debug, Default)]
struct FakeBroker {
    script: Mutex<HashMap<String, Answer>>,
    sent: Mutex<Vec<String>>,
    /// While set, every publish waits for `release` before it answers.
    holding: AtomicBool,
    release: Notify,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// Producers it stands for (one when zero).
    lanes: usize,
}

impl FakeBroker {
    fn answer(&self, event_id: &str, answer: Answer) {
        self.script.lock().unwrap().insert(event_id.to_owned(), answer);
    }

    fn sent(&self) -> Vec<String> {
        self.sent.lock().unwrap().clone()
    }
}

impl Publisher for &FakeBroker {
    fn lanes(&self) -> usize {
        self.lanes.max(1)
    }

    async fn publish(
        &self,
        event: &ClaimedEvent,
        _lane: usize,
        _hand_over_by: tokio::time::Instant,
    ) -> Result<Delivery, PublishError> {
        let offset = {
            let mut sent = self.sent.lock().unwrap();
            sent.push(event.event_id.clone());
            sent.len() as i64 - 1
        };
        let in_flight = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(in_flight, Ordering::SeqCst);
        while self.holding.load(Ordering::SeqCst) {
            let released = self.release.notified();
            if !self.holding.load(Ordering::SeqCst) {
                break;
            }
            released.await;
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let answer = self.script.lock().unwrap().get(&event.event_id).copied().unwrap_or(Answer::Confirm);
        let refused = |code| {
            Err(PublishError {
                event_id: event.event_id.clone(),
                source: KafkaError::MessageProduction(code),
            })
        };
        match answer {
            Answer::Confirm => Ok(Delivery { topic: "fake".into(), partition: 0, offset }),
            Answer::Refuse => refused(RDKafkaErrorCode::MessageSizeTooLarge),
            Answer::Unreachable => refused(RDKafkaErrorCode::AllBrokersDown),
            Answer::Hang => std::future::pending().await,
            Answer::Late(after) => {
                tokio::time::sleep(after).await;
                Ok(Delivery { topic: "fake".into(), partition: 0, offset })
            }
        }
    }
}

/// A migrated SQLite outbox in a temporary directory (a file, so that every pooled connection
/// sees the same database).
async fn outbox() -> (Outbox, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/outbox.db?mode=rwc", dir.path().display());
    let db = db::connect(&url, 2).await.unwrap();
    idempost_migration::Migrator::up(&db, None).await.unwrap();
    (Outbox::new(db), dir)
}

/// Writes `count` PENDING events, each of its own order, oldest first; returns their ids.
async fn seed(db: &DatabaseConnection, count: usize) -> Vec<String> {
    let created = Utc::now() - chrono::Duration::seconds(10);
    let mut ids = Vec::new();
    for i in 0..count {
        let id = uuid::Uuid::now_v7().to_string();
        let sql = "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, event_version, \
                   payload, status, attempts, created_at) VALUES (?, 'order', ?, 'idempost.v1.OrderAccepted', 1, ?, 'PENDING', 0, ?)";
        let values = [
            id.clone().into(),
            (1_000 + i).to_string().into(),
            vec![1u8, 2, 3].into(),
            (created + chrono::Duration::milliseconds(i as i64)).into(),
        ];
        db.execute_raw(Statement::from_sql_and_values(db.get_database_backend(), sql, values)).await.unwrap();
        ids.push(id);
    }
    ids
}

/// `(status, attempts)` of every event, by id.
async fn states(db: &DatabaseConnection) -> HashMap<String, (String, i32)> {
    let sql = "SELECT event_id, status, attempts FROM outbox_event";
    let rows = db.query_all_raw(Statement::from_string(db.get_database_backend(), sql)).await.unwrap();
    rows.iter()
        .map(|row| {
            let id: String = row.try_get("", "event_id").unwrap();
            (id, (row.try_get("", "status").unwrap(), row.try_get("", "attempts").unwrap()))
        })
        .collect()
}

fn tuning(max_attempts: i32) -> Tuning {
    Tuning {
        batch_size: 100,
        lease: Duration::from_secs(30),
        delivery_timeout: Duration::from_secs(5),
        lease_margin: Duration::from_secs(1),
        retry: RetryPolicy { max_attempts, backoff_base: Duration::ZERO, backoff_max: Duration::ZERO },
        max_idle_poll: Duration::from_millis(50),
    }
}

fn worked(outcome: StepOutcome) -> StepReport {
    match outcome {
        StepOutcome::Worked(report) => report,
        StepOutcome::Idle => panic!("the step found nothing to claim"),
    }
}

#[tokio::test]
async fn a_step_publishes_each_claimed_event_once_in_claim_order_and_marks_it_published() {
    let (outbox, _dir) = outbox().await;
    let ids = seed(outbox.connection(), 5).await;
    let broker = FakeBroker::default();
    let relay = Relay::new(outbox.clone(), &broker, tuning(3));

    let report = worked(relay.step().await.unwrap());

    assert_eq!((report.claimed, report.published, report.released, report.failed), (5, 5, 0, 0));
    assert_eq!(broker.sent(), ids, "sent once each, oldest first");
    let states = states(outbox.connection()).await;
    assert!(ids.iter().all(|id| states[id] == ("PUBLISHED".to_owned(), 1)), "{states:?}");
    assert_eq!(relay.step().await.unwrap(), StepOutcome::Idle, "nothing is left to claim");
}

#[tokio::test]
async fn a_broker_outage_releases_the_batch_without_spending_an_attempt() {
    let (outbox, _dir) = outbox().await;
    let ids = seed(outbox.connection(), 3).await;
    let broker = FakeBroker::default();
    for id in &ids {
        broker.answer(id, Answer::Unreachable);
    }
    let relay = Relay::new(outbox.clone(), &broker, tuning(1));

    for _ in 0..3 {
        let report = worked(relay.step().await.unwrap());
        assert_eq!((report.released, report.failed, report.published), (3, 0, 0));
    }

    // Three claims with one allowed attempt, yet none is FAILED: the broker was to blame.
    let states = states(outbox.connection()).await;
    assert!(ids.iter().all(|id| states[id] == ("PENDING".to_owned(), 0)), "{states:?}");
}

#[tokio::test]
async fn a_refused_record_spends_its_attempts_and_ends_failed_while_the_rest_of_the_batch_publishes() {
    let (outbox, _dir) = outbox().await;
    let ids = seed(outbox.connection(), 3).await;
    let broker = FakeBroker::default();
    broker.answer(&ids[1], Answer::Refuse);
    let relay = Relay::new(outbox.clone(), &broker, tuning(2));

    let first = worked(relay.step().await.unwrap());
    assert_eq!((first.published, first.released, first.failed), (2, 1, 0));
    let second = worked(relay.step().await.unwrap());
    assert_eq!((second.claimed, second.failed), (1, 1));

    let states = states(outbox.connection()).await;
    assert_eq!(states[&ids[1]], ("FAILED".to_owned(), 2));
    assert_eq!(states[&ids[0]].0, "PUBLISHED");
    assert_eq!(states[&ids[2]].0, "PUBLISHED");
    assert_eq!(relay.step().await.unwrap(), StepOutcome::Idle, "a FAILED event waits for an operator");
}

#[tokio::test]
async fn a_record_confirmed_after_the_hand_over_deadline_is_still_marked_not_released() {
    // Released at the hand-over deadline, as it once was, the event went back to PENDING while
    // the producer still held its record: another claim could publish it and the order's next
    // versions, and this record then landed behind them.
    let (outbox, _dir) = outbox().await;
    let ids = seed(outbox.connection(), 2).await;
    let broker = FakeBroker::default();
    broker.answer(&ids[0], Answer::Late(Duration::from_millis(500)));
    let tuning = Tuning { delivery_timeout: Duration::from_millis(300), ..tuning(1) };
    let relay = Relay::new(outbox.clone(), &broker, tuning);

    let report = worked(relay.step().await.unwrap());

    assert_eq!((report.published, report.released, report.unsettled), (2, 0, 0));
    let states = states(outbox.connection()).await;
    assert_eq!(states[&ids[0]].0, "PUBLISHED");
    assert_eq!(broker.sent().iter().filter(|id| **id == ids[0]).count(), 1, "sent once");
}

#[tokio::test]
async fn a_record_without_a_verdict_by_the_settle_deadline_is_left_to_its_lease() {
    let (outbox, _dir) = outbox().await;
    let ids = seed(outbox.connection(), 2).await;
    let broker = FakeBroker::default();
    broker.answer(&ids[0], Answer::Hang);
    let tuning = Tuning { delivery_timeout: Duration::from_millis(300), ..tuning(1) };
    let relay = Relay::new(outbox.clone(), &broker, tuning);

    let started = tokio::time::Instant::now();
    let report = worked(relay.step().await.unwrap());

    // Settle deadline: the hand-over (300 ms), the producer's own timeout (300 ms) and the slack.
    assert!(started.elapsed() >= Duration::from_millis(1600), "{:?}", started.elapsed());
    assert_eq!((report.published, report.released, report.unsettled), (1, 0, 1));
    let states = states(outbox.connection()).await;
    assert_eq!(states[&ids[0]], ("PUBLISHING".to_owned(), 1), "still leased by this claim");
    assert_eq!(states[&ids[1]].0, "PUBLISHED");
    assert_eq!(relay.step().await.unwrap(), StepOutcome::Idle, "not claimable before its lease ends");
}

#[tokio::test]
async fn a_batch_whose_producer_turn_comes_too_late_is_released_unsent_as_the_brokers_fault() {
    let (outbox, _dir) = outbox().await;
    let ids = seed(outbox.connection(), 2).await;
    let broker = FakeBroker::default();
    let tuning = Tuning { delivery_timeout: Duration::from_millis(300), ..tuning(1) };
    let relay = Relay::new(outbox.clone(), &broker, tuning);
    // Another batch holds the producer's only turn past this step's hand-over deadline.
    let held = relay.producer_turns[0].acquire().await.unwrap();

    let report = worked(relay.step().await.unwrap());
    drop(held);

    assert_eq!((report.published, report.released, report.unsettled), (0, 2, 0));
    assert!(broker.sent().is_empty(), "nothing was handed over");
    let states = states(outbox.connection()).await;
    assert!(
        ids.iter().all(|id| states[id] == ("PENDING".to_owned(), 0)),
        "released, no attempt spent: {states:?}"
    );
}

/// Two loops step at once over 6 events in batches of 3, every publish held until both batches
/// were claimed and the second had every chance to reach the publisher; answers the most
/// records the publisher held at once. Every event ends PUBLISHED.
async fn most_in_flight_of_two_loops(lanes: usize, second_lane: usize) -> usize {
    let (outbox, _dir) = outbox().await;
    let ids = seed(outbox.connection(), 6).await;
    let broker = FakeBroker { holding: AtomicBool::new(true), lanes, ..FakeBroker::default() };
    let relay = Relay::new(outbox.clone(), &broker, tuning(3));

    let steps = async { tokio::join!(relay.step_of(3, 0), relay.step_of(3, second_lane)) };
    let watch = async {
        // Both batches claimed; then give the second loop every chance to hand its batch over.
        for _ in 0..500 {
            let states = states(outbox.connection()).await;
            if states.values().filter(|(status, _)| status == "PUBLISHING").count() == 6 {
                break;
            }
            tokio::task::yield_now().await;
        }
        // The second loop learns of its claim from SQLite's worker thread: give it up to 500 ms
        // to reach the publisher (when it shares the first one's producer it cannot, so this
        // only bounds how long a regression takes to show).
        for _ in 0..500 {
            if broker.most_in_flight.load(Ordering::SeqCst) > 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let most = broker.most_in_flight.load(Ordering::SeqCst);
        broker.holding.store(false, Ordering::SeqCst);
        broker.release.notify_waiters();
        most
    };
    let ((first, second), most) = tokio::join!(steps, watch);

    let published = worked(first.unwrap()).published + worked(second.unwrap()).published;
    assert_eq!(published, 6);
    let states = states(outbox.connection()).await;
    assert!(ids.iter().all(|id| states[id].0 == "PUBLISHED"), "{states:?}");
    most
}

#[tokio::test]
async fn two_loops_on_one_producer_never_have_two_batches_in_it_at_once() {
    assert_eq!(
        most_in_flight_of_two_loops(1, 0).await,
        3,
        "the second batch waited for the first one's confirms"
    );
}

#[tokio::test]
async fn two_loops_on_two_producers_have_both_batches_in_flight_at_once() {
    assert_eq!(most_in_flight_of_two_loops(2, 1).await, 6, "each producer took its batch at once");
}
