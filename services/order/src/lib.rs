//! The order service: accepts orders, and amendments and cancellations of them, over gRPC and
//! writes each with its outbox event in one local transaction, answering with the exact
//! transaction outcome.

mod accepting;
mod admin;
mod alone;
mod application;
mod change;
mod event;
mod group;
mod grpc;
mod settings;
mod shards;
mod store;
mod transaction;

pub use application::{Application, StartupError};
pub use group::{BatchSizes, BatchStats, GroupCommitMode, GroupCommitSettings};
pub use settings::Settings;
pub use shards::{ReloadError, ShardError, ShardMapReload};
