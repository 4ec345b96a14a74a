//! The three services in one test: an order service, a relay and a consumer over one fresh
//! database and one topic, each in this process, each at its defaults but for what a test needs
//! to be quick (the relay's idle poll, the consumer's group timings).

use crate::consumer::{TestConsumer, consumer_settings};
use crate::db::Backend;
use crate::order::TestOrder;
use crate::relay::{TestRelay, relay_defaults};

/// A [`TestOrder`], a [`TestRelay`] and a [`TestConsumer`] sharing one database and one topic.
#[derive(Debug)]
pub struct Pipeline {
    pub order: TestOrder,
    pub relay: TestRelay,
    pub consumer: TestConsumer,
}

impl Pipeline {
    /// The three services on a fresh `backend` database, publishing to and consuming `topic` on
    /// the broker at `brokers`, the consumer in `group`.
    pub async fn spawn(backend: Backend, brokers: &str, topic: &str, group: &str) -> Self {
        let order = TestOrder::spawn(backend).await;
        let relay = TestRelay::spawn(relay_defaults(&order.db.url, brokers, topic)).await;
        let consumer = TestConsumer::spawn(consumer_settings(&order.db.url, brokers, topic, group)).await;
        Self { order, relay, consumer }
    }

    /// Stops the consumer, the relay and the order service, as SIGTERM would, in that order.
    pub async fn stop(self) {
        self.consumer.stop().await;
        self.relay.stop().await;
        self.order.stop().await;
    }
}
