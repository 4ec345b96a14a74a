//! Topic names and topics: a fresh topic per test or run, created through the Kafka admin API
//! (any Kafka-protocol broker).

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

/// A topic name no other test or run uses: `prefix-<uuid>`.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Creates `topic` with `partitions` partitions on `brokers` with the admin API.
pub async fn create(brokers: &str, topic: &str, partitions: i32) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers).create().map_err(|e| e.to_string())?;
    let results = admin
        .create_topics(&[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))], &AdminOptions::new())
        .await
        .map_err(|e| e.to_string())?;
    results.into_iter().try_for_each(|r| r.map(|_| ()).map_err(|(t, e)| format!("create topic {t}: {e}")))
}
