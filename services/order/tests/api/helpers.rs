//! The order service's harness, from the test kit: every test here starts its service through
//! [`TestOrder`] and waits with [`idempost_testkit::wait::WAIT`].

pub use idempost_testkit::db::{Backend, TestDb};
#[cfg(feature = "failpoints")]
pub use idempost_testkit::failpoint::arm;
pub use idempost_testkit::on_every_backend;
pub use idempost_testkit::order::{TestOrder, amend, cancel, connect_order_service, order};
pub use idempost_testkit::service::{TestService, binary as service_binary};
pub use idempost_testkit::status::{metadata, reason, violated_fields};
pub use idempost_testkit::wait::assert_eventually;
