//! The outbox's retention: PUBLISHED rows do not stay forever. PENDING, PUBLISHING and FAILED
//! rows are never deleted. (The dedup history is the consumer's, and so is its retention.)

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ColumnTrait, Condition, DatabaseConnection, DbErr};

use idempost::audit::{self, Action, Entry};
use idempost::db::{self, purge};
use idempost::domain::OutboxStatus;
use idempost::entity::outbox_event::{self, Column};

/// How long PUBLISHED outbox rows are kept after the broker confirmed them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutboxRetention {
    /// PUBLISHED outbox rows are kept this long after the broker confirmed them.
    pub(crate) outbox: Duration,
    /// Rows deleted per statement: each batch is its own short transaction.
    pub(crate) batch_size: u64,
}

/// What a purge deleted (or, in a dry run, would delete).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutboxPurgeReport {
    /// PUBLISHED outbox rows.
    pub(crate) outbox_rows: u64,
    /// Outbox rows published before this (database clock) were eligible.
    pub(crate) outbox_cutoff: DateTime<Utc>,
}

impl OutboxRetention {
    /// Deletes the PUBLISHED rows the window allows, oldest first from the head, in batches of
    /// `batch_size` ([`purge::delete_in_batches`]), or with `dry_run` only counts them. The
    /// cut-off comes from the database clock.
    pub(crate) async fn purge(
        &self,
        db: &DatabaseConnection,
        dry_run: bool,
    ) -> Result<OutboxPurgeReport, DbErr> {
        self.purge_after(db, dry_run, &mut None).await
    }

    /// The periodic purge: as [`OutboxRetention::purge`], but continuing where the run before
    /// stopped except on a full pass ([`purge::Resume`]).
    pub(crate) async fn purge_resuming(
        &self,
        db: &DatabaseConnection,
        resume: &mut purge::Resume<String>,
    ) -> Result<OutboxPurgeReport, DbErr> {
        self.purge_after(db, false, resume.next_run()).await
    }

    /// Rows are taken in `(published_at, event_id)` order, on `idx_outbox_retention (status,
    /// published_at)`: `status` is fixed by equality, and ties of `published_at` (one relay mark
    /// statement stamps its whole batch with one time) are as many as a mark's batch at most.
    async fn purge_after(
        &self,
        db: &DatabaseConnection,
        dry_run: bool,
        after: &mut Option<purge::Cursor<String>>,
    ) -> Result<OutboxPurgeReport, DbErr> {
        let outbox_cutoff = purge::before(db::now(db).await?, self.outbox)?;
        let published = Condition::all()
            .add(Column::Status.eq(OutboxStatus::Published.as_str()))
            .add(Column::PublishedAt.lt(outbox_cutoff));
        let outbox_rows = purge::delete_in_batches::<outbox_event::Entity, String>(
            db,
            published,
            Column::EventId,
            Column::PublishedAt,
            self.batch_size,
            dry_run,
            after,
        )
        .await?;
        Ok(OutboxPurgeReport { outbox_rows, outbox_cutoff })
    }

    /// An operator's purge: its PURGE audit row first, then the purge. A purge deletes in many
    /// short transactions by design (no statement holds locks for long), so there is no one
    /// transaction to share: the row is committed before the first batch, with the cut-off and
    /// how many rows it made eligible, so that no row is ever deleted unaudited.
    pub(crate) async fn purge_audited(
        &self,
        db: &DatabaseConnection,
        requested_by: &str,
        reason: &str,
    ) -> Result<OutboxPurgeReport, DbErr> {
        let eligible = self.purge(db, true).await?;
        let outcome = format!(
            "PUBLISHED outbox rows published before {} (a window of {}): {} eligible, deleted in batches after this row",
            eligible.outbox_cutoff.to_rfc3339(),
            humantime::format_duration(self.outbox),
            eligible.outbox_rows
        );
        audit::record(db, Entry::new(Action::Purge, requested_by, reason, outcome)).await?;
        self.purge(db, false).await
    }
}
