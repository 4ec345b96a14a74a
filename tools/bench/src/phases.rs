//! Where the time of a relay drain and of an end-to-end level goes: the relays' own per-batch
//! phase times (claim, publish, record), read from their logs, and each event's stages from the
//! timestamps the services store.

use std::path::Path;

use serde_json::Value;

use crate::measure::{Latencies, Percentiles};

/// The environment that makes a relay log one JSON line per batch with its phase times (and its
/// warnings), which [`RelayPhases::from_logs`] reads.
pub(crate) const RELAY_STEP_LOG: [(&str, &str); 2] =
    [("RUST_LOG", "warn,idempost_relay::step=debug"), ("IDEMPOST_LOG_FORMAT", "json")];

/// The relays' batches during one drain.
#[derive(Debug, Clone, Default)]
pub(crate) struct RelayPhases {
    /// Batches claimed (steps that found work).
    pub(crate) batches: u64,
    /// Events those batches claimed.
    pub(crate) claimed: u64,
    /// The claim transaction, per batch.
    pub(crate) claim: Percentiles,
    /// From the claim until every record was confirmed, per batch.
    pub(crate) publish: Percentiles,
    /// The release and mark statements, per batch.
    pub(crate) record: Percentiles,
    /// Marks and releases that met a lock conflict (a deadlock, a lock-wait timeout) and ran again.
    pub(crate) lock_conflicts: u64,
    /// Warnings that mention a deadlock or a lock-wait timeout, anywhere.
    pub(crate) deadlock_lines: u64,
    /// Confirmed events whose lease another claim had taken.
    pub(crate) lease_lost: u64,
}

impl RelayPhases {
    /// Reads the step lines and warnings of every log in `logs`.
    pub(crate) fn from_logs(logs: &[&Path]) -> Self {
        Self::read(logs, 0)
    }

    /// Lines in the log at `path` so far.
    pub(crate) fn lines(path: &Path) -> usize {
        std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
    }

    /// Reads the step lines and warnings of the log at `path` after its first `skip` lines.
    pub(crate) fn from_log_after(path: &Path, skip: usize) -> Self {
        Self::read(&[path], skip)
    }

    fn read(logs: &[&Path], skip: usize) -> Self {
        let mut phases = Self::default();
        let (mut claim, mut publish, mut record) =
            (Latencies::default(), Latencies::default(), Latencies::default());
        for path in logs {
            let Ok(text) = std::fs::read_to_string(path) else { continue };
            for line in text.lines().skip(skip) {
                let lower = line.to_ascii_lowercase();
                if lower.contains("deadlock") || lower.contains("lock wait") {
                    phases.deadlock_lines += 1;
                }
                if lower.contains("lock conflict") {
                    phases.lock_conflicts += 1;
                }
                let Ok(entry) = serde_json::from_str::<Value>(line) else { continue };
                if entry.get("target").and_then(Value::as_str) != Some("idempost_relay::step") {
                    continue;
                }
                let fields = entry.get("fields").unwrap_or(&entry);
                let number = |key: &str| fields.get(key).and_then(Value::as_f64).unwrap_or(0.0);
                phases.batches += 1;
                phases.claimed += number("claimed") as u64;
                phases.lease_lost += number("lease_lost") as u64;
                claim.push_ms(number("claim_ms"));
                publish.push_ms(number("publish_ms"));
                record.push_ms(number("record_ms"));
            }
        }
        phases.claim = claim.summary();
        phases.publish = publish.summary();
        phases.record = record.summary();
        phases
    }

    /// Mean events per batch.
    pub(crate) fn mean_batch(&self) -> f64 {
        if self.batches == 0 { 0.0 } else { self.claimed as f64 / self.batches as f64 }
    }
}

/// One end-to-end level's events split at the timestamps the services store: SubmitOrder sent
/// until the order service's `created_at` (taken before its transaction), until the relay's
/// `published_at` (the database clock after the broker confirmed, before the mark), until the
/// consumer's `notification_job.created_at` (before its commit).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Stages {
    /// Sent until the order service stamped the order.
    pub(crate) accept: Percentiles,
    /// Stamped until published: the order's commit, the wait for a claim, the claim, the publish.
    pub(crate) relay: Percentiles,
    /// Published until consumed: the fetch from the broker and the consumer's batch.
    pub(crate) consume: Percentiles,
}
