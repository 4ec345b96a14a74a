//! The few places where SQL differs per backend beyond what SeaORM's builder hides.

use chrono::{DateTime, NaiveDateTime, SubsecRound, Utc};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, IsolationLevel, Statement};

/// The database server's current time, to the microsecond.
///
/// Leases and retry times come from here, never from the local clock, so that relays on hosts
/// with skewed clocks agree on when a lease has expired. Every timestamp Idempost writes is bound
/// as a parameter (never a SQL clock function), so one column always holds one text format on
/// SQLite and compares correctly.
pub async fn now(conn: &impl ConnectionTrait) -> Result<DateTime<Utc>, DbErr> {
    let backend = conn.get_database_backend();
    let sql = match backend {
        DbBackend::MySql => "SELECT UTC_TIMESTAMP(6)",
        DbBackend::Postgres => "SELECT clock_timestamp()",
        // SQLite's clock has millisecond resolution.
        _ => "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')",
    };
    let row = conn
        .query_one_raw(Statement::from_string(backend, sql))
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("the database clock".into()))?;
    let now = match backend {
        DbBackend::MySql => row.try_get_by_index::<NaiveDateTime>(0)?.and_utc(),
        DbBackend::Postgres => row.try_get_by_index::<DateTime<Utc>>(0)?,
        _ => {
            let text: String = row.try_get_by_index(0)?;
            NaiveDateTime::parse_from_str(&text, "%Y-%m-%d %H:%M:%S%.f")
                .map_err(|e| DbErr::Type(format!("SQLite clock `{text}`: {e}")))?
                .and_utc()
        }
    };
    Ok(now.trunc_subsecs(6))
}

/// Whether the backend can lock rows with `FOR UPDATE SKIP LOCKED`, letting concurrent workers
/// take disjoint batches without waiting. SQLite cannot, but it has only one writer at a time, so
/// a single `UPDATE … RETURNING` claims atomically there.
pub fn has_skip_locked(conn: &impl ConnectionTrait) -> bool {
    conn.get_database_backend() != DbBackend::Sqlite
}

/// The isolation level of the relay's short locking transactions (claims, marks, releases).
///
/// READ COMMITTED on MariaDB/MySQL: there a locking read takes no gap or next-key locks and
/// unlocks at once the rows it read but did not keep, so a claim holds exactly the rows it
/// leases. Under the default REPEATABLE READ the claim's range locks blocked the order
/// service's inserts and crossed other relays' claims and marks: deadlocks. PostgreSQL has no
/// gap locks (its default stays), and SQLite has one writer at a time.
pub fn relay_isolation(conn: &impl ConnectionTrait) -> Option<IsolationLevel> {
    (conn.get_database_backend() == DbBackend::MySql).then_some(IsolationLevel::ReadCommitted)
}

/// The OpenTelemetry `db.system.name` of the backend.
pub fn system_name(conn: &impl ConnectionTrait) -> &'static str {
    match conn.get_database_backend() {
        DbBackend::MySql => "mysql",
        DbBackend::Postgres => "postgresql",
        _ => "sqlite",
    }
}
