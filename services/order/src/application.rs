//! Builds the order service from its settings and runs it until shutdown.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::watch;

use super::admin::{AdminGrpc, OutboxRetention};
use super::group::BatchStats;
use super::grpc::OrderGrpc;
use super::settings::Settings;
use super::shards::{self, ShardError, ShardMapReload, Shards};
use idempost::db::purge;
use idempost::edge::LongPoll;
use idempost::security::{AuthConfigError, Authenticator, Listener};
use idempost::service::{self, Health, MetricsListener, ReadyError};
use idempost::telemetry;
use idempost::wake::WakeSender;

/// Calls a listener admits per database connection before it refuses more (the default of
/// `--max-concurrent-calls`).
const CALLS_PER_CONNECTION: u32 = 8;

/// The order service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The database or the listener could not get ready.
    #[error(transparent)]
    Ready(#[from] ReadyError),
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// Reflection could not load the service descriptors.
    #[error("cannot build gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The authentication settings cannot be used.
    #[error(transparent)]
    Auth(#[from] AuthConfigError),
    /// No UDP socket for relay wake-ups could be opened.
    #[error("cannot open a socket for relay wake-ups: {0}")]
    Wake(#[source] std::io::Error),
    /// A shard of the map cannot be served, or the one database's order ids are outside shard
    /// 0's block.
    #[error(transparent)]
    Shard(ShardError),
}

// Here rather than beside the shards: the shards know nothing of the application that starts them.
impl From<ShardError> for StartupError {
    /// Without a map, the one database's errors are the ones it always had.
    fn from(error: ShardError) -> Self {
        match error {
            ShardError::Ready { shard: None, source } => Self::Ready(source),
            error => Self::Shard(error),
        }
    }
}

/// A built, listening order service.
#[derive(Debug)]
pub struct Application {
    listener: Listener,
    port: u16,
    admin_listener: Listener,
    admin_port: u16,
    metrics: Option<MetricsListener>,
    auth: Authenticator,
    public_reflection: bool,
    admin_reflection: bool,
    reload_every: Duration,
    /// The databases: every shard of the map, or the one database.
    shards: Shards,
    retention: OutboxRetention,
    wake: WakeSender,
    purge_every: Duration,
    shutdown_grace: Duration,
    batches: BatchStats,
}

impl Application {
    /// Connects to the database, checks it is migrated, and binds the listener.
    ///
    /// Nothing is served until [`Application::run_until_stopped`].
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        let settings = settings.with_secrets_read().map_err(ReadyError::from)?;
        let retention = settings.retention();
        let security = &settings.security;
        let auth = Authenticator::from_settings(&security.auth, &[settings.listen, settings.admin_listen])?;
        // Before connecting to anything: a policy error must not wait behind the database.
        for addr in [settings.listen, settings.admin_listen].into_iter().chain(settings.metrics_listen) {
            Listener::check_plaintext(addr, &security.listeners).map_err(ReadyError::from)?;
        }
        let batches = BatchStats::new(usize::from(settings.group_commit.max_batch));
        let shards = Shards::open(&settings, batches.clone()).await?;
        // One call holds at most one connection. A listener admits a short queue of calls per
        // pooled connection (each waits milliseconds for one under a burst) and refuses calls past
        // it at once, so a burst never queues without bound on the pool: refusing at the pool size
        // itself would turn every ordinary burst of more callers than connections into errors.
        let limited = security
            .listeners
            .limited_by_default(settings.db_max_connections.saturating_mul(CALLS_PER_CONNECTION));
        let listener = Listener::bind(settings.listen, &limited).await.map_err(ReadyError::from)?;
        let admin_listener = Listener::bind(settings.admin_listen, &limited)
            .await
            .map_err(ReadyError::from)?
            .operators_only(AdminGrpc::OPERATOR_ONLY);
        let metrics = MetricsListener::bind(settings.metrics_listen, &security.listeners).await?;
        let (port, admin_port) = (listener.port(), admin_listener.port());
        let mut bound = vec![
            ("listen", SocketAddr::new(settings.listen.ip(), port)),
            ("admin-listen", SocketAddr::new(settings.admin_listen.ip(), admin_port)),
        ];
        bound.extend(metrics.as_ref().map(MetricsListener::port_file_line));
        service::write_port_file(settings.port_file.as_deref(), &bound)?;
        let wake = WakeSender::new(&settings.wake_relays).map_err(StartupError::Wake)?;
        Ok(Self {
            listener,
            port,
            admin_listener,
            admin_port,
            metrics,
            auth,
            public_reflection: security.auth.reflection_on(settings.listen),
            admin_reflection: security.auth.reflection_on(settings.admin_listen),
            reload_every: security.listeners.reload_every,
            shards,
            retention,
            wake,
            purge_every: settings.purge_every,
            shutdown_grace: settings.shutdown_grace,
            batches,
        })
    }

    /// The port the OrderService listens on (useful when the settings asked for port 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port the AdminService listens on.
    pub fn admin_port(&self) -> u16 {
        self.admin_port
    }

    /// Rereads the shard map when asked, as SIGHUP does.
    pub fn shard_map_reload(&self) -> ShardMapReload {
        ShardMapReload(self.shards.clone())
    }

    /// The sizes of the group-commit batches written so far (none with group commit off).
    pub fn batch_sizes(&self) -> BatchStats {
        self.batches.clone()
    }

    /// Serves gRPC until `shutdown` completes, then lets in-flight calls finish for at most the
    /// configured grace period.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartupError> {
        let (reporter, health_service) = service::health_service();
        let health = Health::new(reporter, "idempost-order", HEALTH_NAMES).await;
        let reflection = service::reflection_service()?;

        let (stop, stopped) = watch::channel(false);
        let draining = health.clone();
        let watcher = tokio::spawn(shards::watch_health(self.shards.clone(), health, stopped.clone()));
        let hangups = shards::watch_hangup(self.shards.clone(), stopped.clone());
        let signal = async move {
            shutdown.await;
            tracing::info!("shutdown requested; draining in-flight calls");
            draining.draining().await;
            let _ = stop.send(true);
        };
        tracing::info!(
            port = self.port,
            admin_port = self.admin_port,
            tls = self.listener.is_tls(),
            "order service listening"
        );
        let keys = tokio::spawn(self.auth.clone().watch(self.reload_every, stopped.clone()));
        if let Some(metrics) = self.metrics {
            metrics.serve(stopped.clone());
        }
        telemetry::start_at_zero(&[&telemetry::metrics().calls_refused]);
        // The order service's own claimable gauges, one per shard; the relays report the shards
        // they serve.
        tokio::spawn(shards::report_claimable(self.shards.clone(), stopped.clone()));
        let orders = self
            .listener
            .server(&self.auth)
            .add_service(health_service)
            .add_optional_service(self.public_reflection.then(|| reflection.clone()))
            .add_service(OrderGrpc::server(self.shards.clone(), self.wake.clone(), self.auth.clone()))
            .serve_with_incoming_shutdown(self.listener.incoming(), signal);
        let waits = LongPoll::for_listener(&self.admin_listener);
        let admin = self
            .admin_listener
            .server(&self.auth)
            .add_optional_service(self.admin_reflection.then_some(reflection))
            .add_service(AdminGrpc::server(self.shards.clone(), self.retention.clone(), self.auth, waits))
            .serve_with_incoming_shutdown(self.admin_listener.incoming(), until_true(stopped.clone()));
        let (shards, retention, every, until) =
            (self.shards.clone(), self.retention, self.purge_every, stopped.clone());
        let purger = tokio::spawn(async move {
            // Each shard's own cursor, by name: a shard added by a reload starts with a full pass.
            let resumes = tokio::sync::Mutex::new(HashMap::<String, purge::Resume<String>>::new());
            let purge = || async {
                let mut resumes = resumes.lock().await;
                let (mut rows, mut failed) = (0, None);
                // A shard that fails keeps none of the others from their purge.
                for (name, shard) in shards.all() {
                    match retention.purge_resuming(shard.store.db(), resumes.entry(name).or_default()).await {
                        Ok(report) => rows += report.outbox_rows,
                        Err(e) => failed = Some(e),
                    }
                }
                failed.map_or(Ok(rows), Err)
            };
            service::purge_periodically("outbox_event", every, until, purge).await;
        });
        let servers = async { tokio::try_join!(orders, admin).map(|_| ()) };
        tokio::pin!(servers);
        let result = tokio::select! {
            result = &mut servers => result,
            () = until_true(stopped) => match tokio::time::timeout(self.shutdown_grace, servers).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::warn!(grace = ?self.shutdown_grace, "grace period over; stopping with calls still in flight");
                    Ok(())
                }
            },
        };
        purger.abort();
        watcher.abort();
        hangups.abort();
        keys.abort();
        Ok(result?)
    }
}

/// The gRPC names the order service's health covers: the whole server and OrderService.
const HEALTH_NAMES: &[&str] = &["", "idempost.v1.OrderService"];

/// Completes once the flag turns true (or its sender is gone).
async fn until_true(mut flag: watch::Receiver<bool>) {
    let _ = flag.wait_for(|stop| *stop).await;
}
