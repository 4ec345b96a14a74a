//! Builds the order service from its settings and runs it until shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tonic::transport::server::TcpIncoming;

use super::Settings;
use super::grpc::OrderGrpc;
use super::store::OrderStore;
use crate::proto;
use crate::service::{self, ReadyError};

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
}

/// A built, listening order service.
#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    port: u16,
    store: OrderStore,
    shutdown_grace: Duration,
}

impl Application {
    /// Connects to the database, checks it is migrated, and binds the listener.
    ///
    /// Nothing is served until [`Application::run_until_stopped`].
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        let db = service::open_database(&settings.database_url, settings.db_max_connections).await?;
        let (listener, port) = service::bind(settings.listen).await?;
        Ok(Self { listener, port, store: OrderStore::new(db), shutdown_grace: settings.shutdown_grace })
    }

    /// The port the service listens on (useful when the settings asked for port 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Serves gRPC until `shutdown` completes, then lets in-flight calls finish for at most the
    /// configured grace period.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartupError> {
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<proto::v1::order_service_server::OrderServiceServer<OrderGrpc>>().await;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;

        let stopping = Arc::new(Notify::new());
        let signal = {
            let stopping = Arc::clone(&stopping);
            async move {
                shutdown.await;
                tracing::info!("shutdown requested; draining in-flight calls");
                health
                    .set_not_serving::<proto::v1::order_service_server::OrderServiceServer<OrderGrpc>>()
                    .await;
                stopping.notify_one();
            }
        };
        tracing::info!(port = self.port, "order service listening");
        let server = tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(reflection)
            .add_service(OrderGrpc::server(self.store))
            .serve_with_incoming_shutdown(TcpIncoming::from(self.listener), signal);
        tokio::pin!(server);
        tokio::select! {
            result = &mut server => return Ok(result?),
            () = stopping.notified() => {}
        }
        match tokio::time::timeout(self.shutdown_grace, server).await {
            Ok(result) => Ok(result?),
            Err(_) => {
                tracing::warn!(grace = ?self.shutdown_grace, "grace period over; stopping with calls still in flight");
                Ok(())
            }
        }
    }
}
