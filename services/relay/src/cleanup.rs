//! The database's cleanup as the relay's claims feel it: the oldest open transaction's age and
//! the row versions cleanup has not removed yet ([`idempost::db::cleanup`]), exported as gauges
//! for the alert that names a held snapshot as the cause of a slowing relay.
//!
//! Sampled on an interval of its own on the outbox's pool, never in the claim path: both are
//! reads of the server's statistics views, once every [`INTERVAL`]. One relay samples its one
//! database with no attribute; a fleet relay samples each shard it serves, under the shard's
//! `idempost.shard`.

use std::time::Duration;

use idempost::db::cleanup;
use idempost::telemetry::metrics;
use opentelemetry::KeyValue;
use sea_orm::DatabaseConnection;
use tokio::sync::watch;

/// How often the gauges are refreshed: a snapshot that matters is held for minutes.
const INTERVAL: Duration = Duration::from_secs(15);

/// Records both gauges every [`INTERVAL`] until `stop`. A failed read (a role without the
/// privilege to read the views, see [`cleanup`]) leaves the gauge as it was and is logged at
/// debug level only, since it fails the same way every time.
pub(crate) async fn report(db: DatabaseConnection, stop: watch::Receiver<bool>) {
    report_as(db, Vec::new(), stop).await;
}

/// [`report`] with `attributes` on every value (a relay fleet's `idempost.shard`).
pub(crate) async fn report_as(
    db: DatabaseConnection,
    attributes: Vec<KeyValue>,
    mut stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        match cleanup::oldest_transaction_age(&db).await {
            Ok(age) => metrics().db_oldest_transaction_age.record(age.as_secs_f64(), &attributes),
            Err(e) => tracing::debug!(error = %e, "oldest transaction query failed"),
        }
        match cleanup::unremoved_versions(&db).await {
            Ok(versions) => metrics().db_unremoved_versions.record(versions, &attributes),
            Err(e) => tracing::debug!(error = %e, "unremoved versions query failed"),
        }
        tokio::select! {
            () = tokio::time::sleep(INTERVAL) => {}
            changed = stop.changed() => if changed.is_err() { break },
        }
    }
}

/// Sets both gauges of a shard this relay no longer serves to 0, once its [`report_as`] has ended:
/// a gauge keeps its last value for as long as the process exports it, and a transaction this
/// relay saw open when it gave the shard back would otherwise page for the shard long after
/// its new owner saw it end. The fleet's `max by (idempost_shard)` is then the owner's reading.
pub(crate) fn given_back(attributes: &[KeyValue]) {
    metrics().db_oldest_transaction_age.record(0.0, attributes);
    metrics().db_unremoved_versions.record(0, attributes);
}
