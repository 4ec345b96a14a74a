//! The few places where SQL differs per backend beyond what SeaORM's builder hides.

use chrono::{DateTime, NaiveDateTime, SubsecRound, Utc};
use sea_orm::sea_query::ArrayType;
use sea_orm::{ConnectionTrait, DbBackend, DbErr, IsolationLevel, Statement, Value};

mod joined_update;

pub use joined_update::{JoinedUpdate, ValueColumn};

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

/// SQL for the database server's clock as of the statement's start, so that a statement stamps
/// its rows without a round trip of its own to [`now`]; the column then holds what a value bound
/// from [`now`] would (a `timestamptz` on PostgreSQL, a UTC `DATETIME(6)` on MariaDB/MySQL).
/// `None` on SQLite, where every timestamp is bound, as text of one format.
pub fn statement_time(conn: &impl ConnectionTrait) -> Option<&'static str> {
    match conn.get_database_backend() {
        DbBackend::Postgres => Some("statement_timestamp()"),
        DbBackend::MySql => Some("UTC_TIMESTAMP(6)"),
        _ => None,
    }
}

/// Whether an `UPDATE` can return the rows it changed (`RETURNING`). MariaDB/MySQL cannot: it
/// only counts them.
pub fn has_update_returning(conn: &impl ConnectionTrait) -> bool {
    conn.get_database_backend() != DbBackend::MySql
}

/// `{head} IN (…ids){tail}`, with one parameter per event id, or on PostgreSQL `{head} =
/// ANY($1::char(36)[]){tail}`: one array, so one statement text however many ids.
pub fn by_event_ids(backend: DbBackend, head: &str, tail: &str, ids: &[&str]) -> Statement {
    if backend == DbBackend::Postgres {
        let ids = ids.iter().map(|id| Value::from(*id)).collect();
        return Statement::from_sql_and_values(
            backend,
            format!("{head} = ANY($1::char(36)[]){tail}"),
            [Value::Array(ArrayType::String, Some(Box::new(ids)))],
        );
    }
    let keys = vec!["?"; ids.len()].join(", ");
    Statement::from_sql_and_values(
        backend,
        format!("{head} IN ({keys}){tail}"),
        ids.iter().map(|id| Value::from(*id)),
    )
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
