//! How one run is shaped: what the command line asked for.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How one run is shaped.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) database_url: String,
    pub(crate) brokers: String,
    pub(crate) bin_dir: PathBuf,
    pub(crate) out_dir: PathBuf,
    pub(crate) backlog: u64,
    pub(crate) partitions: i32,
    /// Length of each throughput point.
    pub(crate) point: Duration,
    /// Length of each end-to-end load level.
    pub(crate) e2e: Duration,
    /// Length of the trickle.
    pub(crate) trickle: Duration,
    /// Length of each probe of the steady-rate searches.
    pub(crate) steady: Duration,
    /// Longest a drain may take.
    pub(crate) drain_limit: Duration,
    pub(crate) concurrencies: Vec<usize>,
    pub(crate) order_args: Vec<String>,
    pub(crate) relay_args: Vec<String>,
    /// Whether the relays write the legacy headers that a `ce_*` header repeats, and so the raw
    /// producer's records too.
    pub(crate) legacy_headers: bool,
    pub(crate) consumer_args: Vec<String>,
    /// The phases to run; empty: all of them.
    pub(crate) only: Vec<Phase>,
    /// The end-to-end levels' 100 %, instead of the least of the measured stages.
    pub(crate) max_offered: Option<f64>,
    /// The backlog of the ordered-relay phase.
    pub(crate) ordered: crate::ordered::Shape,
    /// The soak's stages and rate.
    pub(crate) soak: SoakShape,
}

/// What the command line asked of the soak (here, beside the rest of the plan, so that the soak
/// reads the plan and the plan never reads the soak).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SoakShape {
    /// Length of the baseline and of the stage after the release.
    pub(crate) stage: std::time::Duration,
    /// How long the snapshot is held: the middle stage.
    pub(crate) hold: std::time::Duration,
    /// The offered rate, orders/s; none: `soak::SHARE` of the pipeline's sustained rate when the
    /// run measured it (or `--max-offered` gave it), else `soak::DEFAULT_RATE`.
    pub(crate) rate: Option<f64>,
}

impl SoakShape {
    /// When the snapshot is taken and when it is released, from the start of the load.
    pub(crate) fn held(&self) -> (std::time::Duration, std::time::Duration) {
        (self.stage, self.stage + self.hold)
    }

    /// The whole load: baseline, hold, release.
    pub(crate) fn total(&self) -> std::time::Duration {
        self.stage * 2 + self.hold
    }
}

/// One phase of a run, as `--only` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Phase {
    RawCommit,
    Submit,
    Group,
    RawInsert,
    RawProduce,
    RawClaimMark,
    Relay,
    Consumer,
    E2e,
    /// The raw pipeline's sustained rate (no Idempost code).
    Floor,
    /// The steady rate with a bounded backlog, relay alone.
    SteadyRelay,
    /// The steady rate with a bounded backlog, whole pipeline.
    Steady,
    /// Many events per order: the relay x1 and x2 draining 10 versions of each of 1,000 orders
    /// beside the same number of events one per order, and the latency of amendments.
    Ordered,
    /// The whole pipeline for minutes on a private server with stock settings: a baseline,
    /// another session holding a snapshot open, the snapshot released (issue 42).
    Soak,
    /// One relay fleet over 1, 2 and 4 shard databases against one database of the same
    /// backlog, and the time to full assignment after a fleet relay dies (issue 44).
    Shards,
}

impl Plan {
    /// Whether `phase` runs: every phase when `--only` names none, except the soak, which takes
    /// a quarter of an hour and a server of its own, and the shards phase, which makes databases
    /// of its own and needs a control topic per fleet: they run only when named.
    pub(crate) fn runs(&self, phase: Phase) -> bool {
        runs(&self.only, phase)
    }
}

/// Whether `phase` runs when `--only` names `only` (see [`Plan::runs`]).
fn runs(only: &[Phase], phase: Phase) -> bool {
    only.contains(&phase) || (only.is_empty() && !matches!(phase, Phase::Soak | Phase::Shards))
}

/// Where the services are: `--bin-dir`, or beside this binary.
pub(crate) fn default_bin_dir() -> PathBuf {
    std::env::current_exe().ok().and_then(|exe| exe.parent().map(Path::to_path_buf)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum as _;

    use super::Phase;

    #[test]
    fn only_names_the_ordered_phase_ordered() {
        assert_eq!(Phase::from_str("ordered", false), Ok(Phase::Ordered));
        assert_eq!(
            Phase::Ordered.to_possible_value().map(|v| v.get_name().to_owned()),
            Some("ordered".into())
        );
    }

    #[test]
    fn the_shards_phase_runs_only_when_named() {
        assert!(!super::runs(&[], Phase::Shards));
        assert!(!super::runs(&[], Phase::Soak));
        assert!(super::runs(&[], Phase::Relay));
        assert!(super::runs(&[Phase::Shards], Phase::Shards));
        assert!(!super::runs(&[Phase::Shards], Phase::Relay));
        assert_eq!(Phase::from_str("shards", false), Ok(Phase::Shards));
    }

    #[test]
    fn the_existing_phase_names_stay_as_they_were() {
        for (name, phase) in [
            ("raw-commit", Phase::RawCommit),
            ("relay", Phase::Relay),
            ("consumer", Phase::Consumer),
            ("e2e", Phase::E2e),
            ("steady-relay", Phase::SteadyRelay),
        ] {
            assert_eq!(Phase::from_str(name, false), Ok(phase));
        }
    }
}
