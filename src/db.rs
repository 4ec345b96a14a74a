//! The database seam: connecting, checking the schema, and classifying errors per backend.
//!
//! Every difference between MariaDB/MySQL, PostgreSQL and SQLite that Outpost cares about lives
//! under this module, so the rest of the code speaks one dialect.

mod classify;
mod connect;
mod dialect;
mod failure;
pub(crate) mod purge;

pub use classify::{ErrorFacts, LockConflict, UniqueKey, lock_conflict, violated_unique_key};
pub use connect::{Pool, SchemaError, connect, connect_for, ensure_migrated};
pub use dialect::{has_skip_locked, now, relay_isolation, system_name};
pub use failure::TxFailure;
pub use sea_orm::{DatabaseConnection, DbBackend, DbErr};
