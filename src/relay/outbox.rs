//! The relay's side of the outbox table: leased claims, owner-fenced marks and releases.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use outpost_client::Backoff;
use sea_orm::sea_query::{Expr, ExprTrait, Query};
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait as _, DatabaseConnection, DbBackend, DbErr, EntityTrait,
    FromQueryResult as _, IsolationLevel, QueryFilter, QuerySelect, Statement, TransactionTrait, Value,
};

use super::{LeaseToken, WorkerId};
use set::{FENCE_COLUMNS, FencedUpdate, ValueColumn};

mod set;
use crate::domain::OutboxStatus;
use crate::entity::outbox_event::{self, Column};
use crate::outbox::{Backlog, Redrive, RedriveAudit};
use crate::{db, failpoint};

/// An event this worker holds the lease on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedEvent {
    /// The event's stable id.
    pub event_id: String,
    /// `order` for OrderAccepted.
    pub aggregate_type: String,
    /// The order id: the Kafka record key, so one order's events stay in order.
    pub aggregate_id: String,
    /// The protobuf message name of the payload.
    pub event_type: String,
    /// The version of the aggregate's facts the event describes.
    pub event_version: i64,
    /// The encoded event, published verbatim.
    pub payload: Vec<u8>,
    /// Claims so far, this one included.
    pub attempts: i32,
    /// When this claim's lease ends, by the database clock.
    pub lease_until: DateTime<Utc>,
    /// This claim's fence: every mark or release of the event carries it.
    pub lease_token: LeaseToken,
    /// When the order service wrote the event.
    pub created_at: DateTime<Utc>,
    /// The W3C `traceparent` of the SubmitOrder that wrote the event, if it was traced.
    pub traceparent: Option<String>,
    /// The W3C `tracestate` that goes with it.
    pub tracestate: Option<String>,
}

/// Where the broker put a confirmed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The record's offset in the partition.
    pub offset: i64,
}

/// The result of an owner-fenced update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced<T> {
    /// The claim still held the lease; the update happened.
    Done(T),
    /// Another claim holds the lease now (or the row left PUBLISHING): nothing was changed.
    LeaseLost,
}

/// What a release did to the event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// Back to PENDING; claimable again from this database time.
    RetryAt(DateTime<Utc>),
    /// Out of attempts: FAILED until an operator redrives it.
    Failed,
}

/// Whom a failed publish is blamed on, which decides whether it spends an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The event itself (the broker refused this record): the attempt counts, and the event is
    /// FAILED once its attempts are used up.
    Event,
    /// The broker as a whole was unavailable: the attempt is given back, so an outage of any
    /// length moves no event to FAILED; the backoff still applies.
    Broker,
}

/// Retry timing for failed publishes.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts (claims) after which a failure is final.
    pub max_attempts: i32,
    /// Backoff after the first failure; doubled for each further one.
    pub backoff_base: Duration,
    /// Longest backoff.
    pub backoff_max: Duration,
}

impl RetryPolicy {
    /// Exponential backoff with jitter for the given attempt count: a random point in the upper
    /// half of the capped exponential, so released events spread out instead of returning in step.
    pub fn backoff(&self, attempts: i32) -> Duration {
        // Capped from the first wait on (start-up refuses a base above the max anyway).
        let first = Ord::min(self.backoff_base, self.backoff_max);
        Backoff::new(first, self.backoff_max).jittered().delay(u32::try_from(attempts).unwrap_or(0))
    }
}

/// The most characters of an error kept in `last_error`.
const LAST_ERROR_CHARS: usize = 1000;

/// The outbox table, as the relay uses it.
#[derive(Debug, Clone)]
pub struct Outbox {
    db: DatabaseConnection,
    /// Set at the start of each locking transaction; `None` where the pool's sessions already
    /// run at the relay's isolation level (or the backend needs none).
    isolation: Option<IsolationLevel>,
}

impl Outbox {
    /// The outbox in `db`, a pool of any kind: each locking transaction sets the relay's
    /// isolation level ([`db::relay_isolation`]) itself, one round trip more on MariaDB/MySQL.
    pub fn new(db: DatabaseConnection) -> Self {
        let isolation = db::relay_isolation(&db);
        Self { db, isolation }
    }

    /// The outbox in `db`, a pool opened for the relay ([`db::Pool::Relay`]), whose sessions
    /// already run at the relay's isolation level.
    pub fn on_relay_pool(db: DatabaseConnection) -> Self {
        Self { db, isolation: None }
    }

    /// The database connection this outbox uses.
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    /// Claims up to `batch_size` events for `worker` for `lease`, oldest first, under a fresh
    /// [`LeaseToken`] that every event of the claim carries.
    ///
    /// Candidates are PUBLISHING events whose lease has expired (taken first, longest expired
    /// first), then PENDING events whose retry time (if any) has come, oldest first. On MariaDB/MySQL and PostgreSQL
    /// the candidates are locked with `FOR UPDATE SKIP LOCKED` and leased in one short
    /// transaction, so concurrent relays take disjoint batches without waiting on each other.
    /// Each candidate query reads an index in the order it takes rows (`idx_outbox_claim` for
    /// expired leases, `idx_outbox_due` for due events), so `LIMIT` stops the scan and the claim
    /// locks only the rows it leases; on MariaDB/MySQL the transaction runs at READ COMMITTED,
    /// which takes no gap locks, so a claim never blocks an order's insert or another relay's
    /// claim or mark. SQLite has one writer at a time, so one
    /// `UPDATE … RETURNING` does the same. Every claim counts as an attempt.
    ///
    /// Per-aggregate order: a due event is a candidate only while no earlier version of its
    /// aggregate is unpublished ([`first_unpublished`]), so an aggregate has at most one event
    /// leased at a time, and version n + 1 is claimed only after version n was marked PUBLISHED,
    /// which only the broker's confirm leads to. An event in backoff, leased elsewhere, or FAILED
    /// therefore holds back the later events of its own aggregate and nothing else.
    pub async fn claim(
        &self,
        worker: &WorkerId,
        lease: Duration,
        batch_size: u64,
    ) -> Result<Vec<ClaimedEvent>, DbErr> {
        let token = LeaseToken::new(worker);
        match self.db.get_database_backend() {
            DbBackend::Postgres => self.claim_in_one_statement(&token, lease, batch_size).await,
            _ if !db::has_skip_locked(&self.db) => self.claim_single_writer(&token, lease, batch_size).await,
            _ => self.claim_locking(&token, lease, batch_size).await,
        }
    }

    /// MariaDB/MySQL's claim: one transaction of a plain read of the expired leases, one locking
    /// read and one lease update, so five round trips where a clock read and a locking query per
    /// kind of candidate made seven; under a loaded two-core machine each round trip waits for
    /// the server thread to be scheduled.
    ///
    /// The locking read is a `UNION ALL` of the expired leases found (locked by primary key, the
    /// expiry checked again) and the due events (`idx_outbox_due` in its order, forced, up to
    /// `batch_size`), both `FOR UPDATE SKIP LOCKED`, and returns the server's clock
    /// (`UTC_TIMESTAMP(6)`, one value per statement) with every row; the leases end `lease`
    /// after it. Expired leases come first (each row says its part, since a union's order is not
    /// promised), and due events beyond the batch stay locked only until the commit, unleased.
    ///
    /// Why the expired leases are found by a plain read first: a locking read of
    /// `idx_outbox_claim (status, lease_until, created_at)` stops at the first lease still
    /// running, and InnoDB keeps that row's entry locked until the claim commits, even at READ
    /// COMMITTED. That row is another loop's event in flight, so its mark waited for this claim:
    /// 160-190 lock waits totalling 4 s in 30 s of the bench at 1,516 orders/s, marks of 90
    /// events taking 47 ms (p50). A plain read locks nothing; only the rows it found expired are
    /// then locked, by key.
    ///
    /// Why the due part is pinned to its index (`FORCE INDEX`): InnoDB locks the index entries a
    /// locking read scans, also those of rows it then skips as locked, and keeps them until the
    /// transaction ends. Left to itself, MariaDB sometimes read the due events through
    /// `idx_outbox_claim` and sorted them: that claim locked every due event's
    /// `idx_outbox_claim` entry, while a concurrent claim through `idx_outbox_due` held the
    /// `idx_outbox_due` entries of its own rows, and their lease updates, which rewrite both
    /// indexes' entries, waited on each other: `1213 Deadlock found` between two claims (the
    /// bench's end-to-end run showed it, two claims of 22 and 80 rows holding 1,019 and 1,020
    /// row locks). On its own index, in the index's order, it stops at its `LIMIT` and locks
    /// only what it takes and what it skips.
    async fn claim_locking(
        &self,
        token: &LeaseToken,
        lease: Duration,
        batch_size: u64,
    ) -> Result<Vec<ClaimedEvent>, DbErr> {
        let limit = i64::try_from(batch_size).unwrap_or(i64::MAX);
        let (publishing, pending) = (OutboxStatus::Publishing.as_str(), OutboxStatus::Pending.as_str());
        let txn = self.db.begin_with_config(self.isolation, None).await?;
        let expired: Vec<Value> = txn
            .query_all_raw(Statement::from_sql_and_values(
                DbBackend::MySql,
                format!(
                    "SELECT event_id FROM outbox_event FORCE INDEX ({CLAIM_INDEX}) \
                     WHERE status = '{publishing}' AND lease_until < UTC_TIMESTAMP(6) \
                     ORDER BY lease_until, created_at LIMIT ?"
                ),
                [limit.into()],
            ))
            .await?
            .iter()
            .map(|row| row.try_get_by_index::<String>(0).map(Value::from))
            .collect::<Result<_, _>>()?;
        let columns = "o.*, UTC_TIMESTAMP(6) AS claim_now";
        let first = first_unpublished(DbBackend::MySql, "o");
        let due = format!(
            "(SELECT {columns}, 1 AS claim_part FROM outbox_event AS o FORCE INDEX ({DUE_INDEX}) \
              WHERE o.status = '{pending}' AND (o.lease_until IS NULL OR o.lease_until <= UTC_TIMESTAMP(6)) \
              AND {first} ORDER BY o.created_at, o.event_id LIMIT ? FOR UPDATE SKIP LOCKED)"
        );
        let statement = if expired.is_empty() {
            Statement::from_sql_and_values(DbBackend::MySql, due, [limit.into()])
        } else {
            let keys = vec!["?"; expired.len()].join(", ");
            let sql = format!(
                "(SELECT {columns}, 0 AS claim_part FROM outbox_event AS o \
                  WHERE o.event_id IN ({keys}) AND o.status = '{publishing}' AND o.lease_until < UTC_TIMESTAMP(6) \
                  FOR UPDATE SKIP LOCKED) UNION ALL {due}"
            );
            let values = expired.into_iter().chain([limit.into()]);
            Statement::from_sql_and_values(DbBackend::MySql, sql, values)
        };
        let result = txn.query_all_raw(statement).await?;
        // One clock value per statement: the first row's is every row's.
        let Some(first) = result.first() else {
            txn.commit().await?;
            return Ok(Vec::new());
        };
        let lease_until = lease_end(first.try_get::<NaiveDateTime>("", "claim_now")?.and_utc(), lease)?;
        let mut found = Vec::with_capacity(result.len());
        for row in &result {
            found.push((
                row.try_get::<i64>("", "claim_part")?,
                outbox_event::Model::from_query_result(row, "")?,
            ));
        }
        // Expired leases first, longest expired first; then due events, oldest first.
        found.sort_by(|(part_a, a), (part_b, b)| {
            let key = |part: i64, row: &outbox_event::Model| {
                if part == 0 { (part, row.lease_until, row.created_at) } else { (part, None, row.created_at) }
            };
            key(*part_a, a).cmp(&key(*part_b, b)).then_with(|| a.event_id.cmp(&b.event_id))
        });
        found.truncate(usize::try_from(batch_size).unwrap_or(usize::MAX));
        let mut rows: Vec<outbox_event::Model> = found.into_iter().map(|(_, row)| row).collect();
        rows.sort_by(|a, b| (a.created_at, &a.event_id).cmp(&(b.created_at, &b.event_id)));
        let held = still_behind_an_unpublished_version(&txn, &rows).await?;
        rows.retain(|row| !held.contains(&row.event_id));
        if rows.is_empty() {
            txn.commit().await?;
            return Ok(Vec::new());
        }
        // At most `batch_size` placeholders, and never an empty `IN ()`.
        let ids: Vec<String> = rows.iter().map(|r| r.event_id.clone()).collect();
        lease_to(outbox_event::Entity::update_many(), token, lease_until)
            .filter(Column::EventId.is_in(ids))
            .exec(&txn)
            .await?;
        failpoint::hit(failpoint::INSIDE_RELAY_CLAIM_BEFORE_COMMIT)
            .map_err(|e| DbErr::Custom(e.to_string()))?;
        txn.commit().await?;
        Ok(rows.into_iter().map(|row| claimed(row, 1, lease_until, token)).collect())
    }

    /// PostgreSQL's claim: the clock read, both candidate queries (each on its own index, in its
    /// order, `FOR UPDATE SKIP LOCKED`) and the lease update in one statement, so one round trip
    /// and one implicit transaction instead of six round trips (begin, clock, two selects, the
    /// update, commit). Under a loaded two-core machine each round trip waits for the server
    /// process to be scheduled, and that wait, not the statements, was most of a 57 ms claim.
    ///
    /// The lease ends `lease` after the database clock (`clock_timestamp()`, read once in a
    /// materialized CTE): PostgreSQL stores a `timestamptz`, so a clock function writes the same
    /// value a bound timestamp would (only SQLite needs every timestamp bound as text). The due
    /// query takes only what the expired one left of `batch_size`, as the two queries of the
    /// transaction did.
    async fn claim_in_one_statement(
        &self,
        token: &LeaseToken,
        lease: Duration,
        batch_size: u64,
    ) -> Result<Vec<ClaimedEvent>, DbErr> {
        let lease_micros = i64::try_from(lease.as_micros())
            .map_err(|_| DbErr::Custom(format!("a lease of {lease:?} is out of range")))?;
        let limit = i64::try_from(batch_size).unwrap_or(i64::MAX);
        let sql = format!(
            "WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now), \
             expired AS MATERIALIZED (SELECT event_id FROM outbox_event \
               WHERE status = '{publishing}' AND lease_until < (SELECT now FROM clock) \
               ORDER BY lease_until, created_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
             due AS MATERIALIZED (SELECT o.event_id FROM outbox_event AS o \
               WHERE o.status = '{pending}' AND (o.lease_until IS NULL OR o.lease_until <= (SELECT now FROM clock)) \
               AND {first} \
               ORDER BY o.created_at, o.event_id LIMIT $2 - (SELECT count(*) FROM expired) FOR UPDATE OF o SKIP LOCKED) \
             UPDATE outbox_event AS o SET status = '{publishing}', lease_owner = $1, \
               lease_until = (SELECT now FROM clock) + $3 * interval '1 microsecond', attempts = o.attempts + 1 \
             WHERE o.event_id IN (SELECT event_id FROM expired UNION ALL SELECT event_id FROM due) \
             RETURNING o.*",
            publishing = OutboxStatus::Publishing.as_str(),
            pending = OutboxStatus::Pending.as_str(),
            first = first_unpublished(DbBackend::Postgres, "o"),
        );
        let statement = Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            [token.as_str().into(), limit.into(), lease_micros.into()],
        );
        let mut rows = outbox_event::Entity::find().from_raw_sql(statement).all(&self.db).await?;
        rows.sort_by(|a, b| (a.created_at, &a.event_id).cmp(&(b.created_at, &b.event_id)));
        rows.into_iter()
            .map(|row| {
                let lease_until = row.lease_until.ok_or_else(|| {
                    DbErr::Custom(format!("claimed event {} came back without a lease", row.event_id))
                })?;
                // RETURNING shows the row after the update: its attempts already count this claim.
                Ok(claimed(row, 0, lease_until, token))
            })
            .collect()
    }

    async fn claim_single_writer(
        &self,
        token: &LeaseToken,
        lease: Duration,
        batch_size: u64,
    ) -> Result<Vec<ClaimedEvent>, DbErr> {
        let now = db::now(&self.db).await?;
        let lease_until = lease_end(now, lease)?;
        let candidates = Query::select()
            .column(Column::EventId)
            .from(outbox_event::Entity)
            .cond_where(
                Condition::all()
                    .add(claimable(now))
                    .add(Expr::cust(first_unpublished(DbBackend::Sqlite, "outbox_event"))),
            )
            .order_by(Column::CreatedAt, sea_orm::Order::Asc)
            .order_by(Column::EventId, sea_orm::Order::Asc)
            .limit(batch_size)
            .to_owned();
        let mut rows = lease_to(outbox_event::Entity::update_many(), token, lease_until)
            .filter(Column::EventId.in_subquery(candidates))
            .exec_with_returning(&self.db)
            .await?;
        rows.sort_by(|a, b| (a.created_at, &a.event_id).cmp(&(b.created_at, &b.event_id)));
        // RETURNING shows the row after the update: its attempts already count this claim.
        Ok(rows.into_iter().map(|row| claimed(row, 0, lease_until, token)).collect())
    }

    /// Marks the event PUBLISHED, only if the claim that wrote `token` still holds its lease.
    ///
    /// Call it only after the broker confirmed the record. `LeaseLost` means another claim
    /// took the event over: it will publish again (a duplicate the consumer absorbs), and this
    /// worker must neither mark nor republish it.
    pub async fn mark_published(
        &self,
        event_id: &str,
        token: &LeaseToken,
        delivery: &Delivery,
    ) -> Result<Fenced<()>, DbErr> {
        let mut marked = self.mark_all_published(&[(event_id, token, delivery)]).await?;
        Ok(marked.pop().unwrap_or(Fenced::LeaseLost))
    }

    /// [`Outbox::mark_published`] for a batch, in one statement: each row gets its own topic,
    /// partition and offset, and changes only while it is still PUBLISHING under its own claim's
    /// token, so the answer says exactly which marks took. If the statement fails none is known
    /// to have taken: their leases expire and the events are published again, duplicates the
    /// consumer absorbs.
    pub async fn mark_all_published(
        &self,
        marks: &[(&str, &LeaseToken, &Delivery)],
    ) -> Result<Vec<Fenced<()>>, DbErr> {
        if marks.is_empty() {
            return Ok(Vec::new());
        }
        const PUBLISHED_AT: ValueColumn = ValueColumn { name: "v_published_at", pg_type: "timestamptz" };
        const DELIVERY: [ValueColumn; 3] = [
            ValueColumn { name: "v_topic", pg_type: "text" },
            ValueColumn { name: "v_partition", pg_type: "integer" },
            ValueColumn { name: "v_offset", pg_type: "bigint" },
        ];
        // The server stamps `published_at` with its own clock in the mark statement itself: the
        // clock read before it was a round trip of its own. The column holds what a bound value
        // from [`db::now`] would (a `timestamptz` on PostgreSQL, a UTC `DATETIME(6)` on
        // MariaDB/MySQL); only SQLite needs every timestamp bound, as text of one format.
        let (published_at, now) = match self.db.get_database_backend() {
            DbBackend::Postgres => ("statement_timestamp()", None),
            DbBackend::MySql => ("UTC_TIMESTAMP(6)", None),
            _ => ("v.v_published_at", Some(db::now(&self.db).await?)),
        };
        let columns: Vec<ValueColumn> =
            FENCE_COLUMNS.iter().copied().chain(now.map(|_| PUBLISHED_AT)).chain(DELIVERY).collect();
        let mut rows: Vec<(usize, Vec<Value>)> = marks
            .iter()
            .enumerate()
            .map(|(i, (event_id, token, delivery))| {
                let mut row: Vec<Value> = vec![(*event_id).into(), token.as_str().into()];
                row.extend(now.map(Value::from));
                row.extend([
                    delivery.topic.as_str().into(),
                    delivery.partition.into(),
                    delivery.offset.into(),
                ]);
                (i, row)
            })
            .collect();
        let assignments = format!(
            "status = '{}', published_at = {published_at}, published_topic = v.v_topic, \
             published_partition = v.v_partition, published_offset = v.v_offset, \
             lease_owner = NULL, lease_until = NULL",
            OutboxStatus::Published.as_str()
        );
        let update = FencedUpdate {
            columns: &columns,
            rows: in_lock_order(&mut rows),
            assignments: &assignments,
            fenced: !failpoint::broken(failpoint::BREAK_MARK_WITHOUT_OWNER_CONDITION),
        };
        // One statement on its own, no transaction: one round trip per batch instead of three
        // or four on MariaDB/MySQL. Where it cannot say which rows it changed, it is read back.
        let changed = match update.run_alone(&self.db).await? {
            Some(changed) => changed,
            None => self.published_as(&update.ids(), marks).await?,
        };
        Ok(in_call_order(
            &rows,
            &changed,
            |changed| if changed { Fenced::Done(()) } else { Fenced::LeaseLost },
        ))
    }

    /// For each of `ids` (in lock order), whether the row is PUBLISHED at the very record its
    /// mark in `marks` names: only that mark can have written it, since every publish of an
    /// event is a record of its own at an offset of its own, and nothing changes a PUBLISHED
    /// row afterwards (redrive takes FAILED rows; retention deletes rows hours later, and a row
    /// already deleted counts as not marked, so at worst a lost lease is reported).
    async fn published_as(
        &self,
        ids: &[String],
        marks: &[(&str, &LeaseToken, &Delivery)],
    ) -> Result<Vec<bool>, DbErr> {
        let found: Vec<PublishedRow> = outbox_event::Entity::find()
            .select_only()
            .column(Column::EventId)
            .column(Column::Status)
            .column(Column::PublishedTopic)
            .column(Column::PublishedPartition)
            .column(Column::PublishedOffset)
            .filter(Column::EventId.is_in(ids.iter().cloned()))
            .into_tuple()
            .all(&self.db)
            .await?;
        let asked: HashMap<&str, &Delivery> =
            marks.iter().map(|(id, _, delivery)| (*id, *delivery)).collect();
        let marked: HashSet<&str> = found
            .iter()
            .filter(|(id, status, topic, partition, offset)| {
                status == OutboxStatus::Published.as_str()
                    && asked.get(id.as_str()).is_some_and(|d| {
                        topic.as_deref() == Some(d.topic.as_str())
                            && *partition == Some(d.partition)
                            && *offset == Some(d.offset)
                    })
            })
            .map(|(id, ..)| id.as_str())
            .collect();
        Ok(ids.iter().map(|id| marked.contains(id.as_str())).collect())
    }

    /// Gives the event back after a failed publish, only if its claim (`event.lease_token`)
    /// still holds the lease: PENDING with a backoff in database time, or FAILED once its
    /// attempts are used up.
    pub async fn release(
        &self,
        event: &ClaimedEvent,
        error: &str,
        policy: &RetryPolicy,
    ) -> Result<Fenced<Released>, DbErr> {
        let mut released = self.release_all(&[(event, error, Blame::Event)], policy).await?;
        Ok(released.pop().unwrap_or(Fenced::LeaseLost))
    }

    /// [`Outbox::release`] for a batch, in one statement: each row gets its own status, retry
    /// time and error, and changes only while it is still PUBLISHING under its own claim's token.
    /// A failure blamed on the broker gives the claim's attempt back and never ends FAILED.
    pub async fn release_all(
        &self,
        failures: &[(&ClaimedEvent, &str, Blame)],
        policy: &RetryPolicy,
    ) -> Result<Vec<Fenced<Released>>, DbErr> {
        if failures.is_empty() {
            return Ok(Vec::new());
        }
        const COLUMNS: [ValueColumn; 6] = [
            FENCE_COLUMNS[0],
            FENCE_COLUMNS[1],
            ValueColumn { name: "v_status", pg_type: "text" },
            ValueColumn { name: "v_retry_at", pg_type: "timestamptz" },
            ValueColumn { name: "v_error", pg_type: "text" },
            ValueColumn { name: "v_refund", pg_type: "integer" },
        ];
        let now = db::now(&self.db).await?;
        let mut outcomes = Vec::with_capacity(failures.len());
        let mut rows: Vec<(usize, Vec<Value>)> = Vec::with_capacity(failures.len());
        for (i, (event, error, blame)) in failures.iter().enumerate() {
            let last_error: String = error.chars().take(LAST_ERROR_CHARS).collect();
            let refund = i32::from(*blame == Blame::Broker);
            let (status, retry_at, released) =
                if *blame == Blame::Event && event.attempts >= policy.max_attempts {
                    (OutboxStatus::Failed, None, Released::Failed)
                } else {
                    let at = lease_end(now, policy.backoff(event.attempts))?;
                    (OutboxStatus::Pending, Some(at), Released::RetryAt(at))
                };
            outcomes.push(released);
            let row = vec![
                event.event_id.as_str().into(),
                event.lease_token.as_str().into(),
                status.as_str().into(),
                retry_at.into(),
                last_error.into(),
                refund.into(),
            ];
            rows.push((i, row));
        }
        let assignments = "status = v.v_status, lease_owner = NULL, lease_until = v.v_retry_at, last_error = v.v_error, \
             attempts = attempts - v.v_refund";
        let update =
            FencedUpdate { columns: &COLUMNS, rows: in_lock_order(&mut rows), assignments, fenced: true };
        let changed = update.run(&self.db, self.isolation).await?;
        Ok(in_call_order(
            &rows,
            &changed,
            |changed| {
                if changed { Fenced::Done(()) } else { Fenced::LeaseLost }
            },
        )
        .into_iter()
        .zip(outcomes)
        .map(|(fenced, released)| match fenced {
            Fenced::Done(()) => Fenced::Done(released),
            Fenced::LeaseLost => Fenced::LeaseLost,
        })
        .collect())
    }

    /// The backlog, as [`crate::outbox::backlog`] defines it.
    pub async fn backlog(&self) -> Result<Backlog, DbErr> {
        crate::outbox::backlog(&self.db).await
    }

    /// The audited redrive of [`crate::outbox::redrive`].
    pub async fn redrive(&self, event_id: &str, audit: &RedriveAudit) -> Result<Redrive, DbErr> {
        crate::outbox::redrive(&self.db, event_id, audit).await
    }
}

fn claimable(now: DateTime<Utc>) -> Condition {
    Condition::any().add(due(now)).add(expired(now))
}

/// PENDING events whose retry time, if any, has come.
fn due(now: DateTime<Utc>) -> Condition {
    Condition::all()
        .add(Column::Status.eq(OutboxStatus::Pending.as_str()))
        .add(Condition::any().add(Column::LeaseUntil.is_null()).add(Column::LeaseUntil.lte(now)))
}

/// PUBLISHING events whose lease has run out.
fn expired(now: DateTime<Utc>) -> Condition {
    Condition::all().add(Column::Status.eq(OutboxStatus::Publishing.as_str())).add(Column::LeaseUntil.lt(now))
}

/// SQL true when the outbox row `alias` is its aggregate's earliest event not yet PUBLISHED: no
/// earlier version of the same aggregate waits (PENDING, in backoff, PUBLISHING or FAILED). A
/// claim takes only such events, so at most one event of an aggregate is ever leased, and version
/// n + 1 is claimed only after version n's mark, which follows the broker's confirm. The probe
/// reads `idx_outbox_aggregate` over the aggregate's own earlier versions only (retention deletes
/// published ones), never the table.
fn first_unpublished(backend: DbBackend, alias: &str) -> String {
    let index =
        if backend == DbBackend::MySql { format!(" FORCE INDEX ({AGGREGATE_INDEX})") } else { String::new() };
    format!(
        "NOT EXISTS (SELECT 1 FROM outbox_event AS p{index} \
         WHERE p.aggregate_type = {alias}.aggregate_type AND p.aggregate_id = {alias}.aggregate_id \
         AND p.event_version < {alias}.event_version AND p.status <> '{}')",
        OutboxStatus::Published.as_str()
    )
}

/// Which of `rows` (locked by this claim) have an earlier version of their aggregate not yet
/// PUBLISHED, by a read that starts after their locks were taken.
///
/// On MariaDB/MySQL the claim's locking read sees the newest committed rows, while its `NOT
/// EXISTS` probe reads the snapshot taken when the statement began: versions n and n + 1 both
/// committed during the statement would show n + 1 and hide n. This plain read is a new
/// statement, so (at READ COMMITTED) a new snapshot, which holds n whenever the claim saw n + 1
/// (n committed first). What it finds PUBLISHED stays so, so an event it clears stays clear.
/// PostgreSQL's claim reads one snapshot throughout and SQLite has one writer: neither needs it.
async fn still_behind_an_unpublished_version(
    txn: &sea_orm::DatabaseTransaction,
    rows: &[outbox_event::Model],
) -> Result<HashSet<String>, DbErr> {
    if rows.is_empty() {
        return Ok(HashSet::new());
    }
    let keys = vec!["?"; rows.len()].join(", ");
    let sql = format!(
        "SELECT o.event_id FROM outbox_event AS o WHERE o.event_id IN ({keys}) AND NOT {}",
        first_unpublished(DbBackend::MySql, "o")
    );
    let values = rows.iter().map(|row| Value::from(row.event_id.as_str()));
    txn.query_all_raw(Statement::from_sql_and_values(DbBackend::MySql, sql, values))
        .await?
        .iter()
        .map(|row| row.try_get_by_index::<String>(0))
        .collect()
}

/// A row's event id and status, and the record (topic, partition, offset) it was marked at.
type PublishedRow = (String, String, Option<String>, Option<i32>, Option<i64>);

/// The index due events are claimed through.
const DUE_INDEX: &str = "idx_outbox_due";
/// The index expired leases are claimed through.
const CLAIM_INDEX: &str = "idx_outbox_claim";
/// The index that finds an aggregate's earlier versions.
const AGGREGATE_INDEX: &str = "idx_outbox_aggregate";

fn lease_to(
    update: sea_orm::UpdateMany<outbox_event::Entity>,
    token: &LeaseToken,
    lease_until: DateTime<Utc>,
) -> sea_orm::UpdateMany<outbox_event::Entity> {
    update
        .col_expr(Column::Status, Expr::value(OutboxStatus::Publishing.as_str()))
        .col_expr(Column::LeaseOwner, Expr::value(token.as_str()))
        .col_expr(Column::LeaseUntil, Expr::value(lease_until))
        .col_expr(Column::Attempts, Expr::col(Column::Attempts).add(1))
}

/// Sorts `rows` (tagged with their call position) by event id, the order every set-based
/// update locks rows in, so two of them never wait on each other in a cycle; returns the values.
fn in_lock_order(rows: &mut [(usize, Vec<Value>)]) -> Vec<Vec<Value>> {
    rows.sort_by(|(_, a), (_, b)| id_of(a).cmp(id_of(b)));
    rows.iter().map(|(_, row)| row.clone()).collect()
}

/// `changed` (in lock order) mapped back to the call's order.
fn in_call_order<T: Copy>(rows: &[(usize, Vec<Value>)], changed: &[bool], f: impl Fn(bool) -> T) -> Vec<T> {
    let mut out: Vec<Option<T>> = vec![None; rows.len()];
    for ((i, _), changed) in rows.iter().zip(changed) {
        out[*i] = Some(f(*changed));
    }
    out.into_iter().map(|o| o.unwrap_or_else(|| f(false))).collect()
}

fn id_of(row: &[Value]) -> &str {
    match row.first() {
        Some(Value::String(Some(id))) => id,
        _ => "",
    }
}

fn claimed(
    row: outbox_event::Model,
    uncounted_attempts: i32,
    lease_until: DateTime<Utc>,
    token: &LeaseToken,
) -> ClaimedEvent {
    ClaimedEvent {
        event_id: row.event_id,
        aggregate_type: row.aggregate_type,
        aggregate_id: row.aggregate_id,
        event_type: row.event_type,
        event_version: row.event_version,
        payload: row.payload,
        attempts: row.attempts + uncounted_attempts,
        lease_until,
        lease_token: token.clone(),
        created_at: row.created_at,
        traceparent: row.traceparent,
        tracestate: row.tracestate,
    }
}

fn lease_end(now: DateTime<Utc>, lease: Duration) -> Result<DateTime<Utc>, DbErr> {
    chrono::Duration::from_std(lease)
        .ok()
        .and_then(|lease| now.checked_add_signed(lease))
        .ok_or_else(|| DbErr::Custom(format!("a lease of {lease:?} is out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_ends_its_length_after_now_and_an_absurd_one_is_an_error() {
        let now = DateTime::<Utc>::from_timestamp(1_700_000_000, 123_456_000).unwrap_or_default();
        let end = lease_end(now, Duration::from_millis(30_250));
        assert_eq!(end.ok(), DateTime::<Utc>::from_timestamp(1_700_000_030, 373_456_000));
        assert_eq!(lease_end(now, Duration::ZERO).ok(), Some(now));
        assert!(lease_end(now, Duration::MAX).is_err());
    }

    #[test]
    fn a_failed_publish_waits_a_jittered_doubling_time_from_the_base_up_to_the_max() {
        let ms = Duration::from_millis;
        let policy = RetryPolicy { max_attempts: 10, backoff_base: ms(500), backoff_max: ms(300_000) };
        for (attempts, ceiling) in
            [(0, ms(500)), (1, ms(500)), (2, ms(1_000)), (3, ms(2_000)), (10, ms(256_000)), (11, ms(300_000))]
        {
            // Enough draws that a wrong ceiling cannot pass by luck.
            for _ in 0..200 {
                let wait = policy.backoff(attempts);
                assert!(
                    wait >= ceiling / 2 && wait <= ceiling,
                    "attempt {attempts}: {wait:?} of {ceiling:?}"
                );
            }
        }
        for attempts in [12, 40, i32::MAX, -1] {
            assert!(policy.backoff(attempts) <= ms(300_000), "attempt {attempts}");
        }
        // A base above the max is capped from the first wait on.
        let inverted = RetryPolicy { max_attempts: 10, backoff_base: ms(900), backoff_max: ms(100) };
        assert!(inverted.backoff(1) <= ms(100));
    }
}
