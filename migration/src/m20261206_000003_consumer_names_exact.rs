//! The consumer names of the per-order read model (`order_view`, `parked_event`, `gap_release`)
//! compared byte for byte on MariaDB/MySQL, as `consumed_event`'s already are
//! (m20261205_000001_exact_identifiers) and as every name is on PostgreSQL and SQLite.
//!
//! m20261205_000003_per_order_order created these columns after that migration, with the table's
//! default collation, which on MariaDB is case-insensitive and pads trailing blanks: consumers
//! named `Reports` and `reports` kept two dedup histories but one read model, each overwriting
//! the other's rows, and each listed and released the other's parked events.
//!
//! Existing rows are kept: two names equal byte for byte were equal under the looser rule too,
//! so every primary key that held still holds. The rewrite copies the three tables once.
//! PostgreSQL and SQLite are unchanged. `down` returns the columns to the table's default
//! collation; it fails, and changes nothing, while two names differ only by case or trailing
//! blanks.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{DbBackend, Statement};

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

/// The tables whose `consumer_name VARCHAR(128) NOT NULL` changes collation.
const TABLES: &[&str] = &["order_view", "parked_event", "gap_release"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::MySql {
            return Ok(());
        }
        let binary =
            first_collation(manager, &["utf8mb4_nopad_bin", "utf8mb4_0900_bin", "utf8mb4_bin"]).await?;
        alter_all(manager, &format!(" CHARACTER SET utf8mb4 COLLATE {binary}")).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::MySql {
            return Ok(());
        }
        // No character set: the column takes the table's default again.
        alter_all(manager, "").await
    }
}

async fn alter_all(manager: &SchemaManager<'_>, collation: &str) -> Result<(), DbErr> {
    for table in TABLES {
        let sql = format!("ALTER TABLE `{table}` MODIFY `consumer_name` VARCHAR(128){collation} NOT NULL");
        manager.get_connection().execute_unprepared(&sql).await?;
    }
    Ok(())
}

/// The first of `names` the server knows.
async fn first_collation(manager: &SchemaManager<'_>, names: &[&'static str]) -> Result<&'static str, DbErr> {
    for name in names {
        let found = manager
            .get_connection()
            .query_one_raw(Statement::from_sql_and_values(
                DbBackend::MySql,
                "SELECT 1 FROM information_schema.COLLATIONS WHERE COLLATION_NAME = ?",
                [(*name).into()],
            ))
            .await?;
        if found.is_some() {
            return Ok(name);
        }
    }
    Err(DbErr::Migration(format!("the server has none of the collations {names:?}")))
}
