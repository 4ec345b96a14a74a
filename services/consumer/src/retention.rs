//! The dedup history's retention, run by the consumer against its own database:
//! consumed_event rows do not stay forever, and they always outlive every possible redelivery.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ColumnTrait, Condition, DatabaseConnection, DbErr};

use idempost::audit::{self, Action, Entry};
use idempost::db::{self, purge};
use idempost::entity::consumed_event::{self, Column};

/// How long consumed_event rows are kept after their effect committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DedupRetention {
    /// consumed_event rows are kept this long after their effect committed.
    pub(crate) consumed: Duration,
    /// The longest a record can be delivered again after a consumer committed it: the broker's
    /// retention plus the window in which an operator may replay (offset reset, restore).
    pub(crate) redelivery_horizon: Duration,
    /// Rows deleted per statement: each batch is its own short transaction.
    pub(crate) batch_size: u64,
}

/// A purge that was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    /// Deleting dedup rows younger than the horizon would let a redelivery make a second effect.
    #[error(
        "consumed_event retention {} is shorter than the redelivery horizon {}: a redelivered record would find no dedup row and take effect twice",
        humantime::format_duration(*consumed),
        humantime::format_duration(*horizon)
    )]
    BelowHorizon {
        /// The window asked for.
        consumed: Duration,
        /// The configured horizon.
        horizon: Duration,
    },
    /// The database failed; batches already deleted stay deleted, none is half done.
    #[error("the purge failed: {0}")]
    Database(#[from] DbErr),
}

/// What a purge deleted (or, in a dry run, would delete).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DedupPurgeReport {
    /// consumed_event rows.
    pub(crate) consumed_rows: u64,
    /// consumed_event rows committed before this (database clock) were eligible.
    pub(crate) consumed_cutoff: DateTime<Utc>,
}

impl DedupRetention {
    /// Refuses a consumed_event window shorter than the redelivery horizon.
    pub(crate) fn check(&self) -> Result<(), RetentionError> {
        if self.consumed < self.redelivery_horizon {
            return Err(RetentionError::BelowHorizon {
                consumed: self.consumed,
                horizon: self.redelivery_horizon,
            });
        }
        Ok(())
    }

    /// Deletes what the window allows, oldest first from the head, in batches of `batch_size`
    /// rows ([`purge::delete_in_batches`]), or with `dry_run` only counts them, after
    /// [`DedupRetention::check`]. The cut-off comes from the database clock.
    pub(crate) async fn purge(
        &self,
        db: &DatabaseConnection,
        dry_run: bool,
    ) -> Result<DedupPurgeReport, RetentionError> {
        self.purge_after(db, dry_run, &mut None).await
    }

    /// The periodic purge: as [`DedupRetention::purge`], but continuing where the run before
    /// stopped except on a full pass ([`purge::Resume`]).
    pub(crate) async fn purge_resuming(
        &self,
        db: &DatabaseConnection,
        resume: &mut purge::Resume<i64>,
    ) -> Result<DedupPurgeReport, RetentionError> {
        self.purge_after(db, false, resume.next_run()).await
    }

    /// Rows are taken in `(consumed_at, id)` order, on `idx_consumed_event_retention
    /// (consumed_at)`: InnoDB and SQLite end every secondary index with the primary key `id`;
    /// PostgreSQL ends it with the row's address, and ties of `consumed_at` (one consumer batch
    /// stamps its rows with one time) are as many as a consumer batch at most.
    async fn purge_after(
        &self,
        db: &DatabaseConnection,
        dry_run: bool,
        after: &mut Option<purge::Cursor<i64>>,
    ) -> Result<DedupPurgeReport, RetentionError> {
        self.check()?;
        let consumed_cutoff = purge::before(db::now(db).await?, self.consumed)?;
        let consumed_rows = purge::delete_in_batches::<consumed_event::Entity, i64>(
            db,
            Condition::all().add(Column::ConsumedAt.lt(consumed_cutoff)),
            Column::Id,
            Column::ConsumedAt,
            self.batch_size,
            dry_run,
            after,
        )
        .await?;
        Ok(DedupPurgeReport { consumed_rows, consumed_cutoff })
    }

    /// An operator's purge: its PURGE_CONSUMED audit row, committed before the first batch (the
    /// batches are short transactions of their own), then the purge.
    pub(crate) async fn purge_audited(
        &self,
        db: &DatabaseConnection,
        requested_by: &str,
        reason: &str,
    ) -> Result<DedupPurgeReport, RetentionError> {
        let eligible = self.purge(db, true).await?;
        let outcome = format!(
            "consumed_event rows committed before {} (a window of {}): {} eligible, deleted in batches after this row",
            eligible.consumed_cutoff.to_rfc3339(),
            humantime::format_duration(self.consumed),
            eligible.consumed_rows
        );
        let reason = if reason.trim().is_empty() { "(none given)" } else { reason };
        audit::record(db, Entry::new(Action::PurgeConsumed, requested_by, reason, outcome)).await?;
        self.purge(db, false).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    fn keeping(consumed: Duration) -> DedupRetention {
        DedupRetention { consumed, redelivery_horizon: 14 * DAY, batch_size: 500 }
    }

    #[test]
    fn dedup_history_shorter_than_the_horizon_is_refused() {
        assert!(keeping(14 * DAY).check().is_ok(), "exactly the horizon is enough");
        assert!(keeping(30 * DAY).check().is_ok());
        let refused = keeping(7 * DAY).check().unwrap_err().to_string();
        assert!(refused.contains("shorter than the redelivery horizon 14days"), "{refused}");
    }
}
