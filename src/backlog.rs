//! The outbox as operators see it, shared by the relay (its backlog gauges, its stall check, its
//! `redrive` command) and the order side's AdminService: one definition of the backlog and one
//! audited redrive. The relay's leased claims and fenced marks stay in `relay`.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, TransactionTrait, Value,
};

use crate::audit::{self, Action};
use crate::db;
use crate::domain::OutboxStatus;
use crate::entity::outbox_event::{self, Column};

/// The statuses of rows that still need something: a relay (PENDING, PUBLISHING) or an operator
/// (FAILED). PUBLISHED rows need nothing and are never counted: there may be millions.
pub const NEEDS_ATTENTION: [OutboxStatus; 3] =
    [OutboxStatus::Pending, OutboxStatus::Publishing, OutboxStatus::Failed];

/// The statuses of rows waiting for a relay: not published yet, and not given up.
pub const WAITING: [OutboxStatus; 2] = [OutboxStatus::Pending, OutboxStatus::Publishing];

/// Both values of `outbox_event.held_back`: a read in creation order on `idx_outbox_ready`
/// takes each range in turn.
pub const HELD_BACK: [bool; 2] = [false, true];

/// How many events still need something, and how long the oldest has waited for a relay.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Backlog {
    /// Rows per status of [`NEEDS_ATTENTION`], as `(status, count)`, in that order.
    pub by_status: Vec<(OutboxStatus, u64)>,
    /// Creation time of the oldest [`WAITING`] row.
    pub oldest_pending: Option<DateTime<Utc>>,
}

impl Backlog {
    /// The count of `status` (0 for PUBLISHED, which is never counted).
    pub fn count(&self, status: OutboxStatus) -> u64 {
        self.by_status.iter().find(|(s, _)| *s == status).map_or(0, |(_, n)| *n)
    }

    /// The backlog from the stored `(status, count)` groups and the oldest creation time of each
    /// waiting status.
    fn assemble(stored: &[(String, i64)], oldest: impl IntoIterator<Item = Option<DateTime<Utc>>>) -> Self {
        let by_status = NEEDS_ATTENTION
            .into_iter()
            .map(|status| {
                let n = stored.iter().find(|(s, _)| s == status.as_str()).map_or(0, |(_, n)| *n);
                (status, u64::try_from(n).unwrap_or(0))
            })
            .collect();
        Self { by_status, oldest_pending: oldest.into_iter().flatten().min() }
    }
}

/// Reads the backlog. Every query stays inside `idx_outbox_ready` (status, held_back,
/// created_at) on the statuses that need attention, so its cost follows the backlog, never the
/// PUBLISHED history.
pub async fn backlog(db: &impl ConnectionTrait) -> Result<Backlog, DbErr> {
    let stored: Vec<(String, i64)> = outbox_event::Entity::find()
        .select_only()
        .column(Column::Status)
        .column_as(Expr::col(Column::EventId).count(), "n")
        .filter(Column::Status.is_in(NEEDS_ATTENTION.map(OutboxStatus::as_str)))
        .group_by(Column::Status)
        .into_tuple()
        .all(db)
        .await?;
    // One index seek per status and `held_back` rather than one sort over all of them: the
    // index orders by creation time only within one value of each.
    let mut oldest = Vec::with_capacity(WAITING.len() * HELD_BACK.len());
    for status in WAITING {
        for held_back in HELD_BACK {
            let first: Option<DateTime<Utc>> = outbox_event::Entity::find()
                .select_only()
                .column(Column::CreatedAt)
                .filter(Column::Status.eq(status.as_str()))
                .filter(Column::HeldBack.eq(held_back))
                .order_by_asc(Column::CreatedAt)
                .limit(1)
                .into_tuple()
                .one(db)
                .await?;
            oldest.push(first);
        }
    }
    Ok(Backlog::assemble(&stored, oldest))
}

/// What a relay could claim now: PENDING events not held back whose retry time (if any) has
/// come, and PUBLISHING events whose lease ran out, each only while no earlier version of its
/// order is unpublished (the claim's own conditions). Events waiting on a backoff or behind an
/// earlier version are not counted: they wait by design, not for want of a relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Claimable {
    /// How many there are.
    pub count: u64,
    /// The oldest one's creation time.
    pub oldest: Option<DateTime<Utc>>,
}

/// Reads what a relay could claim at the database's clock. Each of the claim's two parts is read
/// on its own, through the index the claim reads it by (`idx_outbox_ready` for due events,
/// `idx_outbox_claim` for expired leases): one condition over both statuses could read the
/// PUBLISHED history too. The counts read every claimable row, like [`backlog`]'s.
pub async fn claimable(db: &impl ConnectionTrait) -> Result<Claimable, DbErr> {
    let now = db::now(db).await?;
    let due = Condition::all()
        .add(Column::Status.eq(OutboxStatus::Pending.as_str()))
        .add(Column::HeldBack.eq(false))
        .add(Condition::any().add(Column::LeaseUntil.is_null()).add(Column::LeaseUntil.lte(now)));
    let expired = Condition::all()
        .add(Column::Status.eq(OutboxStatus::Publishing.as_str()))
        .add(Column::LeaseUntil.lt(now));
    let mut claimable = Claimable::default();
    for part in [due, expired] {
        let part = part.add(first_unpublished());
        let count: Option<i64> = outbox_event::Entity::find()
            .select_only()
            .column_as(Expr::col(Column::EventId).count(), "n")
            .filter(part.clone())
            .into_tuple()
            .one(db)
            .await?;
        let oldest: Option<DateTime<Utc>> = outbox_event::Entity::find()
            .select_only()
            .column(Column::CreatedAt)
            .filter(part)
            .order_by_asc(Column::CreatedAt)
            .limit(1)
            .into_tuple()
            .one(db)
            .await?;
        claimable.count += count.and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
        claimable.oldest = claimable.oldest.into_iter().chain(oldest).min();
    }
    Ok(claimable)
}

/// True for an `outbox_event` row that is its order's earliest event not yet PUBLISHED, as the
/// relay's claim requires: an event behind an earlier version waits for it, not for a relay.
fn first_unpublished() -> Expr {
    Expr::cust(format!(
        "NOT EXISTS (SELECT 1 FROM outbox_event AS p \
         WHERE p.aggregate_type = outbox_event.aggregate_type AND p.aggregate_id = outbox_event.aggregate_id \
         AND p.event_version < outbox_event.event_version AND p.status <> '{}')",
        OutboxStatus::Published.as_str()
    ))
}

/// Who redrives an event and why: recorded on the row and in the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedriveAudit {
    /// The operator (or tool) asking.
    pub requested_by: String,
    /// Why the event may be published again now.
    pub reason: String,
}

/// The most characters of an audit field kept on the row.
const AUDIT_CHARS: usize = 128;
const REASON_CHARS: usize = 512;

/// What a redrive found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redrive {
    /// The FAILED event is PENDING again with its attempts reset.
    Redriven,
    /// The event exists but is not FAILED; nothing was changed.
    NotFailed(OutboxStatus),
    /// No event has that id.
    NotFound,
}

/// Returns a FAILED event to PENDING with its attempts reset, counting the redrive and recording
/// when (database clock), by whom and why on the row and in a REDRIVE row of the audit
/// ([`audit`]), in one transaction. Any other state is left alone and nothing is recorded: a
/// FAILED row has no lease, so no relay's lease can be overwritten.
pub async fn redrive(
    db: &DatabaseConnection,
    event_id: &str,
    audit: &RedriveAudit,
) -> Result<Redrive, DbErr> {
    let txn = db.begin().await?;
    let now = db::now(&txn).await?;
    let by: String = audit.requested_by.chars().take(AUDIT_CHARS).collect();
    let reason: String = audit.reason.chars().take(REASON_CHARS).collect();
    let result = outbox_event::Entity::update_many()
        .col_expr(Column::Status, Expr::value(OutboxStatus::Pending.as_str()))
        .col_expr(Column::Attempts, Expr::value(0))
        .col_expr(Column::LeaseOwner, Expr::value(Value::String(None)))
        .col_expr(Column::LeaseUntil, Expr::value(Option::<DateTime<Utc>>::None))
        .col_expr(Column::RedriveCount, Expr::col(Column::RedriveCount).add(1))
        .col_expr(Column::LastRedrivenAt, Expr::value(now))
        .col_expr(Column::LastRedrivenBy, Expr::value(by))
        .col_expr(Column::LastRedriveReason, Expr::value(reason))
        .filter(Column::EventId.eq(event_id))
        .filter(Column::Status.eq(OutboxStatus::Failed.as_str()))
        .exec(&txn)
        .await?;
    if result.rows_affected == 1 {
        let mut entry = audit::Entry::new(
            Action::Redrive,
            &audit.requested_by,
            &audit.reason,
            "FAILED -> PENDING".to_owned(),
        );
        entry.event_id = Some(event_id.to_owned());
        audit::record(&txn, entry).await?;
        txn.commit().await?;
        return Ok(Redrive::Redriven);
    }
    let current = outbox_event::Entity::find_by_id(event_id.to_owned()).one(&txn).await?;
    txn.rollback().await?;
    Ok(match current.and_then(|row| OutboxStatus::from_stored(&row.status)) {
        Some(status) => Redrive::NotFailed(status),
        None => Redrive::NotFound,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(seconds, 0).unwrap()
    }

    #[test]
    fn the_backlog_counts_every_status_that_needs_attention_and_nothing_published() {
        let stored = [("FAILED".to_owned(), 2), ("PENDING".to_owned(), 5), ("PUBLISHED".to_owned(), 9)];
        let backlog = Backlog::assemble(&stored, [None, None]);
        assert_eq!(
            backlog.by_status,
            [(OutboxStatus::Pending, 5), (OutboxStatus::Publishing, 0), (OutboxStatus::Failed, 2)]
        );
        assert_eq!(backlog.count(OutboxStatus::Published), 0, "PUBLISHED is never counted");
        assert_eq!(backlog.oldest_pending, None, "nothing waits for a relay");
    }

    #[test]
    fn the_oldest_waiting_row_is_the_oldest_pending_or_publishing_one() {
        assert_eq!(Backlog::assemble(&[], [Some(at(20)), Some(at(10))]).oldest_pending, Some(at(10)));
        assert_eq!(Backlog::assemble(&[], [Some(at(20)), None]).oldest_pending, Some(at(20)));
        assert_eq!(Backlog::assemble(&[], [None, Some(at(30))]).oldest_pending, Some(at(30)));
    }
}
