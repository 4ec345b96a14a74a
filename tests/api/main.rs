//! Tests that span services, against real MariaDB, PostgreSQL and SQLite servers and a real
//! broker: the three services together (the test kit's `Pipeline`), per-order order end to end,
//! faults of what they depend on, callers and operators with real credentials, the clients in
//! other languages, the console, the verifier and chaos runs, the deployment files. Each
//! service's own tests live beside it, in `services/<service>/tests`. Run with `cargo nextest`:
//! failpoints are process-global, and nextest gives every test its own process.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub, missing_debug_implementations)]

mod broker;
mod helpers;
mod private_db;

use idempost_testkit::{otlp, pki};

mod admin;
mod awaiting;
#[cfg(feature = "failpoints")]
mod chaos;
mod claimable;
mod classify;
mod cleanup;
mod client;
mod cloudevents;
mod console;
mod credentials;
mod dependencies;
mod deploy;
mod escaping;
mod galera;
mod metrics_scrape;
mod ordering;
mod outage;
mod pipeline;
mod python;
mod replay;
mod rollback;
mod security;
mod stopping;
mod traces;
mod typescript;
#[cfg(feature = "failpoints")]
mod verify;
mod wake;
