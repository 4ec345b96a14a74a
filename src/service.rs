//! Plumbing every service shares: a migrated database, a bound listener, a health endpoint.

use std::net::SocketAddr;

use sea_orm::{DatabaseConnection, DbErr};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic_health::server::HealthReporter;

use crate::db::{self, SchemaError};
use crate::security::Listener;

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
}

/// Connects to `url` and checks that every migration is applied; writes nothing.
pub async fn open_database(url: &str, max_connections: u32) -> Result<DatabaseConnection, ReadyError> {
    let db = db::connect(url, max_connections).await.map_err(ReadyError::Database)?;
    db::ensure_migrated(&db).await?;
    Ok(db)
}

/// Binds `addr` (port 0 picks a free port) and returns the listener with its port.
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, u16), ReadyError> {
    let listen = |source| ReadyError::Listen { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(listen)?;
    let port = listener.local_addr().map_err(listen)?.port();
    Ok((listener, port))
}

/// A `grpc.health.v1` endpoint for a service that serves nothing else over gRPC (the relay and
/// the consumer), reporting SERVING until `stop` turns true.
#[derive(Debug)]
pub struct HealthEndpoint {
    reporter: HealthReporter,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl HealthEndpoint {
    /// Serves health on `listener` (with its TLS and load limits) until `stop` turns true.
    pub async fn serve(listener: Listener, mut stop: watch::Receiver<bool>) -> Self {
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter.set_service_status("", tonic_health::ServingStatus::Serving).await;
        let server = tokio::spawn(listener.server().add_service(service).serve_with_incoming_shutdown(
            listener.incoming(),
            async move {
                let _ = stop.wait_for(|stop| *stop).await;
            },
        ));
        Self { reporter, server }
    }

    /// Reports NOT_SERVING: the service is draining.
    pub async fn draining(&self) {
        self.reporter.set_service_status("", tonic_health::ServingStatus::NotServing).await;
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
