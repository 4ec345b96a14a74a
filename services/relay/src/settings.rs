use std::net::SocketAddr;
use std::time::Duration;

use idempost::db::DatabaseSettings;
use idempost::kafka::KafkaSettings;

use crate::publisher::CloudEventsMode;

/// The relay's settings, from flags or the environment (flags win).
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "idempost-relay",
    version,
    about = "Idempost relay: publishes outbox events to Kafka under a lease",
    mut_args(shared_settings)
)]
pub struct Settings {
    /// What to do; without a command the relay runs.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// The database holding the outbox (`--database-url`, or `--database-url-file`).
    #[command(flatten)]
    pub database: DatabaseSettings,

    /// Shard map (JSON, the order service's): one relay fleet serves every shard of it, each
    /// shard relayed by the one relay its partition of `--control-topic` (required to run) is
    /// assigned to; instead of `--database-url`. SIGHUP rereads it. `redrive` looks for the event
    /// on every shard of it and redrives it on the one that holds it. Format and rules: the
    /// operations guide's "Shards" section.
    #[arg(long, global = true, env = "IDEMPOST_SHARD_MAP_FILE", conflicts_with_all = ["database_url", "database_url_file"])]
    pub shard_map_file: Option<std::path::PathBuf>,

    /// With `--shard-map-file`: the fleet's control topic, created by the operator with one
    /// partition per shard number (partition n is the shard numbered n), so more partitions than
    /// the highest number; shards are handed to relays by assigning its partitions.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_CONTROL_TOPIC", requires = "shard_map_file")]
    pub control_topic: Option<String>,

    /// With `--shard-map-file`: the consumer group the fleet's relays join on the control topic.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_FLEET_GROUP", default_value = "idempost-relay-fleet")]
    pub fleet_group: String,

    /// Most database connections the relay holds (per shard it serves, in a fleet).
    #[arg(long, global = true, env = "IDEMPOST_DB_MAX_CONNECTIONS", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) db_max_connections: u32,

    /// The brokers, the topic and the producer's pass-through options.
    #[command(flatten)]
    pub kafka: KafkaSettings,

    /// Batches one relay works on at once: while one batch awaits the broker's confirms,
    /// another is claimed or marked. Events of different batches may reach the topic in either
    /// order, as with several relays.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_WORKERS", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub workers: u16,

    /// Kafka producers one relay publishes through, each holding one batch at a time on a
    /// connection of its own (at most `--workers` of them are used): with two, two batches are
    /// with the broker at once, as with two relays. Worth it only where the broker has time to
    /// spare between one relay's batches; on a busy broker it was slower.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_PRODUCERS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub producers: u16,

    /// Most events one claim takes. Claims start small and grow toward this while a backlog
    /// exists and steps stay well inside the lease budget; they shrink again when idle.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_BATCH_SIZE", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub batch_size: u64,

    /// How long a claimed event is leased; it is claimable again after that. At least twice
    /// `--delivery-timeout` + 2 s + `--lease-margin` (checked at start): the producer may still
    /// send a record up to a delivery timeout after the step's hand-over ended.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub lease: Duration,

    /// Longest a batch's claim and queue wait may take before its records are handed to the
    /// producer (a batch not handed over by then is released unsent), and librdkafka's
    /// `delivery.timeout.ms` for each record after it got it. A record handed over is released
    /// only once the producer gave its verdict; one still without a verdict a second after both
    /// timeouts is left to its lease.
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

    /// How far behind the newest event it claimed a relay's claims read (MariaDB/MySQL and
    /// PostgreSQL), and how long after their end expired leases are looked for: claims then pass
    /// only the dead index entries of this span, not all that a held snapshot keeps. Cover the
    /// order service's transactions (their `created_at` is taken before they commit); a row
    /// committed later, or left behind for any other reason, waits for the sweep.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_CLAIM_LOOKBACK", default_value = "5s", value_parser = humantime::parse_duration)]
    pub claim_lookback: Duration,

    /// How often a plain read over the whole due and expired ranges looks for claimable events
    /// behind where the claims read (a retry, a late commit, a redrive), so that the next claim
    /// takes them; off the claim path. Counted in `idempost.relay.claim_sweep_finds`.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_CLAIM_SWEEP_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub claim_sweep_interval: Duration,

    /// Longest wait between polls of an empty outbox.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_MAX_IDLE_POLL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub max_idle_poll: Duration,

    /// Address of the gRPC health endpoint; port 0 picks a free port.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_LISTEN", default_value = "127.0.0.1:50052")]
    pub listen: SocketAddr,

    /// Address of the Prometheus `/metrics` listener (HTTP/1.1; TLS, plaintext policy and
    /// connection bounds as the gRPC listeners); port 0 picks a free port. Off when unset.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Health reports NOT_SERVING when nothing was published for this long while an event has
    /// waited this long.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_PUBLISH_STALL", default_value = "60s", value_parser = humantime::parse_duration)]
    pub publish_stall: Duration,

    /// UDP address for wake-ups from the order service (its `--wake-relays`): an idle relay
    /// polls at once instead of after its back-off. Off when unset; polling alone stays correct.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_WAKE_LISTEN")]
    pub(crate) wake_listen: Option<SocketAddr>,

    /// How each record carries the CloudEvents 1.0 attributes: `binary` (the value is the protobuf
    /// payload, the attributes are `ce_*` headers) or `structured` (the value is the
    /// `application/cloudevents+json` envelope with the payload in `data_base64`). The consumer
    /// reads both; the project's own headers are written in both.
    #[arg(long, global = true, env = "IDEMPOST_RELAY_CLOUDEVENTS_MODE", value_enum, default_value_t = CloudEventsMode::Binary)]
    pub cloudevents_mode: CloudEventsMode,

    /// In binary mode, also write the project's own headers that a `ce_*` header repeats
    /// (`event_id` = `ce_id`, `event_type` = `ce_type`, `aggregate_id` = `ce_subject`,
    /// `traceparent` and `tracestate` = `ce_traceparent` and `ce_tracestate`), for readers older
    /// than the CloudEvents headers. The consumer and the clients read either; turn it off once
    /// every reader is upgraded: a broker may pay for every header (Tansu 0.6 stores each as a
    /// row of its own).
    #[arg(long, global = true, env = "IDEMPOST_RELAY_LEGACY_HEADERS", default_value_t = true, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub legacy_headers: bool,

    /// Once every listener is bound, the service writes `name=address` lines to this file, one
    /// per listener (`listen`, and `wake-listen` and `metrics-listen` when set), through a temporary file renamed into place: how whoever
    /// started it on port 0 learns which ports it got.
    #[arg(long, global = true, env = "IDEMPOST_PORT_FILE")]
    pub(crate) port_file: Option<std::path::PathBuf>,

    /// TLS, plaintext policy and load bounds of the health listener.
    #[command(flatten)]
    pub(crate) security: idempost::security::ListenerSettings,
}

/// The shared database and Kafka settings as the relay takes them: global like all of its own
/// (but the health listener's), so that they may follow a subcommand (`idempost-relay redrive …
/// --database-url …`), and with help that says what each is to the relay (one paragraph without
/// a full stop, as clap shows a doc comment's). Applied in place, so the settings keep their
/// order in `--help` and on the configuration page.
fn shared_settings(arg: clap::Arg) -> clap::Arg {
    match arg.get_id().as_str() {
        "database_url" => arg.global(true).help(
            "The database holding the outbox: mysql://, postgres:// or sqlite:// URL. A URL with a password \
             belongs in `--database-url-file`: flags show in `ps`",
        ),
        "topic" => arg.global(true).help("Topic the events are published to"),
        "kafka_options" => arg.global(true).help(
            "librdkafka producer options passed through as KEY=VALUE (SASL, TLS, batching, ...): repeat the \
             flag, one option each (a value may contain commas); in the environment variable, one option per \
             line",
        ),
        "database_url_file" | "brokers" | "kafka_option_file" => arg.global(true),
        _ => arg,
    }
}

/// Operator commands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Run the relay until SIGTERM (the default).
    Run,
    /// Return a FAILED event to PENDING with its attempts reset; recorded on the row and in the
    /// admin audit (`idempostctl audit`). With `--shard-map-file`, on the one shard of the map
    /// that holds the event: every shard is asked first, and an event no shard holds, or that
    /// more than one holds, or that a shard cannot be asked about, is refused.
    Redrive {
        /// The event's id.
        event_id: String,
        /// Why the event may be published again now: recorded on the row and in the audit.
        #[arg(long)]
        reason: String,
        /// Who asks: recorded on the row and in the audit.
        #[arg(long, env = "USER", default_value = "operator")]
        requested_by: String,
    },
}

impl Settings {
    /// These settings with the database URL and the Kafka options file read, when they were
    /// given as files.
    pub(crate) fn with_secrets_read(mut self) -> Result<Self, idempost::secret::SecretError> {
        // With a shard map, each shard's URL is read when the shard is opened.
        if self.shard_map_file.is_none() {
            self.database.read_url_file()?;
        }
        self.kafka.read_option_file()?;
        Ok(self)
    }

    /// Settings for `database_url` and `brokers` with every other value at its default and an
    /// OS-chosen health port.
    pub fn new(database_url: impl Into<String>, brokers: impl Into<String>) -> Self {
        Self {
            command: None,
            database: DatabaseSettings::new(database_url),
            shard_map_file: None,
            control_topic: None,
            fleet_group: "idempost-relay-fleet".to_owned(),
            db_max_connections: 4,
            kafka: KafkaSettings::new(brokers),
            workers: 2,
            producers: 1,
            batch_size: 500,
            lease: Duration::from_secs(30),
            delivery_timeout: Duration::from_secs(10),
            lease_margin: Duration::from_secs(5),
            max_attempts: 12,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(300),
            max_idle_poll: Duration::from_secs(1),
            claim_lookback: Duration::from_secs(5),
            claim_sweep_interval: Duration::from_secs(10),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_listen: None,
            publish_stall: Duration::from_secs(60),
            security: idempost::security::ListenerSettings::default(),
            wake_listen: None,
            cloudevents_mode: CloudEventsMode::Binary,
            legacy_headers: true,
            port_file: None,
        }
    }
}
