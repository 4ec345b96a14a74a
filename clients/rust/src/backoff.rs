//! The one retry-wait policy: exponential backoff, capped, optionally jittered.
//!
//! Every retry loop (the safe submitter here; in the services, the order transaction's and the
//! relay's lock-conflict retries, the relay's release of a failed publish, the consumer's receive
//! and handling retries) takes its waits from a [`Backoff`]; what is retried and when to give up
//! stay with each loop. The wait is a pure function of the retry number, because the relay keeps that
//! number in the outbox row (`attempts`) rather than in memory.
//!
//! Not the `backon` crate: its jitter adds up to one more delay on top (waits in `[d, 2d)`, past
//! the cap), where ours picks a point in the upper half under the cap (`[d/2, d]`), and its
//! backoffs are iterators, which cannot answer "the wait after attempt n" for a count read back
//! from the database.

use std::time::Duration;

/// Waits of `first`, then doubled per retry but never above `max` (the first wait is `first` as
/// given: `max` bounds the growth); with jitter, each a random point in the upper half of that,
/// so retriers that failed together do not return in step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    jitter: bool,
}

impl Backoff {
    /// Waits of `first`, `2 × first`, `4 × first`, … up to `max`, without jitter.
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self { first, max, jitter: false }
    }

    /// The same waits, each scaled by a random factor in `[0.5, 1]`.
    pub const fn jittered(self) -> Self {
        Self { jitter: true, ..self }
    }

    /// The wait before retry `retry` (1-based; 0 counts as 1), before jitter: `first`, then
    /// `min(first × 2^(retry-1), max)`.
    fn ceiling(&self, retry: u32) -> Duration {
        match retry.saturating_sub(1).min(30) {
            0 => self.first,
            doublings => Ord::min(self.first.saturating_mul(1 << doublings), self.max),
        }
    }

    /// The wait before retry `retry` (1-based; 0 counts as 1).
    pub fn delay(&self, retry: u32) -> Duration {
        let ceiling = self.ceiling(retry);
        if self.jitter { ceiling.mul_f64(rand::random_range(0.5..=1.0)) } else { ceiling }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_double_from_the_first_and_stop_at_the_cap() {
        let backoff = Backoff::new(100 * MS, 1_000 * MS);
        let waits: Vec<_> = (1..=6).map(|retry| backoff.delay(retry)).collect();
        assert_eq!(waits, [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1_000 * MS, 1_000 * MS]);
    }

    #[test]
    fn retry_zero_waits_like_the_first_retry() {
        let backoff = Backoff::new(10 * MS, 1_280 * MS);
        assert_eq!(backoff.delay(0), backoff.delay(1));
        assert_eq!(backoff.delay(0), 10 * MS);
    }

    #[test]
    fn huge_retry_numbers_neither_overflow_nor_pass_the_cap() {
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(300));
        let uncapped = Backoff::new(Duration::from_secs(1), Duration::MAX);
        assert_eq!(uncapped.delay(u32::MAX), Duration::from_secs(1 << 30));
    }

    #[test]
    fn jitter_stays_in_the_upper_half_of_the_ceiling() {
        let backoff = Backoff::new(10 * MS, 1_280 * MS).jittered();
        for retry in 0..12 {
            let ceiling = backoff.ceiling(retry);
            for _ in 0..200 {
                let wait = backoff.delay(retry);
                assert!(wait >= ceiling / 2 && wait <= ceiling, "retry {retry}: {wait:?} of {ceiling:?}");
            }
        }
    }

    #[test]
    fn a_cap_below_the_first_wait_bounds_only_the_later_ones() {
        let backoff = Backoff::new(100 * MS, 30 * MS);
        assert_eq!([backoff.delay(1), backoff.delay(2), backoff.delay(3)], [100 * MS, 30 * MS, 30 * MS]);
    }

    #[test]
    fn without_jitter_the_wait_is_the_ceiling() {
        let backoff = Backoff::new(50 * MS, 2_000 * MS);
        assert!((0..10).all(|retry| backoff.delay(retry) == backoff.ceiling(retry)));
    }
}
