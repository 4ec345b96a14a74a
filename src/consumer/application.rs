//! Builds the consumer from its settings and runs it until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;

use super::Settings;
use super::inbox::Inbox;
use super::worker::{CommitOnRevoke, ConsumerStats, Worker, commit_stored};
use crate::db::{self, SchemaError};

/// The consumer could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The settings contradict each other or miss something.
    #[error("invalid settings: {0}")]
    Settings(String),
    /// The database could not be reached.
    #[error("cannot connect to the database: {0}")]
    Database(#[source] sea_orm::DbErr),
    /// The database is not migrated for this version.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// The Kafka consumer could not be created or subscribed.
    #[error("kafka consumer: {0}")]
    Kafka(#[from] KafkaError),
    /// The health endpoint could not listen.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address from the settings.
        addr: SocketAddr,
        /// Why binding failed.
        source: std::io::Error,
    },
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
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        let db = db::connect(&settings.database_url, settings.db_max_connections)
            .await
            .map_err(StartupError::Database)?;
        db::ensure_migrated(&db).await?;
        let stats = Arc::<ConsumerStats>::default();
        let consumer = kafka_consumer(&settings, Arc::clone(&stats))?;
        consumer.subscribe(&[&settings.topic])?;
        let listener = TcpListener::bind(settings.listen)
            .await
            .map_err(|source| StartupError::Listen { addr: settings.listen, source })?;
        let port = listener
            .local_addr()
            .map_err(|source| StartupError::Listen { addr: settings.listen, source })?
            .port();
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
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_service_status("", tonic_health::ServingStatus::Serving).await;
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut server_stop = stop_rx.clone();
        let server = tokio::spawn(
            tonic::transport::Server::builder().add_service(health_service).serve_with_incoming_shutdown(
                TcpIncoming::from(self.listener),
                async move {
                    let _ = server_stop.wait_for(|stop| *stop).await;
                },
            ),
        );

        let worker = Worker {
            consumer: &self.consumer,
            inbox: &self.inbox,
            stats: &self.stats,
            backoff_max: self.settings.backoff_max,
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
                health.set_service_status("", tonic_health::ServingStatus::NotServing).await;
                let _ = stop_tx.send(true);
                if tokio::time::timeout(self.settings.shutdown_grace, &mut run).await.is_err() {
                    tracing::warn!("grace period over; the record in hand will be redelivered");
                }
            }
        }
        commit_stored(&self.consumer, "shutdown");
        self.consumer.unsubscribe();
        let _ = stop_tx.send(true);
        server.await.map_err(|e| StartupError::Settings(format!("health server task: {e}")))??;
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
