//! The relay's claim index: a claim reads candidates in the order it takes them, so it locks only
//! the rows it leases.
//!
//! `idx_outbox_claim (status, lease_until, created_at)` cannot serve "oldest first": the claim
//! sorted every claimable row, and on MariaDB/MySQL `FOR UPDATE` locked the whole backlog (and,
//! under REPEATABLE READ, the gaps new orders insert into) before `LIMIT` applied. That crossed
//! the order service's inserts and other relays' claims (deadlocks, and relays that found every
//! row locked). `idx_outbox_due (status, created_at, event_id)` returns one status's rows oldest
//! first, so `LIMIT n` stops after n rows. Migrations only add: `idx_outbox_claim` stays for
//! relays of the previous version.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .name("idx_outbox_due")
                    .table(OutboxEvent::Table)
                    .col(OutboxEvent::Status)
                    .col(OutboxEvent::CreatedAt)
                    .col(OutboxEvent::EventId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_index(Index::drop().name("idx_outbox_due").table(OutboxEvent::Table).to_owned()).await
    }
}

#[derive(DeriveIden)]
enum OutboxEvent {
    Table,
    EventId,
    Status,
    CreatedAt,
}
