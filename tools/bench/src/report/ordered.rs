//! The ordered-relay phase in the table and the JSON: the drains one and many events per order,
//! their ratio against the target, and the latency of amendments.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::figures::{Figures, Ordered, OrderedDrain};
use crate::measure::Percentiles;
use crate::ordered::TARGET;

/// (name, value, target, met) for each relay count both drains measured.
pub(super) fn targets(f: &Figures) -> Vec<(String, String, String, bool)> {
    let Some(o) = &f.ordered else { return Vec::new() };
    o.many_per_order
        .iter()
        .filter_map(|d| {
            let r = o.ratio(d.processes)?;
            let complete = d.drain.complete && o.one_per_order.iter().all(|b| b.drain.complete);
            Some((
                format!("ordered relay x{0} / one per order x{0}", d.processes),
                format!("{r:.3}"),
                format!(">= {TARGET:.2}"),
                complete && r >= TARGET,
            ))
        })
        .collect()
}

fn drain_line(t: &mut String, what: &str, d: &OrderedDrain) {
    let p = &d.phases;
    let _ = writeln!(
        t,
        "  {what:<15} x{} {:>9.1} events/s  {:>7} events in {:>6.1} s{}  {:>5} batches of {:>5.1}  claim {:>6.1} / {:>6.1}  publish {:>6.1} / {:>6.1}  mark {:>6.1} / {:>6.1} ms  lease lost {}  lock conflicts {}",
        d.processes,
        d.drain.per_second,
        d.drain.events,
        d.drain.wall_seconds,
        if d.drain.complete { "" } else { " INCOMPLETE" },
        p.batches,
        p.mean_batch(),
        p.claim.p50,
        p.claim.p95,
        p.publish.p50,
        p.publish.p95,
        p.record.p50,
        p.record.p95,
        p.lease_lost,
        p.lock_conflicts
    );
}

fn ms(p: &Percentiles) -> String {
    format!("p50 {:.1} / p95 {:.1} / p99 {:.1} ms ({} samples)", p.p50, p.p95, p.p99, p.samples)
}

/// The ordered-relay section of the table (empty when the phase did not run).
pub(super) fn table(f: &Figures) -> String {
    let mut t = String::new();
    let Some(o) = &f.ordered else { return t };
    let _ = writeln!(
        t,
        "\nordered relay: {} events, one per order, and {} orders x {} versions (claim: each order's earliest unpublished event)",
        o.orders * o.versions,
        o.orders,
        o.versions
    );
    for d in &o.one_per_order {
        drain_line(&mut t, "one per order", d);
    }
    for d in &o.many_per_order {
        drain_line(&mut t, "many per order", d);
    }
    for d in &o.many_per_order {
        if let Some(r) = o.ratio(d.processes) {
            let _ = writeln!(
                t,
                "  ordered x{0} / one per order x{0} = {r:.3}  (target >= {TARGET:.2})",
                d.processes
            );
        }
    }
    let a = &o.amends;
    let _ = writeln!(
        t,
        "  amends at {:.0}/s over {} orders: {} accepted, {} failed, {} not applied, {} parked, {} of {} amended orders' read models at the order's version",
        a.offered_per_second, a.orders, a.accepted, a.failed, a.missing, a.parked, a.views_current, a.orders
    );
    let _ = writeln!(t, "    sent -> applied      {}", ms(&a.sent_to_applied));
    let _ = writeln!(t, "    accepted -> applied  {}", ms(&a.accepted_to_applied));
    t
}

fn drains(drains: &[OrderedDrain]) -> Value {
    drains
        .iter()
        .map(|d| {
            json!({"processes": d.processes, "perSecond": d.drain.per_second, "events": d.drain.events,
                   "wallSeconds": d.drain.wall_seconds, "complete": d.drain.complete,
                   "batches": d.phases.batches, "meanBatch": d.phases.mean_batch(),
                   "claimP50Ms": d.phases.claim.p50, "claimP95Ms": d.phases.claim.p95,
                   "publishP50Ms": d.phases.publish.p50, "markP50Ms": d.phases.record.p50,
                   "leaseLost": d.phases.lease_lost, "lockConflicts": d.phases.lock_conflicts})
        })
        .collect()
}

fn percentiles(p: &Percentiles) -> Value {
    json!({"p50Ms": p.p50, "p95Ms": p.p95, "p99Ms": p.p99, "samples": p.samples})
}

/// The ordered-relay phase as JSON (null when it did not run).
pub(super) fn json(f: &Figures) -> Value {
    let Some(o) = &f.ordered else { return Value::Null };
    let ratio = |o: &Ordered, n| o.ratio(n).map_or(Value::Null, Value::from);
    let a = &o.amends;
    json!({
        "orders": o.orders,
        "versions": o.versions,
        "onePerOrder": drains(&o.one_per_order),
        "manyPerOrder": drains(&o.many_per_order),
        "ratioX1": ratio(o, 1),
        "ratioX2": ratio(o, 2),
        "amends": {"offeredPerSecond": a.offered_per_second, "orders": a.orders, "accepted": a.accepted,
                   "failed": a.failed, "notApplied": a.missing, "parked": a.parked, "readModelsCurrent": a.views_current,
                   "sentToApplied": percentiles(&a.sent_to_applied),
                   "acceptedToApplied": percentiles(&a.accepted_to_applied)},
    })
}
