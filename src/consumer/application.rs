//! Builds the consumer from its settings and runs it until shutdown.

use std::future::Future;
use std::sync::Arc;

use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use tokio::sync::watch;

use super::Settings;
use super::inbox::Inbox;
use super::worker::{CommitOnRevoke, ConsumerStats, Worker, commit_stored};
use crate::security::Listener;
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
    listener: Listener,
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
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        let db = service::open_database(&settings.database_url, settings.db_max_connections).await?;
        let stats = Arc::<ConsumerStats>::default();
        let consumer = kafka_consumer(&settings, Arc::clone(&stats))?;
        consumer.subscribe(&[&settings.topic])?;
        let listener = Listener::bind(settings.listen, &settings.security).await?;
        let port = listener.port();
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
        self.consumer.unsubscribe();
        let _ = stop_tx.send(true);
        health.stopped().await?;
        tracing::info!(stats = ?self.stats.snapshot(), "consumer stopped");
        Ok(())
    }
}

fn kafka_consumer(
    settings: &Settings,
    stats: Arc<ConsumerStats>,
) -> Result<StreamConsumer<CommitOnRevoke>, StartupError> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.brokers)
        .set("group.id", settings.group())
        // Offsets are stored by hand after the local commit; only stored offsets are committed.
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        // A new group starts at the beginning: events published before it existed still count.
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false");
    for (key, value) in &settings.kafka_options {
        if key == "enable.auto.offset.store" && value != "false" {
            return Err(StartupError::Settings(
                "kafka option enable.auto.offset.store must stay false: offsets are stored only after the local commit".into(),
            ));
        }
        config.set(key, value);
    }
    Ok(config.create_with_context(CommitOnRevoke { stats })?)
}
