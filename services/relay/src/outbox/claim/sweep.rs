//! The sweep: what the claims' starts left behind.

use chrono::{DateTime, NaiveDateTime, Utc};
use sea_orm::{ConnectionTrait as _, DbBackend, DbErr, Statement, Value};

use super::{READY_INDEX, first_unpublished, micros};
use crate::outbox::position::ExpiredFrom;
use crate::outbox::table::Outbox;
use idempost::db;
use idempost::domain::OutboxStatus;

/// What one sweep found behind the claims' starts, and lowered them to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// A due event (not held back, its retry time come, its order's next) older than where the
    /// due read starts.
    pub due: bool,
    /// A lease that expired before where the expired read starts.
    pub expired: bool,
}

impl Outbox {
    /// Looks over the whole due and expired ranges, with plain reads (no locks), for the oldest
    /// claimable row behind where this process's claims start reading, and lowers the start to
    /// it, so that the next claim takes it: a retry whose backoff ended after the claims moved
    /// on, a row whose transaction committed later than the lookback, a held-back version
    /// released late, a redrive, a lease that expired while no claim looked. Each read walks its
    /// range from the head, dead entries and all, up to the start at most: the cost the claims
    /// no longer pay, once per sweep and off their path. On SQLite, whose claims read from the
    /// head, it finds nothing.
    pub async fn sweep_claims(&self) -> Result<Swept, DbErr> {
        let backend = self.db.get_database_backend();
        if backend != DbBackend::Postgres && !db::has_skip_locked(&self.db) {
            return Ok(Swept::default());
        }
        let starts = self.position.starts();
        let mut swept = Swept::default();
        if let Some(from) = starts.due_from
            && let Some(created_at) = self.oldest_due_before(backend, from).await?
        {
            swept.due = self.position.due_behind(created_at);
        }
        if let Some(lease_until) = self.oldest_expired_before(backend, starts.expired_from).await? {
            swept.expired = self.position.expired_behind(lease_until);
        }
        Ok(swept)
    }

    /// The `created_at` of the oldest event a claim's due read would take, if it is older than
    /// `from`: the claim's conditions, read through the same index, in the same order.
    async fn oldest_due_before(
        &self,
        backend: DbBackend,
        from: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, DbErr> {
        // PostgreSQL: `statement_timestamp()`, stable within the statement, so that a comparison
        // with it bounds the index scan; against the volatile `clock_timestamp()` it was only a
        // filter, and the expired read walked every PUBLISHING entry instead of stopping.
        let (index, now, from) = match backend {
            DbBackend::MySql => {
                (format!(" FORCE INDEX ({READY_INDEX})"), "UTC_TIMESTAMP(6)", Value::from(from.naive_utc()))
            }
            _ => (String::new(), "statement_timestamp()", Value::from(from)),
        };
        let sql = format!(
            "SELECT o.created_at FROM outbox_event AS o{index} \
             WHERE o.status = '{pending}' AND o.held_back = FALSE AND o.created_at < {param} \
             AND (o.lease_until IS NULL OR o.lease_until <= {now}) AND {first} \
             ORDER BY o.created_at, o.event_id LIMIT 1",
            pending = OutboxStatus::Pending.as_str(),
            param = placeholder(backend),
            first = first_unpublished(backend, "o"),
        );
        self.first_time(Statement::from_sql_and_values(backend, sql, [from])).await
    }

    /// The `lease_until` of the longest expired lease, if it ended before where the expired read
    /// starts (`from`); from the head, nothing is before it.
    async fn oldest_expired_before(
        &self,
        backend: DbBackend,
        from: ExpiredFrom,
    ) -> Result<Option<DateTime<Utc>>, DbErr> {
        let mysql = backend == DbBackend::MySql;
        let (bound, value) = match from {
            ExpiredFrom::Head => return Ok(None),
            ExpiredFrom::Window if mysql => (
                "UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND".to_owned(),
                micros(self.position.window().lookback)?.into(),
            ),
            ExpiredFrom::Window => (
                "statement_timestamp() - $1 * interval '1 microsecond'".to_owned(),
                micros(self.position.window().lookback)?.into(),
            ),
            ExpiredFrom::From(lease_until) if mysql => ("?".to_owned(), lease_until.naive_utc().into()),
            ExpiredFrom::From(lease_until) => ("$1".to_owned(), lease_until.into()),
        };
        let index = if mysql { format!(" FORCE INDEX ({})", super::CLAIM_INDEX) } else { String::new() };
        let sql = format!(
            "SELECT lease_until FROM outbox_event{index} WHERE status = '{}' AND lease_until < {bound} \
             ORDER BY lease_until, created_at LIMIT 1",
            OutboxStatus::Publishing.as_str()
        );
        self.first_time(Statement::from_sql_and_values(backend, sql, [value])).await
    }

    /// The one timestamp `statement` answers, if any.
    async fn first_time(&self, statement: Statement) -> Result<Option<DateTime<Utc>>, DbErr> {
        let backend = statement.db_backend;
        let Some(row) = self.db.query_one_raw(statement).await? else {
            return Ok(None);
        };
        // MariaDB/MySQL's DATETIME has no zone; the outbox keeps UTC in it.
        let time = match backend {
            DbBackend::MySql => row.try_get_by_index::<NaiveDateTime>(0)?.and_utc(),
            _ => row.try_get_by_index::<DateTime<Utc>>(0)?,
        };
        Ok(Some(time))
    }
}

fn placeholder(backend: DbBackend) -> &'static str {
    if backend == DbBackend::MySql { "?" } else { "$1" }
}
