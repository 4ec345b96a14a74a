//! The bounded long poll behind the admin services' Await calls: a caller waits on the server
//! for a state to become final, but never longer than a call may run, and never so many callers
//! at once that waiting calls hold every permit of the listener.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::domain::FieldViolation;
use crate::security::Listener;

/// The longest one call waits: short enough that proxies and load balancers in front of the
/// listener never see an idle call worth cutting, long enough that a test's wait is a handful of
/// calls.
pub const MAX_WAIT: Duration = Duration::from_secs(10);

/// How often a waiting call reads its database: a test waiting for its event learns of it within
/// this, and a full house of waiters costs at most ten reads a second each.
const POLL_EVERY: Duration = Duration::from_millis(100);

/// What a caller refused a wait is told to leave before calling again.
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// Most callers that wait at once on one listener, whatever its size: each reads the database
/// every [`POLL_EVERY`].
const MAX_WAITERS: usize = 64;

/// One listener's waits: how many may run at once, and how long each may last.
#[derive(Debug, Clone)]
pub struct LongPoll {
    waiters: Arc<Semaphore>,
    longest: Duration,
}

/// How a long poll ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Polled<T> {
    /// The last state read: final, or the one the wait ended on.
    pub state: T,
    /// Set when no wait was allowed (too many callers were waiting): the state was read once,
    /// and the caller should call again no sooner than this.
    pub retry_after: Option<Duration>,
}

impl LongPoll {
    /// Waits sized by `listener`: a quarter of its calls (at least one, at most [`MAX_WAITERS`]),
    /// and an end well inside its call timeout, so that a wait is never cut by it.
    pub fn for_listener(listener: &Listener) -> Self {
        let (calls, call_timeout) = listener.call_limits();
        Self::new(calls, call_timeout)
    }

    fn new(calls: usize, call_timeout: Duration) -> Self {
        let waiters = (calls / 4).clamp(1, MAX_WAITERS);
        Self { waiters: Arc::new(Semaphore::new(waiters)), longest: MAX_WAIT.min(call_timeout * 3 / 4) }
    }

    /// How long a call asking for `asked` may wait: absent or zero means the longest, longer is
    /// cut to it; a negative one is a violation of `field`, recorded in `violations`.
    pub fn wait_for(
        &self,
        field: &str,
        asked: Option<prost_types::Duration>,
        violations: &mut Vec<FieldViolation>,
    ) -> Duration {
        match asked.map(Duration::try_from) {
            None => self.longest,
            Some(Ok(wait)) if wait.is_zero() => self.longest,
            Some(Ok(wait)) => wait.min(self.longest),
            Some(Err(_)) => {
                violations.push(FieldViolation::new(field, "must not be negative"));
                self.longest
            }
        }
    }

    /// Reads the state with `read` until it is final (`is_final`) or `wait` is over, whichever
    /// comes first. Past the waiters' limit it reads once and says when to call again.
    pub async fn poll<T, E, R>(
        &self,
        wait: Duration,
        mut read: impl FnMut() -> R,
        is_final: impl Fn(&T) -> bool,
    ) -> Result<Polled<T>, E>
    where
        R: Future<Output = Result<T, E>>,
    {
        let Ok(_waiting) = self.waiters.try_acquire() else {
            return Ok(Polled { state: read().await?, retry_after: Some(RETRY_AFTER) });
        };
        let until = Instant::now() + wait;
        loop {
            let state = read().await?;
            let left = until.saturating_duration_since(Instant::now());
            if is_final(&state) || left.is_zero() {
                return Ok(Polled { state, retry_after: None });
            }
            tokio::time::sleep(POLL_EVERY.min(left)).await;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_well_inside_the_call_timeout_and_never_past_the_maximum() {
        assert_eq!(LongPoll::new(16, Duration::from_secs(30)).longest, MAX_WAIT);
        assert_eq!(LongPoll::new(16, Duration::from_secs(4)).longest, Duration::from_secs(3));
    }

    #[test]
    fn a_quarter_of_the_listener_waits_at_most_and_at_least_one() {
        assert_eq!(LongPoll::new(16, MAX_WAIT).waiters.available_permits(), 4);
        assert_eq!(LongPoll::new(2, MAX_WAIT).waiters.available_permits(), 1);
        assert_eq!(LongPoll::new(100_000, MAX_WAIT).waiters.available_permits(), MAX_WAITERS);
    }

    #[test]
    fn an_absent_or_zero_wait_is_the_longest_and_a_longer_one_is_cut_to_it() {
        let poll = LongPoll::new(16, Duration::from_secs(30));
        let mut violations = Vec::new();
        let asked = |secs| Some(prost_types::Duration { seconds: secs, nanos: 0 });
        assert_eq!(poll.wait_for("wait", None, &mut violations), MAX_WAIT);
        assert_eq!(poll.wait_for("wait", asked(0), &mut violations), MAX_WAIT);
        assert_eq!(poll.wait_for("wait", asked(2), &mut violations), Duration::from_secs(2));
        assert_eq!(poll.wait_for("wait", asked(600), &mut violations), MAX_WAIT);
        assert!(violations.is_empty());
        poll.wait_for("wait", asked(-1), &mut violations);
        assert_eq!(violations.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_poll_past_the_waiters_limit_reads_once_and_says_when_to_call_again() {
        let poll = LongPoll::new(4, MAX_WAIT);
        let _held = poll.waiters.try_acquire().unwrap();
        let mut reads = 0;
        let polled = poll
            .poll::<u32, (), _>(
                MAX_WAIT,
                || {
                    reads += 1;
                    std::future::ready(Ok(0))
                },
                |_| false,
            )
            .await
            .unwrap();
        assert_eq!((reads, polled.retry_after), (1, Some(RETRY_AFTER)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_poll_ends_at_the_final_state_or_at_the_end_of_its_wait() {
        let poll = LongPoll::new(4, MAX_WAIT);
        let mut reads = 0;
        let final_at_third = poll
            .poll::<u32, (), _>(
                MAX_WAIT,
                || {
                    reads += 1;
                    std::future::ready(Ok(reads))
                },
                |n| *n == 3,
            )
            .await
            .unwrap();
        assert_eq!(final_at_third, Polled { state: 3, retry_after: None });
        let started = Instant::now();
        let never = poll
            .poll::<u32, (), _>(Duration::from_secs(1), || std::future::ready(Ok(0)), |_| false)
            .await
            .unwrap();
        assert_eq!((never.state, never.retry_after), (0, None));
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }
}
