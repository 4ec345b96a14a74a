//! One shard, served: its pool opened, its relay's step loops run until it is stopped, its
//! gauges reported under its name (and set to 0 once it stops), its pool closed.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::KeyValue;
use tokio::sync::{mpsc, watch};

use super::super::super::backlog::{self, report_backlog};
use super::super::super::cleanup;
use super::super::super::outbox::open_outbox;
use super::super::super::outbox::{ClaimWindow, Outbox};
use super::super::super::publisher::KafkaPublisher;
use super::super::super::worker::{Producers, PublisherFailed, Relay, Tuning};
use super::{Live, Registry};
use idempost::service;
use idempost_shard_map::Shard;

/// What every shard is served with.
#[derive(Debug)]
pub(crate) struct Serving {
    pub(crate) producers: Producers<KafkaPublisher>,
    pub(crate) tuning: Tuning,
    pub(crate) workers: u16,
    pub(crate) max_connections: u32,
    pub(crate) claim_window: ClaimWindow,
}

/// Longest wait between attempts to open a shard's pool.
const REOPEN_MAX: Duration = Duration::from_secs(10);

/// Serves `shard` until `stop`. A pool that cannot be opened is tried again (with back-off)
/// while the shard is owned; a publisher that fails for good is reported on `fatal`.
pub(super) async fn shard(
    serving: Arc<Serving>,
    shard: Shard,
    live: Registry,
    fatal: mpsc::Sender<PublisherFailed>,
    mut stop: watch::Receiver<bool>,
) {
    let name = shard.name().to_owned();
    let Some(outbox) = open(&serving, &shard, &mut stop).await else { return };
    let relay = Relay::on(outbox.clone(), &serving.producers, serving.tuning.clone());
    let (wake, vitals) = (relay.wake_handle(), relay.vitals());
    live.insert(name.clone(), Live { wake, vitals, outbox: outbox.clone() });
    let attrs = vec![KeyValue::new("idempost.shard", name.clone())];
    let samplers = [
        tokio::spawn(report_backlog(outbox.clone(), attrs.clone(), stop.clone())),
        tokio::spawn(service::report_claimable_as(outbox.connection().clone(), attrs.clone(), stop.clone())),
        tokio::spawn(cleanup::report_as(outbox.connection().clone(), attrs.clone(), stop.clone())),
    ];
    tracing::info!(shard = %name, lease_owner = %relay.owner(), "shard served");
    // As one relay's loops (see `Application::run_until_stopped`): disjoint claims, each mark
    // and release fenced by its own claim's token.
    let loops = (0..serving.workers.max(1)).map(|_| relay.run(stop.clone()));
    let outcome = futures::future::try_join_all(loops).await;
    live.remove(&name);
    // Ended before the gauges are zeroed, so that no sample still in flight comes after (and
    // ended even when the loops stopped for a failed publisher rather than for `stop`).
    for sampler in samplers {
        sampler.abort();
        let _ = sampler.await;
    }
    cleanup::given_back(&attrs);
    backlog::given_back(&attrs);
    if let Err(failed) = outcome {
        let _ = fatal.send(failed).await;
    }
    drop(relay);
    if let Err(e) = outbox.connection().clone().close().await {
        tracing::debug!(shard = %name, error = %e, "shard pool close");
    }
    tracing::info!(shard = %name, "shard stopped");
}

/// The shard's outbox, opened with back-off until it opens or `stop`.
async fn open(serving: &Serving, shard: &Shard, stop: &mut watch::Receiver<bool>) -> Option<Outbox> {
    let mut wait = Duration::from_millis(500);
    loop {
        let opened = match shard.url() {
            Ok(url) => open_outbox(&url, serving.max_connections).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match opened {
            Ok(outbox) => return Some(outbox.with_claim_window(serving.claim_window)),
            Err(e) => {
                tracing::error!(shard = %shard.name(), error = %e, "cannot open the shard's database; trying again")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = super::super::stopped(stop) => return None,
        }
        wait = (wait * 2).min(REOPEN_MAX);
    }
}
