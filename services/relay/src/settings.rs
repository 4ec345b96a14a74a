use std::net::SocketAddr;
use std::time::Duration;

use idempost::contract::DEFAULT_TOPIC;

/// The relay's settings, from flags or the environment (flags win).
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "idempost-relay",
    version,
    about = "Idempost relay: publishes outbox events to Kafka under a lease"
)]
pub struct Settings {
    /// What to do; without a command the relay runs.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// The database holding the outbox: mysql://, postgres:// or sqlite:// URL. A URL with a
    /// password belongs in `--database-url-file`: flags show in `ps`.
    #[arg(long, global = true, env = "IDEMPOST_DATABASE_URL", default_value = "", hide_default_value = true)]
    pub database_url: String,

    /// File holding the database URL (instead of `--database-url`), such as a mounted secret.
    #[arg(long, global = true, env = "IDEMPOST_DATABASE_URL_FILE")]
    pub(crate) database_url_file: Option<std::path::PathBuf>,

    /// Most database connections the relay holds.
    #[arg(long, global = true, env = "IDEMPOST_DB_MAX_CONNECTIONS", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) db_max_connections: u32,

    /// Kafka bootstrap servers, comma-separated host:port.
    #[arg(long, global = true, env = "IDEMPOST_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub brokers: String,

    /// Topic the events are published to.
    #[arg(long, global = true, env = "IDEMPOST_TOPIC", default_value = DEFAULT_TOPIC)]
    pub topic: String,

    /// librdkafka producer options passed through as KEY=VALUE (SASL, TLS, batching, ...):
    /// repeat the flag, one option each (a value may contain commas); in the environment
    /// variable, one option per line.
    #[arg(long = "kafka-option", global = true, env = "IDEMPOST_KAFKA_OPTIONS", value_delimiter = '\n', value_parser = idempost::startup::parse_key_value)]
    pub kafka_options: Vec<(String, String)>,

    /// File of librdkafka options, one KEY=VALUE a line (`#` starts a comment line), read after
    /// `--kafka-option`: the place for `sasl.password` and other secrets.
    #[arg(long, global = true, env = "IDEMPOST_KAFKA_OPTION_FILE")]
    pub(crate) kafka_option_file: Option<std::path::PathBuf>,

    /// Batches one relay works on at once: while one batch awaits the broker's confirms,
    /// another is claimed or marked. Events of different batches may reach the topic in either
    /// order, as with several relays.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_WORKERS", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub workers: u16,

    /// Most events one claim takes. Claims start small and grow toward this while a backlog
    /// exists and steps stay well inside the lease budget; they shrink again when idle.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_BATCH_SIZE", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub batch_size: u64,

    /// How long a claimed event is leased; it is claimable again after that.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub lease: Duration,

    /// Longest the publishing of a batch may take, queue wait included, before a record counts as
    /// failed (also librdkafka's delivery.timeout.ms).
    #[arg(long, global = true, env = "IDEMPOST_RELAY_DELIVERY_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub delivery_timeout: Duration,

    /// Time the lease keeps to spare after a step (publishing, marks and releases) has ended.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_LEASE_MARGIN", default_value = "5s", value_parser = humantime::parse_duration)]
    pub lease_margin: Duration,

    /// Claims after which a failed publish moves the event to FAILED.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_MAX_ATTEMPTS", default_value_t = 12, value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub max_attempts: i32,

    /// Backoff after the first failed publish; doubles per attempt, with jitter.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_BACKOFF_BASE", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub backoff_base: Duration,

    /// Longest backoff between attempts.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_BACKOFF_MAX", default_value = "5m", value_parser = humantime::parse_duration)]
    pub backoff_max: Duration,

    /// Longest wait between polls of an empty outbox.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_MAX_IDLE_POLL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub max_idle_poll: Duration,

    /// Address of the gRPC health endpoint; port 0 picks a free port.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_LISTEN", default_value = "127.0.0.1:50052")]
    pub listen: SocketAddr,

    /// Health reports NOT_SERVING when nothing was published for this long while an event has
    /// waited this long.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_PUBLISH_STALL", default_value = "60s", value_parser = humantime::parse_duration)]
    pub publish_stall: Duration,

    /// UDP address for wake-ups from the order service (its `--wake-relays`): an idle relay
    /// polls at once instead of after its back-off. Off when unset; polling alone stays correct.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_WAKE_LISTEN")]
    pub(crate) wake_listen: Option<SocketAddr>,

    /// Once every listener is bound, the service writes `name=address` lines to this file, one
    /// per listener (`listen`, and `wake-listen` when set), through a temporary file renamed into place: how whoever
    /// started it on port 0 learns which ports it got.
    #[arg(long, global = true, env = "IDEMPOST_PORT_FILE")]
    pub(crate) port_file: Option<std::path::PathBuf>,

    /// TLS, plaintext policy and load bounds of the health listener.
    #[command(flatten)]
    pub(crate) security: idempost::security::ListenerSettings,
}

/// Operator commands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Run the relay until SIGTERM (the default).
    Run,
    /// Return a FAILED event to PENDING with its attempts reset; recorded on the row.
    Redrive {
        /// The event's id.
        event_id: String,
        /// Why the event may be published again now: recorded on the row.
        #[arg(long)]
        reason: String,
        /// Who asks: recorded on the row.
        #[arg(long, env = "USER", default_value = "operator")]
        requested_by: String,
    },
}

impl Settings {
    /// These settings with the database URL read from `database_url_file`, when that is how it
    /// was given, and the options of `kafka_option_file` added to `kafka_options`.
    pub(crate) fn with_secrets_read(mut self) -> Result<Self, idempost::secret::SecretError> {
        self.database_url =
            idempost::secret::database_url(&self.database_url, self.database_url_file.take().as_deref())?;
        self.kafka_options =
            idempost::secret::kafka_options(&self.kafka_options, self.kafka_option_file.take().as_deref())?;
        Ok(self)
    }

    /// Settings for `database_url` and `brokers` with every other value at its default and an
    /// OS-chosen health port.
    pub fn new(database_url: impl Into<String>, brokers: impl Into<String>) -> Self {
        Self {
            command: None,
            database_url: database_url.into(),
            database_url_file: None,
            db_max_connections: 4,
            brokers: brokers.into(),
            topic: DEFAULT_TOPIC.to_owned(),
            kafka_options: Vec::new(),
            kafka_option_file: None,
            workers: 2,
            batch_size: 500,
            lease: Duration::from_secs(30),
            delivery_timeout: Duration::from_secs(10),
            lease_margin: Duration::from_secs(5),
            max_attempts: 12,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(300),
            max_idle_poll: Duration::from_secs(1),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            publish_stall: Duration::from_secs(60),
            security: idempost::security::ListenerSettings::default(),
            wake_listen: None,
            port_file: None,
        }
    }
}
