//! What one run measured, as plain data: the run fills it in, the report prints it.

use crate::measure::Percentiles;
use crate::observe::Waits;
use crate::phases::{RelayPhases, Stages};

/// A throughput with its latencies.
#[derive(Debug, Clone, Default)]
pub(crate) struct Point {
    pub(crate) concurrency: usize,
    pub(crate) per_second: f64,
    pub(crate) latency: Percentiles,
    pub(crate) errors: u64,
}

/// Draining a fixed amount of work.
#[derive(Debug, Clone, Default)]
pub(crate) struct Drain {
    pub(crate) events: u64,
    /// From the first to the last event's database timestamp.
    pub(crate) per_second: f64,
    /// From the process start until the last event, seconds.
    pub(crate) wall_seconds: f64,
    pub(crate) complete: bool,
}

/// One end-to-end load level.
#[derive(Debug, Clone, Default)]
pub(crate) struct EndToEnd {
    pub(crate) label: String,
    pub(crate) offered_per_second: f64,
    pub(crate) accepted: u64,
    pub(crate) failed: u64,
    pub(crate) missing: u64,
    pub(crate) latency: Percentiles,
    /// Where the time went.
    pub(crate) stages: Stages,
    /// The relay's batches during the level.
    pub(crate) relay: RelayPhases,
}

/// CPU and memory of one service over one phase.
#[derive(Debug, Clone, Default)]
pub(crate) struct ServiceUse {
    pub(crate) service: String,
    pub(crate) phase: String,
    pub(crate) events: u64,
    pub(crate) cpu_seconds: f64,
    pub(crate) peak_rss_mib: f64,
}

impl ServiceUse {
    pub(crate) fn cpu_per_1000(&self) -> f64 {
        if self.events == 0 { 0.0 } else { self.cpu_seconds * 1000.0 / self.events as f64 }
    }
}

/// Everything one run measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct Figures {
    pub(crate) machine: Vec<(String, String)>,
    pub(crate) raw_commit: Vec<Point>,
    pub(crate) raw_produce: f64,
    /// The same with two producers at once (as two relays).
    pub(crate) raw_produce_two: f64,
    pub(crate) raw_insert: Point,
    pub(crate) raw_claim_mark: f64,
    /// The plain-SQL claim+mark's batches: claim and mark (as `record`) times.
    pub(crate) raw_claim_mark_phases: RelayPhases,
    /// The same with two workers at once (as two relays).
    pub(crate) raw_claim_mark_two: f64,
    pub(crate) raw_consume: f64,
    pub(crate) submit: Vec<Point>,
    pub(crate) group: Vec<GroupPoint>,
    pub(crate) relay: Vec<(usize, Drain)>,
    /// Each drain's batches, from the relays' logs.
    pub(crate) relay_phases: Vec<(usize, RelayPhases)>,
    pub(crate) consumer: Drain,
    /// The least of SubmitOrder, relay x1 and consumer, each measured alone.
    pub(crate) stages_max: f64,
    /// The search for the rate the whole pipeline sustains (empty when given `--max-offered`).
    pub(crate) pipeline: Vec<crate::sustain::Probe>,
    /// The end-to-end levels' 100 %: the least of `stages_max` and the pipeline's sustained rate.
    pub(crate) max_offered: f64,
    /// The search for the raw pipeline's sustained rate (see [`crate::floor`]).
    pub(crate) floor: Vec<crate::sustain::Probe>,
    /// The searches for the steady rate with a bounded backlog (see [`crate::steady`]).
    pub(crate) steady_relay: Vec<crate::steady::Probe>,
    pub(crate) steady_pipeline: Vec<crate::steady::Probe>,
    pub(crate) e2e: Vec<EndToEnd>,
    pub(crate) services: Vec<ServiceUse>,
    pub(crate) waits: Vec<Waits>,
    pub(crate) notes: Vec<String>,
}

/// SubmitOrder at one concurrency with group commit on or off.
#[derive(Debug, Clone)]
pub(crate) struct GroupPoint {
    pub(crate) on: bool,
    pub(crate) point: Point,
    /// Transactions the service wrote in the point, and their mean and p99 sizes (on only).
    pub(crate) batches: u64,
    pub(crate) batch_mean: f64,
    pub(crate) batch_p99: usize,
    /// Runs of a batch written with one INSERT per table, and those that fell back to one order
    /// at a time.
    pub(crate) set_written: u64,
    pub(crate) set_fell_back: u64,
}
