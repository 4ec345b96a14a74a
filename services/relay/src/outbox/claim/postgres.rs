//! PostgreSQL's claim.

use std::time::Duration;

use sea_orm::{ConnectionTrait as _, DbBackend, DbErr, FromQueryResult as _, Statement, Value};

use super::{claimed, first_unpublished, micros, took};
use crate::lease::LeaseToken;
use crate::outbox::event::ClaimedEvent;
use crate::outbox::position::{ExpiredFrom, Starts, Took};
use crate::outbox::table::Outbox;
use idempost::domain::OutboxStatus;
use idempost::entity::outbox_event;

impl Outbox {
    /// PostgreSQL's claim: the clock read, both candidate queries (each on its own index, in its
    /// order, `FOR UPDATE SKIP LOCKED`) and the lease update in one statement, so one round trip
    /// and one implicit transaction instead of six round trips (begin, clock, two selects, the
    /// update, commit). Under a loaded two-core machine each round trip waits for the server
    /// process to be scheduled, and that wait, not the statements, was most of a claim's time.
    ///
    /// The lease ends `lease` after the database clock (`clock_timestamp()`, read once in a
    /// materialized CTE): PostgreSQL stores a `timestamptz`, so a clock function writes the same
    /// value a bound timestamp would (only SQLite needs every timestamp bound as text). The due
    /// query takes only what the expired one left of `batch_size`, as the two queries of the
    /// transaction did.
    ///
    /// Both reads start where this process's claims left off (`read`, its [`Starts`]): the
    /// expired one at the lease end the sweep found or `lookback` before the clock, the due one
    /// at its `created_at` bound, each a range condition on the index it reads, so that the index
    /// scan begins there instead of passing every dead entry before it. Each row comes back with
    /// whether the expired read found it, so that the position learns what the due read took.
    pub(super) async fn claim_in_one_statement(
        &self,
        token: &LeaseToken,
        lease: Duration,
        batch_size: u64,
        read: Starts,
    ) -> Result<(Vec<ClaimedEvent>, Took), DbErr> {
        let limit = i64::try_from(batch_size).unwrap_or(i64::MAX);
        let mut values: Vec<Value> = vec![token.as_str().into(), limit.into(), micros(lease)?.into()];
        let mut bind = |value: Value| {
            values.push(value);
            format!("${}", values.len())
        };
        let expired_from = match read.expired_from {
            ExpiredFrom::Head => String::new(),
            ExpiredFrom::Window => format!(
                "AND lease_until >= (SELECT now FROM clock) - {} * interval '1 microsecond' ",
                bind(micros(self.position.window().lookback)?.into())
            ),
            ExpiredFrom::From(lease_until) => format!("AND lease_until >= {} ", bind(lease_until.into())),
        };
        let due_from = read
            .due_from
            .map_or_else(String::new, |from| format!("AND o.created_at >= {} ", bind(from.into())));
        let sql = format!(
            "WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now), \
             expired AS MATERIALIZED (SELECT event_id FROM outbox_event \
               WHERE status = '{publishing}' {expired_from}AND lease_until < (SELECT now FROM clock) \
               ORDER BY lease_until, created_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
             due AS MATERIALIZED (SELECT o.event_id FROM outbox_event AS o \
               WHERE o.status = '{pending}' AND o.held_back = FALSE {due_from}\
               AND (o.lease_until IS NULL OR o.lease_until <= (SELECT now FROM clock)) \
               AND {first} \
               ORDER BY o.created_at, o.event_id LIMIT $2 - (SELECT count(*) FROM expired) FOR UPDATE OF o SKIP LOCKED) \
             UPDATE outbox_event AS o SET status = '{publishing}', lease_owner = $1, \
               lease_until = (SELECT now FROM clock) + $3 * interval '1 microsecond', attempts = o.attempts + 1 \
             WHERE o.event_id IN (SELECT event_id FROM expired UNION ALL SELECT event_id FROM due) \
             RETURNING o.*, o.event_id IN (SELECT event_id FROM expired) AS claim_expired",
            publishing = OutboxStatus::Publishing.as_str(),
            pending = OutboxStatus::Pending.as_str(),
            first = first_unpublished(DbBackend::Postgres, "o"),
        );
        let statement = Statement::from_sql_and_values(DbBackend::Postgres, sql, values);
        let mut rows = Vec::new();
        for row in self.db.query_all_raw(statement).await? {
            rows.push((
                row.try_get::<bool>("", "claim_expired")?,
                outbox_event::Model::from_query_result(&row, "")?,
            ));
        }
        let expired_found = rows.iter().filter(|(expired, _)| *expired).count();
        let took =
            took(rows.iter().filter(|(expired, _)| !expired).map(|(_, row)| row), expired_found, batch_size);
        let mut rows: Vec<outbox_event::Model> = rows.into_iter().map(|(_, row)| row).collect();
        rows.sort_by(|a, b| (a.created_at, &a.event_id).cmp(&(b.created_at, &b.event_id)));
        let claimed = rows
            .into_iter()
            .map(|row| {
                let lease_until = row.lease_until.ok_or_else(|| {
                    DbErr::Custom(format!("claimed event {} came back without a lease", row.event_id))
                })?;
                // RETURNING shows the row after the update: its attempts already count this claim.
                Ok(claimed(row, 0, lease_until, token))
            })
            .collect::<Result<_, DbErr>>()?;
        Ok((claimed, took))
    }
}
