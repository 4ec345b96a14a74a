//! The soak (issue 42): the whole pipeline at a fixed rate for minutes, on a private database
//! server with its stock settings (autovacuum on, InnoDB's purge as shipped), with retention
//! running throughout, in three stages: a baseline, another session holding a snapshot open (so
//! that neither VACUUM nor purge may remove what the outbox's updates and deletes leave
//! behind), and the snapshot released. Every [`WINDOW`] it records what the events created in
//! the window saw and what the database and the services did (see [`sample`]); the raw
//! pipeline floor at the same rate on the same server ([`run_floor`]) is what each figure is
//! judged against, as a ratio.

mod chart;
mod hold;
mod pipeline;
mod report;
mod retention;
mod sample;
mod server;

use std::time::Duration;

use crate::error::BenchError;
use crate::measure::Percentiles;
use crate::plan::{Plan, SoakShape as Shape};
use crate::sql::BenchDatabase;

pub(crate) use chart::draw;
pub(crate) use report::{json, table, targets};

/// How often the soak samples, and the span of creation times each sample judges.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// The share of the sustained rate the soak offers: issue 42 tried 300 orders/s, about a tenth
/// of what the pipeline sustains here, a load a production outbox runs at for months.
pub(crate) const SHARE: f64 = 0.1;

/// The rate when no sustained rate is known: issue 42's.
pub(crate) const DEFAULT_RATE: f64 = 300.0;

/// One stage of the soak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Baseline,
    /// Another session holds a snapshot open.
    Held,
    /// The snapshot released.
    Released,
}

impl Stage {
    pub(crate) const ALL: [Self; 3] = [Self::Baseline, Self::Held, Self::Released];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Baseline => "baseline",
            Self::Held => "snapshot held",
            Self::Released => "released",
        }
    }
}

/// One sample: the events created in the window that ended [`WINDOW`] before it was taken, and
/// the state of the database and the services when it was taken.
#[derive(Debug, Clone, Default)]
pub(crate) struct Window {
    /// Seconds from the start of the load to the end of the window's creation times.
    pub(crate) at: f64,
    /// Seconds from the start of the load to the sample: a window after `at`. The relay's
    /// statements and the CPU are those of the period that ended then, the rest as of then.
    pub(crate) sampled_at: f64,
    pub(crate) stage: Option<Stage>,
    /// Events created in the window.
    pub(crate) events: u64,
    /// Of them, not yet published when sampled (their lag counts as their age then).
    pub(crate) unpublished: u64,
    /// Creation (the order service's stamp) to the relay's `published_at`.
    pub(crate) publish: Percentiles,
    /// Creation to the consumer's job (its commit).
    pub(crate) consume: Percentiles,
    /// The relay's claim and mark (with releases) statements, per batch, in the last period.
    pub(crate) claim: Percentiles,
    pub(crate) mark: Percentiles,
    pub(crate) batches: u64,
    /// Outbox rows not PUBLISHED.
    pub(crate) backlog: i64,
    /// The database's own view of what cleanup has not removed yet (see [`server::Cleanup`]).
    pub(crate) cleanup: server::Cleanup,
    pub(crate) sizes: server::Sizes,
    /// The oldest open transaction's age as the relay's `idempost_db_oldest_transaction_age`
    /// gauge reads it.
    pub(crate) oldest_transaction: f64,
    /// CPU over the period, in cores: order service, relay, consumer, database server, the
    /// whole machine (everything on it, other work included).
    pub(crate) cpu: [f64; 5],
    /// The one-minute load average when sampled.
    pub(crate) load: f64,
}

/// Latencies pooled over every window of a stage.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StageLatency {
    pub(crate) publish: Percentiles,
    pub(crate) consume: Percentiles,
    /// The worst window's p99s.
    pub(crate) worst_publish_p99: f64,
    pub(crate) worst_consume_p99: f64,
    pub(crate) claim_p50: f64,
    pub(crate) mark_p50: f64,
    pub(crate) peak_backlog: i64,
}

/// Everything one soak measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct Soak {
    pub(crate) settings: Vec<(String, String)>,
    pub(crate) rate: f64,
    /// Why that rate.
    pub(crate) rate_source: String,
    /// Seconds of the baseline and of the stage after the release.
    pub(crate) stage_seconds: f64,
    /// Seconds the snapshot was held.
    pub(crate) hold_seconds: f64,
    pub(crate) retention: String,
    /// Every retention run of both services during the load, from their logs.
    pub(crate) purges: Vec<retention::Purge>,
    /// The raw pipeline floor at the same rate on the same server: publish and consume lag.
    pub(crate) floor: (Percentiles, Percentiles),
    pub(crate) windows: Vec<Window>,
    pub(crate) stages: Vec<(Stage, StageLatency)>,
    /// Orders accepted and refused over the soak.
    pub(crate) accepted: u64,
    pub(crate) failed: u64,
    /// CPU seconds per 1,000 events over the soak: order service, relay, consumer, server.
    pub(crate) cpu_per_1000: [f64; 4],
    /// The time from the release until a window's publish p99 was back within 1.5x the
    /// baseline's (none: it never was).
    pub(crate) recovered_after: Option<f64>,
    pub(crate) notes: Vec<String>,
}

/// The rate of the soak, and why.
pub(crate) fn rate(shape: &Shape, sustained: f64) -> (f64, String) {
    match shape.rate {
        Some(rate) => (rate, "as given (--soak-rate)".into()),
        None if sustained >= 1.0 => {
            (sustained * SHARE, format!("{:.0} % of the sustained {sustained:.0}/s", SHARE * 100.0))
        }
        None => (DEFAULT_RATE, "issue 42's rate (no sustained rate measured in this run)".into()),
    }
}

/// Runs the floor and the soak on a private server of the kind `plan.database_url` names.
pub(crate) async fn run(plan: &Plan, shape: &Shape, sustained: f64) -> Result<Soak, BenchError> {
    let engine = server::engine(&plan.database_url)?;
    println!("== soak: starting a private {} server with stock settings", server::engine_name(engine));
    let private = idempost_testkit::private_db::PrivateServer::start_stock(engine).await;
    let bench = BenchDatabase::create(&server::admin_url(&private, engine)).await?;
    let (rate, rate_source) = rate(shape, sustained);
    let outcome = pipeline::Session::open(plan, &bench, &private).await;
    let outcome = match outcome {
        Ok(mut session) => {
            let soak = session.soak(shape, rate, rate_source).await;
            session.close().await;
            soak
        }
        Err(e) => Err(e),
    };
    let dropped = bench.remove().await;
    drop(private);
    let soak = outcome?;
    dropped?;
    Ok(soak)
}

/// The stage `at` seconds into the load of `shape` falls in.
fn stage_at(at: f64, shape: &Shape) -> Stage {
    let (taken, released) = shape.held();
    if at < taken.as_secs_f64() {
        Stage::Baseline
    } else if at < released.as_secs_f64() {
        Stage::Held
    } else {
        Stage::Released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_belongs_to_the_stage_its_events_were_created_in() {
        let shape = Shape { stage: Duration::from_secs(120), hold: Duration::from_secs(120), rate: None };
        assert_eq!(stage_at(0.0, &shape), Stage::Baseline);
        assert_eq!(stage_at(119.9, &shape), Stage::Baseline);
        assert_eq!(stage_at(120.0, &shape), Stage::Held);
        assert_eq!(stage_at(240.0, &shape), Stage::Released);
    }

    #[test]
    fn a_longer_hold_moves_the_release_and_the_end() {
        let shape = Shape { stage: Duration::from_secs(300), hold: Duration::from_secs(3600), rate: None };
        assert_eq!(stage_at(3899.0, &shape), Stage::Held);
        assert_eq!(stage_at(3900.0, &shape), Stage::Released);
        assert_eq!(shape.total(), Duration::from_secs(4200));
    }

    #[test]
    fn the_soak_offers_a_tenth_of_the_sustained_rate_unless_told() {
        let shape = Shape { stage: Duration::from_secs(60), hold: Duration::from_secs(60), rate: None };
        assert_eq!(rate(&shape, 2_700.0).0, 270.0);
        assert_eq!(rate(&shape, 0.0).0, DEFAULT_RATE);
        assert_eq!(rate(&Shape { rate: Some(50.0), ..shape }, 2_700.0).0, 50.0);
    }
}
