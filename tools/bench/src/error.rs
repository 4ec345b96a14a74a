//! Why a benchmark run could not be carried out.

/// A run failed: a phase could not be set up or did not finish.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BenchError {
    /// The settings cannot work.
    #[error("{0}")]
    Settings(String),
    /// The database failed.
    #[error("database: {0}")]
    Database(#[from] sea_orm::DbErr),
    /// A process or a file could not be handled.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The broker or the Kafka client failed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The order service could not be reached.
    #[error("order service: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The order service refused a call.
    #[error("order service: {0}")]
    Grpc(#[from] tonic::Status),
    /// A phase did not finish in time or went wrong.
    #[error("{0}")]
    Stuck(String),
    /// The chart could not be drawn.
    #[error("chart: {0}")]
    Chart(String),
}
