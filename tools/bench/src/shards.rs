//! The relay over shards (issue 44, part 2): one relay fleet serving every shard of a shard map,
//! its shards handed out by Kafka's group protocol on a control topic. Two measures:
//!
//! - **Drain**: the same total backlog split evenly over 1, 2 and 4 shards, each a database of
//!   its own on the one server (its order ids in its block), drained by one relay with the map;
//!   beside the same backlog in one database drained by one relay without a map, in the same
//!   run: the rate and the CPU per event of each, as ratios to that one database's.
//! - **Failover**: two relays of one fleet over 4 shards while every shard receives a trickle
//!   of events; one is SIGKILLed, and the survivor is timed until its log says it owns all four
//!   (`shards owned`) and until events of the dead one's shards are published again.

mod drain;
mod failover;
mod owned;
mod report;
mod set;

use crate::error::BenchError;
use crate::plan::Plan;

pub(crate) use report::{json, table};

/// The numbers of shards the backlog is split over.
pub(crate) const SHARD_COUNTS: [usize; 3] = [1, 2, 4];

/// The shards of the failover, served by two relays.
pub(crate) const FAILOVER_SHARDS: usize = 4;

/// The environment of every relay the phase starts: warnings, and the fleet's `shards owned`
/// lines as JSON, which [`owned`] reads. The relay without a map runs with it too, so that
/// both spend the same on logging.
pub(crate) const FLEET_LOG: [(&str, &str); 2] =
    [("RUST_LOG", "warn,idempost_relay::fleet=info"), ("IDEMPOST_LOG_FORMAT", "json")];

/// One relay draining one backlog.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Drain {
    /// Events published.
    pub(crate) events: u64,
    /// From the first to the last `published_at`, over every shard.
    pub(crate) per_second: f64,
    /// The relay's CPU over the drain (its start included), per event.
    pub(crate) cpu_us_per_event: f64,
    /// Whether every event was published within the drain limit.
    pub(crate) complete: bool,
}

/// Two relays over [`FAILOVER_SHARDS`] shards, one SIGKILLed.
#[derive(Debug, Clone, Default)]
pub(crate) struct Failover {
    /// The shards each relay owned before the kill: the survivor's, then the killed one's.
    pub(crate) before: (Vec<String>, Vec<String>),
    /// Seconds from the SIGKILL until the survivor logged that it owns every shard (none: it
    /// did not within the limit).
    pub(crate) assigned_after: Option<f64>,
    /// Seconds from the SIGKILL until an event of each of the killed relay's shards had been
    /// published again (none: not within the limit).
    pub(crate) flowing_after: Option<f64>,
    /// How long the phase waited for each.
    pub(crate) limit_seconds: f64,
}

/// What the phase measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shards {
    /// The backlog of every drain, over all its shards.
    pub(crate) backlog: u64,
    /// One database, a relay without a map.
    pub(crate) single: Drain,
    /// (shards, drain) with a map.
    pub(crate) sharded: Vec<(usize, Drain)>,
    pub(crate) failover: Failover,
    pub(crate) notes: Vec<String>,
}

/// Runs the drains, then the failover.
pub(crate) async fn run(plan: &Plan) -> Result<Shards, BenchError> {
    let mut shards = Shards { backlog: plan.backlog, ..Shards::default() };
    shards.single = drain::run(plan, 1, false).await?;
    for n in SHARD_COUNTS {
        let drained = drain::run(plan, n, true).await?;
        shards.sharded.push((n, drained));
    }
    for (n, d) in std::iter::once((0, &shards.single)).chain(shards.sharded.iter().map(|(n, d)| (*n, d))) {
        if !d.complete {
            let what = if n == 0 { "one database".to_owned() } else { format!("{n} shards") };
            shards.notes.push(format!("the drain over {what} did not finish within the drain limit"));
        }
    }
    shards.failover = failover::run(plan).await?;
    Ok(shards)
}

/// `a / b`, 0 when `b` is not positive.
pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// A step of the phase, with the load average.
fn step(what: &str) {
    println!("== shards: {what} (load {:.2})", crate::observe::load_average());
}
