//! The machine's limits with no Outpost code in the path: the same transactions in plain SQL,
//! and the same records through a bare idempotent producer.

use std::time::{Duration, Instant};

use futures::future::join_all;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, TransactionTrait, Value};

use crate::error::BenchError;
use crate::load::{LoopResult, closed_loop};
use crate::measure::now_micros;
use crate::payload::{self, OrderRow};
use crate::sql::statement;

/// One order, its line and its PENDING outbox row, in one transaction: what SubmitOrder writes.
async fn order_transaction(db: &DatabaseConnection) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    let row = OrderRow::fresh();
    let txn = db.begin().await?;
    let insert_order = "INSERT INTO orders (tenant_id, request_id, acceptance_event_id, customer_id, currency, \
                        total, version, status, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)";
    let values: Vec<Value> = vec![
        payload::TENANT.into(),
        row.request_id.clone().into(),
        row.event_id.clone().into(),
        payload::CUSTOMER.into(),
        "EUR".into(),
        (i64::from(payload::QUANTITY) * payload::UNIT_PRICE).into(),
        1i64.into(),
        "ACCEPTED".into(),
        row.at.into(),
    ];
    let order_id = if backend == DbBackend::Postgres {
        let sql = format!("{insert_order} RETURNING id");
        let returned = txn.query_one_raw(statement(backend, &sql, values)).await?;
        returned.and_then(|r| r.try_get_by_index::<i64>(0).ok()).unwrap_or_default()
    } else {
        i64::try_from(txn.execute_raw(statement(backend, insert_order, values)).await?.last_insert_id())
            .unwrap_or_default()
    };
    txn.execute_raw(statement(
        backend,
        "INSERT INTO order_line (order_id, line_no, sku, quantity, unit_price_minor) VALUES (?, ?, ?, ?, ?)",
        vec![
            order_id.into(),
            1i32.into(),
            payload::SKU.into(),
            payload::QUANTITY.into(),
            payload::UNIT_PRICE.into(),
        ],
    ))
    .await?;
    let event = payload::order_accepted(&row.event_id, order_id, &row.request_id, row.at);
    txn.execute_raw(statement(
        backend,
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, event_version, payload, \
         status, attempts, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        vec![
            row.event_id.into(),
            "order".into(),
            order_id.to_string().into(),
            outpost::order::EVENT_TYPE.into(),
            1i64.into(),
            event.into(),
            "PENDING".into(),
            0i32.into(),
            row.at.into(),
        ],
    ))
    .await?;
    txn.commit().await
}

/// Raw durable commits of the order transaction at `concurrency`, on a pool of that size.
pub(crate) async fn commit(
    url: &str,
    concurrency: usize,
    duration: Duration,
) -> Result<LoopResult, BenchError> {
    let db = crate::sql::connect(url, u32::try_from(concurrency).unwrap_or(64)).await?;
    let shared = db.clone();
    let result = closed_loop(concurrency, duration, move |_| {
        let db = shared.clone();
        async move { Ok(order_transaction(&db).await?) }
    })
    .await;
    db.close().await?;
    Ok(result)
}

/// The consumer's two inserts in one transaction, one at a time as the consumer does them.
pub(crate) async fn insert(url: &str, duration: Duration) -> Result<LoopResult, BenchError> {
    let db = crate::sql::connect(url, 1).await?;
    let shared = db.clone();
    let result = closed_loop(1, duration, move |_| {
        let db = shared.clone();
        async move {
            let backend = db.get_database_backend();
            let event_id = uuid::Uuid::now_v7().to_string();
            let now = now_micros();
            let txn = db.begin().await?;
            txn.execute_raw(statement(
                backend,
                "INSERT INTO consumed_event (consumer_name, event_id, consumed_at) VALUES (?, ?, ?)",
                vec!["bench-raw".into(), event_id.clone().into(), now.into()],
            ))
            .await?;
            txn.execute_raw(statement(
                backend,
                "INSERT INTO notification_job (event_id, order_id, source_version, status, created_at) \
                 VALUES (?, ?, ?, ?, ?)",
                vec![event_id.into(), 1i64.into(), 1i64.into(), "PENDING".into(), now.into()],
            ))
            .await?;
            txn.commit().await?;
            Ok(())
        }
    })
    .await;
    db.close().await?;
    Ok(result)
}

/// The relay's producer settings: idempotent, `acks=all`, `linger.ms=5`.
pub(crate) fn producer(brokers: &str) -> Result<FutureProducer, BenchError> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("delivery.timeout.ms", "10000")
        .set("linger.ms", "5")
        .create()?)
}

fn headers(event_id: &str, aggregate_id: &str) -> OwnedHeaders {
    fn h<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
        Header { key, value: Some(value) }
    }
    OwnedHeaders::new_with_capacity(6)
        .insert(h("event_id", event_id))
        .insert(h("event_type", outpost::order::EVENT_TYPE))
        .insert(h("event_version", "1"))
        .insert(h("aggregate_type", "order"))
        .insert(h("aggregate_id", aggregate_id))
        .insert(h("content-type", outpost::relay::CONTENT_TYPE))
}

/// Confirmed produce of the same records, in batches of `batch` awaited together as the relay
/// awaits a claimed batch. Returns confirmed records and the time taken.
pub(crate) async fn produce(
    brokers: &str,
    topic: &str,
    batch: usize,
    duration: Duration,
) -> Result<(u64, u64, Duration), BenchError> {
    let producer = producer(brokers)?;
    let started = Instant::now();
    let (mut confirmed, mut failed) = (0u64, 0u64);
    let mut order_id = 0i64;
    while started.elapsed() < duration {
        let records: Vec<(String, String, Vec<u8>)> = (0..batch)
            .map(|_| {
                order_id += 1;
                let row = OrderRow::fresh();
                let value = payload::order_accepted(&row.event_id, order_id, &row.request_id, row.at);
                (row.event_id, order_id.to_string(), value)
            })
            .collect();
        let sends = records.iter().map(|(event_id, key, value)| {
            producer.send(
                FutureRecord::to(topic)
                    .key(key.as_bytes())
                    .payload(value.as_slice())
                    .headers(headers(event_id, key)),
                Timeout::After(Duration::from_secs(10)),
            )
        });
        for result in join_all(sends).await {
            match result {
                Ok(_) => confirmed += 1,
                Err(_) => failed += 1,
            }
        }
    }
    Ok((confirmed, failed, started.elapsed()))
}

/// Reads `expected` records of `topic` from the start with a fresh group and no database work:
/// what the broker serves to one consumer. Returns records read and the time from the first to
/// the last (group join excluded), or stops after `limit`.
pub(crate) async fn consume(
    brokers: &str,
    topic: &str,
    expected: u64,
    limit: Duration,
) -> Result<(u64, Duration), BenchError> {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("outpost-bench-raw-{}", uuid::Uuid::new_v4().simple()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()?;
    consumer.subscribe(&[topic])?;
    let deadline = tokio::time::Instant::now() + limit;
    let mut first: Option<Instant> = None;
    let mut read = 0u64;
    while read < expected {
        // A broker that serves nothing for two minutes is stuck, not slow.
        let next = deadline.min(tokio::time::Instant::now() + Duration::from_secs(120));
        match tokio::time::timeout_at(next, consumer.recv()).await {
            Ok(Ok(_)) => {
                first.get_or_insert_with(Instant::now);
                read += 1;
            }
            Ok(Err(_)) => {}
            Err(_) => break,
        }
    }
    Ok((read, first.map(|t| t.elapsed()).unwrap_or_default()))
}

/// Fills the outbox with `count` PENDING events, oldest first, in multi-row inserts.
pub(crate) async fn prefill(db: &DatabaseConnection, count: u64) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    let chunk = 500u64;
    let base = now_micros() - chrono::Duration::hours(1);
    let mut next = 1u64;
    while next <= count {
        let end = (next + chunk - 1).min(count);
        let mut sql = String::from(
            "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, event_version, \
             payload, status, attempts, created_at) VALUES ",
        );
        let mut values: Vec<Value> = Vec::with_capacity(((end - next + 1) * 9) as usize);
        for i in next..=end {
            if i > next {
                sql.push_str(", ");
            }
            sql.push_str("(?, ?, ?, ?, ?, ?, ?, ?, ?)");
            let event_id = uuid::Uuid::now_v7().to_string();
            let at = base + chrono::Duration::microseconds(i64::try_from(i).unwrap_or(0) * 10);
            let order_id = i64::try_from(i).unwrap_or(i64::MAX);
            let payload = payload::order_accepted(&event_id, order_id, &format!("bench-{event_id}"), at);
            values.extend([
                event_id.into(),
                "order".into(),
                order_id.to_string().into(),
                outpost::order::EVENT_TYPE.into(),
                1i64.into(),
                payload.into(),
                "PENDING".into(),
                0i32.into(),
                at.into(),
            ]);
        }
        db.execute_raw(statement(backend, &sql, values)).await?;
        next = end + 1;
    }
    Ok(())
}

/// Puts every outbox row back to PENDING, as if never claimed.
pub(crate) async fn reset_outbox(db: &DatabaseConnection) -> Result<(), DbErr> {
    db.execute_unprepared(
        "UPDATE outbox_event SET status = 'PENDING', lease_owner = NULL, lease_until = NULL, attempts = 0, \
         published_at = NULL, published_topic = NULL, published_partition = NULL, published_offset = NULL",
    )
    .await?;
    Ok(())
}

/// The relay's database work in plain SQL on the pre-filled outbox: claim a batch with
/// `FOR UPDATE SKIP LOCKED` and lease it in one transaction, then mark each event PUBLISHED
/// under the owner fence, one UPDATE per event in one transaction per batch (as the relay
/// does). One worker, as one relay.
/// Stops when nothing is claimable or `duration` passed; returns events marked and time taken.
pub(crate) async fn claim_and_mark(
    url: &str,
    batch: u64,
    duration: Duration,
) -> Result<(u64, Duration), BenchError> {
    let db = crate::sql::connect(url, 2).await?;
    let backend = db.get_database_backend();
    let owner = format!("bench-raw/{}", std::process::id());
    let started = Instant::now();
    let mut marked = 0u64;
    let mut offset = 0i64;
    while started.elapsed() < duration {
        let now = now_micros();
        let lease_until = now + chrono::Duration::seconds(30);
        let txn = db.begin().await?;
        let rows = txn
            .query_all_raw(statement(
                backend,
                &format!(
                    "SELECT event_id, aggregate_id, payload FROM outbox_event \
                     WHERE (status = 'PENDING' AND (lease_until IS NULL OR lease_until <= ?)) \
                     OR (status = 'PUBLISHING' AND lease_until < ?) \
                     ORDER BY created_at, event_id LIMIT {batch} FOR UPDATE SKIP LOCKED"
                ),
                vec![now.into(), now.into()],
            ))
            .await?;
        if rows.is_empty() {
            txn.commit().await?;
            break;
        }
        let ids: Vec<String> = rows.iter().filter_map(|r| r.try_get_by_index::<String>(0).ok()).collect();
        let placeholders = vec!["?"; ids.len()].join(", ");
        let mut values: Vec<Value> = vec![owner.clone().into(), lease_until.into()];
        values.extend(ids.iter().cloned().map(Value::from));
        txn.execute_raw(statement(
            backend,
            &format!(
                "UPDATE outbox_event SET status = 'PUBLISHING', lease_owner = ?, lease_until = ?, \
                 attempts = attempts + 1 WHERE event_id IN ({placeholders})"
            ),
            values,
        ))
        .await?;
        txn.commit().await?;
        let marks = db.begin().await?;
        for id in ids {
            offset += 1;
            marks
                .execute_raw(statement(
                    backend,
                    "UPDATE outbox_event SET status = 'PUBLISHED', published_at = ?, published_topic = ?, \
                 published_partition = ?, published_offset = ?, lease_owner = NULL, lease_until = NULL \
                 WHERE event_id = ? AND status = 'PUBLISHING' AND lease_owner = ?",
                    vec![
                        now_micros().into(),
                        "bench-raw".into(),
                        0i32.into(),
                        offset.into(),
                        id.into(),
                        owner.clone().into(),
                    ],
                ))
                .await?;
            marked += 1;
        }
        marks.commit().await?;
    }
    let elapsed = started.elapsed();
    db.close().await?;
    Ok((marked, elapsed))
}
