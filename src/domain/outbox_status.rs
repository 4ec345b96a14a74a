/// Where an outbox event is on its way to the broker.
///
/// `PENDING` → `PUBLISHING` (leased) → `PUBLISHED`; a failed publish goes back to `PENDING` with a
/// retry time, and after too many attempts to `FAILED`, which only an operator's redrive leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxStatus {
    /// Waiting to be claimed. `lease_until`, when set, is the earliest time of the next attempt.
    Pending,
    /// Claimed by `lease_owner` until `lease_until`; claimable again once that has passed.
    Publishing,
    /// The broker confirmed the record.
    Published,
    /// Gave up after the configured attempts; kept for an operator to redrive.
    Failed,
}

impl OutboxStatus {
    /// The spelling stored in `outbox_event.status`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Publishing => "PUBLISHING",
            Self::Published => "PUBLISHED",
            Self::Failed => "FAILED",
        }
    }

    /// Reads a stored status; `None` for one this version does not know.
    pub fn from_stored(text: &str) -> Option<Self> {
        [Self::Pending, Self::Publishing, Self::Published, Self::Failed]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_reads_back_as_stored_and_nothing_else_does() {
        for status in
            [OutboxStatus::Pending, OutboxStatus::Publishing, OutboxStatus::Published, OutboxStatus::Failed]
        {
            assert_eq!(OutboxStatus::from_stored(status.as_str()), Some(status));
        }
        assert_eq!(OutboxStatus::from_stored("pending"), None);
        assert_eq!(OutboxStatus::from_stored(""), None);
    }
}
