//! Whether every shard of the fleet has a live owner, and the way out when one is stranded.
//!
//! Tansu 0.6 can leave the fleet's group formed with a dead relay's assignment (see
//! docs/design/tansu.md, "Dead group members"): nobody serves that relay's shards, and nothing in
//! the group protocol says so. The consumer sees the same from committed offsets that stop while
//! records wait; the control topic carries no data, so its owners make a signal of their own:
//! every owner appends a tick (key = the shard's name, no value) to each control partition it
//! holds every [`TICK`]. Every relay reads the control partitions' ends now and then:
//!
//! - a partition whose end did not move for [`UNOWNED_TICKS`] ticks has no live owner, and
//!   `idempost.relay.shard.unowned` says so for its shard (every relay reports every shard, so
//!   the fleet's maximum per shard is what an alert reads);
//! - one that did not move for the group's session timeout and a margin, and that this relay does
//!   not hold, is stranded: every member dead before it stopped has expired by then, and this
//!   relay asks to leave and join again as a new member, which re-forms the group over the live
//!   members (the fleet's group client does it, from a formed group only). It asks once per
//!   stretch: the stretch starts again when it asked.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use idempost::kafka::{Look, Stalls};
use idempost::telemetry::metrics;
use idempost_shard_map::ShardMap;
use opentelemetry::KeyValue;
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, ProducerContext};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};

/// How often an owner ticks into each control partition it holds, and how often every relay
/// looks at the partitions' ends. A tick is a record Tansu 0.6 keeps (it enforces no retention):
/// 43 200 a day per shard. Two seconds shows an unowned shard within [`UNOWNED_TICKS`] of them
/// (6 s), well inside the fleet's session timeout (10 s), so the gauge is 1 for most of the
/// time a dead relay's shards wait, and the stretch before a rejoin (session timeout and margin,
/// 20 s) spans ten ticks, so a late tick or two never looks like a dead owner.
pub(crate) const TICK: Duration = Duration::from_secs(2);

/// Ticks a control partition's end stays still before its shard counts as unowned: one missed
/// tick is a slow broker, three are an owner that is gone.
const UNOWNED_TICKS: u32 = 3;

/// How long one look at the partitions' ends may take.
const LOOK_TIMEOUT: Duration = Duration::from_secs(2);

/// What the watch needs to know.
#[derive(Debug, Clone)]
pub(crate) struct Watch {
    /// Kafka bootstrap servers.
    pub(crate) brokers: String,
    /// The relay's pass-through Kafka options (SASL, TLS), for the tick producer and the
    /// reader of the partitions' ends.
    pub(crate) options: Vec<(String, String)>,
    /// The fleet's control topic.
    pub(crate) topic: String,
    /// How often owners tick and every relay looks; [`TICK`] in a running relay.
    pub(crate) tick: Duration,
    /// How long a partition this relay does not hold stands still before this relay rejoins the
    /// group: the group's session timeout and [`idempost::kafka::STRANDED_MARGIN`].
    pub(crate) stranded_after: Duration,
}

/// Ticks into the partitions in `owned`, reports `idempost.relay.shard.unowned` for every shard
/// of `map`, and sends `()` on `rejoin` when a partition is stranded, until `stop`. A relay whose
/// clients cannot be made runs without it (and says so): ownership does not depend on it.
pub(crate) async fn watch(
    settings: Watch,
    owned: watch::Receiver<BTreeSet<i32>>,
    map: watch::Receiver<Arc<ShardMap>>,
    rejoin: mpsc::Sender<()>,
    mut stop: watch::Receiver<bool>,
) {
    let clients = match Clients::new(&settings) {
        Ok(clients) => clients,
        Err(e) => {
            tracing::error!(error = %e, "no liveness watch over the fleet's shards: its Kafka clients cannot be made");
            // The group client waits on `rejoin`: it stays open, and silent, until the relay stops.
            let _ = stop.wait_for(|stopped| *stopped).await;
            return;
        }
    };
    let mut verdicts = Verdicts::new(&settings);
    let mut every = tokio::time::interval(settings.tick);
    every.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
        let (held, current) = (owned.borrow().clone(), Arc::clone(&map.borrow()));
        clients.tick(&settings.topic, &current, &held);
        let partitions = current.shards().iter().filter_map(|s| i32::try_from(s.number()).ok()).collect();
        match clients.look(&settings.topic, partitions).await {
            Ok(looks) => {
                let verdict = verdicts.judge(Instant::now(), &current, &held, &looks);
                for (shard, unowned) in verdict.unowned {
                    let shard = KeyValue::new("idempost.shard", shard);
                    metrics().relay_shard_unowned.record(u64::from(unowned), &[shard]);
                }
                if !verdict.stranded.is_empty() {
                    let stranded = verdict.stranded;
                    tracing::warn!(partitions = ?stranded, "control partitions stranded on a member that is gone");
                    // A full channel already holds a request to rejoin.
                    let _ = rejoin.try_send(());
                }
            }
            Err(e) => tracing::debug!(error = %e, "control partitions not looked at"),
        }
    }
    // Closing the producer waits for what it still has in flight: off the runtime's workers.
    let _ = tokio::task::spawn_blocking(move || drop(clients)).await;
}

/// What the looks mean: the unowned gauge's stretch and the rejoin's.
#[derive(Debug)]
struct Verdicts {
    unowned: Stalls,
    stranded: Stalls,
    /// The shards the gauge was last given for, so that a shard dropped from the map is given 0
    /// once rather than left at its last value.
    reported: BTreeSet<String>,
}

/// What one look says.
#[derive(Debug, PartialEq, Eq)]
struct Verdict {
    /// Every shard of the map (and each dropped from it since the last look), and whether it is
    /// unowned.
    unowned: Vec<(String, bool)>,
    /// The partitions stranded: ask to rejoin.
    stranded: Vec<i32>,
}

impl Verdicts {
    fn new(settings: &Watch) -> Self {
        Self {
            unowned: Stalls::new(settings.tick * UNOWNED_TICKS),
            stranded: Stalls::new(settings.stranded_after),
            reported: BTreeSet::new(),
        }
    }

    /// Judges one look at `now`, this relay holding `held`. A stranded partition's stretch starts
    /// again once it is answered here.
    fn judge(&mut self, now: Instant, map: &ShardMap, held: &BTreeSet<i32>, looks: &[Look]) -> Verdict {
        // Held or not: a shard this relay holds and cannot tick for is as unserved as any.
        let stalled = self.unowned.observe(now, &HashSet::new(), looks);
        let mut unowned: Vec<(String, bool)> = map
            .shards()
            .iter()
            .map(|s| (s.name().to_owned(), i32::try_from(s.number()).is_ok_and(|p| stalled.contains(&p))))
            .collect();
        let shown: BTreeSet<String> = unowned.iter().map(|(name, _)| name.clone()).collect();
        unowned.extend(self.reported.difference(&shown).map(|gone| (gone.clone(), false)));
        self.reported = shown;
        let stranded = self.stranded.observe(now, &held.iter().copied().collect(), looks);
        if !stranded.is_empty() {
            self.stranded.restart();
        }
        Verdict { unowned, stranded }
    }
}

/// The tick producer and the reader of the partitions' ends.
struct Clients {
    producer: BaseProducer<Ticks>,
    reader: Arc<BaseConsumer>,
}

impl Clients {
    fn new(settings: &Watch) -> Result<Self, KafkaError> {
        let mut config = ClientConfig::new();
        for (key, value) in &settings.options {
            config.set(key, value);
        }
        config.set("bootstrap.servers", &settings.brokers);
        let mut producing = config.clone();
        // A tick later than the gauge's stretch says nothing any more: drop it rather than queue.
        let give_up = settings.tick * UNOWNED_TICKS;
        producing.set("message.timeout.ms", give_up.as_millis().to_string()).set("linger.ms", "0");
        Ok(Self { producer: producing.create_with_context(Ticks)?, reader: Arc::new(config.create()?) })
    }

    /// Appends one tick to each partition of `held` that is a shard of `map`; counts them as
    /// the broker confirms them (served by the polls here, one tick later).
    fn tick(&self, topic: &str, map: &ShardMap, held: &BTreeSet<i32>) {
        self.producer.poll(Duration::ZERO);
        for shard in map.shards() {
            let Ok(partition) = i32::try_from(shard.number()) else { continue };
            if !held.contains(&partition) {
                continue;
            }
            let record = BaseRecord::to(topic).partition(partition).key(shard.name()).payload(&[] as &[u8]);
            if let Err((e, _)) = self.producer.send(record) {
                tracing::debug!(error = %e, shard = shard.name(), "tick not sent");
            }
        }
    }

    /// Every partition's end in one request (a `ListOffsets` for the latest offsets), off the
    /// runtime's workers. A partition the broker answers with an error is left out.
    async fn look(&self, topic: &str, partitions: Vec<i32>) -> Result<Vec<Look>, KafkaError> {
        let (reader, topic) = (Arc::clone(&self.reader), topic.to_owned());
        let answered = tokio::task::spawn_blocking(move || {
            let mut list = TopicPartitionList::new();
            for partition in partitions {
                list.add_partition_offset(&topic, partition, Offset::End)?;
            }
            let ends = reader.offsets_for_times(list, LOOK_TIMEOUT)?;
            // Events such a reader gets (errors, mostly) would pile up unread.
            let _ = reader.poll(Duration::ZERO);
            Ok::<_, KafkaError>(ends)
        })
        .await
        .map_err(|_| KafkaError::Canceled)??;
        Ok(answered
            .elements()
            .iter()
            .filter(|e| e.error().is_ok())
            .filter_map(|e| match e.offset() {
                Offset::Offset(end) => Some(Look { partition: e.partition(), progress: end, expected: true }),
                _ => None,
            })
            .collect())
    }
}

/// Counts the ticks the broker confirmed, per shard.
struct Ticks;

impl ClientContext for Ticks {}

impl ProducerContext for Ticks {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, (): ()) {
        if let Ok(message) = result {
            let shard = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
            metrics().relay_control_ticks.add(1, &[KeyValue::new("idempost.shard", shard)]);
        }
    }
}

#[cfg(test)]
mod tests;
