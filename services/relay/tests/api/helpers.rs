//! The relay's harness, from the test kit: every test here starts its relay through
//! `idempost_testkit::relay` ([`TestRelay`](idempost_testkit::relay::TestRelay) in process, or a
//! [`TestService`] process) and waits with [`idempost_testkit::wait::WAIT`].

pub use idempost_testkit::db::Backend;
#[cfg(feature = "failpoints")]
pub use idempost_testkit::failpoint::hold;
pub use idempost_testkit::on_every_backend;
pub use idempost_testkit::order::{TestOrder, order};
pub use idempost_testkit::outbox::{OutboxProbe, OutboxState};
pub use idempost_testkit::service::{TestService, binary as service_binary};
pub use idempost_testkit::wait::{assert_eventually, eventually};
