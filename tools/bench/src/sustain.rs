//! The whole pipeline's sustained rate: the highest offered load at which order service, relay
//! and consumer, running together on this machine, keep up.
//!
//! Each stage's rate measured alone is only an upper bound for the pipeline when the stages
//! share the machine's cores: at the least of those rates the order service, the database, the
//! broker and the load generator together need more CPU than there is, and the latency at
//! "50 % of max" measures a saturated machine, not Idempost. The end-to-end levels are therefore
//! fractions of the rate found here (never more than the least stage alone).

/// One probe: an open loop at `offered` orders/s for a while, with the pipeline running.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Probe {
    pub(crate) offered: f64,
    /// SubmitOrder calls accepted.
    pub(crate) sent: u64,
    /// SubmitOrder calls refused or failed.
    pub(crate) failed: u64,
    /// Notification jobs written while the probe ran (from its first send until its last reply).
    pub(crate) delivered: u64,
    pub(crate) seconds: f64,
}

/// A probe kept up when no call failed, its sender kept [`ON_SCHEDULE`] of the rate offered, and
/// all but this share of the accepted orders were consumed before the last reply: what is left is
/// the last moments' orders in flight, not a backlog that grows.
const BEHIND: f64 = 0.05;

/// Least share of the offered rate the sender must have kept for a probe to count: on two cores
/// a plain-SQL writer can fall behind its schedule, and what it feeds, keeping up with the slower
/// writer, was credited with the rate offered (the steady relay: 211,753 writes offered for 60 s
/// took 79 s; the raw floor on MariaDB: 45,955 writes offered for 10 s at 4,595/s went out at
/// 2,037/s, 2026-12-05).
pub(crate) const ON_SCHEDULE: f64 = 0.95;

/// Probes in one search, the first (at the upper bound) included.
pub(crate) const PROBES: usize = 5;

/// Stop refining once the highest rate that kept up is this close to the lowest that did not.
const CLOSE: f64 = 1.1;

/// A probe of a search for the highest rate that keeps up: what it offered, whether it kept up
/// by its own measure, and what it pushed through.
pub(crate) trait Verdict {
    /// The offered rate, per second.
    fn offered(&self) -> f64;
    /// Whether the probe kept up with what it offered.
    fn kept_up(&self) -> bool;
    /// The rate that actually went through, per second.
    fn delivered_per_second(&self) -> f64;
}

impl Verdict for Probe {
    fn offered(&self) -> f64 {
        self.offered
    }

    fn kept_up(&self) -> bool {
        self.failed == 0
            && self.sent > 0
            && self.delivered as f64 >= (1.0 - BEHIND) * self.sent as f64
            && self.sent as f64 / self.seconds.max(f64::MIN_POSITIVE) >= ON_SCHEDULE * self.offered
    }

    fn delivered_per_second(&self) -> f64 {
        if self.seconds > 0.0 { self.delivered as f64 / self.seconds } else { 0.0 }
    }
}

/// The next rate to offer, or `None` when the search is done. The first probe is at `upper`;
/// a probe that fell behind is followed by one at the rate it actually delivered (what the
/// pipeline pushed through under overload), then the search halves the interval between the
/// highest rate that kept up and the lowest that did not.
pub(crate) fn next<P: Verdict>(upper: f64, probes: &[P]) -> Option<f64> {
    if probes.is_empty() {
        return Some(upper);
    }
    if probes.len() >= PROBES {
        return None;
    }
    let kept = probes.iter().filter(|p| p.kept_up()).map(Verdict::offered).fold(0.0, f64::max);
    let behind = probes.iter().filter(|p| !p.kept_up()).map(Verdict::offered).fold(f64::INFINITY, f64::min);
    if behind.is_infinite() {
        return None;
    }
    if kept > 0.0 {
        return (behind / kept > CLOSE).then(|| (kept + behind) / 2.0);
    }
    let delivered = probes
        .iter()
        .filter(|p| !p.kept_up())
        .map(Verdict::delivered_per_second)
        .fold(f64::INFINITY, f64::min);
    let rate = delivered.min(behind * 0.8);
    (rate >= 1.0).then_some(rate)
}

/// The highest offered rate that kept up; when none did, the least rate any probe delivered.
pub(crate) fn sustained<P: Verdict>(probes: &[P]) -> f64 {
    let kept = probes.iter().filter(|p| p.kept_up()).map(Verdict::offered).fold(0.0, f64::max);
    if kept > 0.0 {
        return kept;
    }
    let least = probes.iter().map(Verdict::delivered_per_second).fold(f64::INFINITY, f64::min);
    if least.is_finite() { least } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(offered: f64, delivered_share: f64, failed: u64) -> Probe {
        let sent = (offered * 10.0) as u64;
        Probe { offered, sent, failed, delivered: (sent as f64 * delivered_share) as u64, seconds: 10.0 }
    }

    #[test]
    fn a_pipeline_that_keeps_up_with_the_least_stage_is_probed_once() {
        let first = next::<Probe>(1000.0, &[]);
        assert_eq!(first, Some(1000.0));
        let probes = [probe(1000.0, 0.99, 0)];
        assert_eq!(next(1000.0, &probes), None);
        assert_eq!(sustained(&probes), 1000.0);
    }

    #[test]
    fn an_overloaded_pipeline_is_next_offered_what_it_delivered_then_bisected() {
        // At 1000/s it pushed 400/s through (4,000 of 10,000 in 10 s).
        let mut probes = vec![probe(1000.0, 0.4, 0)];
        assert_eq!(next(1000.0, &probes), Some(400.0));
        probes.push(probe(400.0, 0.99, 0));
        assert_eq!(next(1000.0, &probes), Some(700.0));
        probes.push(probe(700.0, 0.5, 0));
        assert_eq!(next(1000.0, &probes), Some(550.0));
        probes.push(probe(550.0, 0.97, 0));
        assert_eq!(next(1000.0, &probes), Some(625.0));
        probes.push(probe(625.0, 0.9, 0));
        assert_eq!(next(1000.0, &probes), None, "five probes at most");
        assert_eq!(sustained(&probes), 550.0);
    }

    #[test]
    fn a_probe_whose_sender_fell_behind_its_schedule_did_not_keep_up() {
        // 45,955 writes offered for 10 s went out over 22.6 s, every one of them delivered.
        let late = Probe { offered: 4595.0, sent: 45_955, failed: 0, delivered: 45_955, seconds: 22.6 };
        assert!(!late.kept_up());
        assert_eq!(next(4595.0, &[late]), Some(late.delivered_per_second()));
        assert!(probe(1000.0, 0.99, 0).kept_up(), "on schedule and delivered");
    }

    #[test]
    fn refused_calls_mean_the_pipeline_did_not_keep_up() {
        let refused = probe(1000.0, 1.0, 3);
        assert!(!refused.kept_up());
        assert_eq!(next(1000.0, &[refused]), Some(800.0), "never more than 0.8 of a rate that fell behind");
    }

    #[test]
    fn the_search_stops_when_the_bounds_are_close() {
        let probes = [probe(1000.0, 0.5, 0), probe(500.0, 0.99, 0), probe(540.0, 0.5, 0)];
        assert_eq!(next(1000.0, &probes), None);
        assert_eq!(sustained(&probes), 500.0);
    }

    #[test]
    fn when_nothing_keeps_up_the_least_delivered_rate_stands() {
        let probes = [probe(1000.0, 0.5, 0), probe(400.0, 0.5, 0)];
        assert_eq!(next(1000.0, &probes), Some(200.0));
        assert_eq!(sustained(&probes), 200.0);
    }
}
