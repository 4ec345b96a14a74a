//! A consumer group's committed offsets, set before its consumer first starts: a new consumer
//! name that must see only what is published from now on (the services' consumer always starts
//! a new group at the beginning of the topic, by design).

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Joins `group` on `topic`, commits every partition's end (its high watermark) as the group's
/// offsets, and leaves: a consumer of `group` started afterwards reads only later records.
/// Panics if the group does not get all `partitions` within `timeout`.
pub async fn commit_end(brokers: &str, topic: &str, group: &str, partitions: usize, timeout: Duration) {
    let (brokers, topic, group) = (brokers.to_owned(), topic.to_owned(), group.to_owned());
    tokio::task::spawn_blocking(move || commit_end_blocking(&brokers, &topic, &group, partitions, timeout))
        .await
        .unwrap();
}

fn commit_end_blocking(brokers: &str, topic: &str, group: &str, partitions: usize, timeout: Duration) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("session.timeout.ms", "6000")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let deadline = Instant::now() + timeout;
    // The assignment arrives through poll; records it returns meanwhile are not committed.
    while consumer.assignment().unwrap().count() < partitions {
        assert!(Instant::now() < deadline, "group {group} got no assignment of {topic} within {timeout:?}");
        let _ = consumer.poll(Duration::from_millis(100));
    }
    let mut ends = TopicPartitionList::new();
    for element in consumer.assignment().unwrap().elements() {
        let (_, high) =
            consumer.fetch_watermarks(element.topic(), element.partition(), Duration::from_secs(10)).unwrap();
        ends.add_partition_offset(element.topic(), element.partition(), Offset::Offset(high)).unwrap();
    }
    consumer.commit(&ends, CommitMode::Sync).unwrap();
    consumer.unsubscribe();
}
