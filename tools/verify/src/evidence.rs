//! What the verifier reads back: rows by event id, and records by consuming the topic.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use idempost_relay::Delivery;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Statement, Value};

/// The outbox row of one event, as an operator would query it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// PENDING, PUBLISHING, PUBLISHED or FAILED.
    pub status: String,
    /// Claims so far.
    pub attempts: i32,
    /// The current lease owner, if any.
    pub lease_owner: Option<String>,
    /// When it was marked PUBLISHED.
    pub published_at: Option<String>,
    /// Where the marking relay's copy landed.
    pub partition: Option<i32>,
    /// Its offset.
    pub offset: Option<i64>,
}

/// Row counts for one event across the tables.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rows {
    /// Orders whose acceptance event is the event.
    pub orders: u64,
    /// Versions of an order (order_version rows: a submission, amendment or cancellation) that
    /// committed the event.
    pub versions: u64,
    /// Outbox rows with the event id.
    pub outbox: u64,
    /// consumed_event rows with the event id.
    pub consumed: u64,
    /// notification_job rows with the event id.
    pub jobs: u64,
}

/// `sql` with `?` placeholders, bound to `values`, in the backend's dialect.
pub(crate) fn statement(db: &DatabaseConnection, sql: &str, values: Vec<Value>) -> Statement {
    idempost_testkit::sql::statement(db.get_database_backend(), sql, values)
}

/// The first column of the one row `sql` returns, as a count.
async fn count(db: &DatabaseConnection, sql: &str, values: Vec<Value>) -> Result<u64, DbErr> {
    let row = db.query_one_raw(statement(db, sql, values)).await?;
    let count = row.map(|row| row.try_get_by_index::<i64>(0)).transpose()?.unwrap_or_default();
    Ok(u64::try_from(count).unwrap_or_default())
}

/// Reads `event_id`'s outbox row.
pub(crate) async fn outbox_row(db: &DatabaseConnection, event_id: &str) -> Result<Option<OutboxRow>, DbErr> {
    let sql = "SELECT status, attempts, lease_owner, published_at, published_partition, published_offset \
               FROM outbox_event WHERE event_id = ?";
    let Some(row) = db.query_one_raw(statement(db, sql, vec![event_id.into()])).await? else {
        return Ok(None);
    };
    Ok(Some(OutboxRow {
        status: row.try_get_by_index(0)?,
        attempts: row.try_get_by_index(1)?,
        lease_owner: row.try_get_by_index(2)?,
        published_at: row.try_get_by_index::<Option<DateTime<Utc>>>(3)?.map(|t| t.to_rfc3339()),
        partition: row.try_get_by_index(4)?,
        offset: row.try_get_by_index(5)?,
    }))
}

/// Counts `event_id`'s rows in every table.
pub(crate) async fn rows(db: &DatabaseConnection, event_id: &str) -> Result<Rows, DbErr> {
    let by_event = |sql: &'static str| count(db, sql, vec![event_id.into()]);
    Ok(Rows {
        orders: by_event("SELECT COUNT(*) FROM orders WHERE acceptance_event_id = ?").await?,
        versions: by_event("SELECT COUNT(*) FROM order_version WHERE event_id = ?").await?,
        outbox: by_event("SELECT COUNT(*) FROM outbox_event WHERE event_id = ?").await?,
        consumed: by_event("SELECT COUNT(*) FROM consumed_event WHERE event_id = ?").await?,
        jobs: by_event("SELECT COUNT(*) FROM notification_job WHERE event_id = ?").await?,
    })
}

/// Orders holding `(tenant_id, request_id)`.
pub(crate) async fn orders_for_key(
    db: &DatabaseConnection,
    tenant_id: i64,
    request_id: &str,
) -> Result<u64, DbErr> {
    let sql = "SELECT COUNT(*) FROM orders WHERE tenant_id = ? AND request_id = ?";
    count(db, sql, vec![tenant_id.into(), request_id.into()]).await
}

/// Creates `topic` on the broker with the admin API (any Kafka-protocol broker).
pub use idempost_testkit::topic::create as create_topic;

/// One record of the topic, as a reader saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The `event_id` header.
    pub event_id: String,
    /// The `aggregate_id` header: the order id, as text (also the record's key).
    pub aggregate_id: String,
    /// The `event_version` header: the order's version the event describes; `None` when the
    /// header is missing or not a number.
    pub version: Option<i64>,
    /// Where it is on the topic.
    pub delivery: Delivery,
}

/// Every record on `topic`, read from the beginning with a fresh consumer group until nothing
/// new arrived for `quiet` (or `limit` passed). Counting by consuming is the only count that
/// does not depend on how a broker reports its watermarks.
pub async fn read_topic(
    brokers: &str,
    topic: &str,
    quiet: Duration,
    limit: Duration,
) -> Result<Vec<Record>, String> {
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", format!("idempost-verify-reader-{}", uuid::Uuid::new_v4()))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| e.to_string())?;
        consumer.subscribe(&[&topic]).map_err(|e| e.to_string())?;
        let started = Instant::now();
        let mut last = Instant::now();
        let mut records = Vec::new();
        while last.elapsed() < quiet && started.elapsed() < limit {
            if let Some(message) = consumer.poll(Duration::from_millis(100)) {
                // Transient client errors (a broker connection dropping) are retried by
                // librdkafka itself; only records count.
                let Ok(message) = message else { continue };
                let header = |name: &str| {
                    message
                        .headers()
                        .and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value))
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                };
                let delivery = Delivery {
                    topic: topic.clone(),
                    partition: message.partition(),
                    offset: message.offset(),
                };
                records.push(Record {
                    // `ce_id` and `ce_subject` alone from a relay run with `--legacy-headers false`.
                    event_id: header("event_id").or_else(|| header("ce_id")).unwrap_or_default(),
                    aggregate_id: header("aggregate_id").or_else(|| header("ce_subject")).unwrap_or_default(),
                    version: header("event_version").and_then(|v| v.parse().ok()),
                    delivery,
                });
                last = Instant::now();
            }
        }
        Ok(records)
    })
    .await
    .map_err(|e| e.to_string())?
}
