//! Builds the relay from its settings and runs it until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;

use super::backlog::report_backlog;
use super::budget::StepBudget;
use super::fleet::{Fleet, FleetError};
use super::health::{Vitals, publish_verdict};
use super::outbox::{ClaimWindow, Outbox, RetryPolicy, open_outbox};
use super::publisher::{KafkaPublisher, ProducerConfigError};
use super::settings::Settings;
use super::worker::{PublisherFailed, Relay, Tuning};
use idempost::backlog::{Redrive, RedriveAudit};
use idempost::security::Listener;
use idempost::service::{self, Health, HealthEndpoint, MetricsListener, ReadyError};
use idempost::telemetry::{self, metrics};
use idempost::wake::WakeListener;

/// The relay could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The settings contradict each other or miss something.
    #[error("invalid settings: {0}")]
    Settings(String),
    /// The database or the health endpoint could not get ready.
    #[error(transparent)]
    Ready(#[from] ReadyError),
    /// The Kafka producer could not be configured.
    #[error(transparent)]
    Producer(#[from] ProducerConfigError),
    /// The health server failed.
    #[error("health server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// The producer failed for good while relaying.
    #[error(transparent)]
    Publisher(#[from] PublisherFailed),
    /// The relay fleet cannot start (`--shard-map-file`).
    #[error(transparent)]
    Fleet(#[from] FleetError),
}

/// What a relay serves: one database, or a fleet's shards.
#[derive(Debug)]
enum Serving {
    /// `--database-url`: today's relay.
    One(Relay<KafkaPublisher>),
    /// `--shard-map-file`: the shards its partitions of the control topic stand for.
    Fleet(Fleet),
}

/// A built relay with its health endpoint bound.
#[derive(Debug)]
pub struct Application {
    serving: Serving,
    listener: Listener,
    port: u16,
    wake: Option<WakeListener>,
    metrics: Option<MetricsListener>,
    settings: Settings,
}

impl Application {
    /// Checks the settings (the listener's plaintext policy included) before anything else,
    /// connects to the database (which must be migrated), creates the
    /// producer and binds the health endpoint. Publishing starts in
    /// [`Application::run_until_stopped`].
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        let settings = settings.with_secrets_read().map_err(ReadyError::from)?;
        check(&settings)?;
        for addr in std::iter::once(settings.listen).chain(settings.metrics_listen) {
            Listener::check_plaintext(addr, &settings.security).map_err(ReadyError::from)?;
        }
        // Without a map, the database is checked first, as it always was; a fleet opens a
        // shard's database only once it owns the shard.
        let outbox = match settings.shard_map_file {
            Some(_) => None,
            None => Some(
                open_outbox(&settings.database.url, settings.db_max_connections).await?.with_claim_window(
                    ClaimWindow {
                        lookback: settings.claim_lookback,
                        sweep_interval: settings.claim_sweep_interval,
                    },
                ),
            ),
        };
        let publisher = KafkaPublisher::new(
            &settings.kafka.brokers,
            settings.kafka.topic.clone(),
            settings.delivery_timeout,
            &settings.kafka.options,
        )?
        .with_cloudevents_mode(settings.cloudevents_mode)
        .with_legacy_headers(settings.legacy_headers)
        .with_producers(usize::from(settings.producers.min(settings.workers.max(1))))?;
        let serving = match outbox {
            Some(outbox) => Serving::One(Relay::new(outbox, publisher, tuning(&settings))),
            None => Serving::Fleet(Fleet::prepare(&settings, publisher, tuning(&settings)).await?),
        };
        let listener = Listener::bind(settings.listen, &settings.security).await.map_err(ReadyError::from)?;
        let port = listener.port();
        let wake = match settings.wake_listen {
            Some(addr) => {
                Some(WakeListener::bind(addr).await.map_err(|source| ReadyError::Listen { addr, source })?)
            }
            None => None,
        };
        let metrics = MetricsListener::bind(settings.metrics_listen, &settings.security).await?;
        let mut bound = vec![("listen", SocketAddr::new(settings.listen.ip(), port))];
        if let (Some(addr), Some(wake)) = (settings.wake_listen, &wake) {
            bound.push(("wake-listen", SocketAddr::new(addr.ip(), wake.port())));
        }
        bound.extend(metrics.as_ref().map(MetricsListener::port_file_line));
        service::write_port_file(settings.port_file.as_deref(), &bound)?;
        Ok(Self { serving, listener, port, wake, metrics, settings })
    }

    /// The health endpoint's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Relays until `shutdown` completes, then drains: no new claims, the batch in flight is
    /// published and marked (bounded by the lease), and the process may exit. Nothing is deleted.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), StartupError> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let health = HealthEndpoint::serve(self.listener, "idempost-relay", stop_rx.clone()).await;
        if let Some(metrics) = self.metrics {
            metrics.serve(stop_rx.clone());
        }
        let m = metrics();
        telemetry::start_at_zero(&[&m.claimed, &m.published, &m.lease_losses, &m.releases, &m.failed]);
        let mut drain = self.settings.lease;
        let mut tasks = Vec::new();
        let run = match self.serving {
            Serving::One(relay) => {
                tasks = one_relay_reports(&relay, &health, &self.settings, &stop_rx);
                if let Some(wake) = self.wake {
                    tokio::spawn(wake.run(relay.wake_handle(), stop_rx.clone()));
                }
                let workers = self.settings.workers;
                futures::future::Either::Left(run_loops(relay, workers, stop_rx))
            }
            Serving::Fleet(fleet) => {
                if let Some(wake) = self.wake {
                    tokio::spawn(wake.run(fleet.wake_handle(), stop_rx.clone()));
                }
                // The shards drain (each within its lease) while the group client leaves.
                drain += FLEET_LEAVE;
                futures::future::Either::Right(fleet.run(health.health(), stop_rx))
            }
        };
        let outcome = until_stopped(run, shutdown, &health, &stop_tx, drain).await;
        let _ = stop_tx.send(true);
        for task in tasks {
            let _ = task.await;
        }
        health.stopped().await?;
        outcome?;
        tracing::info!("relay stopped");
        Ok(())
    }
}

/// What a fleet's shutdown may take beyond the lease: its group client's leave and the shards'
/// pools closing.
const FLEET_LEAVE: std::time::Duration = std::time::Duration::from_secs(10);

/// The one relay's gauges and health watch, until `stop`; the tasks to await at the end.
fn one_relay_reports(
    relay: &Relay<KafkaPublisher>,
    health: &HealthEndpoint,
    settings: &Settings,
    stop: &watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let backlog = tokio::spawn(report_backlog(relay.outbox().clone(), Vec::new(), stop.clone()));
    let claimable = relay.outbox().connection().clone();
    tokio::spawn(service::report_claimable(claimable, stop.clone()));
    tokio::spawn(super::cleanup::report(relay.outbox().connection().clone(), stop.clone()));
    let watcher = tokio::spawn(watch_health(
        relay.vitals(),
        relay.outbox().clone(),
        health.health(),
        settings.publish_stall,
        stop.clone(),
    ));
    vec![backlog, watcher]
}

/// Several step loops over one worker: their claims are disjoint, and every mark or release is
/// fenced by its own claim's lease token, so they need nothing from each other and a late loop
/// cannot touch a row another loop claimed again.
async fn run_loops(
    relay: Relay<KafkaPublisher>,
    workers: u16,
    stop: watch::Receiver<bool>,
) -> Result<(), PublisherFailed> {
    let loops = (0..workers.max(1)).map(|_| relay.run(stop.clone()));
    futures::future::try_join_all(loops).await.map(|_| ())
}

/// Runs `run` until it ends or `shutdown` completes; then drains: health says so, `stop` tells
/// the loops to claim no more, and the batches in flight get at most the lease to finish.
async fn until_stopped(
    run: impl Future<Output = Result<(), PublisherFailed>>,
    shutdown: impl Future<Output = ()>,
    health: &HealthEndpoint,
    stop: &watch::Sender<bool>,
    drain: std::time::Duration,
) -> Result<(), PublisherFailed> {
    tokio::pin!(run);
    tokio::select! {
        outcome = &mut run => outcome,
        () = shutdown => {
            tracing::info!("shutdown requested; finishing the batch in flight");
            health.draining().await;
            let _ = stop.send(true);
            tokio::time::timeout(drain, &mut run).await.unwrap_or_else(|_| {
                tracing::warn!("drain took longer than the lease; its events will be claimed again");
                Ok(())
            })
        }
    }
}

/// The operator's redrive: returns a FAILED event to PENDING.
pub(crate) async fn redrive(
    settings: &Settings,
    event_id: &str,
    audit: &RedriveAudit,
) -> Result<Redrive, StartupError> {
    let url = settings.database.resolved_url().map_err(ReadyError::from)?;
    let db = service::open_database(&url, 1).await?;
    Outbox::new(db).redrive(event_id, audit).await.map_err(|e| StartupError::Ready(ReadyError::Database(e)))
}

/// Keeps health NOT_SERVING while the relay cannot claim, or while nothing was published for
/// longer than `stall` although an event has waited that long, until `stop`.
async fn watch_health(
    vitals: Arc<Vitals>,
    outbox: Outbox,
    health: Health,
    stall: std::time::Duration,
    mut stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let since_publish = vitals.since_last_publish();
        // The backlog is read only while publishing looks stalled, so a healthy relay adds no
        // query; an unreadable backlog leaves the claim check to speak.
        let publishing = if since_publish > stall {
            match outbox.backlog().await {
                Ok(backlog) => publish_verdict(since_publish, backlog.oldest_pending, stall),
                Err(_) => None,
            }
        } else {
            None
        };
        health.update(&[("claim", vitals.claim_verdict()), ("publishing", publishing)]).await;
        tokio::select! {
            () = tokio::time::sleep(service::HEALTH_INTERVAL) => {}
            changed = stop.changed() => if changed.is_err() { break },
        }
    }
}

fn check(settings: &Settings) -> Result<(), StartupError> {
    // A step still acting on its events when their lease ends races the relay that claims them
    // next. The lease must cover the claim and queue wait, librdkafka's own delivery timeout
    // after the hand-over, the marks and releases, and the margin.
    StepBudget::new(settings.lease, settings.delivery_timeout, settings.lease_margin)
        .map_err(StartupError::Settings)?;
    if settings.claim_sweep_interval.is_zero() {
        return Err(StartupError::Settings("--claim-sweep-interval must be longer than zero".into()));
    }
    if settings.backoff_base > settings.backoff_max {
        return Err(StartupError::Settings("--backoff-base must not exceed --backoff-max".into()));
    }
    Ok(())
}

fn tuning(settings: &Settings) -> Tuning {
    Tuning {
        batch_size: settings.batch_size,
        lease: settings.lease,
        delivery_timeout: settings.delivery_timeout,
        lease_margin: settings.lease_margin,
        retry: RetryPolicy {
            max_attempts: settings.max_attempts,
            backoff_base: settings.backoff_base,
            backoff_max: settings.backoff_max,
        },
        max_idle_poll: settings.max_idle_poll,
    }
}
