//! Which shards this relay owns: the fleet's consumer group on the control topic. Kafka's group
//! protocol assigns the topic's partitions to the fleet's relays, partition n standing for the
//! shard numbered n; this client never reads a record for itself, it only holds partitions.
//!
//! The group uses librdkafka's eager `range` assignor, not `cooperative-sticky`: on Tansu 0.6 a
//! cooperative member's rejoin changes its subscription, which makes a group whose dead member
//! led it form again under that dead leader for good (docs/design/tansu.md, "The relay fleet's
//! assignor"), while an eager group stays formed and the liveness watch's rejoin re-forms it.
//! What the eager protocol would cost is kept small in two ways:
//! - a revocation is not acted on until the next assignment, so a shard that the new assignment
//!   gives back keeps running (the leases and fenced marks, not ownership, guard every row);
//! - the client id begins with the time the client was made, and the range assignor orders the
//!   members by member id (Tansu makes it `<client id>-<uuid>`), so a relay that joins comes
//!   last and takes only from the end of the ranges: with four shards a third relay takes one
//!   and the other two keep the rest of theirs; with two, it takes none.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use tokio::sync::{mpsc, watch};

/// How the fleet's group client is made.
#[derive(Debug, Clone)]
pub(crate) struct Membership {
    pub(crate) brokers: String,
    pub(crate) topic: String,
    pub(crate) group: String,
    /// The relay's pass-through Kafka options (SASL, TLS): the producer's options among them are
    /// ignored by a consumer, with a warning from librdkafka.
    pub(crate) options: Vec<(String, String)>,
}

/// A group client; its context says which partitions it holds.
pub(crate) type GroupClient = StreamConsumer<Holder>;

/// Session timeout of the fleet's members: a relay that died without leaving holds its shards
/// this long (then its events wait only for their leases, as with any dead relay).
pub(crate) const SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the control topic's metadata may take to arrive.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a leaving client serves its revocation before it is closed anyway.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(5);

impl Membership {
    /// The control topic's partitions, asked of the brokers.
    pub(crate) async fn partitions(&self) -> Result<i32, super::FleetError> {
        let failed = |reason: String| super::FleetError::ControlTopic { topic: self.topic.clone(), reason };
        let client: BaseConsumer = self.config().create().map_err(|e| failed(e.to_string()))?;
        let topic = self.topic.clone();
        // librdkafka's metadata request blocks: off the runtime's workers.
        let asked = tokio::task::spawn_blocking(move || {
            let metadata =
                client.fetch_metadata(Some(&topic), METADATA_TIMEOUT).map_err(|e| e.to_string())?;
            match metadata.topics().iter().find(|t| t.name() == topic) {
                Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
                    Ok(i32::try_from(t.partitions().len()).unwrap_or(i32::MAX))
                }
                Some(t) => Err(t.error().map_or_else(
                    || "it has no partitions".to_owned(),
                    |e| format!("{:?}", rdkafka::error::RDKafkaErrorCode::from(e)),
                )),
                None => Err("no such topic".to_owned()),
            }
        })
        .await;
        asked.map_err(|e| failed(e.to_string()))?.map_err(failed)
    }

    fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (key, value) in &self.options {
            config.set(key, value);
        }
        config.set("bootstrap.servers", &self.brokers);
        config
    }

    /// A new client, subscribed to the control topic, that publishes what it holds on `owned`.
    pub(crate) fn join(&self, owned: watch::Sender<BTreeSet<i32>>) -> Result<Arc<GroupClient>, KafkaError> {
        let mut config = self.config();
        config
            .set("group.id", &self.group)
            .set("client.id", join_ordered_client_id())
            .set("partition.assignment.strategy", "range")
            .set("session.timeout.ms", SESSION_TIMEOUT.as_millis().to_string())
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "latest");
        let holder = Holder { topic: self.topic.clone(), owned, formed: AtomicBool::new(false) };
        let client: GroupClient = config.create_with_context(holder)?;
        client.subscribe(&[&self.topic])?;
        Ok(Arc::new(client))
    }
}

/// A client id that sorts after every earlier relay's: the time it is made, in milliseconds,
/// padded so that strings order as numbers, and the process id for two made in one millisecond.
fn join_ordered_client_id() -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    format!("idempost-relay-{millis:015}-{}", std::process::id())
}

/// Keeps `client` in the group until `stop`: serves its rebalances, and on a `()` from `rejoin`
/// (partitions stranded on a member that is gone) leaves and joins again as a new member, from a
/// formed group only. Leaves the group when stopped, so that the others take its shards at once.
pub(crate) async fn hold(
    membership: Membership,
    mut client: Arc<GroupClient>,
    owned: watch::Sender<BTreeSet<i32>>,
    mut rejoin: mpsc::Receiver<()>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            () = serve(&client) => {}
            Some(()) = rejoin.recv() => {
                // Leaving a group that is forming again while leading it would leave it
                // leaderless for good (docs/design/tansu.md, "Dead group members").
                if !client.context().formed() {
                    tracing::info!("rejoin asked while the fleet's group is rebalancing; not now");
                    continue;
                }
                client = rejoined(&membership, client, &owned).await;
            }
            () = super::stopped(&mut stop) => break,
        }
    }
    leave(client).await;
    owned.send_replace(BTreeSet::new());
}

/// Serves `client`'s rebalances (they run in its polls); records are not expected, and dropped.
async fn serve(client: &GroupClient) {
    loop {
        if let Err(e) = client.recv().await {
            tracing::debug!(error = %e, "fleet group client");
        }
    }
}

/// Closes `old` (its `LeaveGroup` answered) and only then subscribes a new client, as the
/// consumer's rejoin does (`services/consumer/src/rejoin.rs`). A new client that cannot be made
/// is tried again every second: the settings made one at start.
async fn rejoined(
    membership: &Membership,
    old: Arc<GroupClient>,
    owned: &watch::Sender<BTreeSet<i32>>,
) -> Arc<GroupClient> {
    tracing::warn!("leaving the fleet's group and joining it again as a new member");
    leave(old).await;
    loop {
        match membership.join(owned.clone()) {
            Ok(fresh) => return fresh,
            Err(e) => {
                tracing::error!(error = %e, "cannot join the fleet's group again; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Unsubscribes and serves the revocation until the partitions are given up (bounded), then
/// closes the client off the runtime's workers (librdkafka's close blocks until the broker
/// answered its `LeaveGroup`).
pub(crate) async fn leave(client: Arc<GroupClient>) {
    client.unsubscribe();
    let deadline = tokio::time::Instant::now() + LEAVE_TIMEOUT;
    while client.assignment().is_ok_and(|held| held.count() > 0) && tokio::time::Instant::now() < deadline {
        let _ = tokio::time::timeout(Duration::from_millis(100), client.recv()).await;
    }
    let mut client = client;
    loop {
        match Arc::try_unwrap(client) {
            Ok(alone) => {
                let _ = tokio::task::spawn_blocking(move || drop(alone)).await;
                return;
            }
            // Whoever else held it (nobody should) lets go within the same bound.
            Err(shared) if tokio::time::Instant::now() < deadline => {
                client = shared;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => {
                tracing::warn!("the fleet's group client is still in use; it is closed when let go");
                return;
            }
        }
    }
}

/// A group client's context: after each rebalance, the partitions it holds go on `owned`.
#[derive(Debug)]
pub(crate) struct Holder {
    topic: String,
    owned: watch::Sender<BTreeSet<i32>>,
    /// Between an assignment and the next revocation: the group was formed when it last synced.
    formed: AtomicBool,
}

impl Holder {
    /// Whether the group was formed when this client last heard from it.
    pub(crate) fn formed(&self) -> bool {
        self.formed.load(Ordering::Relaxed)
    }

    fn publish(&self, held: BTreeSet<i32>) {
        self.owned.send_if_modified(|owned| {
            let changed = *owned != held;
            *owned = held;
            changed
        });
    }

    fn partitions(&self, list: &rdkafka::TopicPartitionList) -> BTreeSet<i32> {
        list.elements_for_topic(&self.topic)
            .iter()
            .map(rdkafka::topic_partition_list::TopicPartitionListElem::partition)
            .collect()
    }
}

impl ClientContext for Holder {}

impl ConsumerContext for Holder {
    /// A revocation only marks the group as rebalancing: the eager protocol revokes everything
    /// before every assignment, and stopping each shard only to start most of them again would
    /// move work for nothing. What the next assignment no longer holds is stopped then.
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(_) = rebalance {
            self.formed.store(false, Ordering::Relaxed);
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(_) => {
                self.formed.store(true, Ordering::Relaxed);
                match consumer.assignment() {
                    Ok(held) => self.publish(self.partitions(&held)),
                    Err(e) => tracing::warn!(error = %e, "cannot read the fleet group client's assignment"),
                }
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::warn!(error = %e, "fleet group rebalance failed"),
        }
    }
}
