//! What one run measured, as plain data: the run fills it in, the report prints it.

use crate::measure::Percentiles;
use crate::observe::Waits;
use crate::phases::{RelayPhases, Stages};
use crate::plan::Phase;
use crate::timings::Bunching;

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
    /// How the events over the p99 were spread over the level (`None`: none was).
    pub(crate) tail: Option<Bunching>,
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
    /// The phases that ran: the report has sections for these only (a phase that did not run
    /// leaves its figures at zero, which are not measurements).
    pub(crate) ran: Vec<Phase>,
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
    /// The ordered-relay phase (none when it did not run).
    pub(crate) ordered: Option<Ordered>,
    /// The soak (none when it did not run).
    pub(crate) soak: Option<crate::soak::Soak>,
    /// The relay over shards (none when it did not run).
    pub(crate) shards: Option<crate::shards::Shards>,
    pub(crate) services: Vec<ServiceUse>,
    pub(crate) waits: Vec<Waits>,
    pub(crate) notes: Vec<String>,
}

impl Figures {
    /// Whether `phase` ran.
    pub(crate) fn ran(&self, phase: Phase) -> bool {
        self.ran.contains(&phase)
    }
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

/// One relay drain of the ordered-relay phase.
#[derive(Debug, Clone, Default)]
pub(crate) struct OrderedDrain {
    pub(crate) processes: usize,
    pub(crate) drain: Drain,
    pub(crate) phases: RelayPhases,
}

/// The ordered-relay phase: the same number of events drained one per order and many per order,
/// and the latency of amendments.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ordered {
    pub(crate) orders: u64,
    pub(crate) versions: u64,
    /// Every order with one event (the backlog of the relay phase), x1 and x2.
    pub(crate) one_per_order: Vec<OrderedDrain>,
    /// `versions` events per order, x1 and x2.
    pub(crate) many_per_order: Vec<OrderedDrain>,
    pub(crate) amends: Amends,
}

impl Ordered {
    /// The many-per-order drain's rate over the one-per-order drain's, with `processes` relays.
    pub(crate) fn ratio(&self, processes: usize) -> Option<f64> {
        let rate = |drains: &[OrderedDrain]| {
            drains.iter().find(|d| d.processes == processes).map(|d| d.drain.per_second)
        };
        crate::ordered::ratio(rate(&self.many_per_order)?, rate(&self.one_per_order)?)
    }
}

/// AmendOrder calls at a modest rate through the whole pipeline.
#[derive(Debug, Clone, Default)]
pub(crate) struct Amends {
    pub(crate) offered_per_second: f64,
    /// Orders the amendments went round.
    pub(crate) orders: usize,
    pub(crate) accepted: u64,
    pub(crate) failed: u64,
    /// Accepted amendments with no notification job when the phase ended.
    pub(crate) missing: u64,
    /// AmendOrder sent until the consumer's notification job (its read model's transaction).
    pub(crate) sent_to_applied: Percentiles,
    /// The order service's stamp (the outbox row's `created_at`) until the same.
    pub(crate) accepted_to_applied: Percentiles,
    /// Events the consumer parked (a version that skipped ahead): 0 when in order.
    pub(crate) parked: i64,
    /// Amended orders whose read model ended at the order's own version.
    pub(crate) views_current: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(processes: usize, per_second: f64) -> OrderedDrain {
        OrderedDrain { processes, drain: Drain { per_second, ..Drain::default() }, ..OrderedDrain::default() }
    }

    #[test]
    fn the_ordered_ratio_compares_drains_of_the_same_relay_count() {
        let o = Ordered {
            one_per_order: vec![drain(1, 8_000.0), drain(2, 10_000.0)],
            many_per_order: vec![drain(1, 6_000.0), drain(2, 9_000.0)],
            ..Ordered::default()
        };
        assert_eq!(o.ratio(1), Some(0.75));
        assert_eq!(o.ratio(2), Some(0.9));
        assert_eq!(o.ratio(4), None);
    }

    #[test]
    fn there_is_no_ordered_ratio_when_the_one_per_order_drain_measured_nothing() {
        let o = Ordered {
            one_per_order: vec![drain(1, 0.0)],
            many_per_order: vec![drain(1, 6_000.0)],
            ..Ordered::default()
        };
        assert_eq!(o.ratio(1), None);
    }
}
