//! The relay: publishes every PENDING outbox event to Kafka at least once, under a lease.
//!
//! Claim in a short transaction, publish outside any transaction, mark PUBLISHED only after the
//! broker's confirm and only while this worker still owns the lease. Any number of relays may
//! run at once; a duplicate publish is possible (and absorbed by consumers), a lost one is not.

mod application;
mod backlog;
mod budget;
mod cleanup;
mod fleet;
mod health;
mod lease;
mod outbox;
mod publisher;
mod redrive;
mod settings;
mod step;
mod worker;

pub use application::{Application, StartupError};
pub use fleet::FleetError;
pub use lease::{LeaseToken, WorkerId};
pub use outbox::{
    Blame, ClaimWindow, ClaimedEvent, Delivery, Fenced, Outbox, Released, RetryPolicy, Swept, open_outbox,
};
pub use publisher::{CloudEventsMode, KafkaPublisher, ProducerConfigError, PublishError, Publisher};
pub use redrive::{RedriveError, Redriven, redrive};
pub use settings::{Command, Settings};
pub use step::{StepOutcome, StepReport};
pub use worker::{PublisherFailed, Relay, Tuning};
