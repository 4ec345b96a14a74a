//! The outbox keeps one index per way it is read: `idx_outbox_due` goes.
//!
//! `idx_outbox_due (status, created_at, event_id)` served the relay's due read until
//! `m20261205_000004_held_back` moved it to `idx_outbox_ready (status, held_back, created_at,
//! event_id)`; after that only the backlog figures and `ListBacklog` read it, yet every outbox
//! insert and every claim, mark and release (each changes `status`) wrote its entries, and every
//! locking claim on MariaDB/MySQL locked them. Those reads now take `idx_outbox_ready` once per
//! value of `held_back` (two seeks instead of one), and the index is dropped.
//!
//! Unlike the migrations before it, this one removes something: a relay older than
//! `m20261205_000004_held_back` names `idx_outbox_due` in its MariaDB/MySQL claim and fails
//! every claim without it (nothing is lost; its events wait for a newer relay). Upgrade every
//! relay before running it; to roll a relay back that far, revert this migration first
//! (`idempost-migrate down -n 1` recreates the index). See `docs/operations.md`.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const DUE_INDEX: &str = "idx_outbox_due";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_index(Index::drop().name(DUE_INDEX).table(OutboxEvent::Table).to_owned()).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .name(DUE_INDEX)
                    .table(OutboxEvent::Table)
                    .col(OutboxEvent::Status)
                    .col(OutboxEvent::CreatedAt)
                    .col(OutboxEvent::EventId)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum OutboxEvent {
    Table,
    EventId,
    Status,
    CreatedAt,
}
