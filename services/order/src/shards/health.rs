//! The order service's health over its shards.
//!
//! NOT_SERVING only while no shard's database answers. Health is what a load balancer or an
//! orchestrator picks instances by, and every instance has the same shards: a shard down is down
//! for all of them, so taking instances out of service would serve that shard's tenants no
//! better and would cut off every other tenant too. The tenants of a shard that is down get
//! DATABASE_UNAVAILABLE (nothing written, retry), as every caller did when the one database was
//! down; the shard is named in a warning when it goes down and when it comes back, and
//! `idempost.order.shard.down` is 1 for it meanwhile. With one
//! shard (no map) this is today's health exactly.

use std::collections::BTreeSet;

use tokio::sync::watch;

use super::Shards;
use idempost::service::{self, Health};
use idempost::telemetry;
use opentelemetry::KeyValue;

/// Keeps `health` as above, checking every shard each [`service::HEALTH_INTERVAL`], until
/// `stopped` turns true.
pub(crate) async fn watch(shards: Shards, health: Health, mut stopped: watch::Receiver<bool>) {
    let mut down = BTreeSet::new();
    loop {
        let all = shards.all();
        let mut why = Vec::new();
        for (name, shard) in &all {
            let verdict = service::database_verdict(&shard.health_db).await;
            let attribute = [KeyValue::new("idempost.shard", name.clone())];
            telemetry::metrics().shard_down.record(u64::from(verdict.is_some()), &attribute);
            match verdict {
                Some(verdict) => {
                    if down.insert(name.clone()) {
                        tracing::warn!(shard = %name, reason = %verdict, "shard's database is down; its tenants' calls fail");
                    }
                    // One shard (no map) keeps the words the one database had.
                    why.push(if all.len() == 1 { verdict } else { format!("shard {name:?}: {verdict}") });
                }
                None if down.remove(name) => tracing::info!(shard = %name, "shard's database answers again"),
                None => {}
            }
        }
        let verdict = (why.len() == all.len()).then(|| why.join("; "));
        health.update(&[("database", verdict)]).await;
        tokio::select! {
            () = tokio::time::sleep(service::HEALTH_INTERVAL) => {}
            changed = stopped.changed() => if changed.is_err() || *stopped.borrow() { return },
        }
    }
}
