//! The order service: accepts orders over gRPC and writes each with its outbox event in one
//! local transaction, answering with the exact transaction outcome.

mod accepting;
mod admin;
mod alone;
mod application;
mod event;
mod group;
mod grpc;
mod settings;
mod store;

pub use crate::contract::{AGGREGATE_TYPE, EVENT_TYPE};
pub use accepting::{AcceptedOrder, SubmitError, Submitted};
pub use admin::{PurgeReport, Retention};
pub use application::{Application, StartupError};
pub use group::{BatchSizes, BatchStats, GroupCommitMode, GroupCommitSettings};
pub use settings::Settings;
pub use store::OrderStore;
