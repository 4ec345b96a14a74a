//! One append-only audit table for every operator's write, on the order side and the consumer
//! side alike: who (the token's subject), what (the action and the event, order or consumer it
//! touched), why (the reason, required), when (database clock), the call's trace id, and what
//! came of it. Each service writes its row in the transaction of the write it records, so a write
//! without its row cannot commit.
//!
//! It replaces two tables of one action each: `replay_audit` (AdminService.Replay) and
//! `gap_release` (ConsumerAdminService.ReleaseParkedGap), whose rows it copies, and the outbox
//! row's `last_redriven_*` columns, which keep only the last redrive. The two old tables stay,
//! no longer written by this release: a service of the previous release still running during a
//! rolling upgrade keeps writing them without failing, and nothing already recorded is lost. A
//! later release drops them.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

use crate::column::{event_id, timestamp};

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_database_backend();
        manager.create_table(table(db)).await?;
        for (name, column) in
            [("idx_admin_audit_event", AdminAudit::EventId), ("idx_admin_audit_order", AdminAudit::OrderId)]
        {
            manager
                .create_index(Index::create().name(name).table(AdminAudit::Table).col(column).to_owned())
                .await?;
        }
        let connection = manager.get_connection();
        connection.execute_unprepared(&copy_replays(db)).await?;
        connection.execute_unprepared(&copy_releases(db)).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(AdminAudit::Table).to_owned()).await
    }
}

fn table(db: DbBackend) -> TableCreateStatement {
    let mut consumer_name = ColumnDef::new(AdminAudit::ConsumerName);
    match db {
        // Compared byte for byte, as the consumer names of the read model are
        // (m20261206_000003_consumer_names_exact).
        DbBackend::MySql => {
            consumer_name.custom(Alias::new("VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"))
        }
        _ => consumer_name.string_len(128),
    };
    Table::create()
        .table(AdminAudit::Table)
        .col(ColumnDef::new(AdminAudit::Id).big_integer().not_null().auto_increment().primary_key())
        .col(timestamp(db, AdminAudit::RecordedAt).not_null())
        .col(ColumnDef::new(AdminAudit::Actor).string_len(256).not_null())
        .col(ColumnDef::new(AdminAudit::Action).string_len(32).not_null())
        .col(event_id(db, AdminAudit::EventId).null())
        .col(ColumnDef::new(AdminAudit::OrderId).big_integer().null())
        .col(consumer_name.null())
        .col(ColumnDef::new(AdminAudit::Reason).string_len(1024).not_null())
        .col(ColumnDef::new(AdminAudit::TraceId).string_len(32).null())
        .col(ColumnDef::new(AdminAudit::Outcome).string_len(1024).not_null())
        .to_owned()
}

/// Text concatenation and a number as text, in each backend's words.
fn concat(db: DbBackend, parts: &[&str]) -> String {
    match db {
        DbBackend::MySql => format!("CONCAT({})", parts.join(", ")),
        _ => parts.join(" || "),
    }
}

fn as_text(db: DbBackend, column: &str) -> String {
    match db {
        DbBackend::MySql => format!("CAST({column} AS CHAR)"),
        _ => format!("CAST({column} AS TEXT)"),
    }
}

/// Every `replay_audit` row as a REPLAY row, in the order they were written; the counts and the
/// filter become the outcome's text.
fn copy_replays(db: DbBackend) -> String {
    let outcome = concat(
        db,
        &[
            "'replayed '",
            &as_text(db, "replayed"),
            "', not published '",
            &as_text(db, "not_published"),
            "', purged '",
            &as_text(db, "purged"),
            "' (copied from replay_audit id '",
            &as_text(db, "id"),
            "')'",
        ],
    );
    format!(
        "INSERT INTO admin_audit (recorded_at, actor, action, order_id, reason, outcome) \
         SELECT replayed_at, requested_by, 'REPLAY', order_id, reason, {outcome} \
         FROM replay_audit ORDER BY id"
    )
}

/// Every `gap_release` row as a RELEASE_GAP row.
fn copy_releases(db: DbBackend) -> String {
    let outcome = concat(
        db,
        &[
            "'versions '",
            &as_text(db, "from_version"),
            "'..='",
            &as_text(db, "to_version"),
            "' given up (copied from gap_release id '",
            &as_text(db, "id"),
            "')'",
        ],
    );
    format!(
        "INSERT INTO admin_audit (recorded_at, actor, action, order_id, consumer_name, reason, outcome) \
         SELECT released_at, released_by, 'RELEASE_GAP', order_id, consumer_name, reason, {outcome} \
         FROM gap_release ORDER BY id"
    )
}

#[derive(DeriveIden)]
enum AdminAudit {
    Table,
    Id,
    RecordedAt,
    Actor,
    Action,
    EventId,
    OrderId,
    ConsumerName,
    Reason,
    TraceId,
    Outcome,
}
