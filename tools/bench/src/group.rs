//! SubmitOrder with group commit on and off, against raw commit at the same concurrency, and
//! the sizes of the batches the service wrote.
//!
//! The order service runs in this process here (not as a child like the other phases) so the
//! bench can read its batch sizes exactly, from `Application::batch_sizes`; on and off run the
//! same way, so they compare with each other and with raw commit, which runs here too.

use std::fmt::Write as _;

use clap::Parser as _;
use idempost_order::{Application, GroupCommitMode, Settings};
use sea_orm::DatabaseConnection;
use serde_json::{Value, json};

use crate::error::BenchError;
use crate::figures::{GroupPoint, Point};
use crate::load::{self, OrderClients};
use crate::measure;
use crate::plan::Plan;
use crate::sql;

/// Measures SubmitOrder at each of the plan's concurrencies, group commit on then off, on a
/// truncated database each time. `--order-arg` flags apply (e.g. `--group-commit-writers=8`).
pub(crate) async fn measure(
    plan: &Plan,
    url: &str,
    db: &DatabaseConnection,
) -> Result<Vec<GroupPoint>, BenchError> {
    let mut points = Vec::new();
    for mode in [GroupCommitMode::On, GroupCommitMode::Off] {
        let mut args = vec![
            "idempost-order".to_owned(),
            format!("--database-url={url}"),
            "--listen=127.0.0.1:0".to_owned(),
            "--admin-listen=127.0.0.1:0".to_owned(),
            // Loopback only, as for the other phases; and up to 64 callers are measured, not shed.
            "--auth=none".to_owned(),
            "--max-concurrent-calls=1024".to_owned(),
        ];
        args.extend(plan.order_args.iter().cloned());
        let mut settings = Settings::try_parse_from(args).map_err(|e| BenchError::Settings(e.to_string()))?;
        settings.group_commit.mode = mode;
        let on = mode == GroupCommitMode::On;
        let app = Application::build(settings).await.map_err(|e| BenchError::Stuck(e.to_string()))?;
        let (port, sizes) = (app.port(), app.batch_sizes());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(app.run_until_stopped(async {
            let _ = stopped.await;
        }));
        let clients = OrderClients::connect(&format!("http://127.0.0.1:{port}"), 4).await?;
        clients.submit(0).await?;
        for &c in &plan.concurrencies {
            println!(
                "== SubmitOrder, group commit {} @{c} (load {:.2})",
                if on { "on" } else { "off" },
                crate::observe::load_average()
            );
            let before = sizes.snapshot();
            let shared = clients.clone();
            let mut result = load::closed_loop(c, plan.point, move |worker| {
                let clients = shared.clone();
                async move { clients.submit(worker).await.map(|_| ()) }
            })
            .await;
            let seen = sizes.snapshot().since(&before);
            points.push(GroupPoint {
                on,
                point: Point {
                    concurrency: c,
                    per_second: measure::rate(result.ok, result.elapsed),
                    latency: result.latencies.summary(),
                    errors: result.errors,
                },
                batches: seen.batches(),
                batch_mean: seen.mean(),
                batch_p99: seen.quantile(0.99),
                set_written: seen.set_written(),
                set_fell_back: seen.set_fell_back(),
            });
        }
        let _ = stop.send(());
        match server.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(BenchError::Stuck(format!("in-process order service: {e}"))),
            Err(e) => return Err(BenchError::Stuck(format!("in-process order service: {e}"))),
        }
        sql::truncate_all(db).await?;
    }
    Ok(points)
}

fn at(points: &[GroupPoint], on: bool, c: usize) -> Option<&GroupPoint> {
    points.iter().find(|p| p.on == on && p.point.concurrency == c)
}

fn raw_at(raw: &[Point], c: usize) -> f64 {
    raw.iter().find(|p| p.concurrency == c).map_or(0.0, |p| p.per_second)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// The issue-16 targets: (name, value, target, met).
fn targets(points: &[GroupPoint], raw: &[Point]) -> Vec<(String, String, String, bool)> {
    let mut out = Vec::new();
    for (c, target) in [(64, 1.3), (16, 1.0)] {
        if let Some(on) = at(points, true, c) {
            let r = ratio(on.point.per_second, raw_at(raw, c));
            out.push((
                format!("group on @{c} / raw commit @{c}"),
                format!("{r:.2}"),
                format!(">= {target:.2}"),
                r >= target,
            ));
        }
    }
    if let (Some(on), Some(off)) = (at(points, true, 1), at(points, false, 1)) {
        let r = ratio(on.point.latency.p50, off.point.latency.p50);
        out.push(("group on @1 p50 / off @1 p50".into(), format!("{r:.2}"), "<= 1.10".into(), r <= 1.1));
    }
    out
}

/// The section of the printed table.
pub(crate) fn table(points: &[GroupPoint], raw: &[Point]) -> String {
    let mut t = String::new();
    if points.is_empty() {
        return t;
    }
    let _ = writeln!(
        t,
        "\nSubmitOrder, group commit on / off (order service in the bench process, 16 db connections)"
    );
    for p in points {
        let batches = if p.on {
            format!(
                "batches {:>6}, size mean {:>5.1} p99 {:>3}, set-based {}{}",
                p.batches,
                p.batch_mean,
                p.batch_p99,
                p.set_written,
                if p.set_fell_back > 0 { format!(" ({} fell back)", p.set_fell_back) } else { String::new() }
            )
        } else {
            "one transaction per order".to_owned()
        };
        let _ = writeln!(
            t,
            "  {:<3} @{:<3} {:>8.0} orders/s ({:>4.2} x raw)  p50 {:>7.2} p99 {:>7.2} ms  {batches}{}",
            if p.on { "on" } else { "off" },
            p.point.concurrency,
            p.point.per_second,
            ratio(p.point.per_second, raw_at(raw, p.point.concurrency)),
            p.point.latency.p50,
            p.point.latency.p99,
            if p.point.errors > 0 { format!("  ({} errors)", p.point.errors) } else { String::new() }
        );
    }
    for (name, value, target, met) in targets(points, raw) {
        let _ =
            writeln!(t, "  {name:<32} {value:>6}  target {target:<8} {}", if met { "met" } else { "MISSED" });
    }
    t
}

/// The same figures as JSON.
pub(crate) fn json(points: &[GroupPoint], raw: &[Point]) -> Value {
    json!({
        "points": points.iter().map(|p| json!({
            "groupCommit": if p.on { "on" } else { "off" }, "concurrency": p.point.concurrency,
            "perSecond": p.point.per_second, "overRawCommit": ratio(p.point.per_second, raw_at(raw, p.point.concurrency)),
            "errors": p.point.errors, "p50Ms": p.point.latency.p50, "p99Ms": p.point.latency.p99,
            "batches": p.batches, "batchSizeMean": p.batch_mean, "batchSizeP99": p.batch_p99,
            "setWritten": p.set_written, "setFellBack": p.set_fell_back})).collect::<Vec<_>>(),
        "targets": targets(points, raw).into_iter().map(|(name, value, target, met)| json!({
            "name": name, "value": value, "target": target, "met": met})).collect::<Vec<_>>(),
    })
}
