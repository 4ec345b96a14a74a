//! One relay fleet over every shard of a shard map (`--shard-map-file`): which relay serves
//! which shard is decided by Kafka's group protocol, not by the relays. The fleet's relays join
//! one consumer group (`--fleet-group`) on a small control topic (`--control-topic`) with one
//! partition per shard number; the relay assigned partition n serves the shard numbered n, and
//! connects to no other shard's database. When a relay joins, leaves or dies, the group moves
//! partitions and the relays start and stop shards to match.
//!
//! Ownership is an optimisation of who claims, never the guarantee: every row is still guarded
//! by its claim's lease and fenced marks, so a shard served by two relays for a moment (one
//! draining what it claimed, the other starting) publishes nothing twice that one relay would
//! not, and per-order order holds as it does between any relays.
//!
//! The run loop is thin: whenever the owned partitions or the map change, it applies the
//! difference to the running shards ([`shards::plan`]).

mod health;
mod liveness;
mod ownership;
mod reload;
mod shards;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{Notify, mpsc, watch};

use super::outbox::ClaimWindow;
use super::publisher::KafkaPublisher;
use super::settings::Settings;
use super::worker::{Producers, PublisherFailed, Tuning};
use idempost_shard_map::{ShardMap, ShardMapError};
use ownership::{GroupClient, Membership};
use shards::{Running, Serving};

/// The fleet cannot start, or a map cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The map cannot be used.
    #[error(transparent)]
    Map(#[from] ShardMapError),
    /// `--shard-map-file` without `--control-topic`.
    #[error("--shard-map-file needs --control-topic: the fleet's shards are handed out through it")]
    NoControlTopic,
    /// The control topic's partitions could not be read (no such topic, no broker).
    #[error("cannot read the control topic {topic:?}: {reason}")]
    ControlTopic {
        /// The topic.
        topic: String,
        /// Why.
        reason: String,
    },
    /// A shard's number has no partition in the control topic, so no relay could own it.
    #[error(
        "shard {shard:?} has number {number} but the control topic {topic:?} has {partitions} partitions \
         (0 to {last}): create the control topic with a partition for every shard number, planned ahead \
         (Tansu 0.6 cannot add partitions)",
        last = partitions - 1
    )]
    Unpartitioned {
        /// The shard.
        shard: String,
        /// Its number.
        number: u32,
        /// The control topic.
        topic: String,
        /// Its partitions.
        partitions: i32,
    },
    /// The group client could not be made.
    #[error("cannot join the fleet's group: {0}")]
    Group(#[from] rdkafka::error::KafkaError),
}

/// A fleet relay, ready to run: its map read, its control topic checked, its group joined.
pub(crate) struct Fleet {
    map_file: PathBuf,
    map: watch::Sender<Arc<ShardMap>>,
    membership: Membership,
    client: Arc<GroupClient>,
    owned: watch::Sender<BTreeSet<i32>>,
    serving: Serving,
    wake: Arc<Notify>,
    publish_stall: std::time::Duration,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("map_file", &self.map_file)
            .field("group", &self.membership.group)
            .finish_non_exhaustive()
    }
}

impl Fleet {
    /// Reads the map, checks that the control topic has a partition for every shard number,
    /// and joins the fleet's group.
    pub(crate) async fn prepare(
        settings: &Settings,
        publisher: KafkaPublisher,
        tuning: Tuning,
    ) -> Result<Self, FleetError> {
        let map_file = settings.shard_map_file.clone().ok_or(FleetError::NoControlTopic)?;
        let map = ShardMap::load(&map_file)?;
        let topic = settings.control_topic.clone().ok_or(FleetError::NoControlTopic)?;
        let membership = Membership {
            brokers: settings.kafka.brokers.clone(),
            topic,
            group: settings.fleet_group.clone(),
            options: settings.kafka.options.clone(),
        };
        check_numbers(&map, &membership).await?;
        let (owned, _) = watch::channel(BTreeSet::new());
        let client = membership.join(owned.clone())?;
        let serving = Serving {
            producers: Producers::new(publisher),
            tuning,
            workers: settings.workers,
            max_connections: settings.db_max_connections,
            claim_window: ClaimWindow {
                lookback: settings.claim_lookback,
                sweep_interval: settings.claim_sweep_interval,
            },
        };
        let (map, _) = watch::channel(Arc::new(map));
        let (wake, publish_stall) = (Arc::default(), settings.publish_stall);
        Ok(Self { map_file, map, membership, client, owned, serving, wake, publish_stall })
    }

    /// Notifying this wakes every owned shard's relay.
    pub(crate) fn wake_handle(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }

    /// Serves the owned shards until `stop`, then stops them (each drains its batches in flight)
    /// while the group client leaves, so that the other relays take its shards at once. Ends
    /// early with the error of a shard's publisher that failed for good.
    /// Reports health on `health` ([`health::watch`]).
    pub(crate) async fn run(
        self,
        health: idempost::service::Health,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), PublisherFailed> {
        let (fatal, mut failed) = mpsc::channel(1);
        let mut running = Running::new(self.serving, fatal);
        let (quit, quitting) = watch::channel(false);
        let mut map = self.map.subscribe();
        let mut owned = self.owned.subscribe();
        // The liveness watch asks for a rejoin when a shard's partition is stranded on a member
        // that is gone (Tansu 0.6 keeps such a group formed with the old assignment).
        let (rejoin_tx, rejoin) = mpsc::channel(1);
        let watch = liveness::Watch {
            brokers: self.membership.brokers.clone(),
            options: self.membership.options.clone(),
            topic: self.membership.topic.clone(),
            tick: liveness::TICK,
            stranded_after: ownership::SESSION_TIMEOUT + idempost::kafka::STRANDED_MARGIN,
        };
        tokio::spawn(liveness::watch(watch, owned.clone(), map.clone(), rejoin_tx, quitting.clone()));
        let reloads =
            reload::watch_hangup(self.map_file, self.membership.clone(), self.map, quitting.clone());
        let group =
            tokio::spawn(ownership::hold(self.membership, self.client, self.owned, rejoin, quitting.clone()));
        tokio::spawn(wake_every_shard(self.wake, running.live(), quitting.clone()));
        tokio::spawn(health::watch(running.live(), health, self.publish_stall, quitting.clone()));
        // Every shard any map named: one the map dropped reads 0 from then on.
        let mut known = BTreeSet::new();
        let outcome = loop {
            let held = owned.borrow_and_update().clone();
            let current = Arc::clone(&map.borrow_and_update());
            if running.apply(&held, &current).await {
                tracing::info!(shards = ?running.names(), "shards owned");
            }
            known.extend(current.shards().iter().map(|s| s.name().to_owned()));
            shards::record_owned(&known, &running.names());
            tokio::select! {
                changed = owned.changed() => if changed.is_err() { break Ok(()) },
                changed = map.changed() => if changed.is_err() { break Ok(()) },
                Some(error) = failed.recv() => break Err(error),
                () = stopped(&mut stop) => break Ok(()),
            }
        };
        let _ = quit.send(true);
        let (_, left) = tokio::join!(running.stop_all(), group);
        shards::record_owned(&known, &[]);
        if let Err(e) = left {
            tracing::warn!(error = %e, "the fleet's group client ended badly");
        }
        drop(reloads);
        outcome
    }
}

/// Refuses `map` unless the control topic has a partition for every shard's number.
async fn check_numbers(map: &ShardMap, membership: &Membership) -> Result<(), FleetError> {
    let partitions = membership.partitions().await?;
    match map.shards().iter().find(|s| i64::from(s.number()) >= i64::from(partitions)) {
        Some(shard) => Err(FleetError::Unpartitioned {
            shard: shard.name().to_owned(),
            number: shard.number(),
            topic: membership.topic.clone(),
            partitions,
        }),
        None => Ok(()),
    }
}

/// Hands each wake-up from the order service to every running shard's relay, until `stop`.
async fn wake_every_shard(wake: Arc<Notify>, shards: shards::Registry, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = wake.notified() => shards.wake_all(),
            () = stopped(&mut stop) => return,
        }
    }
}

/// Completes once `stop` is true (or its sender is gone); holds no borrow of it across an await.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}
