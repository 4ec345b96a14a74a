//! Leased claims: the one entry point, and what the three databases' claim statements share.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{DbBackend, DbErr};

use super::event::ClaimedEvent;
use super::position::Took;
use super::table::Outbox;
use crate::lease::{LeaseToken, WorkerId};
use idempost::db;
use idempost::domain::OutboxStatus;
use idempost::entity::outbox_event::{self, Column};

mod gate;
mod mysql;
mod postgres;
mod sqlite;
mod sweep;

pub use sweep::Swept;

impl Outbox {
    /// Claims up to `batch_size` events for `worker` for `lease`, oldest first, under a fresh
    /// [`LeaseToken`] that every event of the claim carries.
    ///
    /// Candidates are PUBLISHING events whose lease has expired (taken first, longest expired
    /// first), then PENDING events whose retry time (if any) has come, oldest first. On MariaDB/MySQL and PostgreSQL
    /// the candidates are locked with `FOR UPDATE SKIP LOCKED` and leased in one short
    /// transaction, so concurrent relays take disjoint batches without waiting on each other.
    /// Each candidate query reads an index in the order it takes rows (`idx_outbox_claim` for
    /// expired leases, `idx_outbox_ready` for due events not held back), so `LIMIT` stops the
    /// scan and the claim locks only the rows it leases; on MariaDB/MySQL the transaction runs at READ COMMITTED,
    /// which takes no gap locks, so a claim never blocks an order's insert or another relay's
    /// claim or mark. SQLite has one writer at a time, so one
    /// `UPDATE … RETURNING` does the same. Every claim counts as an attempt.
    ///
    /// Per-aggregate order: a due event is a candidate only while no earlier version of its
    /// aggregate is unpublished ([`first_unpublished`]), so an aggregate has at most one event
    /// leased at a time, and version n + 1 is claimed only after version n was marked PUBLISHED,
    /// which only the broker's confirm leads to. An event in backoff, leased elsewhere, or FAILED
    /// therefore holds back the later events of its own aggregate and nothing else. Events
    /// written `held_back` (their previous version was unpublished) are not read at all until
    /// that version's mark releases them, so the due read passes only events that may be their
    /// aggregate's next, however many later versions wait.
    ///
    /// On MariaDB/MySQL and PostgreSQL both reads start where this process's claims left off
    /// (its [`ClaimWindow`](super::ClaimWindow)), not at the head of their index range, so that
    /// they do not pass the dead entries a held snapshot keeps; what falls behind is found by
    /// [`Outbox::sweep_claims`] and claimed next.
    pub async fn claim(
        &self,
        worker: &WorkerId,
        lease: Duration,
        batch_size: u64,
    ) -> Result<Vec<ClaimedEvent>, DbErr> {
        let token = LeaseToken::new(worker);
        let read = self.position.starts();
        let (claimed, took) = match self.db.get_database_backend() {
            DbBackend::Postgres => self.claim_in_one_statement(&token, lease, batch_size, read).await?,
            // One writer at a time, and no snapshot that keeps dead rows: read from the head.
            _ if !db::has_skip_locked(&self.db) => {
                return self.claim_single_writer(&token, lease, batch_size).await;
            }
            _ => self.claim_locking(&token, lease, batch_size, read).await?,
        };
        self.position.claimed(read, took);
        Ok(claimed)
    }

    /// This process marked events as old as `oldest` PUBLISHED, and their marks released their
    /// orders' held-back next versions, which the order service wrote after them, so no older:
    /// the due read starts at `oldest` again if it started later, or a chain of versions written
    /// long ago would wait for a sweep at every version. A no-op while the marked events are
    /// inside the lookback, as they are unless they waited (a retry, a redrive, a backlog).
    pub(crate) fn marked_through(&self, oldest: DateTime<Utc>) {
        self.position.due_behind(oldest);
    }
}

/// What a claim that leased `rows`, of which `due` came from the due read, tells its position;
/// `expired_found` is how many expired leases its expired read found within `limit`.
fn took<'a>(due: impl Iterator<Item = &'a outbox_event::Model>, expired_found: usize, limit: u64) -> Took {
    Took {
        newest_due: due.map(|row| row.created_at).max(),
        expired_cut: u64::try_from(expired_found).unwrap_or(u64::MAX) >= limit,
    }
}

/// A lease of `lease` (or a lookback) in whole microseconds, as the claims bind it.
fn micros(length: Duration) -> Result<i64, DbErr> {
    i64::try_from(length.as_micros())
        .map_err(|_| DbErr::Custom(format!("a length of {length:?} is out of range")))
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

/// The index due events are claimed through: `(status, held_back, created_at, event_id)`, so the
/// read of PENDING rows not held back goes oldest first and never passes a held-back one.
const READY_INDEX: &str = "idx_outbox_ready";
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
