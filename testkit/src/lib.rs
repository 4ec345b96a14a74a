//! `idempost-testkit`: what the end-to-end tests, the verifier, the bench and the demo need to
//! stand Idempost up for real, written once: child processes signalled with real signals, a Tansu
//! broker per test, private database servers, certificates and tokens, an OTLP receiver, SQL
//! placeholders per backend, topic names, and the port files the services write.
//!
//! It also holds the harness every test of a service uses (`spawn_app` in the zero-to-production
//! style: [`order::TestOrder`]), fresh databases per backend ([`db`]), the one bound tests wait
//! with ([`wait::WAIT`]) and in-process failpoints. It knows the core library and the services;
//! none of them knows it, except as a dev-dependency of their tests.
//! Test support fails loudly: a set-up step that cannot happen panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// The futures of whole end-to-end set-ups nest deeper than the compiler's default layout limit.
#![recursion_limit = "256"]

pub mod auth;
pub mod broker;
pub mod cloudevents;
pub mod consumer;
pub mod db;
#[cfg(feature = "failpoints")]
pub mod failpoint;
pub mod galera;
pub mod group;
pub mod health;
pub mod in_process;
pub mod node;
pub mod order;
pub mod ordering;
pub mod otlp;
pub mod outbox;
pub mod peer;
pub mod pipeline;
pub mod pki;
pub mod ports;
pub mod private_db;
pub mod process;
pub mod proxy;
pub mod python;
pub mod relay;
pub mod service;
pub mod set_aside;
pub mod sql;
pub mod status;
pub mod topic;
pub mod wait;

/// The repository's root (this crate is `testkit/` in it), where the clients, scripts and
/// deployment files the tests run live.
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}
