//! A real Kafka-protocol broker (Tansu, SQLite storage) per test, and a reader that counts a
//! topic's records by consuming them.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::ports::free_port;
use crate::process::Guard;

/// A Tansu broker on its own port and storage file, killed when dropped.
#[derive(Debug)]
pub struct TestBroker {
    // First, so it is killed before its storage directory goes.
    child: Option<Guard>,
    port: u16,
    dir: tempfile::TempDir,
}

fn tansu() -> String {
    std::env::var("IDEMPOST_TANSU").unwrap_or_else(|_| "tansu".to_owned())
}

impl TestBroker {
    /// Starts a broker on a free port (Tansu cannot bind port 0 and say which port it got).
    pub async fn start() -> Self {
        let mut broker = Self::reserve();
        broker.run().await;
        broker
    }

    /// A broker with its port and storage chosen but not running: its address refuses
    /// connections until [`TestBroker::run`].
    pub fn reserve() -> Self {
        Self { port: free_port(), dir: tempfile::tempdir().unwrap(), child: None }
    }

    /// `127.0.0.1:port`, for `bootstrap.servers`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts (or restarts) the broker on its port with its storage.
    pub async fn run(&mut self) {
        assert!(self.child.is_none(), "broker already running");
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let child = Guard::spawn(
            Command::new(tansu())
                .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
                .args(["--storage-engine", "sqlite://broker.db"])
                .current_dir(self.dir.path())
                .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
                .stdout(Stdio::null())
                .stderr(self.log_sink()),
        )
        .unwrap_or_else(|e| panic!("cannot start `{}` (scripts/test installs it): {e}", tansu()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "broker did not listen on {}{}", self.port, self.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The index Tansu 0.6 lacks: without it every fetched record scans all stored headers.
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/tansu-index");
        let output = tokio::process::Command::new(&script)
            .arg(self.dir.path().join("broker.db"))
            .output()
            .await
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    }

    /// Where the broker writes what it says: the terminal under `TEST_LOG`, otherwise a file
    /// in its directory (appended across restarts) that a failed assertion prints.
    fn log_sink(&self) -> Stdio {
        if std::env::var_os("TEST_LOG").is_some() {
            return Stdio::inherit();
        }
        let file =
            std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("broker.log"));
        file.map_or_else(|_| Stdio::null(), Stdio::from)
    }

    /// The end of the broker's log, for a failure message.
    fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(40)..];
        format!("\n--- the broker's log, last {} lines ---\n{}", tail.len(), tail.join("\n"))
    }

    /// Kills the broker with SIGKILL; its storage stays for a restart.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }

    /// Creates `name` with `partitions` partitions with Tansu's own command.
    pub async fn create_topic(&self, name: &str, partitions: u32) {
        let output = tokio::process::Command::new(tansu())
            .args(["topic", "create", name, "--partitions", &partitions.to_string()])
            .args(["--broker", &format!("tcp://127.0.0.1:{}", self.port)])
            .output()
            .await
            .unwrap();
        assert!(
            output.status.success(),
            "tansu topic create {name} failed: {}{}",
            String::from_utf8_lossy(&output.stderr),
            self.log()
        );
    }
}

/// One consumed record.
#[derive(Debug, Clone)]
pub struct Record {
    /// The record's key.
    pub key: Vec<u8>,
    /// The record's value.
    pub value: Vec<u8>,
    /// Its headers, values as (lossy) text.
    pub headers: HashMap<String, String>,
    /// Where it is on the topic.
    pub partition: i32,
    /// Its offset in the partition.
    pub offset: i64,
    /// Its timestamp in milliseconds since the epoch, when it has one: for a relay's record,
    /// when librdkafka was handed it.
    pub timestamp_ms: Option<i64>,
}

impl Record {
    /// The header called `name`, or "" when absent.
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", String::as_str)
    }
}

/// Reads `topic` from the beginning with a fresh consumer group until at least `at_least`
/// records arrived, then keeps reading for `settle` to catch any extra copies. Panics if
/// `at_least` records do not arrive within `timeout`.
pub async fn read_topic(
    brokers: &str,
    topic: &str,
    at_least: usize,
    timeout: Duration,
    settle: Duration,
) -> Vec<Record> {
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || read_topic_blocking(&brokers, &topic, at_least, timeout, settle))
        .await
        .unwrap()
}

fn read_topic_blocking(
    brokers: &str,
    topic: &str,
    at_least: usize,
    timeout: Duration,
    settle: Duration,
) -> Vec<Record> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("idempost-test-reader-{}", uuid::Uuid::new_v4()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut records = Vec::new();
    let deadline = Instant::now() + timeout;
    let mut settle_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if settle_until.is_some_and(|until| now >= until) {
            return records;
        }
        assert!(
            settle_until.is_some() || now < deadline,
            "only {} of {at_least} records arrived on {topic} within {timeout:?}",
            records.len()
        );
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            let message = message.unwrap();
            let headers = message
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| {
                            (
                                h.key.to_owned(),
                                String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            records.push(Record {
                key: message.key().unwrap_or_default().to_vec(),
                value: message.payload().unwrap_or_default().to_vec(),
                headers,
                partition: message.partition(),
                offset: message.offset(),
                timestamp_ms: message.timestamp().to_millis(),
            });
        }
        if settle_until.is_none() && records.len() >= at_least {
            settle_until = Some(Instant::now() + settle);
        }
    }
}

/// Produces one OrderAccepted-typed record to `topic`, with an `event_id` header when given, as
/// a relay (or anyone who can write to the topic) would.
pub async fn produce(brokers: &str, topic: &str, key: &str, payload: &[u8], event_id: Option<&str>) {
    let producer: FutureProducer = ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    let mut headers =
        OwnedHeaders::new().insert(Header { key: "event_type", value: Some("idempost.v1.OrderAccepted") });
    if let Some(event_id) = event_id {
        headers = headers.insert(Header { key: "event_id", value: Some(event_id) });
    }
    let record = FutureRecord::to(topic).key(key).payload(payload).headers(headers);
    producer.send(record, Duration::from_secs(10)).await.map_err(|(e, _)| e).unwrap();
}
