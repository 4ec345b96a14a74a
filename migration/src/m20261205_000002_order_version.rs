//! `order_version`: one row per version of an order, written in the transaction of the operation
//! that made it (SubmitOrder makes version 1, each AmendOrder and CancelOrder the next one).
//!
//! It is the one idempotency-key space of a tenant: `uq_order_version_tenant_request` holds the
//! `(tenant_id, request_id)` of every operation, so a key used by a submission cannot be used by
//! a change and the other way round, and two callers racing with one key for two operations are
//! decided by the database's unique index (on PostgreSQL no read can see the other's uncommitted
//! row, so checking `orders` and a changes-only table in each transaction would let both commit).
//! `uq_order_version_event` keeps every event id to one operation; the primary key
//! `(order_id, version)` lets no two changes make the same version even if the order row's
//! compare-and-set were ever wrong. Each operation's content is kept as a fingerprint, to tell a
//! replay from a reused key after later changes replaced the order's facts.
//!
//! Existing orders get their version-1 row from their acceptance.

use sea_orm_migration::prelude::*;

use crate::column::{ascii_key, event_id, timestamp};

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

/// Version 1 of every order accepted before this migration.
const BACKFILL: &str = "INSERT INTO order_version \
     (order_id, version, tenant_id, request_id, event_id, operation, fingerprint, total, committed_at) \
     SELECT id, 1, tenant_id, request_id, acceptance_event_id, 'SUBMIT', NULL, total, created_at FROM orders";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(OrderVersion::Table)
                    .col(ColumnDef::new(OrderVersion::OrderId).big_integer().not_null())
                    .col(ColumnDef::new(OrderVersion::Version).big_integer().not_null())
                    .col(ColumnDef::new(OrderVersion::TenantId).big_integer().not_null())
                    .col(ascii_key(db, OrderVersion::RequestId, 128).not_null())
                    .col(event_id(db, OrderVersion::EventId).not_null())
                    .col(ColumnDef::new(OrderVersion::Operation).string_len(16).not_null())
                    // SHA-256 of the request's content in lower-case hex; NULL only for an order
                    // accepted before this migration, until its first change keeps it.
                    .col(ascii_key(db, OrderVersion::Fingerprint, 64).null())
                    .col(ColumnDef::new(OrderVersion::Total).big_integer().not_null())
                    .col(timestamp(db, OrderVersion::CommittedAt).not_null())
                    .primary_key(Index::create().col(OrderVersion::OrderId).col(OrderVersion::Version))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_order_version_order")
                            .from(OrderVersion::Table, OrderVersion::OrderId)
                            .to(Orders::Table, Orders::Id),
                    )
                    .to_owned(),
            )
            .await?;
        for (name, columns) in [
            ("uq_order_version_tenant_request", vec![OrderVersion::TenantId, OrderVersion::RequestId]),
            ("uq_order_version_event", vec![OrderVersion::EventId]),
        ] {
            let mut index = Index::create();
            index.name(name).table(OrderVersion::Table).unique();
            for column in columns {
                index.col(column);
            }
            manager.create_index(index).await?;
        }
        manager.get_connection().execute_unprepared(BACKFILL).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(OrderVersion::Table).to_owned()).await
    }
}

#[derive(DeriveIden)]
enum OrderVersion {
    Table,
    OrderId,
    Version,
    TenantId,
    RequestId,
    EventId,
    Operation,
    Fingerprint,
    Total,
    CommittedAt,
}

#[derive(DeriveIden)]
enum Orders {
    Table,
    Id,
}
