//! The shards phase as the printed table and as `bench.json`'s `shards` object.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::{Drain, Shards, ratio};

/// A drain's rate and CPU per event as ratios to the one database's.
fn against(d: &Drain, single: &Drain) -> (f64, f64) {
    (ratio(d.per_second, single.per_second), ratio(d.cpu_us_per_event, single.cpu_us_per_event))
}

fn seconds(value: Option<f64>, limit: f64) -> String {
    value.map_or_else(|| format!("not within {limit:.0} s"), |s| format!("{s:.1} s"))
}

/// The phase's part of the printed table.
pub(crate) fn table(shards: &Shards) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\nrelay over shards (issue 44): {} events split evenly over the shards (a database each, one server), \
         one relay with the shard map; against the same backlog in one database, one relay without a map",
        shards.backlog
    );
    let _ = writeln!(
        t,
        "  {:<16} {:>9} {:>12} {:>13} {:>8} {:>9}",
        "", "events", "events/s", "CPU µs/event", "rate x", "CPU x"
    );
    let single = &shards.single;
    let _ = writeln!(
        t,
        "  {:<16} {:>9} {:>12.0} {:>13.1} {:>8} {:>9}",
        "one database", single.events, single.per_second, single.cpu_us_per_event, "1.00", "1.00"
    );
    for (n, d) in &shards.sharded {
        let (rate, cpu) = against(d, single);
        let _ = writeln!(
            t,
            "  {:<16} {:>9} {:>12.0} {:>13.1} {:>8.2} {:>9.2}",
            format!("{n} shard(s)"),
            d.events,
            d.per_second,
            d.cpu_us_per_event,
            rate,
            cpu
        );
    }
    let f = &shards.failover;
    let _ = writeln!(
        t,
        "  failover: two relays over {} shards (relay 1 {:?}, relay 2 {:?}), relay 2 SIGKILLed: relay 1 owns every \
         shard after {}; the killed relay's shards publish again after {}",
        super::FAILOVER_SHARDS,
        f.before.0,
        f.before.1,
        seconds(f.assigned_after, f.limit_seconds),
        seconds(f.flowing_after, f.limit_seconds)
    );
    for note in &shards.notes {
        let _ = writeln!(t, "  note: {note}");
    }
    t
}

fn drain_json(d: &Drain, single: &Drain) -> Value {
    let (rate, cpu) = against(d, single);
    json!({
        "events": d.events, "perSecond": d.per_second, "cpuMicrosecondsPerEvent": d.cpu_us_per_event,
        "complete": d.complete, "rateOverOneDatabase": rate, "cpuPerEventOverOneDatabase": cpu,
    })
}

/// `bench.json`'s `shards` object.
pub(crate) fn json(shards: &Shards) -> Value {
    let f = &shards.failover;
    json!({
        "backlog": shards.backlog,
        "oneDatabase": drain_json(&shards.single, &shards.single),
        "sharded": shards.sharded.iter().map(|(n, d)| {
            let mut value = drain_json(d, &shards.single);
            value["shards"] = json!(n);
            value
        }).collect::<Vec<_>>(),
        "failover": {
            "shards": super::FAILOVER_SHARDS, "survivorOwnedBefore": f.before.0, "killedOwnedBefore": f.before.1,
            "allOwnedAfterSeconds": f.assigned_after, "killedShardsPublishingAfterSeconds": f.flowing_after,
            "limitSeconds": f.limit_seconds,
        },
        "notes": shards.notes,
    })
}

#[cfg(test)]
mod tests {
    use super::super::Failover;
    use super::*;

    fn shards() -> Shards {
        let drain = |per_second, cpu_us_per_event| Drain {
            events: 1000,
            per_second,
            cpu_us_per_event,
            complete: true,
        };
        Shards {
            backlog: 1000,
            single: drain(5000.0, 40.0),
            sharded: vec![(1, drain(5000.0, 40.0)), (4, drain(4000.0, 50.0))],
            failover: Failover {
                before: (vec!["shard-0".into(), "shard-1".into()], vec!["shard-2".into(), "shard-3".into()]),
                assigned_after: Some(11.5),
                flowing_after: None,
                limit_seconds: 120.0,
            },
            notes: Vec::new(),
        }
    }

    #[test]
    fn each_drain_is_judged_against_the_one_database_of_the_same_run() {
        let value = json(&shards());
        let four = &value["sharded"][1];
        assert_eq!(four["shards"], 4);
        assert_eq!(four["rateOverOneDatabase"], 0.8);
        assert_eq!(four["cpuPerEventOverOneDatabase"], 1.25);
        assert_eq!(value["oneDatabase"]["rateOverOneDatabase"], 1.0);
    }

    #[test]
    fn the_failover_says_what_did_not_happen_within_its_limit() {
        let value = json(&shards());
        assert_eq!(value["failover"]["allOwnedAfterSeconds"], 11.5);
        assert_eq!(value["failover"]["killedShardsPublishingAfterSeconds"], Value::Null);
        let table = table(&shards());
        assert!(table.contains("after 11.5 s"), "{table}");
        assert!(table.contains("publish again after not within 120 s"), "{table}");
        assert!(table.contains("4 shard(s)"), "{table}");
    }
}
