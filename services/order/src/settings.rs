use std::net::SocketAddr;
use std::time::Duration;

use idempost::db::DatabaseSettings;

use super::admin::OutboxRetention;
use super::group::GroupCommitSettings;

const DAY: u64 = 24 * 3600;

/// The order service's settings, from flags or the environment (flags win).
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "idempost-order",
    version,
    about = "Idempost order service: accepts orders over gRPC",
    mut_args(shared_settings)
)]
pub struct Settings {
    /// Address the gRPC server listens on; port 0 picks a free port.
    #[arg(long, env = "IDEMPOST_ORDER_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// Address of the Prometheus `/metrics` listener (HTTP/1.1; TLS, plaintext policy and
    /// connection bounds as the gRPC listeners); port 0 picks a free port. Off when unset.
    #[arg(long, env = "IDEMPOST_ORDER_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// The database (`--database-url`, or `--database-url-file`).
    #[command(flatten)]
    pub database: DatabaseSettings,

    /// Shard map (JSON): the databases (shards) tenants' orders are split over, and which tenant
    /// is on which; instead of `--database-url`. SIGHUP rereads it. Format and rules: the
    /// operations guide's "Shards" section.
    #[arg(long, env = "IDEMPOST_SHARD_MAP_FILE", conflicts_with_all = ["database_url", "database_url_file"])]
    pub shard_map_file: Option<std::path::PathBuf>,

    /// Most database connections the service holds (per shard, with a shard map).
    #[arg(long, env = "IDEMPOST_DB_MAX_CONNECTIONS", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub db_max_connections: u32,

    /// How long in-flight calls may run after SIGTERM before the server stops anyway.
    #[arg(long, env = "IDEMPOST_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) shutdown_grace: Duration,

    /// Address the AdminService listens on (order and outbox timelines, backlog, redrive, outbox
    /// purge): keep it on an
    /// operators' network. Port 0 picks a free port.
    #[arg(long, env = "IDEMPOST_ADMIN_LISTEN", default_value = "127.0.0.1:50054")]
    pub admin_listen: SocketAddr,

    /// Once every listener is bound, the service writes `name=address` lines to this file, one
    /// per listener (`listen`, `admin-listen`, and `metrics-listen` when set), through a temporary file renamed into place: how whoever
    /// started it on port 0 learns which ports it got.
    #[arg(long, env = "IDEMPOST_PORT_FILE")]
    pub(crate) port_file: Option<std::path::PathBuf>,

    /// PUBLISHED outbox rows are deleted this long after the broker confirmed them.
    #[arg(long, env = "IDEMPOST_OUTBOX_RETENTION", default_value = "7days", value_parser = humantime::parse_duration)]
    pub outbox_retention: Duration,

    /// How often the service purges on its own; "0s" leaves purging to `idempostctl purge`.
    #[arg(long, env = "IDEMPOST_PURGE_EVERY", default_value = "1h", value_parser = humantime::parse_duration)]
    pub purge_every: Duration,

    /// Rows deleted per purge statement.
    #[arg(long, env = "IDEMPOST_PURGE_BATCH_SIZE", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub purge_batch_size: u64,

    /// Relays' wake-up addresses (their `--wake-listen`), comma-separated: after each new order
    /// commits, each gets a UDP datagram so an idle relay polls at once; commits within 5 ms of
    /// the last datagram share the next one, sent when the 5 ms are up. Best effort: a lost
    /// wake-up only means the relay finds the event at its next poll.
    #[arg(long, env = "IDEMPOST_WAKE_RELAYS", value_delimiter = ',')]
    pub(crate) wake_relays: Vec<SocketAddr>,

    /// Group commit of orders: on, the batch limit, the writers and the queue bound.
    #[command(flatten)]
    pub group_commit: GroupCommitSettings,

    /// TLS, load bounds and caller authentication of both listeners.
    #[command(flatten)]
    pub security: idempost::security::SecuritySettings,
}

/// The shared database settings with help that says what the database is to the order service
/// (one paragraph without a full stop, as clap shows a doc comment's). Applied in place, so the
/// settings keep their order in `--help` and on the configuration page.
fn shared_settings(arg: clap::Arg) -> clap::Arg {
    match arg.get_id().as_str() {
        "database_url" => arg.help(
            "The primary database: mysql://, postgres:// or sqlite:// URL. Reconcile reads from it, so it must \
             never point at a replica. A URL with a password belongs in `--database-url-file`: flags show in \
             `ps`",
        ),
        _ => arg,
    }
}

impl Settings {
    /// These settings with the database URL read from its file, when that is how it was given.
    /// With a shard map, each shard's URL is read when the shard is opened.
    pub(crate) fn with_secrets_read(mut self) -> Result<Self, idempost::secret::SecretError> {
        if self.shard_map_file.is_none() {
            self.database.read_url_file()?;
        }
        Ok(self)
    }

    /// Settings for `database_url` with every other value at its default and an OS-chosen port,
    /// except that callers are not authenticated (`--auth none`): loopback only, for tests and
    /// embedding.
    pub fn for_database(database_url: impl Into<String>) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_listen: None,
            database: DatabaseSettings::new(database_url),
            shard_map_file: None,
            db_max_connections: 16,
            shutdown_grace: Duration::from_secs(10),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            port_file: None,
            outbox_retention: Duration::from_secs(7 * DAY),
            purge_every: Duration::from_secs(3600),
            purge_batch_size: 500,
            wake_relays: Vec::new(),
            group_commit: GroupCommitSettings::default(),
            security: idempost::security::SecuritySettings::loopback(),
        }
    }

    /// The outbox's retention policy.
    pub(crate) fn retention(&self) -> OutboxRetention {
        OutboxRetention { outbox: self.outbox_retention, batch_size: self.purge_batch_size }
    }
}
