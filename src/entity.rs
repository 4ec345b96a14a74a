//! SeaORM entities for the tables the migrations create. Crate-private: the stores wrap them.
#![allow(unreachable_pub)]

pub mod admin_audit;
pub mod consumed_event;
pub mod dead_letter;
pub mod gap_release;
pub mod notification_job;
pub mod order_line;
pub mod order_version;
pub mod order_view;
pub mod orders;
pub mod outbox_event;
pub mod parked_event;
pub mod replay_audit;
