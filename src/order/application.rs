//! Builds the order service from its settings and runs it until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tonic::transport::server::TcpIncoming;

use super::Settings;
use super::grpc::OrderGrpc;
use super::store::OrderStore;
use crate::db::{self, SchemaError};
use crate::proto;

/// The order service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The database could not be reached.
    #[error("cannot connect to the database: {0}")]
    Database(#[source] sea_orm::DbErr),
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
        let db = db::connect(&settings.database_url, settings.db_max_connections)
            .await
            .map_err(StartupError::Database)?;
        db::ensure_migrated(&db).await?;
        let listener = TcpListener::bind(settings.listen)
            .await
            .map_err(|source| StartupError::Listen { addr: settings.listen, source })?;
        let port = listener
            .local_addr()
            .map_err(|source| StartupError::Listen { addr: settings.listen, source })?
            .port();
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
