//! The outbox table as the relay holds it: the pool, the isolation level its locking
//! transactions set, and the end of a lease by the database clock.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{DatabaseConnection, DbErr, IsolationLevel};

use super::position::{ClaimPosition, ClaimWindow};
use idempost::backlog::{Backlog, Redrive, RedriveAudit};
use idempost::db;

/// The outbox table, as the relay uses it.
#[derive(Debug, Clone)]
pub struct Outbox {
    pub(super) db: DatabaseConnection,
    /// Set at the start of each locking transaction; `None` where the pool's sessions already
    /// run at the relay's isolation level (or the backend needs none).
    pub(super) isolation: Option<IsolationLevel>,
    /// Where this process's claims start reading; shared by every clone, so by every loop.
    pub(super) position: Arc<ClaimPosition>,
}

impl Outbox {
    /// The outbox in `db`, a pool of any kind: each locking transaction sets the relay's
    /// isolation level ([`db::relay_isolation`]) itself, one round trip more on MariaDB/MySQL.
    pub fn new(db: DatabaseConnection) -> Self {
        let isolation = db::relay_isolation(&db);
        Self { db, isolation, position: Arc::new(ClaimPosition::new(ClaimWindow::default())) }
    }

    /// The outbox in `db`, a pool opened for the relay ([`db::Pool::Relay`]), whose sessions
    /// already run at the relay's isolation level.
    pub(crate) fn on_relay_pool(db: DatabaseConnection) -> Self {
        Self { db, isolation: None, position: Arc::new(ClaimPosition::new(ClaimWindow::default())) }
    }

    /// This outbox with its claims read from the head again, then through `window` (see
    /// [`ClaimWindow`]): as a relay process that has just started.
    pub fn with_claim_window(mut self, window: ClaimWindow) -> Self {
        self.position = Arc::new(ClaimPosition::new(window));
        self
    }

    /// How this outbox's claims look behind their frontier.
    pub fn claim_window(&self) -> ClaimWindow {
        self.position.window()
    }

    /// The database connection this outbox uses.
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    /// The backlog, as [`idempost::backlog::backlog`] defines it.
    pub(crate) async fn backlog(&self) -> Result<Backlog, DbErr> {
        idempost::backlog::backlog(&self.db).await
    }

    /// The audited redrive of [`idempost::backlog::redrive`].
    pub(crate) async fn redrive(&self, event_id: &str, audit: &RedriveAudit) -> Result<Redrive, DbErr> {
        idempost::backlog::redrive(&self.db, event_id, audit).await
    }
}

/// When a lease of `lease` taken at `now` ends.
pub(super) fn lease_end(now: DateTime<Utc>, lease: Duration) -> Result<DateTime<Utc>, DbErr> {
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
