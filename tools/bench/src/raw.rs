//! The machine's limits with no Idempost code in the path: the same transactions in plain SQL,
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
use crate::measure::{Latencies, now_micros};
use crate::payload::{self, OrderRow};
use crate::sql::statement;

/// One order, its line and its PENDING outbox row, in one transaction: what SubmitOrder writes.
pub(crate) async fn order_transaction(db: &DatabaseConnection) -> Result<(), DbErr> {
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
            idempost::contract::EVENT_TYPE.into(),
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
        async move { Ok(consume_transaction(&db, &[(uuid::Uuid::now_v7().to_string(), 1)]).await?) }
    })
    .await;
    db.close().await?;
    Ok(result)
}

/// The consumer's dedup rows and their jobs for `records` (event id, order id), in one
/// transaction: one multi-row insert per table.
pub(crate) async fn consume_transaction(
    db: &DatabaseConnection,
    records: &[(String, i64)],
) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    let now = now_micros();
    let rows = |n: usize| vec![format!("({})", vec!["?"; n].join(", ")); records.len()].join(", ");
    let txn = db.begin().await?;
    let dedup = records.iter().flat_map(|(event_id, _)| {
        [Value::from("bench-raw"), Value::from(event_id.as_str()), Value::from(now)]
    });
    txn.execute_raw(statement(
        backend,
        &format!("INSERT INTO consumed_event (consumer_name, event_id, consumed_at) VALUES {}", rows(3)),
        dedup.collect(),
    ))
    .await?;
    let jobs = records.iter().flat_map(|(event_id, order_id)| {
        [event_id.as_str().into(), (*order_id).into(), 1i64.into(), "PENDING".into(), Value::from(now)]
    });
    txn.execute_raw(statement(
        backend,
        &format!(
            "INSERT INTO notification_job (event_id, order_id, source_version, status, created_at) VALUES {}",
            rows(5)
        ),
        jobs.collect(),
    ))
    .await?;
    txn.commit().await
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

/// The headers of a binary-mode record as the relay writes them when no trace is exported
/// (as in the bench): its own six (three when `legacy` is off, the rest repeated by `ce_*`
/// headers) and six CloudEvents attributes. A broker may pay per header (Tansu 0.6 stores each
/// as a row), so raw produce must send as many as the relay it is compared with.
pub(crate) fn headers(event_id: &str, aggregate_id: &str, legacy: bool) -> OwnedHeaders {
    use idempost::contract::{CLOUDEVENTS_SOURCE, CLOUDEVENTS_SPEC_VERSION, CONTENT_TYPE, EVENT_TYPE};
    fn h<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
        Header { key, value: Some(value) }
    }
    let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let mut headers = OwnedHeaders::new_with_capacity(12);
    if legacy {
        headers = headers.insert(h("event_id", event_id)).insert(h("event_type", EVENT_TYPE));
    }
    headers = headers.insert(h("event_version", "1")).insert(h("aggregate_type", "order"));
    if legacy {
        headers = headers.insert(h("aggregate_id", aggregate_id));
    }
    headers
        .insert(h("content-type", CONTENT_TYPE))
        .insert(h("ce_specversion", CLOUDEVENTS_SPEC_VERSION))
        .insert(h("ce_id", event_id))
        .insert(h("ce_source", CLOUDEVENTS_SOURCE))
        .insert(h("ce_type", EVENT_TYPE))
        .insert(h("ce_subject", aggregate_id))
        .insert(h("ce_time", &time))
}

/// Confirmed produce of the same records in the relay's shape: `producers` producers (as relay
/// processes), each with `loops` loops (as `--workers`) that send a batch of `batch` records and
/// await all their confirms before the next. Returns confirmed and failed records and the time
/// taken.
pub(crate) async fn produce(
    brokers: &str,
    topic: &str,
    producers: usize,
    loops: usize,
    batch: usize,
    legacy_headers: bool,
    duration: Duration,
) -> Result<(u64, u64, Duration), BenchError> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..producers {
        let producer = producer(brokers)?;
        for l in 0..loops {
            let (producer, topic) = (producer.clone(), topic.to_owned());
            // Disjoint order ids per loop: only the keys' spread over partitions matters.
            let first_order = i64::try_from((p * loops + l) * 1_000_000_000).unwrap_or(0);
            tasks.push(tokio::spawn(async move {
                produce_loop(&producer, &topic, batch, first_order, legacy_headers, started + duration).await
            }));
        }
    }
    let (mut confirmed, mut failed) = (0u64, 0u64);
    for task in tasks {
        let (c, f) = task.await.map_err(|e| BenchError::Stuck(format!("a produce loop failed: {e}")))?;
        confirmed += c;
        failed += f;
    }
    Ok((confirmed, failed, started.elapsed()))
}

async fn produce_loop(
    producer: &FutureProducer,
    topic: &str,
    batch: usize,
    mut order_id: i64,
    legacy_headers: bool,
    until: Instant,
) -> (u64, u64) {
    let (mut confirmed, mut failed) = (0u64, 0u64);
    while Instant::now() < until {
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
                FutureRecord::to(topic).key(key.as_bytes()).payload(value.as_slice()).headers(headers(
                    event_id,
                    key,
                    legacy_headers,
                )),
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
    (confirmed, failed)
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
        .set("group.id", format!("idempost-bench-raw-{}", uuid::Uuid::new_v4().simple()))
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

/// Fills the outbox with `count` PENDING events, oldest first, in multi-row inserts, for orders
/// 1 to `count`.
pub(crate) async fn prefill(db: &DatabaseConnection, count: u64) -> Result<(), DbErr> {
    prefill_orders(db, count, 1).await
}

/// [`prefill`] for orders `first` to `first + count - 1`: a shard's backlog in its block of
/// order ids, so that no two shards publish under one key.
pub(crate) async fn prefill_orders(db: &DatabaseConnection, count: u64, first: i64) -> Result<(), DbErr> {
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
            let order_id = first + i64::try_from(i - 1).unwrap_or(i64::MAX - first);
            let payload = payload::order_accepted(&event_id, order_id, &format!("bench-{event_id}"), at);
            values.extend([
                event_id.into(),
                "order".into(),
                order_id.to_string().into(),
                idempost::contract::EVENT_TYPE.into(),
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

/// What the plain-SQL claim+mark did.
#[derive(Debug, Default)]
pub(crate) struct ClaimMark {
    /// Events marked PUBLISHED.
    pub(crate) marked: u64,
    /// From the first claim until the last mark.
    pub(crate) elapsed: Duration,
    /// Each batch's claim transaction.
    pub(crate) claim: Latencies,
    /// Each batch's mark (the clock read and the one fenced statement).
    pub(crate) mark: Latencies,
    /// Batches claimed.
    pub(crate) batches: u64,
}

/// The relay's database work in plain SQL on the pre-filled outbox, in the relay's statement
/// shapes, on a pool set up as the relay's ([`crate::sql::connect_as_relay`]). The claim: on
/// PostgreSQL one statement ([`PG_CLAIM`]); on MariaDB/MySQL a transaction (its sessions at
/// READ COMMITTED) of a plain read of expired leases ([`MYSQL_EXPIRED`]), one locking read
/// ([`MYSQL_DUE`]: the server's clock and due events on `idx_outbox_ready`, `FOR UPDATE SKIP
/// LOCKED`) and one `UPDATE … IN (…)` to lease them. Then one set-based mark of the whole batch stamped with the
/// server's clock, every row fenced by status and claim token and given its own partition and
/// offset (an `unnest` of one array per column on PostgreSQL, a `UNION ALL` derived table on
/// MariaDB/MySQL), a statement of its own. One worker, nothing published. Stops when nothing is claimable or
/// `duration` passed.
pub(crate) async fn claim_and_mark(
    url: &str,
    batch: u64,
    duration: Duration,
) -> Result<ClaimMark, BenchError> {
    let db = crate::sql::connect_as_relay(url, 2).await?;
    let started = Instant::now();
    let mut result = ClaimMark::default();
    let mut offset = 0i64;
    while started.elapsed() < duration {
        let claiming = Instant::now();
        let token = claim_token();
        let ids: Vec<String> = claim(&db, &token, batch).await?.into_iter().map(|e| e.event_id).collect();
        if ids.is_empty() {
            break;
        }
        result.claim.push(claiming.elapsed());
        result.batches += 1;
        let marking = Instant::now();
        let marks = with_offsets(ids, &mut offset);
        result.marked += mark_all(&db, &marks, &token).await?;
        result.mark.push(marking.elapsed());
    }
    result.elapsed = started.elapsed();
    db.close().await?;
    Ok(result)
}

/// One claimed event, as the relay needs it to publish.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    pub(crate) event_id: String,
    pub(crate) aggregate_id: String,
    pub(crate) payload: Vec<u8>,
}

impl Claimed {
    fn of(row: &sea_orm::QueryResult) -> Option<Self> {
        Some(Self {
            event_id: row.try_get("", "event_id").ok()?,
            aggregate_id: row.try_get("", "aggregate_id").ok()?,
            payload: row.try_get("", "payload").ok()?,
        })
    }
}

/// A fresh claim token.
pub(crate) fn claim_token() -> String {
    format!("bench-raw/{}/{:016x}", std::process::id(), rand_u64())
}

/// Up to `batch` events leased under `token`, in the relay's claim shape for the backend.
pub(crate) async fn claim(db: &DatabaseConnection, token: &str, batch: u64) -> Result<Vec<Claimed>, DbErr> {
    let backend = db.get_database_backend();
    if backend == DbBackend::Postgres {
        let rows =
            db.query_all_raw(statement(backend, PG_CLAIM, vec![token.into(), (batch as i64).into()])).await?;
        Ok(rows.iter().filter_map(Claimed::of).collect())
    } else {
        claim_mysql(db, token, batch).await
    }
}

/// MariaDB/MySQL's claim in the relay's shape: a plain read of expired leases, one locking read,
/// then the lease of up to `batch` of the rows, in one transaction; returns the claimed events.
/// The bench's backlog has no expired lease, so the locking read is the due part alone, as in
/// the relay when the plain read finds none.
async fn claim_mysql(db: &DatabaseConnection, token: &str, batch: u64) -> Result<Vec<Claimed>, DbErr> {
    let backend = db.get_database_backend();
    let txn = db.begin().await?;
    let expired = txn.query_all_raw(statement(backend, MYSQL_EXPIRED, vec![(batch as i64).into()])).await?;
    if !expired.is_empty() {
        return Err(DbErr::Custom("the bench's backlog holds an expired lease".into()));
    }
    let rows = txn.query_all_raw(statement(backend, MYSQL_DUE, vec![(batch as i64).into()])).await?;
    let Some(first) = rows.first() else {
        txn.commit().await?;
        return Ok(Vec::new());
    };
    let now = first.try_get::<chrono::NaiveDateTime>("", "claim_now")?.and_utc();
    let lease_until = now + chrono::Duration::seconds(30);
    let claimed: Vec<Claimed> = rows.iter().take(batch as usize).filter_map(Claimed::of).collect();
    let placeholders = vec!["?"; claimed.len()].join(", ");
    let mut values: Vec<Value> = vec![token.into(), lease_until.into()];
    values.extend(claimed.iter().map(|e| Value::from(e.event_id.clone())));
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
    Ok(claimed)
}

/// One set-based, fenced mark in the relay's shape, a statement of its own; returns the rows it
/// changed.
pub(crate) async fn mark_all(
    db: &DatabaseConnection,
    marks: &[(String, i64)],
    token: &str,
) -> Result<u64, DbErr> {
    let backend = db.get_database_backend();
    // The server's clock in the statement, as the relay stamps it (no clock read before it).
    let clock = if backend == DbBackend::Postgres { "statement_timestamp()" } else { "UTC_TIMESTAMP(6)" };
    let assignments = format!(
        "status = 'PUBLISHED', published_at = {clock}, published_topic = v.v_topic, \
         published_partition = v.v_partition, published_offset = v.v_offset, \
         lease_owner = NULL, lease_until = NULL"
    );
    let fence = "o.status = 'PUBLISHING' AND o.lease_owner = v.v_token";
    if backend == DbBackend::Postgres {
        // The status the fence wants is an array too, as in the relay: no constant for the
        // planner to scan idx_outbox_retention by, so it finds each row by its event id.
        let n = marks.len();
        let values: Vec<Value> = vec![
            marks.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>().into(),
            vec![token.to_owned(); n].into(),
            vec!["bench-raw".to_owned(); n].into(),
            vec![0i32; n].into(),
            marks.iter().map(|(_, offset)| *offset).collect::<Vec<_>>().into(),
            vec!["PUBLISHING".to_owned(); n].into(),
        ];
        let sql = format!(
            "UPDATE outbox_event AS o SET {assignments} \
             FROM unnest(?::char(36)[], ?::text[], ?::text[], ?::integer[], ?::bigint[], ?::text[]) \
             AS v(v_id, v_token, v_topic, v_partition, v_offset, v_fenced_status) \
             WHERE o.event_id = v.v_id AND o.status = v.v_fenced_status AND o.lease_owner = v.v_token \
             RETURNING o.event_id"
        );
        return Ok(db.query_all_raw(statement(backend, &sql, values)).await?.len() as u64);
    }
    let mut values: Vec<Value> = Vec::with_capacity(marks.len() * 5);
    for (id, offset) in marks {
        values.extend([id.clone().into(), token.into(), "bench-raw".into(), 0i32.into(), (*offset).into()]);
    }
    let first = "SELECT CONVERT(? USING ascii) COLLATE ascii_bin AS v_id, ? AS v_token, \
                 ? AS v_topic, ? AS v_partition, ? AS v_offset";
    let rest = " UNION ALL SELECT CONVERT(? USING ascii) COLLATE ascii_bin, ?, ?, ?, ?";
    let sql = format!(
        "UPDATE outbox_event AS o JOIN ({first}{}) AS v ON o.event_id = v.v_id SET {assignments} WHERE TRUE AND {fence}",
        rest.repeat(marks.len() - 1)
    );
    Ok(db.execute_raw(statement(backend, &sql, values)).await?.rows_affected())
}

/// MariaDB/MySQL's plain read of expired leases in the relay's shape (no lock).
const MYSQL_EXPIRED: &str = "SELECT event_id FROM outbox_event FORCE INDEX (idx_outbox_claim) \
     WHERE status = 'PUBLISHING' AND lease_until < UTC_TIMESTAMP(6) ORDER BY lease_until, created_at LIMIT ?";

/// MariaDB/MySQL's locking read of due events in the relay's shape: the server's clock
/// (`claim_now`) with the due events not held back on `idx_outbox_ready`, `FOR UPDATE SKIP
/// LOCKED`, up to the batch (`?`).
const MYSQL_DUE: &str = "(SELECT o.*, UTC_TIMESTAMP(6) AS claim_now, 1 AS claim_part FROM outbox_event AS o \
       FORCE INDEX (idx_outbox_ready) WHERE o.status = 'PENDING' AND o.held_back = FALSE \
       AND (o.lease_until IS NULL OR o.lease_until <= UTC_TIMESTAMP(6)) \
       ORDER BY o.created_at, o.event_id LIMIT ? FOR UPDATE SKIP LOCKED)";

/// PostgreSQL's claim in the relay's shape: the clock, expired leases on `idx_outbox_claim`,
/// then what is left of the batch from due events not held back (`idx_outbox_ready`), both
/// `FOR UPDATE SKIP LOCKED`, and the lease update, in one statement (`$1` is the token, `$2` the
/// batch size; the lease is 30 s).
const PG_CLAIM: &str = "WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now), \
     expired AS MATERIALIZED (SELECT event_id FROM outbox_event \
       WHERE status = 'PUBLISHING' AND lease_until < (SELECT now FROM clock) \
       ORDER BY lease_until, created_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
     due AS MATERIALIZED (SELECT event_id FROM outbox_event \
       WHERE status = 'PENDING' AND held_back = FALSE AND (lease_until IS NULL OR lease_until <= (SELECT now FROM clock)) \
       ORDER BY created_at, event_id LIMIT $2 - (SELECT count(*) FROM expired) FOR UPDATE SKIP LOCKED) \
     UPDATE outbox_event AS o SET status = 'PUBLISHING', lease_owner = $1, \
       lease_until = (SELECT now FROM clock) + interval '30 seconds', attempts = o.attempts + 1 \
     WHERE o.event_id IN (SELECT event_id FROM expired UNION ALL SELECT event_id FROM due) \
     RETURNING o.*";

fn rand_u64() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0
}

/// The claimed ids in event id order (the order the relay marks in, which every set-based update
/// locks rows in), each with the next made-up offset.
fn with_offsets(mut ids: Vec<String>, offset: &mut i64) -> Vec<(String, i64)> {
    ids.sort();
    ids.into_iter()
        .map(|id| {
            *offset += 1;
            (id, *offset)
        })
        .collect()
}
