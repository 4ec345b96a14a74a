//! Plumbing every service shares: a migrated database, a bound listener, a health endpoint.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::KeyValue;
use sea_orm::{DatabaseConnection, DbErr};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic_health::pb::health_server::{Health as HealthService, HealthServer};
use tonic_health::server::HealthReporter;
use tonic_reflection::pb::v1::server_reflection_server::{ServerReflection, ServerReflectionServer};

use crate::db::{self, SchemaError};
use crate::security::{Authenticator, Listener};
use crate::telemetry::metrics;

mod metrics_endpoint;
mod port_file;

pub use metrics_endpoint::{METRICS_PATH, MetricsListener};

/// A service could not get ready.
#[derive(Debug, thiserror::Error)]
pub enum ReadyError {
    /// The database could not be reached.
    #[error("cannot connect to the database: {0}")]
    Database(#[source] DbErr),
    /// The database is not migrated for this version.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address from the settings.
        addr: SocketAddr,
        /// Why binding failed.
        source: std::io::Error,
    },
    /// A listener's TLS or plaintext settings refused it.
    #[error(transparent)]
    Listener(#[from] crate::security::ListenerError),
    /// A secret setting (the database URL, Kafka options) could not be read from its file.
    #[error(transparent)]
    Secret(#[from] crate::secret::SecretError),
    /// The bound addresses could not be written to `--port-file`.
    #[error("cannot write the port file {path}: {source}")]
    PortFile {
        /// The file from the settings.
        path: PathBuf,
        /// Why writing failed.
        source: std::io::Error,
    },
}

/// Writes the bound `listeners` (`name=address`, one a line) to `path` when it is set: how a
/// service started on port 0 tells whoever started it which ports it got.
pub fn write_port_file(path: Option<&Path>, listeners: &[(&str, SocketAddr)]) -> Result<(), ReadyError> {
    let Some(path) = path else { return Ok(()) };
    port_file::write(path, listeners).map_err(|source| ReadyError::PortFile { path: path.to_owned(), source })
}

/// Connects to `url` and checks that every migration is applied; writes nothing.
pub async fn open_database(url: &str, max_connections: u32) -> Result<DatabaseConnection, ReadyError> {
    open_database_for(url, max_connections, db::Pool::General).await
}

/// [`open_database`], with the sessions set up for `pool`.
pub async fn open_database_for(
    url: &str,
    max_connections: u32,
    pool: db::Pool,
) -> Result<DatabaseConnection, ReadyError> {
    let db = db::connect_for(url, max_connections, pool).await.map_err(ReadyError::Database)?;
    db::ensure_migrated(&db).await?;
    Ok(db)
}

/// A pool of one connection to `url` that only health checks use: callers' calls saturating the
/// service's own pool cannot make a database that answers look down (NOT_SERVING). Connects
/// lazily, like the main pool, and again after the database comes back.
pub async fn open_health_connection(url: &str) -> Result<DatabaseConnection, ReadyError> {
    db::connect(url, 1).await.map_err(ReadyError::Database)
}

/// The largest health request decoded: a service name. Health needs no token, so a bigger
/// declared message is refused before any of it is buffered (tonic would reserve up to 4 MiB).
const MAX_HEALTH_REQUEST_BYTES: usize = 1024;

/// The largest reflection request decoded: a symbol or file name. Unauthenticated, like health.
const MAX_REFLECTION_REQUEST_BYTES: usize = 4 * 1024;

/// The `grpc.health.v1` service every listener serves, with its tiny request limit, and the
/// reporter that sets its statuses.
pub fn health_service() -> (HealthReporter, HealthServer<impl HealthService>) {
    let (reporter, server) = tonic_health::server::health_reporter();
    (reporter, server.max_decoding_message_size(MAX_HEALTH_REQUEST_BYTES))
}

/// gRPC reflection of Idempost's services and health, with its small request limit.
pub fn reflection_service()
-> Result<ServerReflectionServer<impl ServerReflection>, tonic_reflection::server::Error> {
    let server = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(idempost_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    Ok(server.max_decoding_message_size(MAX_REFLECTION_REQUEST_BYTES))
}

/// How often each service re-checks what its health depends on.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// One health check's verdict: `None` when it passes, or why it fails.
pub type Verdict = Option<String>;

/// A service's `grpc.health.v1` status, kept truthful: NOT_SERVING while any of its checks fails
/// or while it drains, SERVING otherwise. Every change is logged (with the failing check and
/// why) and mirrored in the `idempost.health.serving` and `idempost.health.failing` gauges.
#[derive(Debug, Clone)]
pub struct Health {
    reporter: HealthReporter,
    service: &'static str,
    names: &'static [&'static str],
    state: Arc<Mutex<HealthState>>,
}

#[derive(Debug, Default)]
struct HealthState {
    draining: bool,
    failing: Vec<(&'static str, String)>,
    reported: Option<bool>,
}

impl Health {
    /// Reports for `service` (the metric attribute) under each gRPC service name in `names`
    /// (`""` is the whole server). Starts SERVING.
    pub async fn new(
        reporter: HealthReporter,
        service: &'static str,
        names: &'static [&'static str],
    ) -> Self {
        let health = Self { reporter, service, names, state: Arc::default() };
        health.update(&[]).await;
        health
    }

    /// Records every check's verdict; the status is SERVING exactly when none failed.
    pub async fn update(&self, checks: &[(&'static str, Verdict)]) {
        let change = {
            let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for (check, verdict) in checks {
                let was = state.failing.iter().position(|(name, _)| name == check);
                match (was, verdict) {
                    (None, Some(why)) => {
                        tracing::warn!(service = self.service, check, reason = %why, "health check failing; NOT_SERVING");
                        state.failing.push((check, why.clone()));
                    }
                    (Some(index), None) => {
                        tracing::info!(service = self.service, check, "health check passes again");
                        state.failing.remove(index);
                    }
                    (Some(index), Some(why)) => state.failing[index].1.clone_from(why),
                    (None, None) => {}
                }
                let service = KeyValue::new("idempost.service", self.service);
                let name = KeyValue::new("idempost.health.check", *check);
                metrics().health_failing.record(u64::from(verdict.is_some()), &[service, name]);
            }
            let serving = !state.draining && state.failing.is_empty();
            let changed = state.reported != Some(serving);
            state.reported = Some(serving);
            (serving, changed)
        };
        let (serving, changed) = change;
        metrics()
            .health_serving
            .record(u64::from(serving), &[KeyValue::new("idempost.service", self.service)]);
        if changed {
            if serving {
                tracing::info!(service = self.service, "SERVING");
            }
            self.set(serving).await;
        }
    }

    /// Reports NOT_SERVING for good: the service is draining.
    pub async fn draining(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.draining = true;
            state.reported = Some(false);
        }
        self.set(false).await;
    }

    async fn set(&self, serving: bool) {
        let status = if serving {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        for name in self.names {
            self.reporter.set_service_status(name, status).await;
        }
    }
}

/// Runs the retention `purge` of `table` every `every`, the first time one period after the
/// start, until `stopped` turns true; never when `every` is zero. A slow purge delays the next one
/// instead of piling up; each is logged with its rows and time, and a failed one is tried again
/// at the next period: nothing depends on it finishing.
pub async fn purge_periodically<F, Fut, E>(
    table: &'static str,
    every: Duration,
    mut stopped: watch::Receiver<bool>,
    mut purge: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u64, E>>,
    E: std::fmt::Display,
{
    if every.is_zero() {
        return;
    }
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        let started = std::time::Instant::now();
        match purge().await {
            // Its time per run is how an operator sees retention's cost stay flat while the
            // rows it already removed pile up as dead index entries (a held snapshot).
            Ok(rows) => {
                let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                tracing::info!(table, rows, elapsed_ms, "retention purge");
            }
            Err(e) => tracing::warn!(table, error = %e, "retention purge failed; trying again next period"),
        }
    }
}

/// How often [`report_claimable`] reads the outbox.
pub const CLAIMABLE_INTERVAL: Duration = Duration::from_secs(5);

/// Records `idempost.outbox.claimable` and `idempost.outbox.oldest_claimable_age` from `db`
/// every [`CLAIMABLE_INTERVAL`] until `stopped` turns true. The order service reports them too,
/// not only the relays: with every relay down, the alert "events are due and no relay claims"
/// still has a gauge to read. A failed read keeps the last values (the health checks speak of
/// the database).
pub async fn report_claimable(db: DatabaseConnection, stopped: watch::Receiver<bool>) {
    report_claimable_as(db, Vec::new(), stopped).await;
}

/// [`report_claimable`] with `attributes` on every value (a relay fleet's `idempost.shard`).
pub async fn report_claimable_as(
    db: DatabaseConnection,
    attributes: Vec<KeyValue>,
    mut stopped: watch::Receiver<bool>,
) {
    while !*stopped.borrow() {
        match crate::backlog::claimable(&db).await {
            Ok(claimable) => {
                let age = claimable
                    .oldest
                    .map_or(0.0, |at| (chrono::Utc::now() - at).to_std().unwrap_or_default().as_secs_f64());
                metrics().outbox_claimable.record(claimable.count, &attributes);
                metrics().outbox_oldest_claimable_age.record(age, &attributes);
            }
            Err(e) => tracing::debug!(error = %e, "claimable query failed"),
        }
        tokio::select! {
            () = tokio::time::sleep(CLAIMABLE_INTERVAL) => {}
            changed = stopped.changed() => if changed.is_err() { break },
        }
    }
}

/// Whether the database answers within the check interval, asked on the health checks' own
/// connection ([`open_health_connection`]).
pub async fn database_verdict(db: &DatabaseConnection) -> Verdict {
    match tokio::time::timeout(2 * HEALTH_INTERVAL, db.ping()).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(format!("the database does not answer: {e}")),
        Err(_) => Some("the database did not answer a ping within 2 s".to_owned()),
    }
}

/// A `grpc.health.v1` endpoint for a service without a gRPC API of its own (the relay and the
/// consumer), possibly beside the operators' services it serves on the same listener: SERVING
/// while its checks pass ([`HealthEndpoint::health`]), NOT_SERVING while one fails or once it
/// drains.
#[derive(Debug)]
pub struct HealthEndpoint {
    health: Health,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl HealthEndpoint {
    /// Serves health for `service` on `listener` (with its TLS and load limits) until `stop`
    /// turns true.
    pub async fn serve(listener: Listener, service: &'static str, stop: watch::Receiver<bool>) -> Self {
        let routes = tonic::service::Routes::default();
        Self::serve_with(listener, service, routes, &Authenticator::none(), stop).await
    }

    /// Serves health for `service` and `routes` (whose callers `auth` checks) on `listener`
    /// (with its TLS and load limits) until `stop` turns true.
    pub async fn serve_with(
        listener: Listener,
        service: &'static str,
        routes: tonic::service::Routes,
        auth: &Authenticator,
        mut stop: watch::Receiver<bool>,
    ) -> Self {
        let (reporter, grpc) = health_service();
        let health = Health::new(reporter, service, &[""]).await;
        let routes = routes.add_service(grpc);
        let server = tokio::spawn(listener.server(auth).add_routes(routes).serve_with_incoming_shutdown(
            listener.incoming(),
            async move {
                let _ = stop.wait_for(|stop| *stop).await;
            },
        ));
        Self { health, server }
    }

    /// The status this endpoint serves, for the service's checks to update.
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Reports NOT_SERVING: the service is draining.
    pub async fn draining(&self) {
        self.health.draining().await;
    }

    /// Waits for the server to stop (after `stop` turned true).
    pub async fn stopped(self) -> Result<(), tonic::transport::Error> {
        match self.server.await {
            Ok(result) => result,
            // The task only ends by returning; a panic in it is a bug worth surfacing loudly.
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}
