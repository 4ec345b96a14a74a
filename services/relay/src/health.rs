//! What the relay knows about its own progress, for its health check and producer recovery.

use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::DbErr;
use tokio::time::Instant;

use super::step::StepOutcome;
use idempost::service::Verdict;

/// Progress shared by a relay's step loops.
#[derive(Debug)]
pub(crate) struct Vitals {
    started: Instant,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    claim_error: Option<String>,
    last_publish: Option<Instant>,
    rebuilds: u64,
}

impl Default for Vitals {
    fn default() -> Self {
        Self { started: Instant::now(), state: Mutex::default() }
    }
}

impl Vitals {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records one step.
    pub(crate) fn stepped(&self, step: &Result<StepOutcome, DbErr>) {
        let mut state = self.state();
        match step {
            Err(e) => state.claim_error = Some(format!("cannot claim: {e}")),
            Ok(StepOutcome::Idle) => state.claim_error = None,
            Ok(StepOutcome::Worked(report)) => {
                state.claim_error = None;
                if report.published > 0 {
                    state.last_publish = Some(Instant::now());
                }
            }
        }
    }

    /// Records a producer replacement.
    pub(crate) fn rebuilt(&self) {
        self.state().rebuilds += 1;
    }

    /// Producers replaced since the relay started.
    pub(crate) fn rebuilds(&self) -> u64 {
        self.state().rebuilds
    }

    /// Whether the last claim failed.
    pub(crate) fn claim_verdict(&self) -> Verdict {
        self.state().claim_error.clone()
    }

    /// How long nothing was published (since the start, if nothing ever was).
    pub(crate) fn since_last_publish(&self) -> Duration {
        self.state().last_publish.unwrap_or(self.started).elapsed()
    }
}

/// The publishing check: failing when nothing was published for longer than `stall` while the
/// oldest waiting event (PENDING or PUBLISHING) is older than `stall`.
pub(crate) fn publish_verdict(
    since_publish: Duration,
    oldest_waiting: Option<DateTime<Utc>>,
    stall: Duration,
) -> Verdict {
    let waited = (Utc::now() - oldest_waiting?).to_std().unwrap_or_default();
    (since_publish > stall && waited > stall).then(|| {
        format!(
            "nothing published for {}s while an event has waited {}s (threshold {}s)",
            since_publish.as_secs(),
            waited.as_secs(),
            stall.as_secs()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backlog_older_than_the_threshold_with_no_recent_publish_fails_the_check() {
        let stall = Duration::from_secs(60);
        let old = Some(Utc::now() - chrono::Duration::seconds(120));
        let young = Some(Utc::now() - chrono::Duration::seconds(5));
        assert!(publish_verdict(Duration::from_secs(61), old, stall).is_some());
        assert!(publish_verdict(Duration::from_secs(10), old, stall).is_none(), "published recently");
        assert!(publish_verdict(Duration::from_secs(600), young, stall).is_none(), "nothing waits long");
        assert!(publish_verdict(Duration::from_secs(600), None, stall).is_none(), "nothing waits");
    }
}
