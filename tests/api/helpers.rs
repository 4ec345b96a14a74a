//! The harness the cross-service tests share: the test kit's, under the names these tests use.

pub use idempost_testkit::db::{Backend, TestDb};
#[cfg(feature = "failpoints")]
pub use idempost_testkit::failpoint::arm;
pub use idempost_testkit::in_process::InProcess;
pub use idempost_testkit::on_every_backend;
pub use idempost_testkit::order::{TestOrder, connect_order_service, order, order_accepted};
pub use idempost_testkit::outbox::OutboxProbe;
pub use idempost_testkit::service::{TestService, binary as service_binary};
pub use idempost_testkit::status::{metadata, reason, violated_fields};
pub use idempost_testkit::wait::{assert_eventually, eventually};
