//! The consumer's harness, from the test kit: every test here starts its consumer through
//! `idempost_testkit::consumer` ([`TestConsumer`](idempost_testkit::consumer::TestConsumer) in
//! process, or a [`TestService`] process) and waits with [`idempost_testkit::wait::WAIT`].

pub use idempost_testkit::db::{Backend, TestDb};
pub use idempost_testkit::in_process::InProcess;
pub use idempost_testkit::on_every_backend;
pub use idempost_testkit::order::{TestOrder, order};
pub use idempost_testkit::service::{TestService, binary as service_binary};
pub use idempost_testkit::wait::assert_eventually;
