//! How one relay step spends its lease.
//!
//! A step claims a batch, publishes it and records the outcomes (marks and releases). All of it
//! must end before the lease does, with the margin to spare, or another relay may claim the
//! events while this one still acts on them. librdkafka's `delivery.timeout.ms` starts only once
//! a record is in its queue, and `send` may first wait for queue space, so the relay bounds the
//! publishing itself: the claim, the queue wait and the delivery together take at most
//! `delivery_timeout`, counted from before the claim, and marks and releases get what is left of
//! `lease - margin`. A step stalled between its claim and its publish (a paused process, a
//! starved thread) therefore finds its publishing time spent and hands librdkafka nothing: its
//! events wait for their leases to expire, and an order's later versions, published meanwhile by
//! another relay, are never followed by a late copy of an earlier one from this step. A stall
//! after the records were handed over outlives any budget; the claim's fence makes that step's
//! late marks and releases change nothing.

use std::time::Duration;

/// The least time a step keeps for its marks and releases.
pub(crate) const MIN_RECORD_TIME: Duration = Duration::from_secs(1);

/// How long each phase of one step may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepBudget {
    /// The claim and the publishing (queue wait and delivery) of the batch together.
    pub(crate) publish: Duration,
    /// The whole step, marks and releases included: `lease - margin`.
    pub(crate) whole: Duration,
}

impl StepBudget {
    /// The budget for these settings, or why they cannot keep a step inside its lease.
    pub(crate) fn new(lease: Duration, delivery_timeout: Duration, margin: Duration) -> Result<Self, String> {
        let least = delivery_timeout + MIN_RECORD_TIME + margin;
        if lease < least {
            return Err(format!(
                "the lease ({lease:?}) must cover the delivery timeout ({delivery_timeout:?}, queue wait \
                 included), at least {MIN_RECORD_TIME:?} to mark and release, and the lease margin \
                 ({margin:?}): at least {least:?}"
            ));
        }
        Ok(Self { publish: delivery_timeout, whole: lease - margin })
    }

    /// The budget a relay built without the start-up check uses: the same split, with at least
    /// [`MIN_RECORD_TIME`] for marks and releases however short the lease.
    pub(crate) fn lenient(lease: Duration, delivery_timeout: Duration, margin: Duration) -> Self {
        let whole = lease.saturating_sub(margin).max(delivery_timeout + MIN_RECORD_TIME);
        Self { publish: delivery_timeout, whole }
    }
}

/// The claim size a relay loop uses next.
///
/// A loop starts small, so a lone event is claimed, published and marked without waiting for
/// company. While claims come back full (a backlog) and a step's publishing takes at most half
/// of its budget, the size doubles, up to `max`; a step that used more than half of the budget
/// halves it, and a claim that found nothing returns it to the smallest size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AdaptiveBatch {
    current: u64,
    max: u64,
}

impl AdaptiveBatch {
    /// The smallest size (unless `max` is smaller).
    pub(crate) const MIN: u64 = 10;

    /// A batch size that adapts between [`AdaptiveBatch::MIN`] and `max`.
    pub(crate) fn new(max: u64) -> Self {
        let max = max.max(1);
        Self { current: Self::MIN.min(max), max }
    }

    /// The size of the next claim.
    pub(crate) fn size(&self) -> u64 {
        self.current
    }

    /// Adapts to a step that claimed `claimed` events and spent `publishing` of its
    /// `publish_budget` on publishing them.
    pub(crate) fn after(&mut self, claimed: u64, publishing: Duration, publish_budget: Duration) {
        let floor = Self::MIN.min(self.max);
        self.current = if claimed == 0 {
            floor
        } else if publishing > publish_budget / 2 {
            (self.current / 2).max(floor)
        } else if claimed >= self.current {
            self.current.saturating_mul(2).min(self.max)
        } else {
            self.current
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_defaults_leave_fifteen_seconds_to_mark_and_five_to_spare() {
        assert_eq!(StepBudget::new(S(30), S(10), S(5)), Ok(StepBudget { publish: S(10), whole: S(25) }));
    }

    #[test]
    fn a_lease_that_leaves_no_time_to_mark_after_the_delivery_timeout_is_refused() {
        // The old check (lease > delivery timeout + margin) let this through: nothing was left
        // for the marks, and a queue wait could take the step past its lease.
        let Err(refused) = StepBudget::new(Duration::from_millis(15_500), S(10), S(5)) else {
            panic!("a lease of 15.5s with a delivery timeout of 10s and a margin of 5s was accepted");
        };
        assert!(refused.contains("lease") && refused.contains("delivery timeout"), "{refused}");
        assert!(refused.contains("at least 16s"), "{refused}");
        assert!(StepBudget::new(S(5), S(10), S(1)).is_err());
    }

    #[test]
    fn exactly_enough_is_accepted() {
        let budget = StepBudget { publish: S(3), whole: S(4) };
        assert_eq!(StepBudget::new(S(5), S(3), S(1)), Ok(budget));
        assert!(budget.whole - budget.publish >= MIN_RECORD_TIME);
    }

    #[test]
    fn a_lenient_budget_still_leaves_time_to_mark() {
        let budget = StepBudget::lenient(Duration::from_millis(300), Duration::from_millis(1500), S(0));
        assert_eq!(budget.publish, Duration::from_millis(1500));
        assert_eq!(budget.whole, Duration::from_millis(2500));
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn a_batch_starts_small_and_doubles_while_claims_come_back_full_up_to_the_setting() {
        let mut batch = AdaptiveBatch::new(100);
        assert_eq!(batch.size(), 10);
        for expected in [20, 40, 80, 100, 100] {
            batch.after(batch.size(), MS(200), S(10));
            assert_eq!(batch.size(), expected);
        }
    }

    #[test]
    fn a_partly_filled_claim_keeps_the_size_and_an_empty_one_returns_to_the_smallest() {
        let mut batch = AdaptiveBatch::new(1000);
        batch.after(10, MS(10), S(10));
        batch.after(20, MS(10), S(10));
        assert_eq!(batch.size(), 40);
        batch.after(3, MS(10), S(10));
        assert_eq!(batch.size(), 40, "no backlog, but no reason to shrink either");
        batch.after(0, MS(0), S(10));
        assert_eq!(batch.size(), 10, "idle: a lone event goes out in a small batch at once");
    }

    #[test]
    fn a_step_that_used_more_than_half_its_publishing_budget_halves_the_batch() {
        let mut batch = AdaptiveBatch::new(1000);
        for _ in 0..4 {
            batch.after(batch.size(), MS(100), S(10));
        }
        assert_eq!(batch.size(), 160);
        batch.after(160, MS(5_001), S(10));
        assert_eq!(batch.size(), 80);
        batch.after(80, S(9), S(10));
        batch.after(40, S(9), S(10));
        batch.after(20, S(9), S(10));
        assert_eq!(batch.size(), 10, "never below the smallest size");
    }

    #[test]
    fn a_setting_below_the_smallest_size_is_the_size() {
        let mut batch = AdaptiveBatch::new(3);
        assert_eq!(batch.size(), 3);
        batch.after(3, MS(1), S(10));
        batch.after(0, MS(1), S(10));
        assert_eq!(batch.size(), 3);
    }
}
