//! The relay's side of the outbox table: leased claims ([`claim`], one file per database), owner-fenced
//! marks ([`mark`]) and releases ([`release`]), the last two set-based ([`fenced_update`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{DatabaseConnection, DbErr, IsolationLevel};

use super::lease::LeaseToken;
use crate::backlog::{Backlog, Redrive, RedriveAudit};
use crate::db;

mod claim;
mod fenced_update;
mod mark;
mod release;

pub use release::{Blame, Released, RetryPolicy};

/// An event this worker holds the lease on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedEvent {
    /// The event's stable id.
    pub event_id: String,
    /// `order` for OrderAccepted.
    pub(crate) aggregate_type: String,
    /// The order id: the Kafka record key, so one order's events stay in order.
    pub(crate) aggregate_id: String,
    /// The protobuf message name of the payload.
    pub(crate) event_type: String,
    /// The version of the aggregate's facts the event describes.
    pub(crate) event_version: i64,
    /// The encoded event, published verbatim.
    pub(crate) payload: Vec<u8>,
    /// Claims so far, this one included.
    pub attempts: i32,
    /// When this claim's lease ends, by the database clock.
    pub lease_until: DateTime<Utc>,
    /// This claim's fence: every mark or release of the event carries it.
    pub lease_token: LeaseToken,
    /// When the order service wrote the event.
    pub(crate) created_at: DateTime<Utc>,
    /// The W3C `traceparent` of the SubmitOrder that wrote the event, if it was traced.
    pub(crate) traceparent: Option<String>,
    /// The W3C `tracestate` that goes with it.
    pub(crate) tracestate: Option<String>,
}

/// Where the broker put a confirmed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The record's offset in the partition.
    pub offset: i64,
}

/// The result of an owner-fenced update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced<T> {
    /// The claim still held the lease; the update happened.
    Done(T),
    /// Another claim holds the lease now (or the row left PUBLISHING): nothing was changed.
    LeaseLost,
}

/// The outbox table, as the relay uses it.
#[derive(Debug, Clone)]
pub struct Outbox {
    db: DatabaseConnection,
    /// Set at the start of each locking transaction; `None` where the pool's sessions already
    /// run at the relay's isolation level (or the backend needs none).
    isolation: Option<IsolationLevel>,
}

impl Outbox {
    /// The outbox in `db`, a pool of any kind: each locking transaction sets the relay's
    /// isolation level ([`db::relay_isolation`]) itself, one round trip more on MariaDB/MySQL.
    pub fn new(db: DatabaseConnection) -> Self {
        let isolation = db::relay_isolation(&db);
        Self { db, isolation }
    }

    /// The outbox in `db`, a pool opened for the relay ([`db::Pool::Relay`]), whose sessions
    /// already run at the relay's isolation level.
    pub(crate) fn on_relay_pool(db: DatabaseConnection) -> Self {
        Self { db, isolation: None }
    }

    /// The database connection this outbox uses.
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    /// The backlog, as [`crate::backlog::backlog`] defines it.
    pub(crate) async fn backlog(&self) -> Result<Backlog, DbErr> {
        crate::backlog::backlog(&self.db).await
    }

    /// The audited redrive of [`crate::backlog::redrive`].
    pub(crate) async fn redrive(&self, event_id: &str, audit: &RedriveAudit) -> Result<Redrive, DbErr> {
        crate::backlog::redrive(&self.db, event_id, audit).await
    }
}

fn lease_end(now: DateTime<Utc>, lease: Duration) -> Result<DateTime<Utc>, DbErr> {
    chrono::Duration::from_std(lease)
        .ok()
        .and_then(|lease| now.checked_add_signed(lease))
        .ok_or_else(|| DbErr::Custom(format!("a lease of {lease:?} is out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_ends_its_length_after_now_and_an_absurd_one_is_an_error() {
        let now = DateTime::<Utc>::from_timestamp(1_700_000_000, 123_456_000).unwrap_or_default();
        let end = lease_end(now, Duration::from_millis(30_250));
        assert_eq!(end.ok(), DateTime::<Utc>::from_timestamp(1_700_000_030, 373_456_000));
        assert_eq!(lease_end(now, Duration::ZERO).ok(), Some(now));
        assert!(lease_end(now, Duration::MAX).is_err());
    }
}
