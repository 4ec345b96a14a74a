//! Why a verification could not be carried out.

/// The experiment could not be carried out (as opposed to: it ran and an invariant failed).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// A step did not happen in time.
    #[error("{0}")]
    Stuck(String),
    /// The database failed.
    #[error("database: {0}")]
    Database(#[from] sea_orm::DbErr),
    /// A process could not be started.
    #[error("cannot start a service: {0}")]
    Spawn(#[from] std::io::Error),
    /// The broker refused something.
    #[error("broker: {0}")]
    Broker(String),
    /// The order service refused a call it should have answered.
    #[error("order service: {0}")]
    Grpc(String),
}
