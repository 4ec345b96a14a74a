//! The harness the cross-service tests share: the test kit's, under the names these tests use.

pub use idempost_testkit::db::{Backend, TestDb};
#[cfg(feature = "failpoints")]
pub use idempost_testkit::failpoint::arm;
pub use idempost_testkit::in_process::InProcess;
pub use idempost_testkit::on_every_backend;
pub use idempost_testkit::order::{TestOrder, connect_order_service, order};
pub use idempost_testkit::outbox::OutboxProbe;
pub use idempost_testkit::service::{TestService, binary as service_binary};
pub use idempost_testkit::status::{metadata, reason, violated_fields};
pub use idempost_testkit::wait::{assert_eventually, eventually};

/// Verifier settings over a test database and broker, with the services built beside the tests.
pub fn verify_settings(
    db: &TestDb,
    broker: &idempost_testkit::broker::TestBroker,
    logs: &tempfile::TempDir,
    breaks: Vec<idempost_verify::Break>,
) -> idempost_verify::Settings {
    idempost_verify::Settings {
        database_url: db.url.clone(),
        brokers: broker.address(),
        bin_dir: service_binary("idempost-relay").parent().unwrap().to_owned(),
        work_dir: logs.path().to_owned(),
        breaks,
    }
}
