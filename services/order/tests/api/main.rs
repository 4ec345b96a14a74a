//! End-to-end tests of the order service: a real gRPC client against the service on port 0, over
//! fresh MariaDB, PostgreSQL and SQLite databases (the test kit's `TestOrder`). Run with `cargo
//! nextest`: failpoints are process-global, and nextest gives every test its own process.
// The futures of whole end-to-end tests nest deeper than the compiler's default layout limit.
#![recursion_limit = "256"]
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub, missing_debug_implementations)]

mod helpers;

use idempost_testkit::{otlp, pki};

mod audit;
mod callers;
mod change_order;
mod exact_key;
mod group_commit;
mod limits;
mod listings;
mod peers;
mod reconcile;
mod retention;
mod service;
mod shards;
mod submit_order;
mod successor;
