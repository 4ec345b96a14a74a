//! On MariaDB/MySQL `idx_outbox_ready` sorts `status` and `held_back` descending, so that no run
//! of deleted rows follows the due events.
//!
//! Why: the relay's due read is a range of `idx_outbox_ready (status, held_back, created_at,
//! event_id)`: `status = 'PENDING' AND held_back = FALSE AND created_at >= ?`. InnoDB skips a
//! delete-marked entry whose page every reader can see before it checks whether the entry is
//! still inside the range, so a range read does not stop at its end while dead entries follow
//! it: it walks them up to the first live one. In ascending order the PENDING, not-held-back
//! range is followed by the held-back ones and then by the oldest PUBLISHED rows, exactly the
//! rows retention deletes; while a snapshot is held InnoDB's purge removes none of them, so every
//! claim walked every row retention had deleted since the snapshot was taken (the soak of
//! 2026-12-07: the due read's pages 20 -> 683 and claim p50 3 -> 12.5 ms over a five-minute
//! hold, the server's CPU rising with it). Descending, the range is followed by FAILED rows,
//! which retention never deletes, and then by the end of the index. Every reader of the index
//! fixes `status` and `held_back` by equality, so each still reads `created_at, event_id` in
//! order; the index's name and columns are unchanged, so a relay of any version still finds it.
//!
//! Online: one `ALTER TABLE` drops and adds the index under the same name with
//! `ALGORITHM=INPLACE, LOCK=NONE`, so writes go on while it is built and a server that could only
//! do it with the table locked refuses instead (on a Galera cluster DDL runs in total order, see
//! `docs/operations.md`). PostgreSQL's index scans check the range on every entry, dead or not,
//! and SQLite keeps no dead entries: neither changes. MariaDB before 10.8 accepts `DESC` and
//! builds the index ascending, as before.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        rebuild(manager, "DESC").await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        rebuild(manager, "ASC").await
    }
}

/// Rebuilds `idx_outbox_ready` on MariaDB/MySQL with `status` and `held_back` in `order`.
async fn rebuild(manager: &SchemaManager<'_>, order: &str) -> Result<(), DbErr> {
    if manager.get_database_backend() != DbBackend::MySql {
        return Ok(());
    }
    let sql = format!(
        "ALTER TABLE `outbox_event` DROP INDEX `idx_outbox_ready`, \
         ADD INDEX `idx_outbox_ready` (`status` {order}, `held_back` {order}, `created_at`, `event_id`), \
         ALGORITHM=INPLACE, LOCK=NONE"
    );
    manager.get_connection().execute_unprepared(&sql).await.map(|_| ())
}
