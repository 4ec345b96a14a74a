//! Builds the consumer from its settings and runs it until shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::inbox::Inbox;
use super::worker::{CommitOnRevoke, ConsumerStats, Worker, commit_stored};
use super::{Membership, Settings};
use crate::service::{self, HealthEndpoint, ReadyError};

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
}

/// A built consumer, subscribed, with its health endpoint bound.
pub struct Application {
    consumer: StreamConsumer<CommitOnRevoke>,
    inbox: Inbox,
    stats: Arc<ConsumerStats>,
    listener: TcpListener,
    port: u16,
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
    pub async fn build(mut settings: Settings) -> Result<Self, StartupError> {
        settings.check().map_err(StartupError::Settings)?;
        let db = service::open_database(&settings.database_url, settings.db_max_connections).await?;
        let stats = Arc::<ConsumerStats>::default();
        // Bound first: the health port names the instance when --instance-name does not, and
        // no two processes on one host hold the same port.
        let (listener, port) = service::bind(settings.listen).await?;
        settings.instance_name = settings.static_instance_name(port);
        if settings.instance_name.is_none() {
            settings.membership = Membership::Dynamic;
        }
        let consumer = kafka_consumer(&settings, Arc::clone(&stats))?;
        consumer.subscribe(&[&settings.topic])?;
        let inbox = Inbox::new(db, settings.consumer_name.clone());
        Ok(Self { consumer, inbox, stats, listener, port, settings })
    }

    /// The health endpoint's port.
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
        self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), StartupError> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let health = HealthEndpoint::serve(self.listener, stop_rx.clone()).await;

        let worker = Worker {
            consumer: &self.consumer,
            inbox: &self.inbox,
            stats: &self.stats,
            backoff_max: self.settings.backoff_max,
            group: self.settings.group(),
            batch_size: usize::from(self.settings.batch_size),
        };
        tracing::info!(
            consumer_name = self.inbox.consumer_name(),
            group = self.settings.group(),
            group_instance_id = self.settings.group_instance_id(self.port).as_deref().unwrap_or("-"),
            "consumer started"
        );
        let run = worker.run(stop_rx);
        tokio::pin!(run);
        tokio::select! {
            () = &mut run => {}
            () = shutdown => {
                tracing::info!("shutdown requested; finishing the record in hand");
                health.draining().await;
                let _ = stop_tx.send(true);
                if tokio::time::timeout(self.settings.shutdown_grace, &mut run).await.is_err() {
                    tracing::warn!("grace period over; the record in hand will be redelivered");
                }
            }
        }
        commit_stored(&self.consumer, "shutdown");
        leave_group(&self.consumer).await;
        let _ = stop_tx.send(true);
        health.stopped().await?;
        tracing::info!(stats = ?self.stats.snapshot(), "consumer stopped");
        Ok(())
    }
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

/// How long shutdown waits for the partitions to be given up.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(5);

fn kafka_consumer(
    settings: &Settings,
    stats: Arc<ConsumerStats>,
) -> Result<StreamConsumer<CommitOnRevoke>, StartupError> {
    let config = settings.kafka_config().map_err(StartupError::Settings)?;
    Ok(config.create_with_context(CommitOnRevoke { stats })?)
}
