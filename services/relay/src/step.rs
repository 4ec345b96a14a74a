//! What one relay step did: the report the loop adapts its batches to and health reads.

use std::time::Duration;

/// What one step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Events claimed.
    pub(crate) claimed: usize,
    /// Confirmed by the broker and marked PUBLISHED.
    pub published: usize,
    /// Confirmed (or failed) after another worker took the lease: left alone.
    pub lease_lost: usize,
    /// Failed to publish and released for a later retry.
    pub released: usize,
    /// Failed to publish for the last allowed time: now FAILED.
    pub failed: usize,
    /// Outcomes that could not be written (the database failed); their leases will expire.
    pub(crate) unrecorded: usize,
    /// Handed to the producer without a verdict by the settle deadline: left to their leases.
    pub(crate) unsettled: usize,
    /// Time spent claiming (the claim transaction).
    pub(crate) claim_time: Duration,
    /// Time from the end of the claim until every record of the batch had its verdict (or the
    /// settle deadline passed).
    pub(crate) publish_time: Duration,
    /// Time spent recording the outcomes (the release and the mark statements).
    pub(crate) record_time: Duration,
}

/// What a step found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepOutcome {
    /// Nothing was claimable.
    Idle,
    /// A batch was claimed and handled.
    Worked(StepReport),
}
