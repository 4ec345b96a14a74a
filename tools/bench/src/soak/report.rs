//! The soak's figures as the printed table and as `bench.json`'s `soak` object.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::retention::{self, Growth};
use super::{Soak, Stage, StageLatency};
use crate::measure::Percentiles;

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

fn stage(soak: &Soak, which: Stage) -> StageLatency {
    soak.stages.iter().find(|(s, _)| *s == which).map(|(_, l)| *l).unwrap_or_default()
}

/// Issue 42's targets for part 2, judged on this soak: (name, value, target, met).
pub(crate) fn targets(soak: &Soak) -> Vec<(String, String, String, bool)> {
    let (base, held, released) =
        (stage(soak, Stage::Baseline), stage(soak, Stage::Held), stage(soak, Stage::Released));
    let publish = ratio(held.publish.p99, base.publish.p99);
    let consume = ratio(held.consume.p99, base.consume.p99);
    let claim = ratio(released.claim_p50, base.claim_p50);
    let mark = ratio(released.mark_p50, base.mark_p50);
    let mut targets = vec![
        (
            "soak: publish p99, snapshot held / baseline".into(),
            format!("{publish:.2}"),
            "<= 1.50".into(),
            publish <= 1.5,
        ),
        (
            "soak: consume p99, snapshot held / baseline".into(),
            format!("{consume:.2}"),
            "<= 1.50".into(),
            consume <= 1.5,
        ),
        (
            "soak: back within 1.5x the baseline's publish p99 after release".into(),
            soak.recovered_after.map_or("never".into(), |s| format!("{s:.0} s")),
            "<= 60 s".into(),
            soak.recovered_after.is_some_and(|s| s <= 60.0),
        ),
        (
            "soak: relay claim p50, released / baseline".into(),
            format!("{claim:.2}"),
            "<= 1.50".into(),
            claim <= 1.5,
        ),
        (
            "soak: relay mark p50, released / baseline".into(),
            format!("{mark:.2}"),
            "<= 1.50".into(),
            mark <= 1.5,
        ),
    ];
    targets.extend(retention::growth(&soak.purges).iter().filter_map(|g| {
        let ratio = g.ratio()?;
        Some((
            format!("soak: retention of {} per 1,000 rows, late / early runs", g.table),
            format!("{ratio:.2}"),
            "<= 1.50".into(),
            ratio <= 1.5,
        ))
    }));
    targets
}

/// The tables' retention, as the printed table's lines.
fn retention_lines(t: &mut String, soak: &Soak) {
    let _ = writeln!(
        t,
        "  retention per run (the services' `retention purge` lines): early / late = the first / last third of \
         the runs that removed rows"
    );
    let growth = retention::growth(&soak.purges);
    if growth.is_empty() {
        let _ = writeln!(t, "    no retention run logged");
    }
    for g in &growth {
        let cost = |c: Option<retention::Cost>| {
            c.map_or("-".into(), |c| format!("{:.2} ms ({} runs, {} rows)", c.ms_per_1000, c.runs, c.rows))
        };
        let _ = writeln!(
            t,
            "    {:<15} {} runs, {} rows, p50 {:.1} ms per run; per 1,000 rows early {}, late {}; late / early {}",
            g.table,
            g.all.runs,
            g.all.rows,
            g.all.p50_ms,
            cost(g.early),
            cost(g.late),
            g.ratio().map_or("-".into(), |r| format!("{r:.2}"))
        );
    }
}

/// The window's retention runs, outbox and dedup, as `rows@ms`.
fn purged(soak: &Soak, w: &super::Window) -> String {
    let from = w.sampled_at - super::WINDOW.as_secs_f64();
    let [outbox, dedup] = [OUTBOX, DEDUP].map(|table| {
        let (rows, ms) = retention::within(&soak.purges, table, from, w.sampled_at);
        format!("{rows}@{ms:.0}")
    });
    format!("{outbox}/{dedup}")
}

/// The tables the two services' retention purges.
const OUTBOX: &str = "outbox_event";
const DEDUP: &str = "consumed_event";

fn window_json(w: &super::Window) -> Value {
    json!({
            "atSeconds": w.at, "sampledAtSeconds": w.sampled_at, "stage": w.stage.map(Stage::name), "events": w.events, "unpublished": w.unpublished,
        "publish": percentiles(&w.publish), "consume": percentiles(&w.consume),
        "claim": percentiles(&w.claim), "mark": percentiles(&w.mark), "batches": w.batches,
        "backlog": w.backlog, "outboxDeadRows": w.cleanup.outbox_dead, "dedupDeadRows": w.cleanup.dedup_dead,
        "outboxAutovacuums": w.cleanup.outbox_autovacuums, "historyListLength": w.cleanup.history_length,
        "outboxTableBytes": w.sizes.outbox_table, "outboxIndexBytes": w.sizes.outbox_indexes,
        "dedupTableBytes": w.sizes.dedup_table, "dedupIndexBytes": w.sizes.dedup_indexes,
        "oldestTransactionSeconds": w.oldest_transaction,
        "cpuCores": {"order": w.cpu[0], "relay": w.cpu[1], "consumer": w.cpu[2], "databaseServer": w.cpu[3], "machine": w.cpu[4]},
        "loadAverage": w.load,
    })
}

fn growth_json(g: &Growth) -> Value {
    let cost = |c: Option<retention::Cost>| {
        c.map(|c| json!({"runs": c.runs, "rows": c.rows, "msPer1000Rows": c.ms_per_1000, "p50Ms": c.p50_ms}))
    };
    json!({
        "table": g.table, "runs": g.all.runs, "rows": g.all.rows, "p50Ms": g.all.p50_ms,
        "msPer1000Rows": g.all.ms_per_1000, "early": cost(g.early), "late": cost(g.late),
        "lateOverEarly": g.ratio(),
    })
}

/// One window as the soak prints it while it runs.
pub(crate) fn progress(w: &super::Window) -> String {
    format!(
        "   {:>5.0}s {:<13} events {:>5} publish p50/p99 {:>7.1}/{:>7.1} ms consume {:>7.1}/{:>7.1} ms \
         backlog {:>6} dead/history {:>7} oldest tx {:>5.0}s load {:.2}",
        w.at,
        w.stage.map_or("", Stage::name),
        w.events,
        w.publish.p50,
        w.publish.p99,
        w.consume.p50,
        w.consume.p99,
        w.backlog,
        w.cleanup.outbox_dead + w.cleanup.history_length,
        w.oldest_transaction,
        w.load
    )
}

/// The soak's part of the printed table.
pub(crate) fn table(soak: &Soak) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\nsoak: the whole pipeline at {:.0} orders/s ({}): baseline {:.0} s, snapshot held {:.0} s, released {:.0} s",
        soak.rate, soak.rate_source, soak.stage_seconds, soak.hold_seconds, soak.stage_seconds
    );
    let _ = writeln!(
        t,
        "  private server: {}",
        soak.settings.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
    );
    let _ = writeln!(t, "  retention: {}", soak.retention);
    let (fp, fc) = soak.floor;
    let _ = writeln!(
        t,
        "  raw floor at the same rate: publish p50/p99 {:.1}/{:.1} ms, consume {:.1}/{:.1} ms",
        fp.p50, fp.p99, fc.p50, fc.p99
    );
    let _ = writeln!(
        t,
        "  {:<14} {:>17} {:>17} {:>11} {:>11} {:>9} {:>9} {:>8}",
        "stage",
        "publish p50/p99",
        "consume p50/p99",
        "worst p99",
        "p99/floor",
        "claim p50",
        "mark p50",
        "backlog"
    );
    for (which, l) in &soak.stages {
        let _ = writeln!(
            t,
            "  {:<14} {:>8.1}/{:>8.1} {:>8.1}/{:>8.1} {:>11.1} {:>5.1}/{:>5.1} {:>9.2} {:>9.2} {:>8}",
            which.name(),
            l.publish.p50,
            l.publish.p99,
            l.consume.p50,
            l.consume.p99,
            l.worst_publish_p99,
            ratio(l.publish.p99, fp.p99),
            ratio(l.consume.p99, fc.p99),
            l.claim_p50,
            l.mark_p50,
            l.peak_backlog
        );
    }
    let _ = writeln!(
        t,
        "  {} orders accepted, {} failed; CPU s per 1,000 events: order {:.3}, relay {:.3}, consumer {:.3}, database server {:.3}",
        soak.accepted,
        soak.failed,
        soak.cpu_per_1000[0],
        soak.cpu_per_1000[1],
        soak.cpu_per_1000[2],
        soak.cpu_per_1000[3]
    );
    retention_lines(&mut t, soak);
    let _ = writeln!(
        t,
        "  every {0} s: the lags of the events created in the {0} s up to `s`; the relay's statements, the \
         backlog, cleanup, sizes, the oldest transaction and CPU as of (over the {0} s up to) {0} s later; the \
         retention runs (outbox/dedup rows@ms) that ended in those {0} s:",
        super::WINDOW.as_secs()
    );
    let _ = writeln!(
        t,
        "  {:>5} {:<13} {:>6} {:>15} {:>15} {:>11} {:>7} {:>8} {:>8} {:>7} {:>9} {:>9} {:>6} {:>24} {:>5} {:>17}",
        "s",
        "stage",
        "events",
        "publish p50/p99",
        "consume p50/p99",
        "claim/mark",
        "backlog",
        "dead",
        "history",
        "vacuums",
        "outbox MB",
        "dedup MB",
        "old tx",
        "CPU order/relay/cons/db",
        "all",
        "retention"
    );
    for w in &soak.windows {
        let mb = |a: i64, b: i64| format!("{:.1}+{:.1}", a as f64 / 1048576.0, b as f64 / 1048576.0);
        let _ = writeln!(
            t,
            "  {:>5.0} {:<13} {:>6} {:>7.1}/{:>7.1} {:>7.1}/{:>7.1} {:>5.1}/{:>5.1} {:>7} {:>8} {:>8} {:>7} {:>9} {:>9} {:>6.0} {:>24} {:>5.2} {:>17}",
            w.at,
            w.stage.map_or("", Stage::name),
            w.events,
            w.publish.p50,
            w.publish.p99,
            w.consume.p50,
            w.consume.p99,
            w.claim.p50,
            w.mark.p50,
            w.backlog,
            w.cleanup.outbox_dead,
            w.cleanup.history_length,
            w.cleanup.outbox_autovacuums,
            mb(w.sizes.outbox_table, w.sizes.outbox_indexes),
            mb(w.sizes.dedup_table, w.sizes.dedup_indexes),
            w.oldest_transaction,
            format!("{:.2}/{:.2}/{:.2}/{:.2}", w.cpu[0], w.cpu[1], w.cpu[2], w.cpu[3]),
            w.cpu[4],
            purged(soak, w)
        );
    }
    for note in &soak.notes {
        let _ = writeln!(t, "  note: {note}");
    }
    t
}

fn percentiles(p: &Percentiles) -> Value {
    json!({"p50Ms": p.p50, "p95Ms": p.p95, "p99Ms": p.p99, "samples": p.samples})
}

/// `bench.json`'s `soak` object.
pub(crate) fn json(soak: &Soak) -> Value {
    let (fp, fc) = soak.floor;
    // Built apart: one json! of everything would pass serde_json's macro recursion limit.
    let runs: Vec<Value> = soak
        .purges
        .iter()
        .map(|p| json!({"atSeconds": p.at, "table": p.table, "rows": p.rows, "elapsedMs": p.elapsed_ms}))
        .collect();
    let growth: Vec<Value> = retention::growth(&soak.purges).iter().map(growth_json).collect();
    json!({
        "ratePerSecond": soak.rate,
        "rateSource": soak.rate_source,
        "stageSeconds": soak.stage_seconds,
        "holdSeconds": soak.hold_seconds,
        "windowSeconds": super::WINDOW.as_secs(),
        "retention": soak.retention,
        "retentionRuns": runs,
        "retentionGrowth": growth,
        "server": soak.settings.iter().map(|(k, v)| (k.clone(), Value::from(v.clone()))).collect::<serde_json::Map<_, _>>(),
        "floor": {"publish": percentiles(&fp), "consume": percentiles(&fc)},
        "stages": soak.stages.iter().map(|(which, l)| json!({
            "stage": which.name(),
            "publish": percentiles(&l.publish), "consume": percentiles(&l.consume),
            "worstWindowPublishP99Ms": l.worst_publish_p99, "worstWindowConsumeP99Ms": l.worst_consume_p99,
            "publishP99OverFloor": ratio(l.publish.p99, fp.p99), "consumeP99OverFloor": ratio(l.consume.p99, fc.p99),
            "claimP50Ms": l.claim_p50, "markP50Ms": l.mark_p50, "peakBacklog": l.peak_backlog,
        })).collect::<Vec<_>>(),
        "recoveredAfterSeconds": soak.recovered_after,
        "accepted": soak.accepted,
        "failed": soak.failed,
        "cpuSecondsPer1000": {"order": soak.cpu_per_1000[0], "relay": soak.cpu_per_1000[1],
                              "consumer": soak.cpu_per_1000[2], "databaseServer": soak.cpu_per_1000[3]},
        "windows": soak.windows.iter().map(window_json).collect::<Vec<_>>(),
        "targets": targets(soak).into_iter().map(|(name, value, target, met)| json!({
            "name": name, "value": value, "target": target, "met": met})).collect::<Vec<_>>(),
        "notes": soak.notes,
    })
}
