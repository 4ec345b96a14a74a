//! The relay: publishes every PENDING outbox event to Kafka at least once, under a lease.
//!
//! Claim in a short transaction, publish outside any transaction, mark PUBLISHED only after the
//! broker's confirm and only while this worker still owns the lease. Any number of relays may
//! run at once; a duplicate publish is possible (and absorbed by consumers), a lost one is not.

mod application;
mod health;
mod outbox;
mod publisher;
mod settings;
mod worker;

use std::fmt;

pub use application::{Application, StartupError, redrive};
pub use outbox::{
    Backlog, ClaimedEvent, Delivery, Fenced, Outbox, Redrive, RedriveAudit, Released, RetryPolicy,
};
pub use publisher::{CONTENT_TYPE, KafkaPublisher, ProducerConfigError, PublishError, Publisher};
pub use settings::{Command, Settings};
pub use worker::{PublisherFailed, Relay, StepOutcome, StepReport, Tuning};

/// The Kafka topic OrderAccepted events go to unless configured otherwise.
pub const DEFAULT_TOPIC: &str = "outpost.order-accepted.v1";

/// A lease owner's identity: host, process id and a random part, unique per worker.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorkerId(String);

impl WorkerId {
    /// A new id for this process. Two workers in one process get different ids.
    pub fn generate() -> Self {
        let host = gethostname::gethostname().to_string_lossy().chars().take(96).collect::<String>();
        Self(format!("{host}/{}/{:08x}", std::process::id(), rand::random::<u32>()))
    }

    /// The id as stored in `outbox_event.lease_owner`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
