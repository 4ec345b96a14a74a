//! Refused calls are counted, not shouted: each is logged at DEBUG and counted per reason, and a
//! WARN per reason says how many were refused, at most once a minute. A caller hammering the
//! service with bad tokens thus cannot flood the log, and operators still see that it happens.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;

use super::auth::AuthError;
use crate::telemetry::metrics;

/// The least time between two WARNs for one reason.
const WARN_EVERY: Duration = Duration::from_secs(60);

static WARNINGS: LazyLock<Mutex<HashMap<&'static str, RateLimit>>> = LazyLock::new(Mutex::default);

/// Records one refused call: DEBUG, the `idempost.calls.refused` counter, and the reason's WARN
/// when a minute has passed since its last one. Only the reason: never the token.
pub fn note_refusal(refused: AuthError) {
    let reason = refused.reason();
    tracing::debug!(reason, "call refused");
    metrics().calls_refused.add(1, &[KeyValue::new("reason", reason)]);
    let due = WARNINGS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(reason)
        .or_insert_with(|| RateLimit::new(WARN_EVERY))
        .hit(Instant::now());
    if let Some(refused) = due {
        tracing::warn!(reason, refused, "calls refused (counted in idempost.calls.refused; each at DEBUG)");
    }
}

/// At most one report per `every`: each report says how many hits it covers.
#[derive(Debug)]
struct RateLimit {
    every: Duration,
    last: Option<Instant>,
    pending: u64,
}

impl RateLimit {
    fn new(every: Duration) -> Self {
        Self { every, last: None, pending: 0 }
    }

    /// Counts a hit at `now`; answers the hits since the last report when one is due now.
    fn hit(&mut self, now: Instant) -> Option<u64> {
        self.pending += 1;
        let due = self.last.is_none_or(|last| now.saturating_duration_since(last) >= self.every);
        if !due {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.pending))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_hit_is_reported_then_at_most_one_report_per_interval_covering_every_hit() {
        let start = Instant::now();
        let mut limit = RateLimit::new(Duration::from_secs(60));
        assert_eq!(limit.hit(start), Some(1));
        for s in 1..60 {
            assert_eq!(limit.hit(start + Duration::from_secs(s)), None, "{s}s after the report");
        }
        assert_eq!(limit.hit(start + Duration::from_secs(60)), Some(60));
        assert_eq!(limit.hit(start + Duration::from_secs(61)), None);
        assert_eq!(limit.hit(start + Duration::from_secs(600)), Some(2));
    }
}
