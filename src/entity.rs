//! SeaORM entities for the tables the migrations create. Crate-private: the stores wrap them.
#![allow(unreachable_pub)]

pub(crate) mod consumed_event;
pub(crate) mod dead_letter;
pub(crate) mod gap_release;
pub(crate) mod notification_job;
pub(crate) mod order_line;
pub(crate) mod order_version;
pub(crate) mod order_view;
pub(crate) mod orders;
pub(crate) mod outbox_event;
pub(crate) mod parked_event;
