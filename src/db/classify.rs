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

use crate::backoff::Backoff;

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
}

impl UniqueKey {
    const ALL: [Self; 4] = [
        Self::OrdersTenantRequest,
        Self::OrdersAcceptanceEvent,
        Self::ConsumedEventIdentity,
        Self::DeadLetterCoordinates,
    ];

    /// The constraint's name in the schema.
    pub const fn name(self) -> &'static str {
        match self {
            Self::OrdersTenantRequest => "uq_orders_tenant_request",
            Self::OrdersAcceptanceEvent => "uq_orders_acceptance_event",
            Self::ConsumedEventIdentity => "uq_consumed_event_identity",
            Self::DeadLetterCoordinates => "uq_dead_letter_coordinates",
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
        // ER_DUP_ENTRY and ER_DUP_ENTRY_WITH_KEY_NAME: "Duplicate entry '…' for key '<name>'".
        // MySQL 8 writes the key as '<table>.<name>'. The entry itself is caller data and may
        // contain anything, so only the last quoted name is read.
        if !matches!(e.number(), 1062 | 1586) {
            return None;
        }
        let key = e.message().rsplit_once("for key '")?.1.strip_suffix('\'')?;
        let key = key.rsplit_once('.').map_or(key, |(_, name)| name);
        return UniqueKey::ALL.into_iter().find(|k| k.name() == key);
    }
    if let Some(e) = db_err.try_downcast_ref::<PgDatabaseError>() {
        if e.code() != "23505" {
            return None;
        }
        let constraint = e.constraint()?;
        return UniqueKey::ALL.into_iter().find(|k| k.name() == constraint);
    }
    if let Some(e) = db_err.try_downcast_ref::<SqliteError>() {
        // SQLITE_CONSTRAINT_UNIQUE (2067): "UNIQUE constraint failed: <table>.<col>, …".
        if e.code().as_deref() != Some("2067") {
            return None;
        }
        let columns = e.message().strip_prefix("UNIQUE constraint failed: ")?;
        return UniqueKey::ALL.into_iter().find(|k| k.sqlite_columns() == columns);
    }
    None
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
        return match e.number() {
            1213 => Some(LockConflict::Deadlock),
            1205 => Some(LockConflict::LockWaitTimeout),
            _ => None,
        };
    }
    if let Some(e) = db_err.try_downcast_ref::<PgDatabaseError>() {
        return match e.code() {
            "40P01" | "40001" => Some(LockConflict::Deadlock),
            "55P03" => Some(LockConflict::LockWaitTimeout),
            _ => None,
        };
    }
    if let Some(e) = db_err.try_downcast_ref::<SqliteError>() {
        // SQLITE_BUSY (5) and its extended codes (SQLITE_BUSY_RECOVERY 261, _SNAPSHOT 517,
        // _TIMEOUT 773): another connection held the write lock past the busy timeout.
        return match e.code().as_deref() {
            Some("5" | "261" | "517" | "773") => Some(LockConflict::LockWaitTimeout),
            _ => None,
        };
    }
    None
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
