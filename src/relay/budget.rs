//! How one relay step spends its lease.
//!
//! A step claims a batch, publishes it and records the outcomes (marks and releases). All of it
//! must end before the lease does, with the margin to spare, or another relay may claim the
//! events while this one still acts on them. librdkafka's `delivery.timeout.ms` starts only once
//! a record is in its queue, and `send` may first wait for queue space, so the relay bounds the
//! publishing itself: queue wait and delivery together end `delivery_timeout` after the step
//! began, and marks and releases get what is left of `lease - margin`.

use std::time::Duration;

/// The least time a step keeps for its marks and releases.
pub const MIN_RECORD_TIME: Duration = Duration::from_secs(1);

/// The deadlines of one step, counted from just before its claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBudget {
    /// Queue wait and delivery of every record of the batch end this long after the start.
    pub publish: Duration,
    /// Marks and releases end this long after the start: `lease - margin`.
    pub whole: Duration,
}

impl StepBudget {
    /// The budget for these settings, or why they cannot keep a step inside its lease.
    pub fn new(lease: Duration, delivery_timeout: Duration, margin: Duration) -> Result<Self, String> {
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
    pub fn lenient(lease: Duration, delivery_timeout: Duration, margin: Duration) -> Self {
        let whole = lease.saturating_sub(margin).max(delivery_timeout + MIN_RECORD_TIME);
        Self { publish: delivery_timeout, whole }
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
}
