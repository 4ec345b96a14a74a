//! Where a service's Kafka is, and the librdkafka options passed through to its client.

use std::path::PathBuf;

use crate::contract::DEFAULT_TOPIC;
use crate::secret::{self, SecretError};

pub use self::stalls::{Look, STRANDED_MARGIN, Stalls};

mod stalls;

/// The brokers, the topic and the pass-through client options of a service that talks to Kafka
/// (the relay produces, the consumer consumes; the order service has no Kafka).
///
/// Flattened into each such service's settings, so both take the same flags and environment
/// variables and read the options file the same way. What the topic and the options are for
/// differs per service: each says so in the help of `--topic` and `--kafka-option` (ids `topic`
/// and `kafka_options`), which it sets with `#[command(mut_args(…))]`.
#[derive(Debug, Clone, clap::Args)]
pub struct KafkaSettings {
    /// Kafka bootstrap servers, comma-separated host:port.
    #[arg(long, env = "IDEMPOST_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub brokers: String,

    /// The topic of the order events.
    #[arg(long, env = "IDEMPOST_TOPIC", default_value = DEFAULT_TOPIC)]
    pub topic: String,

    /// librdkafka client options passed through as KEY=VALUE (SASL, TLS, ...): repeat the flag,
    /// one option each (a value may contain commas); in the environment variable, one option per
    /// line.
    #[arg(
        id = "kafka_options",
        long = "kafka-option",
        value_name = "KAFKA_OPTIONS",
        env = "IDEMPOST_KAFKA_OPTIONS",
        value_delimiter = '\n',
        value_parser = crate::startup::parse_key_value
    )]
    pub options: Vec<(String, String)>,

    /// File of librdkafka options, one KEY=VALUE a line (`#` starts a comment line), read after
    /// `--kafka-option`: the place for `sasl.password` and other secrets.
    #[arg(
        id = "kafka_option_file",
        long = "kafka-option-file",
        value_name = "KAFKA_OPTION_FILE",
        env = "IDEMPOST_KAFKA_OPTION_FILE"
    )]
    pub option_file: Option<PathBuf>,
}

impl KafkaSettings {
    /// The brokers at `brokers`, the default topic, no options.
    pub fn new(brokers: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            topic: DEFAULT_TOPIC.to_owned(),
            options: Vec::new(),
            option_file: None,
        }
    }

    /// Adds the options of `option_file`, when one was given, after those given inline: an
    /// option in the file overrides the same key given inline.
    pub fn read_option_file(&mut self) -> Result<(), SecretError> {
        self.options = secret::kafka_options(&self.options, self.option_file.take().as_deref())?;
        Ok(())
    }
}
