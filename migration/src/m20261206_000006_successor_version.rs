//! The change that writes an order's next version while this one is unpublished also writes this
//! one's row: `outbox_event.successor_version`.
//!
//! Why: the next version is written held back (`m20261205_000004_held_back`) and the relay's mark
//! of this one releases it. On one server a row lock on this version's row orders the change and
//! the mark. On a Galera cluster row locks hold only on their node, and certification refuses a
//! commit only for rows both transactions wrote: a change through one node and a mark through
//! another both committed, and the next version stayed held back for good. The change now
//! records its version here instead of only locking the row, so whichever of the two commits
//! second is refused (a deadlock at COMMIT, a confirmed rollback) and runs again, and then sees
//! the other (`docs/design/per-order-order.md`, "On Galera"). Nothing reads the column to decide
//! anything; it says which version waits on this one.
//!
//! Online: a nullable column without a default, added last, changes no existing row. MariaDB and
//! MySQL are asked for `ALGORITHM=INSTANT` (a metadata change, no table copy, no lock held while
//! rows are copied), so a server that could only copy the table refuses instead of blocking the
//! outbox; PostgreSQL and SQLite add such a column without rewriting the table.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() == DbBackend::MySql {
            manager
                .get_connection()
                .execute_unprepared(
                    "ALTER TABLE `outbox_event` ADD COLUMN `successor_version` BIGINT NULL, ALGORITHM=INSTANT",
                )
                .await?;
            return Ok(());
        }
        manager
            .alter_table(
                Table::alter()
                    .table(OutboxEvent::Table)
                    .add_column(ColumnDef::new(OutboxEvent::SuccessorVersion).big_integer().null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(OutboxEvent::Table)
                    .drop_column(OutboxEvent::SuccessorVersion)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum OutboxEvent {
    Table,
    SuccessorVersion,
}
