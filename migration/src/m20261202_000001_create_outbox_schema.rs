//! Orders, their line items, the transactional outbox, and the consumer's dedup and effect tables.

use sea_orm_migration::prelude::*;

use crate::column::{event_id, timestamp};

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_database_backend();

        manager
            .create_table(
                Table::create()
                    .table(Orders::Table)
                    .col(ColumnDef::new(Orders::Id).big_integer().not_null().auto_increment().primary_key())
                    .col(ColumnDef::new(Orders::TenantId).big_integer().not_null())
                    .col(ColumnDef::new(Orders::RequestId).string_len(128).not_null())
                    .col(event_id(db, Orders::AcceptanceEventId).not_null())
                    .col(ColumnDef::new(Orders::CustomerId).string_len(128).not_null())
                    .col(ColumnDef::new(Orders::Currency).char_len(3).not_null())
                    .col(ColumnDef::new(Orders::Total).big_integer().not_null())
                    .col(ColumnDef::new(Orders::Version).big_integer().not_null())
                    .col(ColumnDef::new(Orders::Status).string_len(16).not_null())
                    .col(timestamp(db, Orders::CreatedAt).not_null())
                    .to_owned(),
            )
            .await?;
        unique(manager, "uq_orders_tenant_request", Orders::Table, [Orders::TenantId, Orders::RequestId])
            .await?;
        unique(manager, "uq_orders_acceptance_event", Orders::Table, [Orders::AcceptanceEventId]).await?;

        manager
            .create_table(
                Table::create()
                    .table(OrderLine::Table)
                    .col(ColumnDef::new(OrderLine::OrderId).big_integer().not_null())
                    .col(ColumnDef::new(OrderLine::LineNo).integer().not_null())
                    .col(ColumnDef::new(OrderLine::Sku).string_len(64).not_null())
                    .col(ColumnDef::new(OrderLine::Quantity).integer().not_null())
                    .col(ColumnDef::new(OrderLine::UnitPriceMinor).big_integer().not_null())
                    .primary_key(Index::create().col(OrderLine::OrderId).col(OrderLine::LineNo))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_order_line_order")
                            .from(OrderLine::Table, OrderLine::OrderId)
                            .to(Orders::Table, Orders::Id),
                    )
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(OutboxEvent::Table)
                    .col(event_id(db, OutboxEvent::EventId).not_null().primary_key())
                    .col(ColumnDef::new(OutboxEvent::AggregateType).string_len(64).not_null())
                    .col(ColumnDef::new(OutboxEvent::AggregateId).string_len(128).not_null())
                    .col(ColumnDef::new(OutboxEvent::EventType).string_len(128).not_null())
                    .col(ColumnDef::new(OutboxEvent::EventVersion).big_integer().not_null())
                    .col(ColumnDef::new(OutboxEvent::Payload).blob().not_null())
                    .col(ColumnDef::new(OutboxEvent::Status).string_len(16).not_null())
                    .col(ColumnDef::new(OutboxEvent::LeaseOwner).string_len(128).null())
                    .col(timestamp(db, OutboxEvent::LeaseUntil).null())
                    .col(ColumnDef::new(OutboxEvent::Attempts).integer().not_null().default(0))
                    .col(ColumnDef::new(OutboxEvent::LastError).string_len(1024).null())
                    .col(timestamp(db, OutboxEvent::CreatedAt).not_null())
                    .col(timestamp(db, OutboxEvent::PublishedAt).null())
                    .col(ColumnDef::new(OutboxEvent::PublishedTopic).string_len(249).null())
                    .col(ColumnDef::new(OutboxEvent::PublishedPartition).integer().null())
                    .col(ColumnDef::new(OutboxEvent::PublishedOffset).big_integer().null())
                    // The W3C trace context of the SubmitOrder that wrote the event: the relay
                    // continues that trace, so one event is one trace.
                    .col(ColumnDef::new(OutboxEvent::Traceparent).string_len(55).null())
                    .col(ColumnDef::new(OutboxEvent::Tracestate).string_len(512).null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_outbox_claim")
                    .table(OutboxEvent::Table)
                    .col(OutboxEvent::Status)
                    .col(OutboxEvent::LeaseUntil)
                    .col(OutboxEvent::CreatedAt)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(ConsumedEvent::Table)
                    .col(
                        ColumnDef::new(ConsumedEvent::Id)
                            .big_integer()
                            .not_null()
                            .auto_increment()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(ConsumedEvent::ConsumerName).string_len(128).not_null())
                    .col(event_id(db, ConsumedEvent::EventId).not_null())
                    .col(timestamp(db, ConsumedEvent::ConsumedAt).not_null())
                    .to_owned(),
            )
            .await?;
        unique(
            manager,
            "uq_consumed_event_identity",
            ConsumedEvent::Table,
            [ConsumedEvent::ConsumerName, ConsumedEvent::EventId],
        )
        .await?;

        manager
            .create_table(
                Table::create()
                    .table(NotificationJob::Table)
                    .col(event_id(db, NotificationJob::EventId).not_null().primary_key())
                    .col(ColumnDef::new(NotificationJob::OrderId).big_integer().not_null())
                    .col(ColumnDef::new(NotificationJob::SourceVersion).big_integer().not_null())
                    .col(ColumnDef::new(NotificationJob::Status).string_len(16).not_null())
                    .col(timestamp(db, NotificationJob::CreatedAt).not_null())
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(DeadLetter::Table)
                    .col(
                        ColumnDef::new(DeadLetter::Id)
                            .big_integer()
                            .not_null()
                            .auto_increment()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(DeadLetter::ConsumerName).string_len(128).not_null())
                    .col(ColumnDef::new(DeadLetter::Topic).string_len(249).not_null())
                    .col(ColumnDef::new(DeadLetter::PartitionId).integer().not_null())
                    .col(ColumnDef::new(DeadLetter::OffsetId).big_integer().not_null())
                    .col(ColumnDef::new(DeadLetter::RecordKey).blob().null())
                    .col(ColumnDef::new(DeadLetter::Payload).blob().not_null())
                    .col(ColumnDef::new(DeadLetter::EventId).string_len(128).null())
                    .col(ColumnDef::new(DeadLetter::Error).string_len(1024).not_null())
                    .col(timestamp(db, DeadLetter::CreatedAt).not_null())
                    .to_owned(),
            )
            .await?;
        unique(
            manager,
            "uq_dead_letter_coordinates",
            DeadLetter::Table,
            [DeadLetter::ConsumerName, DeadLetter::Topic, DeadLetter::PartitionId, DeadLetter::OffsetId],
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            DeadLetter::Table.into_iden(),
            NotificationJob::Table.into_iden(),
            ConsumedEvent::Table.into_iden(),
            OutboxEvent::Table.into_iden(),
            OrderLine::Table.into_iden(),
            Orders::Table.into_iden(),
        ] {
            manager.drop_table(Table::drop().table(table).to_owned()).await?;
        }
        Ok(())
    }
}

/// A named unique index: the name is what duplicate classification matches on.
async fn unique<T, C, const N: usize>(
    manager: &SchemaManager<'_>,
    name: &str,
    table: T,
    columns: [C; N],
) -> Result<(), DbErr>
where
    T: IntoIden,
    C: IntoIden,
{
    let mut index = Index::create();
    index.name(name).table(table).unique();
    for column in columns {
        index.col(column);
    }
    manager.create_index(index).await
}

#[derive(DeriveIden)]
enum Orders {
    Table,
    Id,
    TenantId,
    RequestId,
    AcceptanceEventId,
    CustomerId,
    Currency,
    Total,
    Version,
    Status,
    CreatedAt,
}

#[derive(DeriveIden)]
enum OrderLine {
    Table,
    OrderId,
    LineNo,
    Sku,
    Quantity,
    UnitPriceMinor,
}

#[derive(DeriveIden)]
enum OutboxEvent {
    Table,
    EventId,
    AggregateType,
    AggregateId,
    EventType,
    EventVersion,
    Payload,
    Status,
    LeaseOwner,
    LeaseUntil,
    Attempts,
    LastError,
    CreatedAt,
    PublishedAt,
    PublishedTopic,
    PublishedPartition,
    PublishedOffset,
    Traceparent,
    Tracestate,
}

#[derive(DeriveIden)]
enum ConsumedEvent {
    Table,
    Id,
    ConsumerName,
    EventId,
    ConsumedAt,
}

#[derive(DeriveIden)]
enum NotificationJob {
    Table,
    EventId,
    OrderId,
    SourceVersion,
    Status,
    CreatedAt,
}

#[derive(DeriveIden)]
enum DeadLetter {
    Table,
    Id,
    ConsumerName,
    Topic,
    PartitionId,
    OffsetId,
    RecordKey,
    Payload,
    EventId,
    Error,
    CreatedAt,
}
