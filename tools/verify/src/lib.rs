//! `idempost-verify`: one event is followed through a fault at every commit window, with real service
//! processes that the verifier starts, crashes and restarts, and the evidence is reported.
//!
//! The event is submitted (rolled back, then committed with its acknowledgement lost and
//! reconciled), relayed (a relay dies before claiming, another after the broker's confirm and
//! before its mark, a third stalls past its lease while a fourth takes over), and consumed (a
//! consumer fails on a non-target integrity error and is killed, another dies after its commit
//! and before acknowledging, a third absorbs the redeliveries). Its order is amended and
//! cancelled after the submission, so versions 2 and 3 wait behind it through the same faults;
//! the topic must show the order's versions in order, and the consumer's read model must end
//! where the order table is. Every verdict rests on rows read by event id, records counted by
//! consuming the topic, and the processes' own logs.
//!
//! A tool, not part of the services: the production library (`idempost`) knows nothing of it.
//! The end-to-end tests use its [`process`] control to run services out of process, so the
//! tests and the verifier start, signal and kill them one way.

mod chaos;
mod error;
mod evidence;
mod journey;
mod ordering;
/// Service processes: the test kit's process control, under the name the verifier's callers use.
pub use idempost_testkit::service as process;
mod report;
mod settings;

pub use chaos::{BrokerControl, ChaosReport, ChaosSettings, DatabaseControl, chaos};
pub use error::VerifyError;
pub use evidence::{OutboxRow, Record, Rows, create_topic, read_topic};
pub use journey::run;
pub use ordering::{
    OrderCheck, OrderState, check_orders, order_states, read_model_differences, versions_in_order,
};
pub use report::{Counts, EventFacts, Injection, Invariant, Report, Versions};
pub use settings::{Break, Settings};
