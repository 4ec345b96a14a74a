//! The soak's private database server, and what it says about the outbox and the dedup
//! history: what cleanup has not removed yet, table and index sizes, and its CPU.

use idempost_testkit::private_db::{Engine, PrivateServer};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement};

use crate::error::BenchError;

/// The kind of server `url` names.
pub(super) fn engine(url: &str) -> Result<Engine, BenchError> {
    match url.split_once("://").map(|(scheme, _)| scheme) {
        Some("postgres" | "postgresql") => Ok(Engine::Postgres),
        Some("mysql" | "mariadb") => Ok(Engine::MariaDb),
        _ => Err(BenchError::Settings(format!("the soak needs a mysql:// or postgres:// URL, not `{url}`"))),
    }
}

pub(super) fn engine_name(engine: Engine) -> &'static str {
    match engine {
        Engine::Postgres => "PostgreSQL",
        Engine::MariaDb => "MariaDB",
    }
}

/// A URL of the server the bench database is created from.
pub(super) fn admin_url(server: &PrivateServer, engine: Engine) -> String {
    server.url(if engine == Engine::Postgres { "postgres" } else { "mysql" })
}

/// What cleanup has not removed yet. PostgreSQL: dead rows of the outbox and of the dedup table
/// (`pg_stat_user_tables.n_dead_tup`) and the autovacuum runs of the outbox so far; MariaDB:
/// InnoDB's history list length (server-wide; the soak's server serves nothing else).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cleanup {
    pub(crate) outbox_dead: i64,
    pub(crate) dedup_dead: i64,
    pub(crate) outbox_autovacuums: i64,
    pub(crate) history_length: i64,
}

impl Cleanup {
    pub(super) async fn read(db: &DatabaseConnection) -> Result<Self, DbErr> {
        if db.get_database_backend() == DbBackend::Postgres {
            let row = one_row(
                db,
                "SELECT COALESCE(SUM(n_dead_tup) FILTER (WHERE relname = 'outbox_event'), 0)::bigint, \
                 COALESCE(SUM(n_dead_tup) FILTER (WHERE relname = 'consumed_event'), 0)::bigint, \
                 COALESCE(SUM(autovacuum_count) FILTER (WHERE relname = 'outbox_event'), 0)::bigint \
                 FROM pg_stat_user_tables WHERE schemaname = current_schema()",
            )
            .await?;
            return Ok(Self {
                outbox_dead: row[0],
                dedup_dead: row[1],
                outbox_autovacuums: row[2],
                history_length: 0,
            });
        }
        let history = idempost::db::cleanup::unremoved_versions(db).await?;
        Ok(Self { history_length: i64::try_from(history).unwrap_or(i64::MAX), ..Self::default() })
    }
}

/// Table (heap) and index bytes of the outbox and of the dedup table. On MariaDB these are
/// InnoDB's estimates (`information_schema.TABLES`), updated with its persistent statistics.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sizes {
    pub(crate) outbox_table: i64,
    pub(crate) outbox_indexes: i64,
    pub(crate) dedup_table: i64,
    pub(crate) dedup_indexes: i64,
}

impl Sizes {
    pub(super) async fn read(db: &DatabaseConnection) -> Result<Self, DbErr> {
        let sql = if db.get_database_backend() == DbBackend::Postgres {
            "SELECT pg_table_size('outbox_event'), pg_indexes_size('outbox_event'), \
             pg_table_size('consumed_event'), pg_indexes_size('consumed_event')"
        } else {
            "SELECT CAST(SUM(IF(TABLE_NAME = 'outbox_event', DATA_LENGTH, 0)) AS SIGNED), \
             CAST(SUM(IF(TABLE_NAME = 'outbox_event', INDEX_LENGTH, 0)) AS SIGNED), \
             CAST(SUM(IF(TABLE_NAME = 'consumed_event', DATA_LENGTH, 0)) AS SIGNED), \
             CAST(SUM(IF(TABLE_NAME = 'consumed_event', INDEX_LENGTH, 0)) AS SIGNED) \
             FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()"
        };
        let row = one_row(db, sql).await?;
        Ok(Self { outbox_table: row[0], outbox_indexes: row[1], dedup_table: row[2], dedup_indexes: row[3] })
    }
}

/// The first row of `sql`, its first four columns as integers (0 where one is not).
async fn one_row(db: &DatabaseConnection, sql: &str) -> Result<[i64; 4], DbErr> {
    let row = db.query_one_raw(Statement::from_string(db.get_database_backend(), sql)).await?;
    let mut out = [0; 4];
    if let Some(row) = row {
        for (i, value) in out.iter_mut().enumerate() {
            *value = row.try_get_by_index::<i64>(i).unwrap_or(0);
        }
    }
    Ok(out)
}

/// The server's settings that decide its cleanup, as `(name, value)` lines for the report.
pub(super) async fn settings(db: &DatabaseConnection) -> Vec<(String, String)> {
    let sql = if db.get_database_backend() == DbBackend::Postgres {
        "SELECT name, setting FROM pg_settings WHERE name IN ('autovacuum', 'autovacuum_naptime', \
         'autovacuum_vacuum_scale_factor', 'autovacuum_vacuum_threshold', 'autovacuum_vacuum_cost_limit', \
         'autovacuum_vacuum_cost_delay', 'fsync', 'synchronous_commit', 'shared_buffers', 'max_wal_size', \
         'default_transaction_isolation', 'server_version') ORDER BY name"
    } else {
        "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.GLOBAL_VARIABLES WHERE VARIABLE_NAME IN \
         ('INNODB_PURGE_THREADS', 'INNODB_PURGE_BATCH_SIZE', 'INNODB_MAX_PURGE_LAG', 'INNODB_BUFFER_POOL_SIZE', \
         'INNODB_LOG_FILE_SIZE', 'INNODB_FLUSH_LOG_AT_TRX_COMMIT', 'TRANSACTION_ISOLATION', 'VERSION', \
         'LOG_BIN') ORDER BY VARIABLE_NAME"
    };
    let Ok(rows) = db.query_all_raw(Statement::from_string(db.get_database_backend(), sql)).await else {
        return Vec::new();
    };
    rows.iter()
        .filter_map(|row| {
            Some((row.try_get_by_index::<String>(0).ok()?.to_lowercase(), row.try_get_by_index(1).ok()?))
        })
        .collect()
}

/// CPU seconds of `pid` and of its children, living (backends, autovacuum workers) and reaped
/// (counted in its own `cutime`/`cstime`): PostgreSQL's postmaster and every process it started,
/// or `mariadbd`.
pub(super) fn cpu_seconds(pid: u32) -> f64 {
    let mut ticks = stat_ticks(pid, true).map_or(0, |(_, t)| t);
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some((parent, t)) = stat_ticks(child, false)
                && parent == pid
            {
                ticks += t;
            }
        }
    }
    ticks as f64 / 100.0
}

/// The parent and the user+system ticks of `pid` (with its reaped children's when `reaped`).
fn stat_ticks(pid: u32, reaped: bool) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    let parent = u32::try_from(field(1)?).ok()?;
    // After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    let mut ticks = field(11)? + field(12)?;
    if reaped {
        ticks += field(13)? + field(14)?;
    }
    Some((parent, ticks))
}

/// The whole machine's busy and total CPU ticks so far (`/proc/stat`), every core summed.
pub(super) fn machine_ticks() -> (u64, u64) {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else { return (0, 0) };
    let Some(line) = stat.lines().next() else { return (0, 0) };
    let values: Vec<u64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    let total: u64 = values.iter().take(8).sum();
    // idle and iowait are the 4th and 5th.
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}
