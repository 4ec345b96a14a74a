//! Per-order order, on both sides of the topic.
//!
//! The relay claims an event only when no earlier version of its aggregate is unpublished:
//! `idx_outbox_aggregate (aggregate_type, aggregate_id, event_version, status)` answers that for
//! each candidate from the index alone, reading only the aggregate's own earlier versions.
//!
//! The consumer keeps a read model of each order (`order_view`, one row per consumer name and
//! order) and parks an event that cannot be applied yet (`parked_event`: a version that skips
//! ahead, or an event type it does not know), both in the transaction of the event's dedup row.
//! `idx_notification_job_order` finds the version a consumer older than the read model handled
//! last, so an order accepted before the upgrade does not park its first amendment.

use sea_orm_migration::prelude::*;

use crate::column::{event_id, timestamp};

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_database_backend();
        manager
            .create_index(
                Index::create()
                    .name("idx_outbox_aggregate")
                    .table(OutboxEvent::Table)
                    .col(OutboxEvent::AggregateType)
                    .col(OutboxEvent::AggregateId)
                    .col(OutboxEvent::EventVersion)
                    .col(OutboxEvent::Status)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_notification_job_order")
                    .table(NotificationJob::Table)
                    .col(NotificationJob::ConsumerName)
                    .col(NotificationJob::OrderId)
                    .col(NotificationJob::SourceVersion)
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(OrderView::Table)
                    .col(ColumnDef::new(OrderView::ConsumerName).string_len(128).not_null())
                    .col(ColumnDef::new(OrderView::OrderId).big_integer().not_null())
                    .col(ColumnDef::new(OrderView::TenantId).big_integer().not_null())
                    .col(ColumnDef::new(OrderView::Version).big_integer().not_null())
                    .col(ColumnDef::new(OrderView::Status).string_len(16).not_null())
                    .col(ColumnDef::new(OrderView::TotalMinor).big_integer().not_null())
                    .col(event_id(db, OrderView::LastEventId).not_null())
                    .col(timestamp(db, OrderView::UpdatedAt).not_null())
                    .primary_key(Index::create().col(OrderView::ConsumerName).col(OrderView::OrderId))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(ParkedEvent::Table)
                    .col(ColumnDef::new(ParkedEvent::ConsumerName).string_len(128).not_null())
                    .col(event_id(db, ParkedEvent::EventId).not_null())
                    .col(ColumnDef::new(ParkedEvent::OrderId).big_integer().not_null())
                    .col(ColumnDef::new(ParkedEvent::Version).big_integer().not_null())
                    .col(ColumnDef::new(ParkedEvent::EventType).string_len(128).not_null())
                    .col(ColumnDef::new(ParkedEvent::Payload).blob().not_null())
                    .col(ColumnDef::new(ParkedEvent::Reason).string_len(1024).not_null())
                    .col(timestamp(db, ParkedEvent::ParkedAt).not_null())
                    .primary_key(Index::create().col(ParkedEvent::ConsumerName).col(ParkedEvent::EventId))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_parked_event_order")
                    .table(ParkedEvent::Table)
                    .col(ParkedEvent::ConsumerName)
                    .col(ParkedEvent::OrderId)
                    .col(ParkedEvent::Version)
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(GapRelease::Table)
                    .col(
                        ColumnDef::new(GapRelease::Id)
                            .big_integer()
                            .not_null()
                            .auto_increment()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(GapRelease::ConsumerName).string_len(128).not_null())
                    .col(ColumnDef::new(GapRelease::OrderId).big_integer().not_null())
                    .col(ColumnDef::new(GapRelease::FromVersion).big_integer().not_null())
                    .col(ColumnDef::new(GapRelease::ToVersion).big_integer().not_null())
                    .col(ColumnDef::new(GapRelease::ReleasedBy).string_len(256).not_null())
                    .col(ColumnDef::new(GapRelease::Reason).string_len(1024).not_null())
                    .col(timestamp(db, GapRelease::ReleasedAt).not_null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(GapRelease::Table).to_owned()).await?;
        manager.drop_table(Table::drop().table(ParkedEvent::Table).to_owned()).await?;
        manager.drop_table(Table::drop().table(OrderView::Table).to_owned()).await?;
        manager
            .drop_index(
                Index::drop().name("idx_notification_job_order").table(NotificationJob::Table).to_owned(),
            )
            .await?;
        manager
            .drop_index(Index::drop().name("idx_outbox_aggregate").table(OutboxEvent::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum OutboxEvent {
    Table,
    AggregateType,
    AggregateId,
    EventVersion,
    Status,
}

#[derive(DeriveIden)]
enum NotificationJob {
    Table,
    ConsumerName,
    OrderId,
    SourceVersion,
}

#[derive(DeriveIden)]
enum OrderView {
    Table,
    ConsumerName,
    OrderId,
    TenantId,
    Version,
    Status,
    TotalMinor,
    LastEventId,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum ParkedEvent {
    Table,
    ConsumerName,
    EventId,
    OrderId,
    Version,
    EventType,
    Payload,
    Reason,
    ParkedAt,
}

#[derive(DeriveIden)]
enum GapRelease {
    Table,
    Id,
    ConsumerName,
    OrderId,
    FromVersion,
    ToVersion,
    ReleasedBy,
    Reason,
    ReleasedAt,
}
