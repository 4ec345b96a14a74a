//! End-to-end tests of the order service against real MariaDB, PostgreSQL and SQLite servers,
//! through a real gRPC client. Run with `cargo nextest`: failpoints are process-global, and
//! nextest gives every test its own process.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub, missing_debug_implementations)]

mod broker;
mod helpers;
mod private_db;

use idempost_testkit::{otlp, pki};

mod admin;
mod callers;
#[cfg(feature = "failpoints")]
mod chaos;
mod classify;
mod client;
mod console;
mod consumer;
mod credentials;
mod dependencies;
mod deploy;
mod limits;
mod membership;
mod ordering;
mod outage;
mod parking;
mod python;
mod relay;
mod rollback;
mod security;
mod stopping;
mod traces;
mod typescript;
#[cfg(feature = "failpoints")]
mod verify;
mod wake;
