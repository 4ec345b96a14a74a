//! End-to-end tests of the consumer: the consumer in process or as a real process, over fresh
//! MariaDB, PostgreSQL and SQLite databases, reading a real broker (a Tansu per test) that the
//! tests or a relay write to. Run with `cargo nextest`: failpoints are process-global, and
//! nextest gives every test its own process.
// The futures of whole end-to-end tests nest deeper than the compiler's default layout limit.
#![recursion_limit = "256"]
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub, missing_debug_implementations)]

mod helpers;

use idempost_testkit::broker;

mod consumer;
mod listings;
mod membership;
mod parking;
mod restart;
mod retention;
