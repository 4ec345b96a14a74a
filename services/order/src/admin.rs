//! The order side's operators' edge, served as the gRPC `AdminService` on the admin listener:
//! the order and outbox state of an event by its id, the outbox backlog, the audited way out of
//! FAILED, and the outbox's retention purge. It reads the order database only; the consumer
//! serves its own records (`idempost-consumer`'s `admin`).

mod audit;
mod audit_pages;
mod grpc;
mod inspect;
mod listing;
mod replay;
mod retention;
mod wait;

pub(crate) use grpc::AdminGrpc;
pub(crate) use retention::OutboxRetention;
