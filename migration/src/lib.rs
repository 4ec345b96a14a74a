//! Idempost's schema as sea-orm-migration migrations that run unchanged on MariaDB/MySQL,
//! PostgreSQL and SQLite.
//!
//! Constraint and index names are part of Idempost's contract: the order service and the consumer
//! classify duplicate-key errors by them.

pub use sea_orm_migration::prelude::*;

mod column;
mod m20261202_000001_create_outbox_schema;
mod m20261202_000002_operations;
mod m20261203_000001_claim_fence;
mod m20261203_000002_effect_per_consumer;
mod m20261203_000003_event_id_lookup;
mod m20261205_000001_exact_identifiers;
mod m20261205_000002_order_version;
mod m20261205_000003_per_order_order;
mod m20261205_000004_held_back;
mod m20261206_000001_backlog_on_ready;
mod m20261206_000002_replay_audit;
mod m20261206_000003_consumer_names_exact;
mod m20261206_000004_admin_audit;
mod m20261206_000005_instance_lease;
mod m20261206_000006_successor_version;
mod m20261207_000001_ready_descending;
pub mod order_ids;

/// Every migration Idempost knows, oldest first.
#[derive(Debug)]
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261202_000001_create_outbox_schema::Migration),
            Box::new(m20261202_000002_operations::Migration),
            Box::new(m20261203_000001_claim_fence::Migration),
            Box::new(m20261203_000002_effect_per_consumer::Migration),
            Box::new(m20261203_000003_event_id_lookup::Migration),
            Box::new(m20261205_000001_exact_identifiers::Migration),
            Box::new(m20261205_000002_order_version::Migration),
            Box::new(m20261205_000003_per_order_order::Migration),
            Box::new(m20261205_000004_held_back::Migration),
            Box::new(m20261206_000001_backlog_on_ready::Migration),
            Box::new(m20261206_000002_replay_audit::Migration),
            Box::new(m20261206_000003_consumer_names_exact::Migration),
            Box::new(m20261206_000004_admin_audit::Migration),
            Box::new(m20261206_000005_instance_lease::Migration),
            Box::new(m20261206_000006_successor_version::Migration),
            Box::new(m20261207_000001_ready_descending::Migration),
        ]
    }
}
