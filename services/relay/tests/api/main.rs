//! End-to-end tests of the relay: the relay in process or as a real process, over fresh MariaDB,
//! PostgreSQL and SQLite outboxes, publishing to a real broker (a Tansu per test). Events are
//! written by the order service (the test kit's `TestOrder`) or seeded with plain SQL. Run with
//! `cargo nextest`: failpoints are process-global, and nextest gives every test its own process.
// The futures of whole end-to-end tests nest deeper than the compiler's default layout limit.
#![recursion_limit = "256"]
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub, missing_debug_implementations)]

mod helpers;

use idempost_testkit::{broker, otlp};

mod claims;
mod fleet;
mod relay;
