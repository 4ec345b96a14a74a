//! MariaDB/MySQL's claim.

use std::collections::HashSet;
use std::time::Duration;

use chrono::NaiveDateTime;
use sea_orm::{
    ColumnTrait, ConnectionTrait as _, DatabaseTransaction, DbBackend, DbErr, EntityTrait,
    FromQueryResult as _, QueryFilter, QueryResult, Statement, TransactionTrait, Value,
};

use super::{CLAIM_INDEX, READY_INDEX, claimed, first_unpublished, gate, lease_to, micros, took};
use crate::lease::LeaseToken;
use crate::outbox::event::ClaimedEvent;
use crate::outbox::position::{ExpiredFrom, Starts, Took};
use crate::outbox::table::{Outbox, lease_end};
use idempost::domain::OutboxStatus;
use idempost::entity::outbox_event::{self, Column};
use idempost::failpoint;

impl Outbox {
    /// MariaDB/MySQL's claim: one transaction of the claim gate, a plain read of the expired
    /// leases, a plain read of the due events, one locking read by key, one lease update and the
    /// gate's release; under a loaded two-core machine each round trip waits for the server
    /// thread to be scheduled.
    ///
    /// The locking read is a `UNION ALL` of the expired leases found and the due events found,
    /// each locked by primary key `FOR UPDATE SKIP LOCKED` with its conditions checked again,
    /// and returns the server's clock (`UTC_TIMESTAMP(6)`, one value per statement) with every
    /// row; the leases end `lease` after it. Expired leases come first (each row says its part,
    /// since a union's order is not promised).
    ///
    /// Why both kinds are found by a plain read first and only then locked, by key:
    /// - A locking read of `idx_outbox_claim (status, lease_until, created_at)` stops at the
    ///   first lease still running, and InnoDB keeps that row's entry locked until the claim
    ///   commits, even at READ COMMITTED. That row is another loop's event in flight, so its mark
    ///   waited for this claim (every lock wait the bench saw under load was one of these: see
    ///   `docs/design/relay-lease.md`).
    /// - A locking read of `idx_outbox_ready` locks every entry it passes, also those it then
    ///   skips, until the transaction ends, and checks each passed entry for an implicit lock by
    ///   looking up its row's versions. While purge stalls behind a held snapshot, the entries it
    ///   passes are mostly delete-marked ones of events already claimed, and the soak measured
    ///   that locking read growing with the held snapshot's age where a plain read of the same
    ///   range did not (`docs/design/relay-lease.md`, "Claims under a held snapshot"). By key it
    ///   locks only the rows it takes; it also cannot take the index locks by which two claims
    ///   once deadlocked (`1213`, see Deadlocks there).
    ///
    /// The plain reads are pinned to their index (`FORCE INDEX`), in the index's order, so that
    /// `LIMIT` stops them (left to itself MariaDB sometimes read the due events through
    /// `idx_outbox_claim` and sorted them).
    ///
    /// Both reads start where this process's claims left off (`read`): a range condition on
    /// `lease_until` and on `created_at` that InnoDB's range optimizer turns into the start of
    /// the index range, so neither read passes the delete-marked entries before it that a
    /// stalled purge keeps. Nor, for the due read, the ones after it: InnoDB checks a range's
    /// end only on live entries, so `idx_outbox_ready` sorts `status` and `held_back` descending
    /// (`m20261207_000001_ready_descending`) and the due range is followed by FAILED rows, not by
    /// the PUBLISHED rows retention deletes.
    ///
    /// The transaction first takes the database's claim gate ([`gate`]), so that relays claim
    /// one at a time, and releases it before the commit.
    pub(super) async fn claim_locking(
        &self,
        token: &LeaseToken,
        lease: Duration,
        batch_size: u64,
        read: Starts,
    ) -> Result<(Vec<ClaimedEvent>, Took), DbErr> {
        let txn = self.db.begin_with_config(self.isolation, None).await?;
        let gate = gate::enter(&txn).await?;
        let lookback = self.position.window().lookback;
        let leased = async {
            let (candidates, expired_found) = lock_candidates(&txn, batch_size, read, lookback).await?;
            lease_found(&txn, candidates, expired_found, token, lease, batch_size).await
        }
        .await;
        // Before the commit: the next claim may read while this one commits, and skips its rows.
        gate.leave(&txn).await;
        // On an error the transaction is dropped, which rolls it back.
        let leased = leased?;
        txn.commit().await?;
        Ok(leased)
    }
}

/// The claim's locking read in `txn`: expired leases and due events, each row with its part
/// and the server's clock, locked `FOR UPDATE SKIP LOCKED`, both read from `read`; and how many
/// expired leases the plain read found.
async fn lock_candidates(
    txn: &DatabaseTransaction,
    batch_size: u64,
    read: Starts,
    lookback: Duration,
) -> Result<(Vec<QueryResult>, usize), DbErr> {
    let limit = i64::try_from(batch_size).unwrap_or(i64::MAX);
    let (publishing, pending) = (OutboxStatus::Publishing.as_str(), OutboxStatus::Pending.as_str());
    let (expired_from, mut values): (&str, Vec<Value>) = match read.expired_from {
        ExpiredFrom::Head => ("", vec![]),
        ExpiredFrom::Window => {
            ("AND lease_until >= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND ", vec![micros(lookback)?.into()])
        }
        ExpiredFrom::From(lease_until) => ("AND lease_until >= ? ", vec![lease_until.naive_utc().into()]),
    };
    values.push(limit.into());
    let expired = event_ids(
        txn,
        format!(
            "SELECT event_id FROM outbox_event FORCE INDEX ({CLAIM_INDEX}) \
                 WHERE status = '{publishing}' {expired_from}AND lease_until < UTC_TIMESTAMP(6) \
                 ORDER BY lease_until, created_at LIMIT ?"
        ),
        values,
    )
    .await?;
    let expired_found = expired.len();
    let first = first_unpublished(DbBackend::MySql, "o");
    let (due_from, due_values): (&str, Vec<Value>) = match read.due_from {
        None => ("", vec![limit.into()]),
        Some(from) => ("AND o.created_at >= ? ", vec![from.naive_utc().into(), limit.into()]),
    };
    let due = event_ids(
        txn,
        format!(
            "SELECT o.event_id FROM outbox_event AS o FORCE INDEX ({READY_INDEX}) \
                 WHERE o.status = '{pending}' AND o.held_back = FALSE {due_from}\
                 AND (o.lease_until IS NULL OR o.lease_until <= UTC_TIMESTAMP(6)) \
                 AND {first} ORDER BY o.created_at, o.event_id LIMIT ?"
        ),
        due_values,
    )
    .await?;
    let columns = "o.*, UTC_TIMESTAMP(6) AS claim_now";
    let mut parts = Vec::new();
    let mut values = Vec::new();
    if !expired.is_empty() {
        parts.push(format!(
            "(SELECT {columns}, 0 AS claim_part FROM outbox_event AS o \
                  WHERE o.event_id IN ({}) AND o.status = '{publishing}' AND o.lease_until < UTC_TIMESTAMP(6) \
                  FOR UPDATE SKIP LOCKED)",
            placeholders(expired.len())
        ));
        values.extend(expired);
    }
    if !due.is_empty() {
        parts.push(format!(
            "(SELECT {columns}, 1 AS claim_part FROM outbox_event AS o \
                  WHERE o.event_id IN ({}) AND o.status = '{pending}' AND o.held_back = FALSE \
                  AND (o.lease_until IS NULL OR o.lease_until <= UTC_TIMESTAMP(6)) AND {first} \
                  FOR UPDATE SKIP LOCKED)",
            placeholders(due.len())
        ));
        values.extend(due);
    }
    if parts.is_empty() {
        return Ok((Vec::new(), expired_found));
    }
    let statement = Statement::from_sql_and_values(DbBackend::MySql, parts.join(" UNION ALL "), values);
    Ok((txn.query_all_raw(statement).await?, expired_found))
}

/// The event ids a plain read `sql` with `values` finds in `txn`, as values to bind.
async fn event_ids(txn: &DatabaseTransaction, sql: String, values: Vec<Value>) -> Result<Vec<Value>, DbErr> {
    txn.query_all_raw(Statement::from_sql_and_values(DbBackend::MySql, sql, values))
        .await?
        .iter()
        .map(|row| row.try_get_by_index::<String>(0).map(Value::from))
        .collect()
}

/// `n` placeholders for an `IN (…)` list.
fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// Leases what `lock_candidates` found in `txn` (not committed): up to `batch_size`, those not
/// behind an unpublished earlier version of their aggregate.
async fn lease_found(
    txn: &DatabaseTransaction,
    result: Vec<QueryResult>,
    expired_found: usize,
    token: &LeaseToken,
    lease: Duration,
    batch_size: u64,
) -> Result<(Vec<ClaimedEvent>, Took), DbErr> {
    let nothing = took(std::iter::empty(), expired_found, batch_size);
    // One clock value per statement: the first row's is every row's.
    let Some(first) = result.first() else {
        return Ok((Vec::new(), nothing));
    };
    let lease_until = lease_end(first.try_get::<NaiveDateTime>("", "claim_now")?.and_utc(), lease)?;
    let mut found = Vec::with_capacity(result.len());
    for row in &result {
        found.push((row.try_get::<i64>("", "claim_part")?, outbox_event::Model::from_query_result(row, "")?));
    }
    let due: HashSet<String> =
        found.iter().filter(|(part, _)| *part == 1).map(|(_, row)| row.event_id.clone()).collect();
    let mut rows = taken(found, batch_size);
    let held = still_behind_an_unpublished_version(txn, &rows).await?;
    rows.retain(|row| !held.contains(&row.event_id));
    if rows.is_empty() {
        return Ok((Vec::new(), nothing));
    }
    let took = took(rows.iter().filter(|row| due.contains(&row.event_id)), expired_found, batch_size);
    // At most `batch_size` placeholders, and never an empty `IN ()`.
    let ids: Vec<String> = rows.iter().map(|r| r.event_id.clone()).collect();
    lease_to(outbox_event::Entity::update_many(), token, lease_until)
        .filter(Column::EventId.is_in(ids))
        .exec(txn)
        .await?;
    failpoint::hit(failpoint::INSIDE_RELAY_CLAIM_BEFORE_COMMIT).map_err(|e| DbErr::Custom(e.to_string()))?;
    Ok((rows.into_iter().map(|row| claimed(row, 1, lease_until, token)).collect(), took))
}

/// What a claim takes of the rows its union found (each with its part: 0 for an expired lease,
/// 1 for a due event): expired leases first, longest expired first, then due events, oldest
/// first, up to `batch_size`; answered in creation order.
fn taken(mut found: Vec<(i64, outbox_event::Model)>, batch_size: u64) -> Vec<outbox_event::Model> {
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
    rows
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
    txn: &DatabaseTransaction,
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
