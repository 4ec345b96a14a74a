//! The operators' edge, served as the gRPC `AdminService`: every state of an event by its id,
//! the outbox backlog, the audited way out of FAILED, and the retention purge.

mod grpc;
mod inspect;
mod retention;

pub(crate) use grpc::AdminGrpc;
pub use retention::{PurgeReport, Retention, RetentionError};
