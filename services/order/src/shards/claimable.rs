//! The order service's claimable gauges, `idempost.outbox.claimable` and
//! `idempost.outbox.oldest_claimable_age`, over its shards.
//!
//! The order service reports them beside the relays so that, with every relay down, the alert
//! "events are due and no relay claims" still has a gauge to read; with a map that holds for
//! every shard, so each shard is read and its values carry `idempost.shard` (its name). Without
//! a map the one database's values carry no attribute, as they always did, so dashboards and
//! alerts written for one database read the same series.

use std::collections::BTreeSet;

use opentelemetry::KeyValue;
use tokio::sync::watch;

use super::Shards;
use idempost::service::CLAIMABLE_INTERVAL;
use idempost::telemetry::metrics;

/// Records both gauges for every shard of the running map every [`CLAIMABLE_INTERVAL`], until
/// `stopped` turns true. A failed read keeps the shard's last values (health speaks of the
/// database); a shard a reload removed is recorded once as 0 (the gauge cannot forget a series,
/// and its last value would otherwise stand, and alert, for ever).
pub(crate) async fn watch(shards: Shards, mut stopped: watch::Receiver<bool>) {
    let mut reported = BTreeSet::new();
    while !*stopped.borrow() {
        let mut running = BTreeSet::new();
        for (name, shard) in shards.all() {
            let attributes = shards.attributes_of(&name);
            match idempost::backlog::claimable(shard.store.db()).await {
                Ok(claimable) => {
                    let age = claimable.oldest.map_or(0.0, |at| {
                        (chrono::Utc::now() - at).to_std().unwrap_or_default().as_secs_f64()
                    });
                    record(claimable.count, age, &attributes);
                }
                Err(e) => tracing::debug!(shard = %name, error = %e, "claimable query failed"),
            }
            running.insert(name);
        }
        for gone in reported.difference(&running) {
            record(0, 0.0, &[KeyValue::new("idempost.shard", gone.clone())]);
        }
        reported = running;
        tokio::select! {
            () = tokio::time::sleep(CLAIMABLE_INTERVAL) => {}
            changed = stopped.changed() => if changed.is_err() { break },
        }
    }
}

fn record(count: u64, age: f64, attributes: &[KeyValue]) {
    metrics().outbox_claimable.record(count, attributes);
    metrics().outbox_oldest_claimable_age.record(age, attributes);
}
