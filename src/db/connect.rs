use std::time::Duration;

use idempost_migration::{Migrator, MigratorTrait};
use sea_orm::sqlx::Executor as _;
use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr};

/// What a pool's sessions are set up for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// The databases' defaults.
    General,
    /// The relay's short claims and marks, run again and again against a table that grows and
    /// empties:
    /// - on PostgreSQL each run is planned for the tables as they are now
    ///   (`plan_cache_mode=force_custom_plan`), at a fraction of a millisecond per statement.
    ///   Left to itself, after five runs a prepared statement may keep one generic plan for the
    ///   connection's whole life: a claim planned while the outbox was nearly empty kept a
    ///   sequential scan of the whole table for every later claim, its cost growing with the
    ///   table instead of with the claim (figures in `docs/design/relay-lease.md`).
    /// - on PostgreSQL no bitmap scans (`enable_bitmapscan=off`): every relay statement takes few
    ///   rows by key or in an index's order. A bitmap scan of the expired leases
    ///   (`status = 'PUBLISHING' AND lease_until < now`) visits every dead entry that range holds
    ///   between vacuums (one per event ever claimed, its lease long past) and never marks them
    ///   dead, so each claim pays for all of them again. A plain index scan marks them dead on
    ///   its first pass and skips them afterwards.
    /// - on MariaDB/MySQL every session runs at READ COMMITTED (see [`super::relay_isolation`]),
    ///   set once when the connection opens, so no transaction pays a round trip to set it.
    Relay,
    /// The consumer's batches, which read and write the read model of a few dozen orders by key
    /// in tables that grow from empty while it runs: on PostgreSQL planned as they are now, with
    /// no bitmap scans, as for the relay. A generic plan of the batch's read of its orders'
    /// models, made while `order_view` was nearly empty, scanned every model of the consumer
    /// with the orders as a filter for the pool's life, so every batch cost more as the models
    /// grew (figures in `docs/design/consumer-dedup.md`). That read is also written so that
    /// missing statistics cannot mislead it (see the consumer's `inbox::model`). MariaDB/MySQL
    /// sessions keep the server's defaults.
    Consumer,
}

/// Opens a pool of at most `max_connections` to `url` (`mysql://`, `postgres://`, `sqlite://`).
///
/// SQLite runs in WAL mode with `synchronous=FULL`, so a commit that returned is on disk, and
/// writers wait for each other for up to five seconds instead of failing at once.
pub async fn connect(url: &str, max_connections: u32) -> Result<DatabaseConnection, DbErr> {
    connect_for(url, max_connections, Pool::General).await
}

/// [`connect`], with the sessions set up for `pool`. A MariaDB Galera node is checked first and
/// its sessions read causally (see [`super::galera`]).
pub async fn connect_for(url: &str, max_connections: u32, pool: Pool) -> Result<DatabaseConnection, DbErr> {
    // Boxed: the probe's future would otherwise nest in every service's start-up future, past
    // the compiler's depth limit for laying them out.
    let galera = Box::pin(super::galera::probe(url)).await?;
    Database::connect(options(url, max_connections, pool, galera)).await
}

/// How the pool for `pool` connects, its sessions set up for a Galera node when `galera`.
fn options(url: &str, max_connections: u32, pool: Pool, galera: bool) -> ConnectOptions {
    let mut options = ConnectOptions::new(url);
    if matches!(pool, Pool::Relay | Pool::Consumer) {
        options.map_sqlx_postgres_opts(|o| {
            o.options([("plan_cache_mode", "force_custom_plan"), ("enable_bitmapscan", "off")])
        });
    }
    let mut session: Vec<&'static str> = Vec::new();
    if pool == Pool::Relay {
        session.push("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED");
    }
    if galera {
        session.push(super::galera::SYNC_WAIT);
    }
    if !session.is_empty() {
        options.map_sqlx_mysql_pool_opts(move |o| {
            let session = session.clone();
            o.after_connect(move |conn, _| {
                let session = session.clone();
                Box::pin(async move {
                    for statement in session {
                        conn.execute(statement).await?;
                    }
                    Ok(())
                })
            })
        });
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
    options
}

/// The database is not ready for this version of Idempost.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// Migrations this binary knows have not been applied.
    #[error(
        "the database schema is not migrated ({} pending: {}); run `idempost-migrate up` first",
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
/// Migrating is a deploy step (`idempost-migrate up`), never a side effect of starting a service.
pub async fn ensure_migrated(db: &DatabaseConnection) -> Result<(), SchemaError> {
    let pending = Migrator::get_pending_migrations_read_only(db).await.map_err(SchemaError::Unreadable)?;
    if pending.is_empty() {
        Ok(())
    } else {
        Err(SchemaError::NotMigrated { pending: pending.iter().map(|m| m.name().to_owned()).collect() })
    }
}
