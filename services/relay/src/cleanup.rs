//! The database's cleanup as the relay's claims feel it: the oldest open transaction's age and
//! the row versions cleanup has not removed yet ([`idempost::db::cleanup`]), exported as gauges
//! for the alert that names a held snapshot as the cause of a slowing relay.
//!
//! Sampled on an interval of its own on the outbox's pool, never in the claim path: both are
//! reads of the server's statistics views, once every [`INTERVAL`].

use std::time::Duration;

use idempost::db::cleanup;
use idempost::telemetry::metrics;
use sea_orm::DatabaseConnection;
use tokio::sync::watch;

/// How often the gauges are refreshed: a snapshot that matters is held for minutes.
const INTERVAL: Duration = Duration::from_secs(15);

/// Records both gauges every [`INTERVAL`] until `stop`. A failed read (a role without the
/// privilege to read the views, see [`cleanup`]) leaves the gauge as it was and is logged at
/// debug level only, since it fails the same way every time.
pub(crate) async fn report(db: DatabaseConnection, mut stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        match cleanup::oldest_transaction_age(&db).await {
            Ok(age) => metrics().db_oldest_transaction_age.record(age.as_secs_f64(), &[]),
            Err(e) => tracing::debug!(error = %e, "oldest transaction query failed"),
        }
        match cleanup::unremoved_versions(&db).await {
            Ok(versions) => metrics().db_unremoved_versions.record(versions, &[]),
            Err(e) => tracing::debug!(error = %e, "unremoved versions query failed"),
        }
        tokio::select! {
            () = tokio::time::sleep(INTERVAL) => {}
            changed = stop.changed() => if changed.is_err() { break },
        }
    }
}
