//! How one relay step spends its lease.
//!
//! A step claims a batch, publishes it and records the outcomes (marks and releases). All of it
//! must end before the lease does, with the margin to spare, or another relay may claim the
//! events while this one still acts on them. Three deadlines, counted from before the claim:
//!
//! - **Hand-over** (`delivery_timeout`): the claim and the wait for the producer's turn. A record
//!   not handed to librdkafka by then never is, so it is released at once. A step stalled
//!   between its claim and its publish (a paused process, a starved thread) therefore hands
//!   librdkafka nothing.
//! - **Settle** (hand-over + `delivery_timeout` + [`SETTLE_SLACK`]): librdkafka gives up on a
//!   record `delivery.timeout.ms` after it got it, so by then every record handed over has its
//!   verdict. Until it has, the record may still reach the broker: releasing it earlier let
//!   another claim publish it and the order's later versions, after which the first copy landed
//!   behind them. So a step waits for the verdicts, and a record still without one at the
//!   settle deadline is left to its lease, never released.
//! - **Whole** (`lease - margin`): marks and releases get what is left, at least
//!   [`MIN_RECORD_TIME`].
//!
//! A stall after the records were handed over outlives any budget; the claim's fence makes that
//! step's late marks and releases change nothing.

use std::time::Duration;

/// The least time a step keeps for its marks and releases.
pub(crate) const MIN_RECORD_TIME: Duration = Duration::from_secs(1);

/// How long after `delivery.timeout.ms` a record's verdict may still take to reach its step:
/// librdkafka looks for timed-out records about once a second, and the report then passes
/// through the producer's reports thread.
pub(crate) const SETTLE_SLACK: Duration = Duration::from_secs(1);

/// How long each phase of one step may wait, each counted from before the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepBudget {
    /// The claim and the wait for the producer's turn: records are handed over only before it.
    pub(crate) hand_over: Duration,
    /// Until every record handed over has the producer's verdict.
    pub(crate) settle: Duration,
    /// The whole step, marks and releases included: `lease - margin`.
    pub(crate) whole: Duration,
}

impl StepBudget {
    /// The budget for these settings, or why they cannot keep a step inside its lease.
    pub(crate) fn new(lease: Duration, delivery_timeout: Duration, margin: Duration) -> Result<Self, String> {
        let least = Self::settling(delivery_timeout) + MIN_RECORD_TIME + margin;
        if lease < least {
            return Err(format!(
                "the lease ({lease:?}) must cover the claim and the queue wait (up to the delivery timeout, \
                 {delivery_timeout:?}), the producer's own delivery timeout after it ({delivery_timeout:?}) \
                 and {SETTLE_SLACK:?} for its verdict, at least {MIN_RECORD_TIME:?} to mark and release, \
                 and the lease margin ({margin:?}): at least {least:?}"
            ));
        }
        Ok(Self {
            hand_over: delivery_timeout,
            settle: Self::settling(delivery_timeout),
            whole: lease - margin,
        })
    }

    /// The budget a relay built without the start-up check uses: the same split, with at least
    /// [`MIN_RECORD_TIME`] for marks and releases however short the lease.
    pub(crate) fn lenient(lease: Duration, delivery_timeout: Duration, margin: Duration) -> Self {
        let settle = Self::settling(delivery_timeout);
        let whole = lease.saturating_sub(margin).max(settle + MIN_RECORD_TIME);
        Self { hand_over: delivery_timeout, settle, whole }
    }

    fn settling(delivery_timeout: Duration) -> Duration {
        delivery_timeout * 2 + SETTLE_SLACK
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
    fn the_defaults_hand_over_for_ten_seconds_settle_by_twenty_one_and_keep_five_to_spare() {
        assert_eq!(
            StepBudget::new(S(30), S(10), S(5)),
            Ok(StepBudget { hand_over: S(10), settle: S(21), whole: S(25) })
        );
    }

    #[test]
    fn a_lease_that_ends_before_the_producer_gives_up_is_refused() {
        // Accepted before the producer's own delivery timeout was counted: a record handed over
        // at the end of the hand-over could still reach the broker after the lease ran out.
        let Err(refused) = StepBudget::new(S(16), S(10), S(5)) else {
            panic!("a lease of 16s with a delivery timeout of 10s and a margin of 5s was accepted");
        };
        assert!(refused.contains("lease") && refused.contains("delivery timeout"), "{refused}");
        assert!(refused.contains("at least 27s"), "{refused}");
        assert!(StepBudget::new(Duration::from_millis(26_999), S(10), S(5)).is_err());
        assert!(StepBudget::new(S(5), S(10), S(1)).is_err());
    }

    #[test]
    fn exactly_enough_is_accepted() {
        let budget = StepBudget { hand_over: S(3), settle: S(7), whole: S(8) };
        assert_eq!(StepBudget::new(S(9), S(3), S(1)), Ok(budget));
        assert!(budget.whole - budget.settle >= MIN_RECORD_TIME);
    }

    #[test]
    fn a_lenient_budget_still_waits_for_the_verdicts_and_leaves_time_to_mark() {
        let budget = StepBudget::lenient(Duration::from_millis(300), Duration::from_millis(1500), S(0));
        assert_eq!(budget.hand_over, Duration::from_millis(1500));
        assert_eq!(budget.settle, S(4));
        assert_eq!(budget.whole, S(5));
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
