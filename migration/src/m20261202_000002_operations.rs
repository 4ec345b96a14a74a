//! What operators need: the audit of redrives on the outbox row, and indexes that keep the
//! retention purge's batches short.

use sea_orm_migration::prelude::*;

use crate::column::timestamp;

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_database_backend();
        // One column per statement: SQLite's ALTER TABLE adds only one at a time.
        for column in [
            ColumnDef::new(OutboxEvent::RedriveCount).integer().not_null().default(0).to_owned(),
            timestamp(db, OutboxEvent::LastRedrivenAt).null().to_owned(),
            ColumnDef::new(OutboxEvent::LastRedrivenBy).string_len(128).null().to_owned(),
            ColumnDef::new(OutboxEvent::LastRedriveReason).string_len(512).null().to_owned(),
        ] {
            manager
                .alter_table(Table::alter().table(OutboxEvent::Table).add_column(column).to_owned())
                .await?;
        }
        manager
            .create_index(
                Index::create()
                    .name("idx_outbox_retention")
                    .table(OutboxEvent::Table)
                    .col(OutboxEvent::Status)
                    .col(OutboxEvent::PublishedAt)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_consumed_event_retention")
                    .table(ConsumedEvent::Table)
                    .col(ConsumedEvent::ConsumedAt)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop().name("idx_consumed_event_retention").table(ConsumedEvent::Table).to_owned(),
            )
            .await?;
        manager
            .drop_index(Index::drop().name("idx_outbox_retention").table(OutboxEvent::Table).to_owned())
            .await?;
        for column in [
            OutboxEvent::LastRedriveReason,
            OutboxEvent::LastRedrivenBy,
            OutboxEvent::LastRedrivenAt,
            OutboxEvent::RedriveCount,
        ] {
            manager
                .alter_table(Table::alter().table(OutboxEvent::Table).drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum OutboxEvent {
    Table,
    Status,
    PublishedAt,
    RedriveCount,
    LastRedrivenAt,
    LastRedrivenBy,
    LastRedriveReason,
}

#[derive(DeriveIden)]
enum ConsumedEvent {
    Table,
    ConsumedAt,
}
