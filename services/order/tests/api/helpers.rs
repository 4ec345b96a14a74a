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
use tonic::codegen::Bytes;

/// Sends `data` on a raw call's stream (`end`: the last of it). A call refused at the door (no
/// token, a scope it lacks, no slot) may be answered, its stream closed, from the headers alone,
/// before the data is queued: the answer, which the caller reads, is the outcome either way, so a
/// stream already closed here is not a failure. A connection that failed shows in the answer too.
pub fn send_after_headers(body: &mut h2::SendStream<Bytes>, data: Bytes, end: bool) {
    let _ = body.send_data(data, end);
}
