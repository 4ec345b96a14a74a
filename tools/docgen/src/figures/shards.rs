//! The relay-over-shards rows (issue 44): one relay fleet draining a backlog split over 1, 2 and
//! 4 shard databases against the same backlog in one database, and the time until a killed fleet
//! relay's shards were all owned again; read from a run's `shards`, the object
//! `idempost-bench --only shards` writes.

use serde_json::Value;

use super::{find, number_at, rate};

/// What the table shows of one database's shards phase.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardFigures {
    /// One relay over 1, 2 and 4 shards, events/s.
    pub rate: [f64; 3],
    /// Each over the rate of the same backlog in one database, same run.
    pub over_one_database: [f64; 3],
    /// Seconds from a fleet relay's SIGKILL until the survivor owned every shard; none: not
    /// within `limit` seconds.
    pub all_owned_after: Option<f64>,
    pub limit: f64,
}

/// A row: what it measures, and how it shows a run's figures.
type Row = (&'static str, fn(&ShardFigures) -> String);

/// The rows, in the table's order.
pub(super) const ROWS: [Row; 2] = [
    ("relay over 1 / 2 / 4 shards, one relay (events/s)", rate_cell),
    ("a fleet relay SIGKILLed: every shard owned again after (s)", failover_cell),
];

/// The figures of a `shards` object.
pub(super) fn parse(shards: &Value) -> Result<ShardFigures, String> {
    let of = |n: u64, key: &str| {
        find(shards, "sharded", "shards", &Value::from(n))
            .and_then(|drain| number_at(drain, key))
            .map_err(|e| format!("shards, {n} shard(s): {e}"))
    };
    let failover = shards.get("failover").ok_or("shards: `failover` is missing")?;
    Ok(ShardFigures {
        rate: [of(1, "perSecond")?, of(2, "perSecond")?, of(4, "perSecond")?],
        over_one_database: [
            of(1, "rateOverOneDatabase")?,
            of(2, "rateOverOneDatabase")?,
            of(4, "rateOverOneDatabase")?,
        ],
        all_owned_after: failover.get("allOwnedAfterSeconds").and_then(Value::as_f64),
        limit: number_at(failover, "limitSeconds").map_err(|e| format!("shards, failover: {e}"))?,
    })
}

/// `4,451 / 4,161 / 3,796 (1.13x / 1.05x / 0.96x)`.
fn rate_cell(shards: &ShardFigures) -> String {
    let rates: Vec<String> = shards.rate.iter().map(|r| rate(*r)).collect();
    let over: Vec<String> = shards.over_one_database.iter().map(|r| format!("{r:.2}x")).collect();
    format!("{} ({})", rates.join(" / "), over.join(" / "))
}

/// `11.9`, or `not within 120`.
fn failover_cell(shards: &ShardFigures) -> String {
    shards.all_owned_after.map_or_else(|| format!("not within {:.0}", shards.limit), |s| format!("{s:.1}"))
}
