use std::net::SocketAddr;
use std::time::Duration;

/// The order service's settings, from flags or the environment (flags win).
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "outpost-order", version, about = "Outpost order service: accepts orders over gRPC")]
pub struct Settings {
    /// Address the gRPC server listens on; port 0 picks a free port.
    #[arg(long, env = "OUTPOST_ORDER_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// The primary database: mysql://, postgres:// or sqlite:// URL. Reconcile reads from it, so
    /// it must never point at a replica.
    #[arg(long, env = "OUTPOST_DATABASE_URL")]
    pub database_url: String,

    /// Most database connections the service holds.
    #[arg(long, env = "OUTPOST_DB_MAX_CONNECTIONS", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub db_max_connections: u32,

    /// How long in-flight calls may run after SIGTERM before the server stops anyway.
    #[arg(long, env = "OUTPOST_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
}

impl Settings {
    /// Settings for `database_url` with every other value at its default and an OS-chosen port.
    pub fn for_database(database_url: impl Into<String>) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            database_url: database_url.into(),
            db_max_connections: 16,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}
