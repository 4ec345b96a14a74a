//! Plain SQL for the bench: its own database, placeholders per backend, and the server's view of
//! lock waits and busy connections. No Idempost code runs here, apart from the relay's session
//! setup (see [`connect_as_relay`]).

use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, DbErr, Statement, Value,
};

use crate::error::BenchError;

/// Opens a pool of at most `max` connections to `url`.
pub(crate) async fn connect(url: &str, max: u32) -> Result<DatabaseConnection, DbErr> {
    Database::connect(options(url, max)).await
}

/// A pool whose sessions are set up exactly as the relay's (`idempost::db::Pool::Relay`: on
/// PostgreSQL every run planned afresh and no bitmap scans, on MariaDB/MySQL READ COMMITTED), so
/// the plain-SQL claim and mark compare like for like. Only the session setup is Idempost's; the
/// statements run on it are the bench's own.
pub(crate) async fn connect_as_relay(url: &str, max: u32) -> Result<DatabaseConnection, DbErr> {
    idempost::db::connect_for(url, max, idempost::db::Pool::Relay).await
}

fn options(url: &str, max: u32) -> ConnectOptions {
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(max)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(30))
        .sqlx_logging(false);
    options
}

/// `url` with its database name replaced by `name` (the query string is kept).
pub(crate) fn with_database(url: &str, name: &str) -> Result<String, BenchError> {
    let bad = || BenchError::Settings(format!("`{url}` is not a mysql:// or postgres:// URL"));
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    if !matches!(scheme, "mysql" | "mariadb" | "postgres" | "postgresql") {
        return Err(BenchError::Settings(format!(
            "`{scheme}://`: the bench needs a database server (mysql:// or postgres://)"
        )));
    }
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, format!("?{query}")),
        None => (rest, String::new()),
    };
    let authority = rest.split('/').next().ok_or_else(bad)?;
    Ok(format!("{scheme}://{authority}/{name}{query}"))
}

/// The bench's own database on the server of `server_url`: created empty, migrated with
/// Idempost's migrations, dropped by [`BenchDatabase::drop`].
#[derive(Debug)]
pub(crate) struct BenchDatabase {
    admin: DatabaseConnection,
    /// The database's name.
    pub(crate) name: String,
    /// Its URL, for the services.
    pub(crate) url: String,
}

impl BenchDatabase {
    /// Creates and migrates `idempost_bench_<uuid>`.
    pub(crate) async fn create(server_url: &str) -> Result<Self, BenchError> {
        let admin_url = match server_url.split_once("://") {
            Some((scheme, _)) if scheme.starts_with("postgres") => with_database(server_url, "postgres")?,
            _ => server_url.to_owned(),
        };
        let admin = connect(&admin_url, 2).await?;
        let name = format!("idempost_bench_{}", uuid::Uuid::new_v4().simple());
        admin.execute_unprepared(&format!("CREATE DATABASE {name}")).await?;
        let url = with_database(server_url, &name)?;
        let db = connect(&url, 2).await?;
        use idempost_migration::MigratorTrait as _;
        idempost_migration::Migrator::up(&db, None).await?;
        db.close().await?;
        Ok(Self { admin, name, url })
    }

    /// Drops the database.
    pub(crate) async fn remove(self) -> Result<(), DbErr> {
        let sql = match self.admin.get_database_backend() {
            DbBackend::Postgres => format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            _ => format!("DROP DATABASE IF EXISTS {}", self.name),
        };
        self.admin.execute_unprepared(&sql).await?;
        self.admin.close().await
    }
}

/// A statement with `?` placeholders, renumbered to `$n` for PostgreSQL.
pub(crate) fn statement(backend: DbBackend, sql: &str, values: Vec<Value>) -> Statement {
    idempost_testkit::sql::statement(backend, sql, values)
}

/// One number from a query such as `SELECT COUNT(*) …`.
pub(crate) async fn count(db: &impl ConnectionTrait, sql: &str) -> Result<i64, DbErr> {
    let backend = db.get_database_backend();
    let row = db.query_one_raw(Statement::from_string(backend, sql)).await?;
    Ok(row.and_then(|r| r.try_get_by_index::<i64>(0).ok()).unwrap_or_default())
}

/// A timestamp column (`DATETIME(6)` on MariaDB/MySQL, `timestamptz` on PostgreSQL).
pub(crate) fn time_at(row: &sea_orm::QueryResult, index: usize) -> Result<DateTime<Utc>, DbErr> {
    Ok(match row.try_get_by_index::<DateTime<Utc>>(index) {
        Ok(at) => at,
        Err(_) => row.try_get_by_index::<NaiveDateTime>(index)?.and_utc(),
    })
}

/// Holds back every waiting outbox row, so no relay claims any until
/// [`release_first_versions`].
pub(crate) async fn hold_back_all(db: &DatabaseConnection) -> Result<(), DbErr> {
    db.execute_unprepared("UPDATE outbox_event SET held_back = TRUE WHERE status = 'PENDING'").await?;
    Ok(())
}

/// Releases every order's first version in one statement (one commit): what a relay may claim
/// appears at once. Later versions stay held back until their previous version is marked.
pub(crate) async fn release_first_versions(db: &DatabaseConnection) -> Result<(), DbErr> {
    db.execute_unprepared("UPDATE outbox_event SET held_back = FALSE WHERE held_back AND event_version = 1")
        .await?;
    Ok(())
}

/// Empties every Idempost table, so each phase starts from the same state.
pub(crate) async fn truncate_all(db: &DatabaseConnection) -> Result<(), DbErr> {
    let tables = [
        "order_line",
        "order_version",
        "orders",
        "outbox_event",
        "consumed_event",
        "notification_job",
        "dead_letter",
        "order_view",
        "parked_event",
    ];
    match db.get_database_backend() {
        DbBackend::Postgres => {
            db.execute_unprepared(&format!("TRUNCATE {}", tables.join(", "))).await?;
        }
        _ => {
            // order_line's and order_version's foreign keys forbid TRUNCATE of orders; DELETE
            // them first, then TRUNCATE (fast, and it leaves no purge work behind) the rest.
            db.execute_unprepared("DELETE FROM order_line").await?;
            db.execute_unprepared("DELETE FROM order_version").await?;
            db.execute_unprepared("DELETE FROM orders").await?;
            for table in &tables[3..] {
                db.execute_unprepared(&format!("TRUNCATE TABLE {table}")).await?;
            }
        }
    }
    Ok(())
}

/// The server's lock-wait counters (MariaDB/MySQL `Innodb_row_lock_waits` and `_time` in ms;
/// PostgreSQL: deadlocks only, lock waits are sampled instead).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LockCounters {
    pub(crate) waits: i64,
    pub(crate) wait_ms: i64,
}

impl LockCounters {
    pub(crate) async fn read(db: &DatabaseConnection, name: &str) -> Result<Self, DbErr> {
        let backend = db.get_database_backend();
        if backend == DbBackend::Postgres {
            let sql = statement(
                backend,
                "SELECT deadlocks FROM pg_stat_database WHERE datname = ?",
                vec![name.into()],
            );
            let row = db.query_one_raw(sql).await?;
            return Ok(Self { waits: row.and_then(|r| r.try_get_by_index(0).ok()).unwrap_or(0), wait_ms: 0 });
        }
        let rows = db
            .query_all_raw(Statement::from_string(backend, "SHOW GLOBAL STATUS LIKE 'Innodb_row_lock_%'"))
            .await?;
        let mut counters = Self::default();
        for row in rows {
            let key: String = row.try_get_by_index(0)?;
            let value: String = row.try_get_by_index(1)?;
            let value = value.parse().unwrap_or(0);
            match key.as_str() {
                "Innodb_row_lock_waits" => counters.waits = value,
                "Innodb_row_lock_time" => counters.wait_ms = value,
                _ => {}
            }
        }
        Ok(counters)
    }

    pub(crate) fn since(self, before: Self) -> Self {
        Self { waits: self.waits - before.waits, wait_ms: self.wait_ms - before.wait_ms }
    }
}

/// Connections to the bench database right now: all of them, those running a statement, and
/// those waiting for a lock (PostgreSQL only).
pub(crate) async fn connections(db: &DatabaseConnection, name: &str) -> Result<(i64, i64, i64), DbErr> {
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => {
            "SELECT COUNT(*)::bigint, (COUNT(*) FILTER (WHERE state = 'active'))::bigint, \
             (COUNT(*) FILTER (WHERE wait_event_type = 'Lock'))::bigint \
             FROM pg_stat_activity WHERE datname = ? AND pid <> pg_backend_pid()"
        }
        _ => {
            "SELECT COUNT(*), CAST(COALESCE(SUM(COMMAND <> 'Sleep'), 0) AS SIGNED), \
             CAST(COALESCE(SUM(STATE LIKE '%lock%'), 0) AS SIGNED) \
             FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()"
        }
    };
    let row = db.query_one_raw(statement(backend, sql, vec![name.into()])).await?;
    Ok(row
        .map(|r| {
            (
                r.try_get_by_index(0).unwrap_or(0),
                r.try_get_by_index(1).unwrap_or(0),
                r.try_get_by_index(2).unwrap_or(0),
            )
        })
        .unwrap_or_default())
}

/// The server's settings that decide how much it writes between checkpoints and caches, as a
/// line for the report (a redo log at its limit showed in the end-to-end tail; see
/// docs/operations.md). Empty where the server has none or does not answer.
pub(crate) async fn log_settings(db: &DatabaseConnection) -> String {
    per_backend(
        db,
        "SELECT CAST(CONCAT('innodb_log_file_size ', @@innodb_log_file_size DIV 1048576, ' MiB, \
         innodb_buffer_pool_size ', @@innodb_buffer_pool_size DIV 1048576, ' MiB') AS CHAR)",
        "SELECT 'max_wal_size ' || current_setting('max_wal_size') || ', shared_buffers ' \
         || current_setting('shared_buffers')",
    )
    .await
}

/// The server's settings that clear what the outbox's updates leave behind, as a line for the
/// report: until that happens the relay's claims walk the dead index entries of every event
/// claimed and marked before (PostgreSQL with `autovacuum = off` clears them only on a manual
/// `VACUUM`; see docs/operations.md). Empty where the server has none or does not answer.
pub(crate) async fn cleanup_settings(db: &DatabaseConnection) -> String {
    per_backend(
        db,
        "SELECT CAST(CONCAT('innodb_purge_threads ', @@innodb_purge_threads) AS CHAR)",
        "SELECT 'autovacuum ' || current_setting('autovacuum') || ', autovacuum_naptime ' \
         || current_setting('autovacuum_naptime')",
    )
    .await
}

/// [`one_text`] of `mysql` or `postgres`, whichever is `db`'s; empty on any other backend.
async fn per_backend(db: &DatabaseConnection, mysql: &str, postgres: &str) -> String {
    match db.get_database_backend() {
        DbBackend::MySql => one_text(db, mysql).await,
        DbBackend::Postgres => one_text(db, postgres).await,
        _ => String::new(),
    }
}

/// The server's version string.
pub(crate) async fn version(db: &DatabaseConnection) -> String {
    one_text(db, "SELECT VERSION()").await
}

/// The first column of the first row `sql` returns, as text; empty if there is none or the
/// query fails (the machine block describes, it never stops a run).
async fn one_text(db: &DatabaseConnection, sql: &str) -> String {
    db.query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .ok()
        .flatten()
        .and_then(|r| r.try_get_by_index::<String>(0).ok())
        .unwrap_or_default()
}
