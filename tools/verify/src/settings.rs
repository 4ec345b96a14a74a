//! What the verifier is given: where the database, broker and service binaries are, where the
//! evidence goes, and which guarantees to break on purpose; and how it starts a service from them.

use std::path::PathBuf;

use crate::process::{Output, ServiceProcess};

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

    pub(crate) fn switch(self) -> &'static str {
        match self {
            Self::Classifier => idempost::failpoint::BREAK_CLASSIFIER_ANY_INTEGRITY_ERROR_IS_DUPLICATE,
            Self::MarkWithoutOwner => idempost::failpoint::BREAK_MARK_WITHOUT_OWNER_CONDITION,
            Self::OffsetBeforeCommit => idempost::failpoint::BREAK_OFFSET_COMMIT_BEFORE_LOCAL_COMMIT,
        }
    }

    pub(crate) fn in_consumer(self) -> bool {
        matches!(self, Self::Classifier | Self::OffsetBeforeCommit)
    }
}

/// Where and how to verify.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A migrated database (`idempost-migrate up`) the services can share.
    pub database_url: String,
    /// Kafka bootstrap servers.
    pub brokers: String,
    /// Where `idempost-order`, `idempost-relay` and `idempost-consumer` are, built with the
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
    pub(crate) fn launch(
        &self,
        binary: &str,
        label: &str,
        args: &[String],
        failpoints: &str,
    ) -> std::io::Result<ServiceProcess> {
        let env = [
            ("IDEMPOST_DATABASE_URL", self.database_url.clone()),
            ("FAILPOINTS", failpoints.to_owned()),
            ("IDEMPOST_LOG_FORMAT", "json".to_owned()),
            ("RUST_LOG", "info".to_owned()),
        ];
        let log = Output::File(self.work_dir.join(format!("{label}.log")));
        let ports = self.work_dir.join(format!("{label}.ports"));
        ServiceProcess::start_with_port_file(&self.bin_dir.join(binary), label, args, &env, log, &ports)
    }
}
