//! The database seam: connecting, checking the schema, and classifying errors per backend.
//!
//! Every difference between MariaDB/MySQL, PostgreSQL and SQLite that Idempost cares about lives
//! under this module, so the rest of the code speaks one dialect.

mod classify;
pub mod cleanup;
mod connect;
mod dialect;
mod failure;
pub mod galera;
pub mod purge;
mod settings;

pub use classify::{ErrorFacts, UniqueKey, violated_unique_key};
pub use classify::{LockConflict, commit_refused, lock_conflict};
pub use connect::ensure_migrated;
pub use connect::{Pool, SchemaError, connect, connect_for};
pub use dialect::now;
pub use dialect::{JoinedUpdate, ValueColumn};
pub use dialect::{by_event_ids, has_update_returning, statement_time};
pub use dialect::{has_skip_locked, relay_isolation, system_name};
pub use failure::TxFailure;
pub use settings::DatabaseSettings;
