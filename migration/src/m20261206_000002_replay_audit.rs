//! Operators' replays, one append-only row each: who, when, why, the filter and how many events
//! went back to PENDING (AdminService.Replay). A table of its own: the outbox row keeps only its
//! last redrive, and one replay covers up to a thousand rows.

use sea_orm_migration::prelude::*;

use crate::column::timestamp;

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(ReplayAudit::Table)
                    .col(
                        ColumnDef::new(ReplayAudit::Id)
                            .big_integer()
                            .not_null()
                            .auto_increment()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(ReplayAudit::RequestedBy).string_len(256).not_null())
                    .col(ColumnDef::new(ReplayAudit::Reason).string_len(1024).not_null())
                    .col(ColumnDef::new(ReplayAudit::OrderId).big_integer().null())
                    .col(timestamp(db, ReplayAudit::CreatedFrom).null())
                    .col(timestamp(db, ReplayAudit::CreatedTo).null())
                    .col(ColumnDef::new(ReplayAudit::EventType).string_len(128).null())
                    .col(ColumnDef::new(ReplayAudit::Replayed).big_integer().not_null())
                    .col(ColumnDef::new(ReplayAudit::NotPublished).big_integer().not_null())
                    .col(ColumnDef::new(ReplayAudit::Purged).big_integer().not_null())
                    .col(timestamp(db, ReplayAudit::ReplayedAt).not_null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(ReplayAudit::Table).to_owned()).await
    }
}

#[derive(DeriveIden)]
enum ReplayAudit {
    Table,
    Id,
    RequestedBy,
    Reason,
    OrderId,
    CreatedFrom,
    CreatedTo,
    EventType,
    Replayed,
    NotPublished,
    Purged,
    ReplayedAt,
}
