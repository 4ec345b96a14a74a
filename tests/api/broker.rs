//! The test kit's broker (a Tansu per test) and topic reader, under the names the tests use.

pub use idempost_testkit::broker::{Record, TestBroker, read_topic};
pub use idempost_testkit::ports::free_port;
