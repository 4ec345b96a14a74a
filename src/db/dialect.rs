//! The few places where SQL differs per backend beyond what SeaORM's builder hides.

use chrono::{DateTime, NaiveDateTime, SubsecRound, Utc};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};

/// The database server's current time, to the microsecond.
///
/// Leases and retry times come from here, never from the local clock, so that relays on hosts
/// with skewed clocks agree on when a lease has expired. Every timestamp Outpost writes is bound
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

/// The OpenTelemetry `db.system.name` of the backend.
pub fn system_name(conn: &impl ConnectionTrait) -> &'static str {
    match conn.get_database_backend() {
        DbBackend::MySql => "mysql",
        DbBackend::Postgres => "postgresql",
        _ => "sqlite",
    }
}
