//! `outpost-verify`: one event is followed through a fault at every commit window, with real service
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
//! A tool, not part of the services: the production library (`outpost`) knows nothing of it.
//! The end-to-end tests use its [`process`] control to run services out of process, so the
//! tests and the verifier start, signal and kill them one way.

mod chaos;
mod evidence;
mod journey;
mod ordering;
pub mod process;
mod report;

use std::path::PathBuf;

use process::{Output, ServiceProcess};

pub use chaos::{BrokerControl, ChaosReport, ChaosSettings, DatabaseControl, chaos};
pub use evidence::{OutboxRow, Record, Rows, create_topic, read_topic};
pub use journey::run;
pub use ordering::{
    OrderCheck, OrderState, check_orders, order_states, read_model_differences, versions_in_order,
};
pub use report::{Counts, EventFacts, Injection, Invariant, Report, Versions};

/// A guarantee to break on purpose, to show that the verifier catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Break {
    /// The consumer takes any integrity error for "already consumed".
    Classifier,
    /// The relay marks PUBLISHED without the owner condition.
    MarkWithoutOwner,
    /// The consumer commits the offset before its local transaction.
    OffsetBeforeCommit,
}

impl Break {
    /// Parses `classifier`, `mark-without-owner` or `offset-before-commit`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "classifier" => Ok(Self::Classifier),
            "mark-without-owner" => Ok(Self::MarkWithoutOwner),
            "offset-before-commit" => Ok(Self::OffsetBeforeCommit),
            _ => Err(format!("`{text}`: expected classifier, mark-without-owner or offset-before-commit")),
        }
    }

    fn switch(self) -> &'static str {
        match self {
            Self::Classifier => outpost::failpoint::BREAK_CLASSIFIER_ANY_INTEGRITY_ERROR_IS_DUPLICATE,
            Self::MarkWithoutOwner => outpost::failpoint::BREAK_MARK_WITHOUT_OWNER_CONDITION,
            Self::OffsetBeforeCommit => outpost::failpoint::BREAK_OFFSET_COMMIT_BEFORE_LOCAL_COMMIT,
        }
    }

    fn in_consumer(self) -> bool {
        matches!(self, Self::Classifier | Self::OffsetBeforeCommit)
    }
}

/// Where and how to verify.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A migrated database (`outpost-migrate up`) the services can share.
    pub database_url: String,
    /// Kafka bootstrap servers.
    pub brokers: String,
    /// Where `outpost-order`, `outpost-relay` and `outpost-consumer` are, built with the
    /// `failpoints` feature.
    pub bin_dir: PathBuf,
    /// Where the processes' logs go (kept as evidence).
    pub work_dir: PathBuf,
    /// Guarantees to break on purpose (tests of the verifier itself).
    pub breaks: Vec<Break>,
}

impl Settings {
    /// Starts `binary` from `bin_dir` as `label`, with `failpoints` (`NAME=ACTION;…`) armed,
    /// its JSON logs kept in `work_dir/label.log` and its bound addresses in `work_dir/label.ports`. The database URL (which may hold a password)
    /// goes through the environment, never the command line, which every user of the host can
    /// read.
    fn launch(
        &self,
        binary: &str,
        label: &str,
        args: &[String],
        failpoints: &str,
    ) -> std::io::Result<ServiceProcess> {
        let env = [
            ("OUTPOST_DATABASE_URL", self.database_url.clone()),
            ("FAILPOINTS", failpoints.to_owned()),
            ("OUTPOST_LOG_FORMAT", "json".to_owned()),
            ("RUST_LOG", "info".to_owned()),
        ];
        let log = Output::File(self.work_dir.join(format!("{label}.log")));
        let ports = self.work_dir.join(format!("{label}.ports"));
        ServiceProcess::start_with_port_file(&self.bin_dir.join(binary), label, args, &env, log, &ports)
    }
}

/// The experiment could not be carried out (as opposed to: it ran and an invariant failed).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// A step did not happen in time.
    #[error("{0}")]
    Stuck(String),
    /// The database failed.
    #[error("database: {0}")]
    Database(#[from] sea_orm::DbErr),
    /// A process could not be started.
    #[error("cannot start a service: {0}")]
    Spawn(#[from] std::io::Error),
    /// The broker refused something.
    #[error("broker: {0}")]
    Broker(String),
    /// The order service refused a call it should have answered.
    #[error("order service: {0}")]
    Grpc(String),
}
