//! The demo's embedded broker: librdkafka's mock cluster, reachable over TCP by other
//! processes. Prints its bootstrap address on the first line of stdout and runs until SIGTERM.
//!
//! For the demo only. Tests always use a real broker.
#![allow(clippy::expect_used)] // a demo tool: failing loudly is the point

use rdkafka::mocking::MockCluster;

#[tokio::main]
async fn main() {
    let topic = std::env::args().nth(1).unwrap_or_else(|| idempost::contract::DEFAULT_TOPIC.to_owned());
    let cluster = MockCluster::new(1).expect("start the mock cluster");
    cluster.create_topic(&topic, 3, 1).expect("create the topic");
    println!("{}", cluster.bootstrap_servers());
    idempost::shutdown::signal().await;
}
