//! What keeps the database from cleaning up after the outbox: every outbox row is inserted,
//! updated twice and deleted, and each of those leaves an old row version that PostgreSQL's
//! VACUUM or InnoDB's purge removes only once no open transaction may still read it. One long
//! transaction (a report, a `pg_dump`, a session left open) holds all of it back, and the
//! relay's claims walk the growing heap of dead versions: the bench's soak measured publish
//! p99 rising for as long as a snapshot was held (docs/benchmarks). The relay samples these on
//! an interval of their own and exports them as gauges, so an alert can name the cause.
//!
//! Both read the server's statistics views: on PostgreSQL the role sees other roles' sessions
//! only with `pg_read_all_stats` (else their transactions do not count), on MariaDB/MySQL
//! `information_schema.INNODB_TRX` and `INNODB_METRICS` need the `PROCESS` privilege (else the
//! query fails and the gauges keep their last value).

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};

/// The age of the oldest transaction that holds back cleanup: on PostgreSQL the oldest client
/// session of this database with a snapshot or a transaction id (`pg_stat_activity`:
/// `backend_xmin` or `backend_xid`), counted from its `xact_start`; on MariaDB/MySQL the oldest
/// InnoDB transaction on the server (purge is server-wide), from its `trx_started`. Zero when
/// there is none, and always on SQLite, whose writers wait for each other instead.
pub async fn oldest_transaction_age(db: &impl ConnectionTrait) -> Result<Duration, DbErr> {
    let sql = match db.get_database_backend() {
        DbBackend::Postgres => {
            "SELECT COALESCE((EXTRACT(EPOCH FROM clock_timestamp() - MIN(xact_start)) * 1000000)::bigint, 0) \
             FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend' \
             AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND pid <> pg_backend_pid()"
        }
        DbBackend::MySql => {
            "SELECT CAST(COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(trx_started), NOW()), 0) AS SIGNED) \
             FROM information_schema.INNODB_TRX"
        }
        _ => return Ok(Duration::ZERO),
    };
    let micros = one_number(db, sql).await?;
    Ok(Duration::from_micros(u64::try_from(micros).unwrap_or(0)))
}

/// Old row versions cleanup has not removed yet: on PostgreSQL the outbox table's dead rows
/// (`pg_stat_user_tables.n_dead_tup`, the statistics collector's estimate), on MariaDB/MySQL
/// InnoDB's history list length (undo logs purge has not processed, server-wide:
/// `INNODB_METRICS` `trx_rseg_history_len`). Zero on SQLite.
pub async fn unremoved_versions(db: &impl ConnectionTrait) -> Result<u64, DbErr> {
    let sql = match db.get_database_backend() {
        DbBackend::Postgres => {
            "SELECT COALESCE(SUM(n_dead_tup), 0)::bigint FROM pg_stat_user_tables \
             WHERE relname = 'outbox_event' AND schemaname = current_schema()"
        }
        DbBackend::MySql => {
            "SELECT CAST(COALESCE(SUM(`COUNT`), 0) AS SIGNED) FROM information_schema.INNODB_METRICS \
             WHERE NAME = 'trx_rseg_history_len'"
        }
        _ => return Ok(0),
    };
    Ok(u64::try_from(one_number(db, sql).await?).unwrap_or(0))
}

async fn one_number(db: &impl ConnectionTrait, sql: &str) -> Result<i64, DbErr> {
    let row = db.query_one_raw(Statement::from_string(db.get_database_backend(), sql)).await?;
    Ok(row.and_then(|r| r.try_get_by_index::<i64>(0).ok()).unwrap_or(0))
}
