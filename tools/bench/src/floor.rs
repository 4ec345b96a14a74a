//! The raw-pipeline floor: the pipeline's work with no Idempost code in the path. Plain SQL
//! order transactions at the offered rate ([`offer`], from the bench process), a plain relay
//! (claim, a bare idempotent producer, the set-based mark; two loops, as `--workers 2`) and a
//! bare consumer (the dedup rows and jobs of what has arrived in one transaction, then the
//! offsets), each in its own process ([`serve`], `idempost-bench --floor-role ...`), so the CPU
//! of each is its own, as it is for the services.

use std::time::Duration;

use futures::FutureExt as _;
use futures::future::join_all;
use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers as _, Message as _};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use sea_orm::DatabaseConnection;
use tokio::sync::watch;

use crate::error::BenchError;
use crate::raw;

/// One part of the raw pipeline, run as a process of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Role {
    /// Claim, publish, mark.
    Relay,
    /// Consume, write the dedup rows and the jobs of what has arrived in one transaction, store
    /// the offsets for the next commit.
    Consumer,
}

impl Role {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Relay => "relay",
            Self::Consumer => "consumer",
        }
    }
}

/// Events per claim of the raw relay: the relay's largest default batch.
const BATCH: u64 = 500;

/// How long an empty claim waits before the next: the relay's shortest poll.
const EMPTY_POLL: Duration = Duration::from_millis(10);

/// Runs `role` against the database at `url` and `topic` until SIGTERM.
pub(crate) async fn serve(role: Role, url: &str, brokers: &str, topic: &str) -> Result<(), BenchError> {
    let (stop_tx, stop) = watch::channel(false);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::spawn(async move {
        term.recv().await;
        let _ = stop_tx.send(true);
    });
    match role {
        Role::Relay => relay(url, brokers, topic, stop).await,
        Role::Consumer => consumer(url, brokers, topic, stop).await,
    }
}

async fn relay(url: &str, brokers: &str, topic: &str, stop: watch::Receiver<bool>) -> Result<(), BenchError> {
    let db = crate::sql::connect_as_relay(url, 4).await?;
    let producer = raw::producer(brokers)?;
    let loops = (0..2).map(|_| relay_loop(&db, &producer, topic, stop.clone()));
    for done in join_all(loops).await {
        done?;
    }
    Ok(())
}

async fn relay_loop(
    db: &DatabaseConnection,
    producer: &FutureProducer,
    topic: &str,
    stop: watch::Receiver<bool>,
) -> Result<(), BenchError> {
    while !*stop.borrow() {
        let token = raw::claim_token();
        let claimed = again_on_conflict("claim", || raw::claim(db, &token, BATCH)).await?;
        if claimed.is_empty() {
            tokio::time::sleep(EMPTY_POLL).await;
            continue;
        }
        let sends = claimed.iter().map(|event| {
            let record = FutureRecord::to(topic)
                .key(event.aggregate_id.as_bytes())
                .payload(event.payload.as_slice())
                .headers(raw::headers(&event.event_id, &event.aggregate_id, true));
            producer.send(record, Timeout::After(Duration::from_secs(10)))
        });
        let results = join_all(sends).await;
        // Unconfirmed events keep their lease; the floor counts only what reaches the consumer.
        let mut marks: Vec<(String, i64)> = claimed
            .iter()
            .zip(results)
            .filter_map(|(event, sent)| sent.ok().map(|d| (event.event_id.clone(), d.offset)))
            .collect();
        marks.sort();
        if !marks.is_empty() {
            again_on_conflict("mark", || raw::mark_all(db, &marks, &token)).await?;
        }
    }
    Ok(())
}

/// Runs `attempt` again for as long as the database ends it as a lock conflict, as any
/// hand-written relay does: on MariaDB the two loops' locking reads of one index range can
/// deadlock (1213), and the server rolled the victim back, so its claim (or its mark, fenced
/// by the claim's token) may simply run again. Each conflict is written to the role's log.
async fn again_on_conflict<T, F, Fut>(what: &str, mut attempt: F) -> Result<T, sea_orm::DbErr>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sea_orm::DbErr>>,
{
    let mut retry = 0;
    loop {
        match attempt().await {
            Err(e) if let Some(conflict) = idempost::db::lock_conflict(&e) => {
                retry += 1;
                eprintln!("raw relay: {what} ended by a {}, running it again ({e})", conflict.as_str());
                tokio::time::sleep(idempost::db::LockConflict::backoff(retry)).await;
            }
            outcome => return outcome,
        }
    }
}

async fn consumer(
    url: &str,
    brokers: &str,
    topic: &str,
    mut stop: watch::Receiver<bool>,
) -> Result<(), BenchError> {
    let db = crate::sql::connect(url, 1).await?;
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("idempost-bench-floor-{}", uuid::Uuid::new_v4().simple()))
        .set("auto.offset.reset", "earliest")
        // Offsets stored after each local commit and committed in the background every 5 s
        // (librdkafka's default), the at-least-once pattern of a bare consumer. Committing each
        // message's offset itself made every record an offset commit, a write of Tansu's
        // storage: the floor ran at 178 events/s (2026-12-05), bound by the broker.
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("fetch.wait.max.ms", "10")
        .create()?;
    consumer.subscribe(&[topic])?;
    loop {
        let first = tokio::select! {
            message = consumer.recv() => message?,
            _ = stop.changed() => return Ok(()),
        };
        // What has arrived with it, up to a batch: one transaction for all of them, as a bare
        // consumer that keeps up would write (one commit per record bound the floor at the
        // database's commit rate: 628 events/s on PostgreSQL, 2026-12-05).
        let mut batch = vec![first];
        while batch.len() < CONSUME_BATCH {
            match consumer.recv().now_or_never() {
                Some(message) => batch.push(message?),
                None => break,
            }
        }
        let records = batch.iter().map(record).collect::<Result<Vec<_>, _>>()?;
        raw::consume_transaction(&db, &records).await?;
        for message in &batch {
            consumer.store_offset_from_message(message)?;
        }
    }
}

/// Records the bare consumer writes in one transaction at the most.
const CONSUME_BATCH: usize = 500;

/// A record's event id (its header) and order id (its key).
fn record(message: &BorrowedMessage<'_>) -> Result<(String, i64), BenchError> {
    let event_id = message
        .headers()
        .and_then(|h| h.iter().find(|h| h.key == "event_id").and_then(|h| h.value))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .ok_or_else(|| BenchError::Stuck("a record without an event_id header".into()))?;
    let order_id =
        message.key().and_then(|k| std::str::from_utf8(k).ok()).and_then(|k| k.parse().ok()).unwrap_or(0);
    Ok((event_id, order_id))
}

/// Writes order transactions (order, line, outbox row) at `per_second` for `duration`, each on
/// schedule whatever the previous ones do. Returns those committed and those that failed.
pub(crate) async fn offer(db: &DatabaseConnection, per_second: f64, duration: Duration) -> (u64, u64) {
    let tasks = crate::load::scheduled(per_second, duration, |_| {
        let db = db.clone();
        async move { raw::order_transaction(&db).await }
    })
    .await;
    let (mut ok, mut failed) = (0, 0);
    for task in tasks {
        match task.await {
            Ok(Ok(())) => ok += 1,
            _ => failed += 1,
        }
    }
    (ok, failed)
}
