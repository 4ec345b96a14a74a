//! The shards this relay serves: started when their partition is assigned (and the map has
//! them), stopped when it is revoked or the map drops them. Each runs `--workers` step loops of
//! a [`Relay`] of its own over its own pool, all publishing through the fleet's [`Producers`].

mod serve;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::KeyValue;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

use super::super::health::Vitals;
use super::super::outbox::Outbox;
use super::super::worker::PublisherFailed;
use idempost::telemetry::metrics;
use idempost_shard_map::{Shard, ShardMap};

pub(crate) use serve::Serving;

/// What to change in the running set.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Running shards (by name) to stop: revoked, gone from the map, or renumbered.
    pub(crate) stop: Vec<String>,
    /// Shards to start: owned, in the map, not running.
    pub(crate) start: Vec<Shard>,
}

/// Compares the shards that should run (the map's shards whose number is `owned`) with those
/// that do (`running`: name and number).
pub(crate) fn plan(owned: &BTreeSet<i32>, map: &ShardMap, running: &BTreeMap<String, u32>) -> Plan {
    let wanted = |shard: &Shard| i32::try_from(shard.number()).is_ok_and(|n| owned.contains(&n));
    let stop = running
        .iter()
        .filter(|(name, number)| !map.get(name).is_some_and(|s| s.number() == **number && wanted(s)))
        .map(|(name, _)| name.clone())
        .collect();
    let start = map
        .shards()
        .iter()
        .filter(|s| wanted(s) && running.get(s.name()) != Some(&s.number()))
        .cloned()
        .collect();
    Plan { stop, start }
}

/// The running shards.
#[derive(Debug)]
pub(crate) struct Running {
    serving: Arc<Serving>,
    shards: BTreeMap<String, Handle>,
    /// Every running shard's relay, by name: a wake-up wakes them all, health reads them all.
    live: Registry,
    fatal: mpsc::Sender<PublisherFailed>,
}

/// One running shard.
#[derive(Debug)]
struct Handle {
    number: u32,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Running {
    /// Nothing running yet; a shard whose publisher fails for good reports on `fatal`.
    pub(crate) fn new(serving: Serving, fatal: mpsc::Sender<PublisherFailed>) -> Self {
        Self { serving: Arc::new(serving), shards: BTreeMap::new(), live: Registry::default(), fatal }
    }

    /// Makes the running set what `owned` and `map` say; answers whether it changed. Shards
    /// stop (their batches in flight published and marked, bounded by the lease) before new ones
    /// start.
    pub(crate) async fn apply(&mut self, owned: &BTreeSet<i32>, map: &ShardMap) -> bool {
        let running = self.shards.iter().map(|(name, h)| (name.clone(), h.number)).collect();
        let plan = plan(owned, map, &running);
        if plan.stop.is_empty() && plan.start.is_empty() {
            return false;
        }
        let stopping =
            plan.stop.iter().filter_map(|name| self.shards.remove(name).map(|h| (name.clone(), h)));
        let stopping = stopping.collect();
        self.stop_each(stopping).await;
        for shard in plan.start {
            self.start(shard);
        }
        true
    }

    /// Stops every shard.
    pub(crate) async fn stop_all(&mut self) {
        let all = std::mem::take(&mut self.shards).into_iter().collect();
        self.stop_each(all).await;
    }

    /// The names of the running shards.
    pub(crate) fn names(&self) -> Vec<&str> {
        self.shards.keys().map(String::as_str).collect()
    }

    /// The running shards' relays, for wake-ups and health.
    pub(crate) fn live(&self) -> Registry {
        self.live.clone()
    }

    fn start(&mut self, shard: Shard) {
        let (stop, stopped) = watch::channel(false);
        let name = shard.name().to_owned();
        let number = shard.number();
        let task = tokio::spawn(serve::shard(
            Arc::clone(&self.serving),
            shard,
            self.live.clone(),
            self.fatal.clone(),
            stopped,
        ));
        self.shards.insert(name, Handle { number, stop, task });
    }

    /// Stops the shards together: each drains for at most its lease and the pool's close.
    async fn stop_each(&self, shards: Vec<(String, Handle)>) {
        let bound = self.serving.tuning.lease + CLOSE_WAIT;
        let stops = shards.into_iter().map(|(name, handle)| async move {
            let _ = handle.stop.send(true);
            if tokio::time::timeout(bound, handle.task).await.is_err() {
                tracing::warn!(shard = %name, "shard did not stop within its lease; its events will be claimed again");
            }
        });
        futures::future::join_all(stops).await;
    }
}

/// The relays of the running shards, by shard name, from the moment their pool is open.
#[derive(Debug, Clone, Default)]
pub(crate) struct Registry(Arc<Mutex<BTreeMap<String, Live>>>);

/// What the fleet reaches in a running shard's relay.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    pub(crate) wake: Arc<Notify>,
    pub(crate) vitals: Arc<Vitals>,
    pub(crate) outbox: Outbox,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Live>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn insert(&self, name: String, live: Live) {
        self.lock().insert(name, live);
    }

    pub(crate) fn remove(&self, name: &str) {
        self.lock().remove(name);
    }

    /// A copy of what runs now.
    pub(crate) fn snapshot(&self) -> BTreeMap<String, Live> {
        self.lock().clone()
    }

    /// Wakes every running shard's relay.
    pub(crate) fn wake_all(&self) {
        let live = self.lock();
        tracing::debug!(shards = live.len(), "wake-up handed to every running shard");
        for shard in live.values() {
            shard.wake.notify_one();
        }
    }
}

/// How long closing a shard's pool may take beyond the lease.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Records `idempost.relay.shard.owned`: 1 for every shard of `known` in `running`, else 0.
pub(crate) fn record_owned(known: &BTreeSet<String>, running: &[&str]) {
    for shard in known {
        let owned = u64::from(running.contains(&shard.as_str()));
        metrics().relay_shard_owned.record(owned, &[KeyValue::new("idempost.shard", shard.clone())]);
    }
}

#[cfg(test)]
mod tests;
