//! What the verifier reads back: rows by event id, and records by consuming the topic.

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, PaginatorTrait, QueryFilter};

use crate::entity::{consumed_event, notification_job, orders, outbox_event};

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
    /// Outbox rows with the event id.
    pub outbox: u64,
    /// consumed_event rows with the event id.
    pub consumed: u64,
    /// notification_job rows with the event id.
    pub jobs: u64,
}

/// Reads `event_id`'s outbox row.
pub(super) async fn outbox_row(db: &DatabaseConnection, event_id: &str) -> Result<Option<OutboxRow>, DbErr> {
    Ok(outbox_event::Entity::find_by_id(event_id.to_owned()).one(db).await?.map(|row| OutboxRow {
        status: row.status,
        attempts: row.attempts,
        lease_owner: row.lease_owner,
        published_at: row.published_at.map(|t| t.to_rfc3339()),
        partition: row.published_partition,
        offset: row.published_offset,
    }))
}

/// Counts `event_id`'s rows in every table.
pub(super) async fn rows(db: &DatabaseConnection, event_id: &str) -> Result<Rows, DbErr> {
    Ok(Rows {
        orders: orders::Entity::find()
            .filter(orders::Column::AcceptanceEventId.eq(event_id))
            .count(db)
            .await?,
        outbox: outbox_event::Entity::find()
            .filter(outbox_event::Column::EventId.eq(event_id))
            .count(db)
            .await?,
        consumed: consumed_event::Entity::find()
            .filter(consumed_event::Column::EventId.eq(event_id))
            .count(db)
            .await?,
        jobs: notification_job::Entity::find()
            .filter(notification_job::Column::EventId.eq(event_id))
            .count(db)
            .await?,
    })
}

/// Orders holding `(tenant_id, request_id)`.
pub(super) async fn orders_for_key(
    db: &DatabaseConnection,
    tenant_id: i64,
    request_id: &str,
) -> Result<u64, DbErr> {
    orders::Entity::find()
        .filter(orders::Column::TenantId.eq(tenant_id))
        .filter(orders::Column::RequestId.eq(request_id))
        .count(db)
        .await
}

/// Creates `topic` on the broker with the admin API (any Kafka-protocol broker).
pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers).create().map_err(|e| e.to_string())?;
    let results = admin
        .create_topics(&[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))], &AdminOptions::new())
        .await
        .map_err(|e| e.to_string())?;
    results.into_iter().try_for_each(|r| r.map(|_| ()).map_err(|(t, e)| format!("create topic {t}: {e}")))
}

/// One record of the topic, as a consumer saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Partition.
    pub partition: i32,
    /// Offset in the partition.
    pub offset: i64,
    /// The `event_id` header.
    pub event_id: String,
}

/// Every record on `topic`, read from the beginning with a fresh consumer group until nothing
/// new arrived for `quiet` (or `limit` passed). Counting by consuming is the only count that
/// does not depend on how a broker reports its watermarks.
pub async fn read_topic(
    brokers: &str,
    topic: &str,
    quiet: Duration,
    limit: Duration,
) -> Result<Vec<Delivery>, String> {
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", format!("outpost-verify-reader-{}", uuid::Uuid::new_v4()))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| e.to_string())?;
        consumer.subscribe(&[&topic]).map_err(|e| e.to_string())?;
        let started = Instant::now();
        let mut last = Instant::now();
        let mut deliveries = Vec::new();
        while last.elapsed() < quiet && started.elapsed() < limit {
            if let Some(message) = consumer.poll(Duration::from_millis(100)) {
                // Transient client errors (a broker connection dropping) are retried by
                // librdkafka itself; only records count.
                let Ok(message) = message else { continue };
                let event_id = message
                    .headers()
                    .and_then(|h| h.iter().find(|h| h.key == "event_id").and_then(|h| h.value))
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default();
                deliveries.push(Delivery {
                    partition: message.partition(),
                    offset: message.offset(),
                    event_id,
                });
                last = Instant::now();
            }
        }
        Ok(deliveries)
    })
    .await
    .map_err(|e| e.to_string())?
}
