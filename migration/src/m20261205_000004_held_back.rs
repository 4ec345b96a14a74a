//! A claim reads only events that may be their order's next: `outbox_event.held_back`.
//!
//! The relay claims an event only when no earlier version of its aggregate is unpublished (a
//! `NOT EXISTS` on `idx_outbox_aggregate`), but its due read walked `idx_outbox_due` through
//! every PENDING row, so a claim made while most orders had a version in flight read all their
//! waiting later versions before it found one to take, and a backlog of many versions per order
//! drained far slower than one of one version each (figures in `docs/design/per-order-order.md`).
//!
//! `held_back` is TRUE only for an event written while the version just before it was known to
//! be unpublished: the order service sets it under a lock on that version's row, and the relay's
//! mark of that version clears it in the mark's transaction. FALSE says "may be claimable": the
//! `NOT EXISTS` still decides, so rows written without the column (by an older order service,
//! or by hand) are claimed exactly as before, only with the old cost. The claim's due read takes
//! `idx_outbox_ready (status, held_back, created_at, event_id)`, where held-back rows are not in
//! its range. `idx_outbox_due` stayed for the backlog figures until
//! `m20261206_000001_backlog_on_ready`.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(OutboxEvent::Table)
                    .add_column(ColumnDef::new(OutboxEvent::HeldBack).boolean().not_null().default(false))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_outbox_ready")
                    .table(OutboxEvent::Table)
                    .col(OutboxEvent::Status)
                    .col(OutboxEvent::HeldBack)
                    .col(OutboxEvent::CreatedAt)
                    .col(OutboxEvent::EventId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name("idx_outbox_ready").table(OutboxEvent::Table).to_owned())
            .await?;
        manager
            .alter_table(
                Table::alter().table(OutboxEvent::Table).drop_column(OutboxEvent::HeldBack).to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum OutboxEvent {
    Table,
    EventId,
    Status,
    HeldBack,
    CreatedAt,
}
