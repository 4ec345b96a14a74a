//! The order service: accepts orders over gRPC and writes each with its outbox event in one
//! local transaction, answering with the exact transaction outcome.

mod application;
mod event;
mod grpc;
mod settings;
mod store;

pub use application::{Application, StartupError};
pub(crate) use event::timestamp;
pub use event::{AGGREGATE_TYPE, EVENT_TYPE};
pub use grpc::ERROR_DOMAIN;
pub(crate) use grpc::{record_status, rpc_span};
pub use settings::Settings;
pub use store::{AcceptedOrder, OrderStore, SubmitError, Submitted};
