//! Rates, latency percentiles and the time as the database keeps it.

use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};

/// Now, to the microsecond the databases keep.
pub(crate) fn now_micros() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(6)
}

/// Latencies of one phase, in milliseconds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Latencies(Vec<f64>);

impl Latencies {
    pub(crate) fn push(&mut self, latency: Duration) {
        self.0.push(latency.as_secs_f64() * 1000.0);
    }

    pub(crate) fn push_ms(&mut self, ms: f64) {
        self.0.push(ms);
    }

    pub(crate) fn extend(&mut self, other: Latencies) {
        self.0.extend(other.0);
    }

    /// The `p`th percentile (0–100) by nearest rank; 0 when there are no samples.
    pub(crate) fn percentile(&mut self, p: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.sort_by(f64::total_cmp);
        let rank = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        self.0[rank.clamp(1, self.0.len()) - 1]
    }

    /// p50, p95, p99.
    pub(crate) fn summary(&mut self) -> Percentiles {
        Percentiles {
            p50: self.percentile(50.0),
            p95: self.percentile(95.0),
            p99: self.percentile(99.0),
            samples: self.0.len(),
        }
    }
}

/// p50/p95/p99 in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Percentiles {
    pub(crate) p50: f64,
    pub(crate) p95: f64,
    pub(crate) p99: f64,
    pub(crate) samples: usize,
}

/// `count` per second over `elapsed`.
pub(crate) fn rate(count: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 { 0.0 } else { count as f64 / secs }
}
