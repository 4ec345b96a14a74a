//! Idempost: repeatable event delivery through a transactional outbox, a leased relay and a
//! deduplicating consumer. Duplicates are expected and absorbed; nothing is lost silently.
//!
//! This is the core the services share (the domain, the database seam and its entities, the
//! gRPC edge, security, telemetry, settings); each service is a crate of its own in `services/`:
//! `idempost-order` accepts orders and writes each with its event in one local transaction,
//! `idempost-relay` publishes the outbox to Kafka under leases, and `idempost-consumer` turns
//! each event into one local effect.

pub mod audit;
pub mod backlog;
pub mod contract;
pub mod db;
pub mod domain;
pub mod edge;
pub mod entity;
pub mod failpoint;
pub mod hangup;
pub mod kafka;
pub mod secret;
pub mod security;
pub mod service;
pub mod shutdown;
pub mod startup;
pub mod telemetry;
pub mod wake;
