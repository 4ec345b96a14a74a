//! Indexes that let the consumer's timeline find an event's rows by `event_id` alone.
//!
//! `GetConsumerTimeline` reads `consumed_event`, `notification_job` and `dead_letter` by
//! `event_id`, and no index on those tables starts with it: `uq_consumed_event_identity` and
//! `notification_job`'s primary key are `(consumer_name, event_id)`, which serve a lookup by
//! consumer name first, not by event id alone; `dead_letter` has none on `event_id`. Each call
//! therefore scanned all three tables. One event has few rows in each (one per consumer name), so
//! `event_id` alone is enough; the timeline sorts that handful itself.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

/// Each index's name and table. Every index holds the one column `event_id`.
fn indexes() -> [(&'static str, DynIden); 3] {
    [
        ("idx_consumed_event_event_id", ConsumedEvent::Table.into_iden()),
        ("idx_notification_job_event_id", NotificationJob::Table.into_iden()),
        ("idx_dead_letter_event_id", DeadLetter::Table.into_iden()),
    ]
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for (name, table) in indexes() {
            manager.create_index(Index::create().name(name).table(table).col(EventId).to_owned()).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for (name, table) in indexes().into_iter().rev() {
            manager.drop_index(Index::drop().name(name).table(table).to_owned()).await?;
        }
        Ok(())
    }
}

/// The column all three tables share.
#[derive(DeriveIden)]
struct EventId;

#[derive(DeriveIden)]
enum ConsumedEvent {
    Table,
}

#[derive(DeriveIden)]
enum NotificationJob {
    Table,
}

#[derive(DeriveIden)]
enum DeadLetter {
    Table,
}
