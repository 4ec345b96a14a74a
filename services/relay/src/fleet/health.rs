//! A fleet relay's health: the one-database relay's checks, over every shard it serves. Health
//! is NOT_SERVING while a served shard cannot claim, or published nothing for `--publish-stall`
//! while one of its events has waited that long; the failing check names the shard.

use std::time::Duration;

use tokio::sync::watch;

use super::shards::{Live, Registry};
use crate::health::publish_verdict;
use idempost::service::{self, Health, Verdict};

/// Updates `health` from the running shards every health interval until `stop`.
pub(super) async fn watch(
    shards: Registry,
    health: Health,
    stall: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let (mut claim, mut publishing) = (None, None);
        for (name, shard) in shards.snapshot() {
            claim = claim.or_else(|| named(&name, shard.vitals.claim_verdict()));
            if publishing.is_none() {
                publishing = named(&name, publishing_verdict(&shard, stall).await);
            }
        }
        health.update(&[("claim", claim), ("publishing", publishing)]).await;
        tokio::select! {
            () = tokio::time::sleep(service::HEALTH_INTERVAL) => {}
            () = super::stopped(&mut stop) => return,
        }
    }
}

/// The publish-stall check of one shard; its backlog is read only while publishing looks
/// stalled, so a healthy shard adds no query.
async fn publishing_verdict(shard: &Live, stall: Duration) -> Verdict {
    let since_publish = shard.vitals.since_last_publish();
    if since_publish <= stall {
        return None;
    }
    let backlog = shard.outbox.backlog().await.ok()?;
    publish_verdict(since_publish, backlog.oldest_pending, stall)
}

fn named(shard: &str, verdict: Verdict) -> Verdict {
    verdict.map(|why| format!("shard {shard:?}: {why}"))
}
