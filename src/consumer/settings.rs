use std::net::SocketAddr;
use std::time::Duration;

use super::DEFAULT_CONSUMER_NAME;
use crate::relay::DEFAULT_TOPIC;

/// The consumer's settings, from flags or the environment (flags win).
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "outpost-consumer",
    version,
    about = "Outpost consumer: one notification job per OrderAccepted event"
)]
pub struct Settings {
    /// The consumer's own database: mysql://, postgres:// or sqlite:// URL.
    #[arg(long, env = "OUTPOST_DATABASE_URL")]
    pub database_url: String,

    /// Most database connections the consumer holds.
    #[arg(long, env = "OUTPOST_DB_MAX_CONNECTIONS", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub db_max_connections: u32,

    /// Kafka bootstrap servers, comma-separated host:port.
    #[arg(long, env = "OUTPOST_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub brokers: String,

    /// Topic to consume.
    #[arg(long, env = "OUTPOST_TOPIC", default_value = DEFAULT_TOPIC)]
    pub topic: String,

    /// The dedup identity: `consumed_event.consumer_name`. Two consumers with different names
    /// each handle every event once.
    #[arg(long, env = "OUTPOST_CONSUMER_NAME", default_value = DEFAULT_CONSUMER_NAME)]
    pub consumer_name: String,

    /// Kafka consumer group; defaults to the consumer name.
    #[arg(long, env = "OUTPOST_CONSUMER_GROUP")]
    pub group_id: Option<String>,

    /// librdkafka consumer options passed through as KEY=VALUE (SASL, TLS, session timeouts, ...);
    /// repeat the flag, or separate pairs with commas in the environment variable.
    #[arg(long = "kafka-option", env = "OUTPOST_KAFKA_OPTIONS", value_delimiter = ',', value_parser = crate::startup::parse_key_value)]
    pub kafka_options: Vec<(String, String)>,

    /// Most records handled in one transaction: those already fetched, never waiting for more.
    #[arg(long, env = "OUTPOST_CONSUMER_BATCH_SIZE", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub batch_size: u16,

    /// Longest wait between retries of a record whose handling failed.
    #[arg(long, env = "OUTPOST_CONSUMER_BACKOFF_MAX", default_value = "30s", value_parser = humantime::parse_duration)]
    pub backoff_max: Duration,

    /// How long the record in hand may take to finish after SIGTERM.
    #[arg(long, env = "OUTPOST_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,

    /// Address of the gRPC health endpoint; port 0 picks a free port.
    #[arg(long, env = "OUTPOST_CONSUMER_LISTEN", default_value = "127.0.0.1:50053")]
    pub listen: SocketAddr,

    /// TLS, plaintext policy and load bounds of the health listener.
    #[command(flatten)]
    pub security: crate::security::ListenerSettings,
}

impl Settings {
    /// Settings for `database_url` and `brokers` with every other value at its default and an
    /// OS-chosen health port.
    pub fn new(database_url: impl Into<String>, brokers: impl Into<String>) -> Self {
        Self {
            database_url: database_url.into(),
            db_max_connections: 4,
            brokers: brokers.into(),
            topic: DEFAULT_TOPIC.to_owned(),
            consumer_name: DEFAULT_CONSUMER_NAME.to_owned(),
            group_id: None,
            kafka_options: Vec::new(),
            batch_size: 64,
            backoff_max: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            security: crate::security::ListenerSettings::default(),
        }
    }

    /// The consumer group: `group_id`, or the consumer name.
    pub fn group(&self) -> &str {
        self.group_id.as_deref().unwrap_or(&self.consumer_name)
    }
}
