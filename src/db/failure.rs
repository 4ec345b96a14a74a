use sea_orm::DbErr;

use super::classify::ErrorFacts;
use crate::failpoint::Injected;

/// Why a transaction did not commit, or may not have.
///
/// Clone, because one failure of a shared (group-commit) transaction is the answer of every
/// order in it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TxFailure {
    /// The database reported an error.
    #[error("{source} ({facts})")]
    Database {
        /// The error.
        source: DbErr,
        /// SQLSTATE, vendor code and constraint, for the logs.
        facts: ErrorFacts,
    },
    /// A test armed a failpoint.
    #[error(transparent)]
    Injected(#[from] Injected),
}

impl TxFailure {
    /// The database error, unless the failure was injected.
    pub fn db_err(&self) -> Option<&DbErr> {
        match self {
            Self::Database { source, .. } => Some(source),
            Self::Injected(_) => None,
        }
    }
}

impl From<DbErr> for TxFailure {
    fn from(source: DbErr) -> Self {
        let facts = ErrorFacts::of(&source);
        Self::Database { source, facts }
    }
}
