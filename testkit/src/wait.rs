//! Waiting on conditions, never on sleeps: the one bound every test waits with.

use std::future::Future;
use std::time::Duration;

/// How long any test waits for something that should happen: long enough for a loaded two-core
/// machine, short of nextest's limit, so a wait that fails says what it waited for.
pub const WAIT: Duration = Duration::from_secs(60);

/// Polls `check` until it holds, failing the test with `what` after `timeout`.
pub async fn assert_eventually<F, Fut>(what: &str, timeout: Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    assert!(eventually(timeout, check).await, "timed out after {timeout:?} waiting until {what}");
}

/// Whether `check` holds within `timeout`, polled every 50 ms: for a test that reports what it
/// saw when it does not. A check still running at the deadline counts as not holding, so a
/// check that never returns (a call without a deadline of its own) fails the wait instead of
/// hanging the test.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if tokio::time::timeout_at(deadline, check()).await.unwrap_or(false) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
