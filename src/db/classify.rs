//! Which named constraint a database error violated, told apart per backend.
//!
//! Duplicate handling hangs on this: only a violation of one exact, named unique key means
//! "already done". Every other error, including other unique keys, is a failure.

use std::fmt;
use std::time::Duration;

use sea_orm::sqlx::{
    self, error::DatabaseError, mysql::MySqlDatabaseError, postgres::PgDatabaseError, sqlite::SqliteError,
};
use sea_orm::{DbErr, RuntimeErr};

use idempost_client::Backoff;

/// A unique key whose violation carries meaning. Its name is part of the schema contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UniqueKey {
    /// `orders (tenant_id, request_id)`: the order was already accepted.
    OrdersTenantRequest,
    /// `orders (acceptance_event_id)`: the event id belongs to an order already.
    OrdersAcceptanceEvent,
    /// `consumed_event (consumer_name, event_id)`: the consumer already handled the event.
    ConsumedEventIdentity,
    /// `dead_letter (consumer_name, topic, partition_id, offset_id)`: the record is already
    /// in the dead-letter table.
    DeadLetterCoordinates,
    /// `order_version (tenant_id, request_id)`: some operation (submission, amendment,
    /// cancellation) already used the key.
    OrderVersionTenantRequest,
    /// `order_version (event_id)`: the event id belongs to an operation already.
    OrderVersionEvent,
}

impl UniqueKey {
    const ALL: [Self; 6] = [
        Self::OrdersTenantRequest,
        Self::OrdersAcceptanceEvent,
        Self::ConsumedEventIdentity,
        Self::DeadLetterCoordinates,
        Self::OrderVersionTenantRequest,
        Self::OrderVersionEvent,
    ];

    /// A key of the order tables: one a submission can clash with.
    pub const fn is_order_key(self) -> bool {
        matches!(
            self,
            Self::OrdersTenantRequest
                | Self::OrdersAcceptanceEvent
                | Self::OrderVersionTenantRequest
                | Self::OrderVersionEvent
        )
    }

    /// A key on an event id (rather than on a request's key).
    pub const fn is_event_key(self) -> bool {
        matches!(self, Self::OrdersAcceptanceEvent | Self::OrderVersionEvent)
    }

    /// The constraint's name in the schema.
    pub const fn name(self) -> &'static str {
        match self {
            Self::OrdersTenantRequest => "uq_orders_tenant_request",
            Self::OrdersAcceptanceEvent => "uq_orders_acceptance_event",
            Self::ConsumedEventIdentity => "uq_consumed_event_identity",
            Self::DeadLetterCoordinates => "uq_dead_letter_coordinates",
            Self::OrderVersionTenantRequest => "uq_order_version_tenant_request",
            Self::OrderVersionEvent => "uq_order_version_event",
        }
    }

    /// How SQLite names the key in its error message: it reports columns, not index names.
    const fn sqlite_columns(self) -> &'static str {
        match self {
            Self::OrdersTenantRequest => "orders.tenant_id, orders.request_id",
            Self::OrdersAcceptanceEvent => "orders.acceptance_event_id",
            Self::ConsumedEventIdentity => "consumed_event.consumer_name, consumed_event.event_id",
            Self::DeadLetterCoordinates => {
                "dead_letter.consumer_name, dead_letter.topic, dead_letter.partition_id, dead_letter.offset_id"
            }
            Self::OrderVersionTenantRequest => "order_version.tenant_id, order_version.request_id",
            Self::OrderVersionEvent => "order_version.event_id",
        }
    }
}

/// The unique key `err` violated, if it is one of the named keys.
///
/// `None` for everything else: another unique key, a foreign key, a value too long, a lost
/// connection, or an error this function does not recognise.
pub fn violated_unique_key(err: &DbErr) -> Option<UniqueKey> {
    let db_err = database_error(err)?;
    if let Some(e) = db_err.try_downcast_ref::<MySqlDatabaseError>() {
        return mysql_unique_key(e.number(), e.message());
    }
    if let Some(e) = db_err.try_downcast_ref::<PgDatabaseError>() {
        return postgres_unique_key(e.code(), e.constraint());
    }
    if let Some(e) = db_err.try_downcast_ref::<SqliteError>() {
        return sqlite_unique_key(e.code().as_deref(), e.message());
    }
    None
}

/// ER_DUP_ENTRY and ER_DUP_ENTRY_WITH_KEY_NAME: "Duplicate entry '…' for key '<name>'". MySQL 8
/// writes the key as '<table>.<name>'. The entry itself is caller data and may contain anything,
/// so only the last quoted name is read.
fn mysql_unique_key(number: u16, message: &str) -> Option<UniqueKey> {
    if !matches!(number, 1062 | 1586) {
        return None;
    }
    let key = message.rsplit_once("for key '")?.1.strip_suffix('\'')?;
    let key = key.rsplit_once('.').map_or(key, |(_, name)| name);
    UniqueKey::ALL.into_iter().find(|k| k.name() == key)
}

/// unique_violation (23505) of a named constraint.
fn postgres_unique_key(code: &str, constraint: Option<&str>) -> Option<UniqueKey> {
    if code != "23505" {
        return None;
    }
    let constraint = constraint?;
    UniqueKey::ALL.into_iter().find(|k| k.name() == constraint)
}

/// SQLITE_CONSTRAINT_UNIQUE (2067): "UNIQUE constraint failed: <table>.<col>, …".
fn sqlite_unique_key(code: Option<&str>, message: &str) -> Option<UniqueKey> {
    if code != Some("2067") {
        return None;
    }
    let columns = message.strip_prefix("UNIQUE constraint failed: ")?;
    UniqueKey::ALL.into_iter().find(|k| k.sqlite_columns() == columns)
}

/// A lock conflict the database ended by failing one transaction's statement.
///
/// The server rolled the victim back (a deadlock) or refused to wait longer (a lock-wait
/// timeout); once the caller's own rollback is confirmed, nothing of the transaction remains
/// and it may run again with the same ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockConflict {
    /// MySQL/MariaDB 1213, PostgreSQL 40P01 (and 40001, a serialization failure).
    Deadlock,
    /// MySQL/MariaDB 1205, PostgreSQL 55P03, SQLite `SQLITE_BUSY` after its busy timeout.
    LockWaitTimeout,
}

impl LockConflict {
    /// A short name for logs and metric attributes.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Deadlock => "deadlock",
            Self::LockWaitTimeout => "lock_wait_timeout",
        }
    }

    /// The wait before retry `retry` (1-based) of a lock-conflict victim: a random point in the
    /// upper half of 10 ms doubled per retry (at most 1.28 s), so victims of one conflict do not
    /// collide again in step.
    pub fn backoff(retry: u32) -> std::time::Duration {
        const LOCK_CONFLICT: Backoff =
            Backoff::new(Duration::from_millis(10), Duration::from_millis(1280)).jittered();
        LOCK_CONFLICT.delay(retry)
    }
}

/// The lock conflict `err` reports, if it is one.
pub fn lock_conflict(err: &DbErr) -> Option<LockConflict> {
    let db_err = database_error(err)?;
    if let Some(e) = db_err.try_downcast_ref::<MySqlDatabaseError>() {
        return mysql_lock_conflict(e.number());
    }
    if let Some(e) = db_err.try_downcast_ref::<PgDatabaseError>() {
        return postgres_lock_conflict(e.code());
    }
    if let Some(e) = db_err.try_downcast_ref::<SqliteError>() {
        return sqlite_lock_conflict(e.code().as_deref());
    }
    None
}

/// The conflict, when the server answered a COMMIT by refusing it as a deadlock: its exact
/// answer that the transaction was rolled back, so nothing of it remains and it may run again
/// with the same ids. On a Galera cluster this is how certification refuses a transaction whose
/// rows another node committed first (rows are locked only per node); PostgreSQL answers a
/// serialization failure at commit the same way. Every other error of a COMMIT, a lost
/// connection above all, leaves the outcome unknown.
pub fn commit_refused(err: &DbErr) -> Option<LockConflict> {
    lock_conflict(err).filter(|conflict| *conflict == LockConflict::Deadlock)
}

fn mysql_lock_conflict(number: u16) -> Option<LockConflict> {
    match number {
        1213 => Some(LockConflict::Deadlock),
        1205 => Some(LockConflict::LockWaitTimeout),
        _ => None,
    }
}

fn postgres_lock_conflict(code: &str) -> Option<LockConflict> {
    match code {
        "40P01" | "40001" => Some(LockConflict::Deadlock),
        "55P03" => Some(LockConflict::LockWaitTimeout),
        _ => None,
    }
}

/// SQLITE_BUSY (5) and its extended codes (SQLITE_BUSY_RECOVERY 261, _SNAPSHOT 517, _TIMEOUT
/// 773): another connection held the write lock past the busy timeout.
fn sqlite_lock_conflict(code: Option<&str>) -> Option<LockConflict> {
    match code {
        Some("5" | "261" | "517" | "773") => Some(LockConflict::LockWaitTimeout),
        _ => None,
    }
}

/// What a database said about an error, for logs: SQLSTATE, vendor code and constraint.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ErrorFacts {
    /// The SQLSTATE, where the backend reports one.
    pub sqlstate: Option<String>,
    /// The backend's own error number (MySQL error number, SQLite extended result code).
    pub vendor_code: Option<String>,
    /// The violated constraint, where the backend names it.
    pub constraint: Option<String>,
}

impl ErrorFacts {
    /// Reads the facts out of `err`; all `None` when it did not come from the database server.
    pub fn of(err: &DbErr) -> Self {
        let Some(db_err) = database_error(err) else {
            return Self::default();
        };
        if let Some(e) = db_err.try_downcast_ref::<MySqlDatabaseError>() {
            let constraint = e
                .message()
                .rsplit_once("for key '")
                .and_then(|(_, k)| k.strip_suffix('\''))
                .map(str::to_owned);
            return Self {
                sqlstate: e.code().map(str::to_owned),
                vendor_code: Some(e.number().to_string()),
                constraint,
            };
        }
        if let Some(e) = db_err.try_downcast_ref::<SqliteError>() {
            return Self { sqlstate: None, vendor_code: e.code().map(|c| c.into_owned()), constraint: None };
        }
        Self {
            sqlstate: db_err.code().map(|c| c.into_owned()),
            vendor_code: None,
            constraint: db_err.constraint().map(str::to_owned),
        }
    }
}

impl fmt::Display for ErrorFacts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_owned());
        write!(
            f,
            "sqlstate={} vendor_code={} constraint={}",
            show(&self.sqlstate),
            show(&self.vendor_code),
            show(&self.constraint)
        )
    }
}

fn database_error(err: &DbErr) -> Option<&(dyn DatabaseError + 'static)> {
    let runtime = match err {
        DbErr::Exec(e) | DbErr::Query(e) | DbErr::Conn(e) => e,
        _ => return None,
    };
    match runtime {
        RuntimeErr::SqlxError(e) => match e.as_ref() {
            sqlx::Error::Database(db_err) => Some(db_err.as_ref()),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mysql_names_the_key_last_and_only_the_named_keys_count() {
        let duplicate = |key: &str| format!("Duplicate entry '7-req-1' for key '{key}'");
        for key in UniqueKey::ALL {
            assert_eq!(mysql_unique_key(1062, &duplicate(key.name())), Some(key));
            assert_eq!(mysql_unique_key(1586, &duplicate(key.name())), Some(key));
            // MySQL 8 prefixes the table.
            assert_eq!(mysql_unique_key(1062, &duplicate(&format!("orders.{}", key.name()))), Some(key));
        }
        assert_eq!(mysql_unique_key(1062, &duplicate("PRIMARY")), None);
        assert_eq!(mysql_unique_key(1062, &duplicate("uq_orders_tenant_request_extra")), None);
        // Another error number with a matching text is not a duplicate.
        assert_eq!(mysql_unique_key(1452, &duplicate(UniqueKey::OrdersTenantRequest.name())), None);
    }

    #[test]
    fn mysql_reads_the_key_after_an_entry_that_itself_mentions_a_key() {
        let message =
            "Duplicate entry 'for key 'uq_consumed_event_identity'' for key 'uq_orders_tenant_request'";
        assert_eq!(mysql_unique_key(1062, message), Some(UniqueKey::OrdersTenantRequest));
    }

    #[test]
    fn postgres_needs_unique_violation_and_a_named_constraint() {
        for key in UniqueKey::ALL {
            assert_eq!(postgres_unique_key("23505", Some(key.name())), Some(key));
            // A foreign-key or not-null violation on the same constraint name is not a duplicate.
            assert_eq!(postgres_unique_key("23503", Some(key.name())), None);
        }
        assert_eq!(postgres_unique_key("23505", Some("orders_pkey")), None);
        assert_eq!(postgres_unique_key("23505", None), None);
    }

    #[test]
    fn sqlite_is_told_by_its_columns() {
        let failed = |columns: &str| format!("UNIQUE constraint failed: {columns}");
        for key in UniqueKey::ALL {
            assert_eq!(sqlite_unique_key(Some("2067"), &failed(key.sqlite_columns())), Some(key));
            assert_eq!(sqlite_unique_key(Some("1555"), &failed(key.sqlite_columns())), None);
        }
        assert_eq!(sqlite_unique_key(Some("2067"), &failed("orders.tenant_id")), None);
        assert_eq!(sqlite_unique_key(None, &failed(UniqueKey::OrdersAcceptanceEvent.sqlite_columns())), None);
    }

    #[test]
    fn lock_conflicts_per_backend() {
        assert_eq!(mysql_lock_conflict(1213), Some(LockConflict::Deadlock));
        assert_eq!(mysql_lock_conflict(1205), Some(LockConflict::LockWaitTimeout));
        assert_eq!(mysql_lock_conflict(1062), None);
        assert_eq!(postgres_lock_conflict("40P01"), Some(LockConflict::Deadlock));
        assert_eq!(postgres_lock_conflict("40001"), Some(LockConflict::Deadlock));
        assert_eq!(postgres_lock_conflict("55P03"), Some(LockConflict::LockWaitTimeout));
        assert_eq!(postgres_lock_conflict("23505"), None);
        for code in ["5", "261", "517", "773"] {
            assert_eq!(sqlite_lock_conflict(Some(code)), Some(LockConflict::LockWaitTimeout), "{code}");
        }
        assert_eq!(sqlite_lock_conflict(Some("6")), None, "SQLITE_LOCKED is not a busy timeout");
        assert_eq!(sqlite_lock_conflict(None), None);
    }

    #[test]
    fn errors_that_did_not_come_from_the_server_are_neither() {
        let err = DbErr::Custom("the pool timed out".into());
        assert_eq!(violated_unique_key(&err), None);
        assert_eq!(lock_conflict(&err), None);
        assert_eq!(ErrorFacts::of(&err), ErrorFacts::default());
    }
}
