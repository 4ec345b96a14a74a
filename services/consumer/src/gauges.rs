//! The consumer's periodic gauges for operators' dashboards and alerts: how far its group is
//! behind on the topic, and how many of its events are parked.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use sea_orm::{
    ColumnTrait as _, DatabaseConnection, EntityTrait as _, PaginatorTrait as _, QueryFilter as _,
};
use tokio::sync::watch;

use super::worker::CommitOnRevoke;
use idempost::entity::parked_event;
use idempost::telemetry::metrics;

/// How often the gauges are read: each read asks the broker for every partition's end.
const EVERY: Duration = Duration::from_secs(5);

/// How long one broker query may take.
const BROKER_TIMEOUT: Duration = Duration::from_secs(2);

/// The group's position on the topic: records not yet committed, and the committed offsets' sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupLag {
    pub(crate) records: i64,
    pub(crate) committed: i64,
}

/// One partition of the topic as the group sees it: where it ends, and the group's committed
/// position in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartitionPosition {
    pub(crate) partition: i32,
    /// The committed offset, or the partition's low watermark when nothing is committed yet (the
    /// group starts at the beginning).
    pub(crate) committed: i64,
    /// The high watermark.
    pub(crate) end: i64,
}

impl PartitionPosition {
    /// Records not yet committed.
    pub(crate) fn lag(&self) -> i64 {
        (self.end - self.committed).max(0)
    }
}

/// Every partition of `topic` as the group sees it. Blocks on the broker: call it off the
/// runtime's workers.
pub(crate) fn partition_positions(
    consumer: &StreamConsumer<CommitOnRevoke>,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<PartitionPosition>, KafkaError> {
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    let mut list = TopicPartitionList::new();
    for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
        list.add_partition(topic, partition.id());
    }
    let committed = consumer.committed_offsets(list, timeout)?;
    let mut positions = Vec::with_capacity(committed.count());
    for element in committed.elements() {
        let (low, high) = consumer.fetch_watermarks(topic, element.partition(), timeout)?;
        let committed = match element.offset() {
            Offset::Offset(offset) => offset,
            _ => low,
        };
        positions.push(PartitionPosition { partition: element.partition(), committed, end: high });
    }
    Ok(positions)
}

/// The group's lag over every partition of `topic`: each partition's high watermark less the
/// group's committed offset (its low watermark when nothing is committed yet). Blocks on the
/// broker: call it off the runtime's workers.
pub(crate) fn group_lag(
    consumer: &StreamConsumer<CommitOnRevoke>,
    topic: &str,
    timeout: Duration,
) -> Result<GroupLag, KafkaError> {
    let positions = partition_positions(consumer, topic, timeout)?;
    Ok(GroupLag {
        records: positions.iter().map(PartitionPosition::lag).sum(),
        committed: positions.iter().map(|p| p.committed).sum(),
    })
}

/// What the gauges read.
pub(crate) struct Sources {
    pub(crate) current: watch::Receiver<Arc<StreamConsumer<CommitOnRevoke>>>,
    pub(crate) db: DatabaseConnection,
    pub(crate) topic: String,
    pub(crate) consumer_name: String,
}

/// Records `idempost.consumer.lag` and `idempost.consumer.parked` every [`EVERY`] until `stop`.
/// A read that fails leaves the last value (and says so at debug level): the broker and database
/// health checks report outages.
pub(crate) async fn report(sources: Sources, mut stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        let consumer = Arc::clone(&sources.current.borrow());
        let topic = sources.topic.clone();
        let lag = tokio::task::spawn_blocking(move || group_lag(&consumer, &topic, BROKER_TIMEOUT)).await;
        match lag {
            Ok(Ok(lag)) => metrics().consumer_lag.record(u64::try_from(lag.records).unwrap_or(0), &[]),
            Ok(Err(e)) => tracing::debug!(error = %e, "consumer lag not read"),
            Err(e) => tracing::debug!(error = %e, "consumer lag not read"),
        }
        let parked = parked_event::Entity::find()
            .filter(parked_event::Column::ConsumerName.eq(sources.consumer_name.as_str()))
            .count(&sources.db)
            .await;
        match parked {
            Ok(parked) => metrics().consumer_parked.record(parked, &[]),
            Err(e) => tracing::debug!(error = %e, "parked events not counted"),
        }
        tokio::select! {
            () = tokio::time::sleep(EVERY) => {}
            changed = stop.changed() => if changed.is_err() { break },
        }
    }
}
