//! Who holds a claimed row: the relay process's [`WorkerId`] and the per-claim [`LeaseToken`]
//! that fences every mark and release.

use std::fmt;
use std::sync::Arc;

/// A relay process's identity: host, process id and a random part. Every claim it makes gets its
/// own [`LeaseToken`] that starts with this id, so operators still see which relay holds a lease.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorkerId(String);

/// Most characters of the host name kept in a [`WorkerId`], so that a [`LeaseToken`] (id, `/`,
/// 16 hex digits) always fits `outbox_event.lease_owner` (128 characters).
const HOST_CHARS: usize = 80;

impl WorkerId {
    /// A new id for this process. Two workers in one process get different ids.
    pub fn generate() -> Self {
        let host = gethostname::gethostname().to_string_lossy().chars().take(HOST_CHARS).collect::<String>();
        Self(format!("{host}/{}/{:08x}", std::process::id(), rand::random::<u32>()))
    }

    /// The id as a prefix of every lease token this worker writes.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The fence of one claim: the value the claim wrote into `lease_owner` of every row it took,
/// `<worker id>/<64 random bits>`, new for every claim.
///
/// Every mark and release after the claim carries it, so it changes a row only while the row
/// is still leased *by that claim*. A later claim of the same row, even by another loop of the
/// same relay, writes another token, and the earlier claim's late mark or release then matches
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseToken(Arc<str>);

impl LeaseToken {
    /// A fresh token for one claim by `worker`.
    pub(crate) fn new(worker: &WorkerId) -> Self {
        Self(format!("{worker}/{:016x}", rand::random::<u64>()).into())
    }

    /// The token as stored in `outbox_event.lease_owner`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_token_fits_the_lease_owner_column_and_names_its_worker() {
        let worker = WorkerId(format!("{}/{}/{:08x}", "h".repeat(HOST_CHARS), u32::MAX, u32::MAX));
        let token = LeaseToken::new(&worker);
        assert!(token.as_str().len() <= 128, "{}", token.as_str().len());
        assert!(token.as_str().starts_with(&format!("{worker}/")));
    }

    #[test]
    fn every_claim_gets_its_own_token() {
        let worker = WorkerId::generate();
        assert_ne!(LeaseToken::new(&worker), LeaseToken::new(&worker));
    }
}
