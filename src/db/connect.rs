use std::time::Duration;

use outpost_migration::{Migrator, MigratorTrait};
use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr};

/// How PostgreSQL plans the statements a pool runs again and again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plans {
    /// PostgreSQL's default: after five runs a prepared statement may keep one generic plan for
    /// the connection's whole life, however the tables change.
    Cached,
    /// Each run is planned for the tables as they are now (`plan_cache_mode=force_custom_plan`),
    /// at a fraction of a millisecond per statement. For the relay: a claim planned while the
    /// outbox was nearly empty kept a sequential scan of the whole table for every later claim
    /// (40 ms for a lone event over 124,000 rows, against 0.2 ms by primary key).
    Fresh,
}

/// Opens a pool of at most `max_connections` to `url` (`mysql://`, `postgres://`, `sqlite://`).
///
/// SQLite runs in WAL mode with `synchronous=FULL`, so a commit that returned is on disk, and
/// writers wait for each other for up to five seconds instead of failing at once.
pub async fn connect(url: &str, max_connections: u32) -> Result<DatabaseConnection, DbErr> {
    connect_planning(url, max_connections, Plans::Cached).await
}

/// [`connect`], with `plans` for PostgreSQL (the other databases ignore it).
pub async fn connect_planning(
    url: &str,
    max_connections: u32,
    plans: Plans,
) -> Result<DatabaseConnection, DbErr> {
    let mut options = ConnectOptions::new(url);
    if plans == Plans::Fresh {
        options.map_sqlx_postgres_opts(|o| o.options([("plan_cache_mode", "force_custom_plan")]));
    }
    options
        .max_connections(max_connections)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(5))
        .sqlx_logging(false)
        .map_sqlx_sqlite_opts(|o| {
            o.journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(Duration::from_secs(5))
                .foreign_keys(true)
        });
    Database::connect(options).await
}

/// The database is not ready for this version of Outpost.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// Migrations this binary knows have not been applied.
    #[error(
        "the database schema is not migrated ({} pending: {}); run `outpost-migrate up` first",
        pending.len(),
        pending.join(", ")
    )]
    NotMigrated {
        /// Names of the pending migrations, oldest first.
        pending: Vec<String>,
    },
    /// The migration table could not be read.
    #[error("could not read the migration state: {0}")]
    Unreadable(#[source] DbErr),
}

/// Fails unless every migration this binary knows has been applied. Writes nothing.
///
/// Migrating is a deploy step (`outpost-migrate up`), never a side effect of starting a service.
pub async fn ensure_migrated(db: &DatabaseConnection) -> Result<(), SchemaError> {
    let pending = Migrator::get_pending_migrations_read_only(db).await.map_err(SchemaError::Unreadable)?;
    if pending.is_empty() {
        Ok(())
    } else {
        Err(SchemaError::NotMigrated { pending: pending.iter().map(|m| m.name().to_owned()).collect() })
    }
}
