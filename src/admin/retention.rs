//! Retention: PUBLISHED outbox rows and consumed_event rows do not stay forever, and the dedup
//! history always outlives every possible redelivery.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect,
};

use super::inspect::before;
use crate::db;
use crate::domain::OutboxStatus;
use crate::entity::{consumed_event, outbox_event};

/// How long rows are kept after they stop being needed.
///
/// Only PUBLISHED outbox rows and consumed_event rows are ever deleted; PENDING, PUBLISHING and
/// FAILED rows stay until they are published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// PUBLISHED outbox rows are kept this long after the broker confirmed them.
    pub outbox: Duration,
    /// consumed_event rows are kept this long after their effect committed.
    pub consumed: Duration,
    /// The longest a record can be delivered again after a consumer committed it: the broker's
    /// retention plus the window in which an operator may replay (offset reset, restore).
    pub redelivery_horizon: Duration,
    /// Rows deleted per statement: each batch is its own short transaction.
    pub batch_size: u64,
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
pub struct PurgeReport {
    /// PUBLISHED outbox rows.
    pub outbox_rows: u64,
    /// consumed_event rows.
    pub consumed_rows: u64,
    /// Outbox rows published before this (database clock) were eligible.
    pub outbox_cutoff: DateTime<Utc>,
    /// consumed_event rows committed before this (database clock) were eligible.
    pub consumed_cutoff: DateTime<Utc>,
}

impl Retention {
    /// Refuses a consumed_event window shorter than the redelivery horizon.
    pub fn check(&self) -> Result<(), RetentionError> {
        if self.consumed < self.redelivery_horizon {
            return Err(RetentionError::BelowHorizon {
                consumed: self.consumed,
                horizon: self.redelivery_horizon,
            });
        }
        Ok(())
    }

    /// Deletes what the windows allow, oldest first, in batches of `batch_size` rows.
    ///
    /// Each batch selects candidate keys and deletes them with the eligibility conditions
    /// repeated, so several instances purging at once only ever delete eligible rows, and no
    /// statement holds locks for long. Cut-offs come from the database clock.
    pub async fn purge(&self, db: &DatabaseConnection, dry_run: bool) -> Result<PurgeReport, RetentionError> {
        self.check()?;
        let now = db::now(db).await?;
        let outbox_cutoff = before(now, self.outbox)?;
        let consumed_cutoff = before(now, self.consumed)?;
        let batch = self.batch_size.max(1);
        let (outbox_rows, consumed_rows) = if dry_run {
            (
                purgeable_outbox(outbox_cutoff).count(db).await?,
                purgeable_consumed(consumed_cutoff).count(db).await?,
            )
        } else {
            (purge_outbox(db, outbox_cutoff, batch).await?, purge_consumed(db, consumed_cutoff, batch).await?)
        };
        Ok(PurgeReport { outbox_rows, consumed_rows, outbox_cutoff, consumed_cutoff })
    }
}

fn purgeable_outbox(cutoff: DateTime<Utc>) -> sea_orm::Select<outbox_event::Entity> {
    outbox_event::Entity::find()
        .filter(outbox_event::Column::Status.eq(OutboxStatus::Published.as_str()))
        .filter(outbox_event::Column::PublishedAt.lt(cutoff))
}

fn purgeable_consumed(cutoff: DateTime<Utc>) -> sea_orm::Select<consumed_event::Entity> {
    consumed_event::Entity::find().filter(consumed_event::Column::ConsumedAt.lt(cutoff))
}

async fn purge_outbox(db: &DatabaseConnection, cutoff: DateTime<Utc>, batch: u64) -> Result<u64, DbErr> {
    in_batches(batch, || async move {
        let ids: Vec<String> = purgeable_outbox(cutoff)
            .select_only()
            .column(outbox_event::Column::EventId)
            .order_by_asc(outbox_event::Column::PublishedAt)
            .limit(batch)
            .into_tuple()
            .all(db)
            .await?;
        let found = ids.len();
        if found == 0 {
            return Ok((0, 0));
        }
        // The conditions again: another purger or a status change since the select is harmless.
        let deleted = outbox_event::Entity::delete_many()
            .filter(outbox_event::Column::EventId.is_in(ids))
            .filter(outbox_event::Column::Status.eq(OutboxStatus::Published.as_str()))
            .filter(outbox_event::Column::PublishedAt.lt(cutoff))
            .exec(db)
            .await?
            .rows_affected;
        Ok((found, deleted))
    })
    .await
}

async fn purge_consumed(db: &DatabaseConnection, cutoff: DateTime<Utc>, batch: u64) -> Result<u64, DbErr> {
    in_batches(batch, || async move {
        let ids: Vec<i64> = purgeable_consumed(cutoff)
            .select_only()
            .column(consumed_event::Column::Id)
            .order_by_asc(consumed_event::Column::ConsumedAt)
            .limit(batch)
            .into_tuple()
            .all(db)
            .await?;
        let found = ids.len();
        if found == 0 {
            return Ok((0, 0));
        }
        let deleted = consumed_event::Entity::delete_many()
            .filter(consumed_event::Column::Id.is_in(ids))
            .filter(consumed_event::Column::ConsumedAt.lt(cutoff))
            .exec(db)
            .await?
            .rows_affected;
        Ok((found, deleted))
    })
    .await
}

/// Runs `one` (select at most `batch` ids, delete them; answer how many were found and how many
/// deleted) until a batch comes back short, and sums the deletions. Each batch is its own short
/// statement, so no lock is held across batches.
async fn in_batches<F, Fut>(batch: u64, mut one: F) -> Result<u64, DbErr>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(usize, u64), DbErr>>,
{
    let mut deleted = 0;
    loop {
        let (found, gone) = one().await?;
        deleted += gone;
        if (found as u64) < batch.max(1) {
            return Ok(deleted);
        }
    }
}
