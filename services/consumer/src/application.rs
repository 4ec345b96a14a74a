//! Builds the consumer from its settings and runs it until shutdown: the records, and beside
//! them its listener (health and the ConsumerAdminService) and the purge of its dedup history.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use sea_orm::DatabaseConnection;
use tokio::sync::watch;

use super::admin::ConsumerAdminGrpc;
use super::gauges::{self, GroupLag, group_lag};
use super::inbox::Inbox;
use super::instance::{Identity, InstanceError, InstanceLock};
use super::rejoin;
use super::retention::{DedupRetention, RetentionError};
use super::settings::{Membership, Settings};
use super::worker::{CommitOnRevoke, ConsumerStats, Fatal, Worker, commit_stored};
use idempost::db::{self, purge};
use idempost::edge::LongPoll;
use idempost::security::{AuthConfigError, Authenticator, Listener};
use idempost::service::{self, Health, HealthEndpoint, MetricsListener, ReadyError};
use idempost::telemetry::{self, metrics};

/// The consumer could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The settings contradict each other or miss something.
    #[error("invalid settings: {0}")]
    Settings(String),
    /// The database or the health endpoint could not get ready.
    #[error(transparent)]
    Ready(#[from] ReadyError),
    /// The Kafka consumer could not be created or subscribed.
    #[error("kafka consumer: {0}")]
    Kafka(#[from] KafkaError),
    /// The health server failed.
    #[error("health server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// The retention settings would purge dedup history that a redelivery may still need.
    #[error("invalid retention settings: {0}")]
    Retention(#[from] RetentionError),
    /// The authentication settings cannot be used.
    #[error(transparent)]
    Auth(#[from] AuthConfigError),
    /// Reflection could not load the service descriptors.
    #[error("cannot build gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// Another live instance runs under this instance's static name (or the broker fenced this
    /// one for it): this one stops instead of fencing the other in turn, forever.
    #[error(transparent)]
    Instance(#[from] InstanceError),
}

/// A built consumer, subscribed, with its health endpoint bound.
pub struct Application {
    consumer: Arc<StreamConsumer<CommitOnRevoke>>,
    db: DatabaseConnection,
    /// Health's own connection: the consumer's pool busy with records cannot starve its ping.
    health_db: DatabaseConnection,
    inbox: Inbox,
    stats: Arc<ConsumerStats>,
    listener: Listener,
    port: u16,
    metrics: Option<MetricsListener>,
    auth: Authenticator,
    retention: DedupRetention,
    /// Held while this instance runs under a static name.
    instance: Option<(Identity, InstanceLock)>,
    settings: Settings,
}

impl std::fmt::Debug for Application {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Application")
            .field("inbox", &self.inbox)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Application {
    /// Connects to the (migrated) database, creates and subscribes the Kafka consumer, and binds
    /// the health endpoint. Records are received in [`Application::run_until_stopped`].
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        let mut settings = settings.with_secrets_read().map_err(ReadyError::from)?;
        settings.check().map_err(StartupError::Settings)?;
        let retention = settings.retention();
        retention.check()?;
        let auth = Authenticator::from_settings(&settings.auth, &[settings.listen])?;
        // Before connecting to anything: a policy error must not wait behind the database.
        for addr in std::iter::once(settings.listen).chain(settings.metrics_listen) {
            Listener::check_plaintext(addr, &settings.security).map_err(ReadyError::from)?;
        }
        let db = service::open_database_for(
            &settings.database.url,
            settings.db_max_connections,
            db::Pool::Consumer,
        )
        .await?;
        let health_db = service::open_health_connection(&settings.database.url).await?;
        let stats = Arc::<ConsumerStats>::default();
        // Bound first: a fixed port names the instance when --instance-name does not, and no
        // two processes on one host hold the same port.
        let listener = Listener::bind(settings.listen, &settings.security)
            .await
            .map_err(ReadyError::from)?
            .operators_only(ConsumerAdminGrpc::OPERATOR_ONLY);
        let port = listener.port();
        let metrics = MetricsListener::bind(settings.metrics_listen, &settings.security).await?;
        let instance = instance_lock(&mut settings).await?;
        let consumer = subscribed(&settings, &stats)?;
        let inbox = Inbox::new(db.clone(), settings.consumer_name.clone());
        // Last: whoever waits for the file finds the consumer subscribed, not only listening.
        let mut bound = vec![("listen", SocketAddr::new(settings.listen.ip(), port))];
        bound.extend(metrics.as_ref().map(MetricsListener::port_file_line));
        service::write_port_file(settings.port_file.as_deref(), &bound)?;
        Ok(Self {
            consumer,
            db,
            health_db,
            inbox,
            stats,
            listener,
            port,
            metrics,
            auth,
            retention,
            instance,
            settings,
        })
    }

    /// The listener's port (health and the ConsumerAdminService).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Live counts of what this consumer did.
    pub fn stats(&self) -> Arc<ConsumerStats> {
        Arc::clone(&self.stats)
    }

    /// Consumes until `shutdown` completes; then finishes the record in hand (bounded by the
    /// shutdown grace), commits the offsets of committed work, and leaves the group.
    pub async fn run_until_stopped(
        mut self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), StartupError> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let routes = self.admin_routes()?;
        let health = HealthEndpoint::serve_with(
            self.listener,
            "idempost-consumer",
            routes,
            &self.auth,
            stop_rx.clone(),
        )
        .await;
        if let Some(metrics) = self.metrics.take() {
            metrics.serve(stop_rx.clone());
        }
        let m = metrics();
        telemetry::start_at_zero(&[&m.consumed, &m.duplicates, &m.dead_letters, &m.calls_refused]);
        let keys =
            tokio::spawn(self.auth.clone().watch(self.settings.security.reload_every, stop_rx.clone()));
        let (db, retention, every, stopped) =
            (self.db.clone(), self.retention.clone(), self.settings.purge_every, stop_rx.clone());
        let purger = tokio::spawn(async move {
            let resume = tokio::sync::Mutex::new(purge::Resume::default());
            let purge = || async {
                let mut resume = resume.lock().await;
                retention.purge_resuming(&db, &mut resume).await.map(|report| report.consumed_rows)
            };
            service::purge_periodically("consumed_event", every, stopped, purge).await;
        });
        // Moved out, not cloned: a client replaced at run time must be closed by its last holder.
        let consumer = self.consumer;
        let (current_tx, current) = watch::channel(Arc::clone(&consumer));
        let watcher = tokio::spawn(watch_health(
            current.clone(),
            self.health_db.clone(),
            Arc::clone(&self.stats),
            self.settings.kafka.topic.clone(),
            health.health(),
            stop_rx.clone(),
        ));
        let sources = gauges::Sources {
            current: current.clone(),
            db: self.db.clone(),
            topic: self.settings.kafka.topic.clone(),
            consumer_name: self.inbox.consumer_name().to_owned(),
        };
        tokio::spawn(gauges::report(sources, stop_rx.clone()));
        tracing::info!(
            consumer_name = self.inbox.consumer_name(),
            group = self.settings.group(),
            group_instance_id = self.settings.group_instance_id().as_deref().unwrap_or("-"),
            "consumer started"
        );
        let (identity, mut lock) = self.instance.take().unzip();
        let run = Rebuilding {
            inbox: &self.inbox,
            stats: &self.stats,
            settings: &self.settings,
            identity: identity.as_ref(),
            current: &current_tx,
        }
        .consume(consumer, stop_rx.clone());
        tokio::pin!(run);
        let duplicate = guard_instance(lock.as_mut());
        tokio::pin!(duplicate);
        let outcome = tokio::select! {
            outcome = &mut run => outcome,
            duplicate = &mut duplicate => {
                let _ = stop_tx.send(true);
                let _ = tokio::time::timeout(self.settings.shutdown_grace, &mut run).await;
                Err(duplicate.into())
            }
            () = shutdown => {
                tracing::info!("shutdown requested; finishing the record in hand");
                health.draining().await;
                let _ = stop_tx.send(true);
                tokio::time::timeout(self.settings.shutdown_grace, &mut run).await.unwrap_or_else(|_| {
                    tracing::warn!("grace period over; the record in hand will be redelivered");
                    Ok(())
                })
            }
        };
        let consumer = Arc::clone(&current.borrow());
        close(consumer.as_ref()).await;
        let _ = stop_tx.send(true);
        let _ = watcher.await;
        purger.abort();
        keys.abort();
        health.stopped().await?;
        outcome?;
        tracing::info!(stats = ?self.stats.snapshot(), "consumer stopped");
        Ok(())
    }

    /// The admin listener's routes: the ConsumerAdminService, and reflection when the auth
    /// settings allow it on this listener. Fails only when reflection cannot load the service
    /// descriptors.
    fn admin_routes(&self) -> Result<tonic::service::Routes, StartupError> {
        let reflection =
            self.settings.auth.reflection_on(self.settings.listen).then(service::reflection_service);
        let mut routes = tonic::service::Routes::new(ConsumerAdminGrpc::server(
            self.db.clone(),
            self.settings.consumer_name.clone(),
            self.retention.clone(),
            self.auth.clone(),
            LongPoll::for_listener(&self.listener),
        ));
        if let Some(reflection) = reflection.transpose()? {
            routes = routes.add_service(reflection);
        }
        Ok(routes)
    }
}

/// What the record loop needs to run a worker and to replace its Kafka client after a fatal
/// error.
struct Rebuilding<'a> {
    inbox: &'a Inbox,
    stats: &'a Arc<ConsumerStats>,
    settings: &'a Settings,
    /// This instance's static identity, when it runs under one.
    identity: Option<&'a Identity>,
    /// Where the client in use is published (health and the shutdown read it).
    current: &'a watch::Sender<Arc<StreamConsumer<CommitOnRevoke>>>,
}

impl Rebuilding<'_> {
    /// Runs workers over `consumer` until `stop` says stop (`Ok`). After a fatal client error
    /// it subscribes a new client, publishes it on `current` and runs again; stored offsets not
    /// yet committed are lost with the old client, so their records come again and are
    /// deduplicated. A dynamic member whose group strands partitions on a member that is gone
    /// leaves and joins again as a new member ([`crate::rejoin`]). `Err` when a new client cannot be
    /// subscribed, or when the broker fenced this static instance for another with its id:
    /// rejoining would fence that one in turn.
    async fn consume(
        self,
        mut consumer: Arc<StreamConsumer<CommitOnRevoke>>,
        stop: watch::Receiver<bool>,
    ) -> Result<(), StartupError> {
        loop {
            match self.run(&consumer, stop.clone()).await {
                Ended::Stopped => return Ok(()),
                Ended::Fatal(Fatal { reason, fenced }) => {
                    // Fenced by a member with the same instance id: rejoining would fence it in
                    // turn.
                    if let (true, Some(identity)) = (fenced, self.identity) {
                        return Err(identity.duplicate().into());
                    }
                    // Offsets stored but not yet committed are lost with the old client: their
                    // records are delivered again and deduplicated.
                    consumer = subscribed(self.settings, self.stats)?;
                    let old = self.current.send_replace(Arc::clone(&consumer));
                    old.context().closing();
                    tokio::task::spawn_blocking(move || drop(old));
                    metrics().client_rebuilds.add(1, &[]);
                    tracing::warn!(%reason, "Kafka consumer rebuilt after a fatal error; it rejoins the group");
                }
                Ended::Stranded(partitions) => {
                    tracing::warn!(
                        ?partitions,
                        stalled_for = ?self.settings.session_timeout() + rejoin::MARGIN,
                        "partitions stranded on a group member that is gone; leaving the group and \
                         joining it again as a new member"
                    );
                    consumer = self.rejoin(consumer).await?;
                    metrics().client_rebuilds.add(1, &[]);
                }
            }
        }
    }

    /// Runs one worker over `consumer` until `stop`, a fatal client error, or, for a dynamic
    /// member, partitions stranded on a member that is gone.
    async fn run(
        &self,
        consumer: &Arc<StreamConsumer<CommitOnRevoke>>,
        mut stop: watch::Receiver<bool>,
    ) -> Ended {
        let worker = Worker {
            consumer,
            inbox: self.inbox,
            stats: self.stats,
            backoff_max: self.settings.backoff_max,
            group: self.settings.group(),
            batch_size: usize::from(self.settings.batch_size),
        };
        let (retire, retired) = watch::channel(false);
        let run = worker.run(retired);
        tokio::pin!(run);
        let stranded = async {
            if self.settings.membership != Membership::Dynamic {
                return std::future::pending().await;
            }
            let topic = self.settings.kafka.topic.clone();
            rejoin::stranded(Arc::clone(consumer), topic, self.settings.session_timeout()).await
        };
        tokio::pin!(stranded);
        let stranded = tokio::select! {
            fatal = &mut run => return fatal.map_or(Ended::Stopped, Ended::Fatal),
            _ = stop.wait_for(|stopped| *stopped) => None,
            partitions = &mut stranded => Some(partitions),
        };
        // The record in hand is finished first (or left for redelivery when it keeps failing).
        let _ = retire.send(true);
        match (run.await, stranded) {
            (Some(fatal), _) => Ended::Fatal(fatal),
            (None, Some(partitions)) => Ended::Stranded(partitions),
            (None, None) => Ended::Stopped,
        }
    }

    /// Leaves the group with `old` and joins it with a new client, in that order: the old
    /// client's offsets are committed and it is closed (its `LeaveGroup` answered) before the
    /// new one subscribes (see [`crate::rejoin`] for why the order matters on Tansu 0.6).
    async fn rejoin(
        &self,
        old: Arc<StreamConsumer<CommitOnRevoke>>,
    ) -> Result<Arc<StreamConsumer<CommitOnRevoke>>, StartupError> {
        commit_stored(old.as_ref(), "rejoin");
        old.context().closing();
        let fresh = Arc::new(kafka_consumer(self.settings, Arc::clone(self.stats))?);
        drop(self.current.send_replace(Arc::clone(&fresh)));
        if !rejoin::close_alone(old).await {
            tracing::warn!(
                "the old Kafka consumer was still in use; joining before its LeaveGroup was answered"
            );
        }
        fresh.subscribe(&[&self.settings.kafka.topic])?;
        Ok(fresh)
    }
}

/// Why a worker ended.
enum Ended {
    /// `stop` said stop.
    Stopped,
    /// The Kafka client can never consume again.
    Fatal(Fatal),
    /// These partitions stood still on a member that is gone (a dynamic member only).
    Stranded(Vec<i32>),
}

/// Hands the client in use back on shutdown: commits the offsets of committed work, leaves the
/// group (bounded by [`LEAVE_TIMEOUT`]) and marks the client closing.
async fn close(consumer: &StreamConsumer<CommitOnRevoke>) {
    commit_stored(consumer, "shutdown");
    leave_group(consumer).await;
    consumer.context().closing();
}

/// A new Kafka consumer, subscribed to the topic.
fn subscribed(
    settings: &Settings,
    stats: &Arc<ConsumerStats>,
) -> Result<Arc<StreamConsumer<CommitOnRevoke>>, StartupError> {
    let consumer = kafka_consumer(settings, Arc::clone(stats))?;
    consumer.subscribe(&[&settings.kafka.topic])?;
    Ok(Arc::new(consumer))
}

/// Keeps health NOT_SERVING while the consumer has no connection to the broker or the
/// database, or holds no partitions while its group's lag does not shrink, until `stop`.
async fn watch_health(
    current: watch::Receiver<Arc<StreamConsumer<CommitOnRevoke>>>,
    db: DatabaseConnection,
    stats: Arc<ConsumerStats>,
    topic: String,
    health: Health,
    mut stop: watch::Receiver<bool>,
) {
    let mut last_lag: Option<GroupLag> = None;
    while !*stop.borrow() {
        let consumer = Arc::clone(&current.borrow());
        let idle = stats.snapshot().assigned_partitions == 0;
        let topic_name = topic.clone();
        // librdkafka's metadata and offset queries block: off the runtime's workers.
        let probed = tokio::task::spawn_blocking(move || probe_broker(&consumer, &topic_name, idle)).await;
        let (broker, lag) = match probed {
            Ok(Ok(lag)) => (None, lag),
            Ok(Err(e)) => (Some(format!("no connection to the broker: {e}")), None),
            Err(e) => (Some(format!("broker probe failed: {e}")), None),
        };
        // Lag that is there twice in a row without the group's committed offsets moving: the
        // group is stuck, and this member, holding nothing, is not helping.
        let stuck = match (&last_lag, &lag) {
            (Some(before), Some(now)) if now.records > 0 && now.committed == before.committed => {
                Some(format!(
                    "holds no partitions while its group lags {} records on {topic} without progress",
                    now.records
                ))
            }
            _ => None,
        };
        last_lag = lag;
        let database = service::database_verdict(&db).await;
        health.update(&[("broker", broker), ("database", database), ("partitions", stuck)]).await;
        tokio::select! {
            () = tokio::time::sleep(service::HEALTH_INTERVAL) => {}
            changed = stop.changed() => if changed.is_err() { break },
        }
    }
}

/// Asks the broker for the topic's metadata (proving the connection) and, when `idle` (this
/// member holds no partitions), for the group's committed offsets and the partitions' ends.
fn probe_broker(
    consumer: &StreamConsumer<CommitOnRevoke>,
    topic: &str,
    idle: bool,
) -> Result<Option<GroupLag>, KafkaError> {
    let timeout = 2 * service::HEALTH_INTERVAL;
    if !idle {
        consumer.fetch_metadata(Some(topic), timeout)?;
        return Ok(None);
    }
    group_lag(consumer, topic, timeout).map(Some)
}

/// Unsubscribes, and serves the revocation until the partitions are given up (bounded), so
/// librdkafka sends LeaveGroup before the consumer is closed: a static member leaves only then
/// (closing alone keeps it in the group until its session times out), and the partitions move on
/// at once. A record received meanwhile is dropped unacknowledged and redelivered.
async fn leave_group(consumer: &StreamConsumer<CommitOnRevoke>) {
    consumer.unsubscribe();
    let deadline = tokio::time::Instant::now() + LEAVE_TIMEOUT;
    while consumer.assignment().is_ok_and(|assigned| assigned.count() > 0)
        && tokio::time::Instant::now() < deadline
    {
        let _ = tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await;
    }
}

/// Takes this instance's lock before it joins: under its own name (a second live instance under
/// that name stops here), or under the lowest free slot of its group when it has no stable name,
/// which then becomes its name. Sets `settings.instance_name` to the name it runs under, and the
/// membership to dynamic when there is none (an in-memory database, or `--membership dynamic`).
async fn instance_lock(settings: &mut Settings) -> Result<Option<(Identity, InstanceLock)>, StartupError> {
    let group = settings.group().to_owned();
    let taken = if settings.takes_a_slot() {
        let slot = |n: u32| {
            let instance = format!("slot-{n}");
            Identity { group: group.clone(), id: settings.instance_id(&instance), instance }
        };
        InstanceLock::first_free_slot(&settings.database.url, &group, slot).await?
    } else if let (Some(instance), Some(id)) = (settings.static_instance_name(), settings.group_instance_id())
    {
        let identity = Identity { group, instance, id };
        Some((
            identity.clone(),
            InstanceLock::acquire(&settings.database.url, identity, INSTANCE_WAIT).await?,
        ))
    } else {
        None
    };
    match &taken {
        Some((identity, _)) => settings.instance_name = Some(identity.instance.clone()),
        None => {
            settings.instance_name = None;
            settings.membership = Membership::Dynamic;
        }
    }
    Ok(taken)
}

/// How long a starting instance waits for its name's lock: a predecessor killed an instant ago
/// may still hold it until the database notices its session ended.
const INSTANCE_WAIT: Duration = Duration::from_secs(10);

/// How often the instance lock is checked (and taken again after the database came back).
const INSTANCE_CHECK: Duration = Duration::from_secs(5);

/// Returns only when another live process holds this instance's name: checks `lock` every
/// [`INSTANCE_CHECK`]; a database that cannot be asked is tried again at the next check.
async fn guard_instance(lock: Option<&mut InstanceLock>) -> InstanceError {
    let Some(lock) = lock else { return std::future::pending().await };
    loop {
        tokio::time::sleep(INSTANCE_CHECK).await;
        match lock.check().await {
            Ok(()) => {}
            Err(duplicate @ InstanceError::Duplicate { .. }) => return duplicate,
            Err(e) => tracing::warn!(error = %e, "instance lock not checked; trying again"),
        }
    }
}

/// How long shutdown waits for the partitions to be given up.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(5);

fn kafka_consumer(
    settings: &Settings,
    stats: Arc<ConsumerStats>,
) -> Result<StreamConsumer<CommitOnRevoke>, StartupError> {
    let config = settings.kafka_config().map_err(StartupError::Settings)?;
    Ok(config.create_with_context(CommitOnRevoke::new(stats))?)
}
