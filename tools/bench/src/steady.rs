//! The steady rate with a bounded backlog: the highest offered rate at which the backlog grows by
//! at most [`MAX_GROWTH`] events per second over a run of [`RUN`], the capacity figure some
//! outbox libraries publish. Unlike the sustained rate ([`crate::sustain`]), which asks that
//! nearly every order be consumed before the probe ends, this one forgives a backlog that stays
//! put: it is the rate an operator can offer for as long as they like.

use std::time::Duration;

use crate::sustain::{ON_SCHEDULE, Verdict};

/// Most the backlog may grow per second for a rate to count as steady.
pub(crate) const MAX_GROWTH: f64 = 100.0;

/// Length of one probe in a full run.
pub(crate) const RUN: Duration = Duration::from_secs(60);

/// One probe: an open loop at `offered` per second for `seconds`, with the backlog (events
/// written but not yet through the stage measured) counted before and after.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Probe {
    pub(crate) offered: f64,
    /// Writes accepted.
    pub(crate) sent: u64,
    /// Writes refused or failed.
    pub(crate) failed: u64,
    pub(crate) backlog_before: u64,
    pub(crate) backlog_after: u64,
    pub(crate) seconds: f64,
}

impl Probe {
    /// How fast the backlog grew, per second (negative when it shrank).
    pub(crate) fn growth_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            (self.backlog_after as f64 - self.backlog_before as f64) / self.seconds
        } else {
            0.0
        }
    }
}

impl Verdict for Probe {
    fn offered(&self) -> f64 {
        self.offered
    }

    fn kept_up(&self) -> bool {
        self.failed == 0
            && self.sent > 0
            && self.growth_per_second() <= MAX_GROWTH
            && self.sent as f64 / self.seconds.max(f64::MIN_POSITIVE) >= ON_SCHEDULE * self.offered
    }

    /// What went through: what was written less what piled up.
    fn delivered_per_second(&self) -> f64 {
        if self.seconds <= 0.0 {
            return 0.0;
        }
        (self.sent as f64 / self.seconds - self.growth_per_second().max(0.0)).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sustain::{next, sustained};

    fn probe(offered: f64, growth: f64) -> Probe {
        let seconds = 60.0;
        Probe {
            offered,
            sent: (offered * seconds) as u64,
            failed: 0,
            backlog_before: 1_000,
            backlog_after: (1_000.0 + growth * seconds) as u64,
            seconds,
        }
    }

    #[test]
    fn a_backlog_that_grows_by_at_most_a_hundred_a_second_is_steady() {
        assert!(probe(2_000.0, 100.0).kept_up());
        assert!(probe(2_000.0, -10.0).kept_up(), "a shrinking backlog is steady");
        assert!(!probe(2_000.0, 101.0).kept_up());
    }

    #[test]
    fn a_failed_write_is_not_steady() {
        let failed = Probe { failed: 1, ..probe(2_000.0, 0.0) };
        assert!(!failed.kept_up());
    }

    #[test]
    fn a_probe_whose_writer_fell_behind_its_schedule_is_not_steady() {
        let slow = Probe { seconds: 79.0, ..probe(3_529.0, 1.0) };
        assert!(!slow.kept_up(), "the rate offered was never written");
        let on_time = Probe { seconds: 62.0, ..probe(3_529.0, 1.0) };
        assert!(on_time.kept_up());
    }

    #[test]
    fn what_went_through_is_what_was_written_less_what_piled_up() {
        let p = probe(2_000.0, 500.0);
        assert!((p.delivered_per_second() - 1_500.0).abs() < 1.0, "{}", p.delivered_per_second());
        assert!((probe(2_000.0, -50.0).delivered_per_second() - 2_000.0).abs() < 1.0);
    }

    #[test]
    fn the_search_offers_what_went_through_then_bisects_on_backlog_growth() {
        let mut probes = vec![probe(2_000.0, 800.0)];
        assert_eq!(next(2_000.0, &probes).map(f64::round), Some(1_200.0));
        probes.push(probe(1_200.0, 20.0));
        assert_eq!(next(2_000.0, &probes), Some(1_600.0));
        probes.push(probe(1_600.0, 150.0));
        assert_eq!(next(2_000.0, &probes), Some(1_400.0));
        probes.push(probe(1_400.0, 90.0));
        assert_eq!(next(2_000.0, &probes), Some(1_500.0));
        probes.push(probe(1_500.0, 101.0));
        assert_eq!(next(2_000.0, &probes), None, "five probes at most");
        assert_eq!(sustained(&probes), 1_400.0);
    }
}
