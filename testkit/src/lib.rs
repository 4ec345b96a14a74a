//! `idempost-testkit`: what the end-to-end tests, the verifier, the bench and the demo need to
//! stand Idempost up for real, written once: child processes signalled with real signals, a Tansu
//! broker per test, private database servers, certificates and tokens, an OTLP receiver, SQL
//! placeholders per backend, topic names, and the port files the services write.
//!
//! It knows nothing of the `idempost` library (whose tests use it): everything here is generic.
//! Test support fails loudly: a set-up step that cannot happen panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod broker;
pub mod otlp;
pub mod pki;
pub mod ports;
pub mod private_db;
pub mod process;
pub mod sql;
pub mod topic;
