//! The consumer: turns each OrderAccepted into exactly one local effect (a notification job),
//! however often Kafka delivers it.
//!
//! One message, one transaction: the `consumed_event` row and the effect commit together, and the
//! offset is stored only after that commit, or after the event is proven already consumed by a
//! violation of `uq_consumed_event_identity` and nothing else. Undecodable records go to the
//! dead-letter table, in one transaction, before their offset is stored.
//!
//! Each order's events also update the consumer's read model of the order (`order_view`) in that
//! transaction, in version order: an event at or below the model's version is a duplicate; one
//! that skips ahead (its predecessor was dead-lettered, or not delivered yet) or whose type this
//! consumer does not know is parked (`parked_event`) and applied once the gap fills, or when an
//! operator releases the gap (`ConsumerAdminService.ReleaseParkedGap`, audited in `admin_audit`).
//!
//! The consumer owns its tables (`consumed_event`, `notification_job`, `dead_letter`,
//! `order_view`, `parked_event`, and its rows of `admin_audit`), in its
//! own database: it purges its dedup history itself (never inside the redelivery horizon) and
//! serves operators its records of each event on its listener (`ConsumerAdminService`).

mod admin;
mod application;
mod decode;
mod gap;
mod gauges;
mod inbox;
mod instance;
mod rejoin;
mod retention;
mod settings;
mod worker;

pub use application::{Application, StartupError};
pub use decode::{OrderEvent, Poison, decode};
pub use inbox::{Consumed, Inbox};
pub use instance::InstanceError;
pub use retention::RetentionError;
pub use settings::{DEFAULT_CONSUMER_NAME, Membership, Settings};
pub use worker::{ConsumerStats, StatsSnapshot};
