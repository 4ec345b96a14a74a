//! One relay draining a backlog split over shards, or the same backlog in one database.

use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait as _, Statement};

use super::set::ShardSet;
use super::{Drain, FLEET_LOG, step};
use crate::child::Service;
use crate::error::BenchError;
use crate::plan::Plan;
use crate::sql;

/// Drains `plan.backlog` events over `shards` fresh shard databases with one relay: given the
/// shard map when `with_map`, else the first database's URL (one shard: the reference).
pub(super) async fn run(plan: &Plan, shards: usize, with_map: bool) -> Result<Drain, BenchError> {
    let label = if with_map { format!("shards-x{shards}") } else { "shards-single".to_owned() };
    step(&format!("{label}: {shards} database(s), {} events in all", plan.backlog));
    let set = ShardSet::create(plan, shards, &label).await?;
    let outcome = drain(plan, &set, &label, with_map).await;
    set.remove().await;
    outcome
}

async fn drain(plan: &Plan, set: &ShardSet, label: &str, with_map: bool) -> Result<Drain, BenchError> {
    set.prefill(plan.backlog).await?;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("idempost-bench-{label}-{id}");
    idempost_verify::create_topic(&plan.brokers, &topic, plan.partitions).await.map_err(BenchError::Stuck)?;
    let mut args = vec![
        format!("--brokers={}", plan.brokers),
        format!("--topic={topic}"),
        "--listen=127.0.0.1:0".to_owned(),
    ];
    if with_map {
        args.extend(fleet_args(plan, set, &format!("{label}-{id}")).await?);
    } else {
        args.push(format!("--database-url={}", set.first_url()));
    }
    args.extend(plan.relay_args.iter().cloned());
    let mut relay =
        Service::start_with_env(&plan.bin_dir, "idempost-relay", label, &args, &plan.out_dir, &FLEET_LOG)?;
    let complete = wait_published(set, plan.backlog, &mut relay, plan.drain_limit).await?;
    let usage = relay.stop().await;
    let (events, per_second) = span_rate(set).await?;
    Ok(Drain {
        events,
        per_second,
        cpu_us_per_event: usage.cpu_seconds * 1e6 / events.max(1) as f64,
        complete,
    })
}

/// A fleet relay's flags over `set`: its map, a control topic of one partition per shard (made
/// here) and a group, both named after `name`.
pub(super) async fn fleet_args(plan: &Plan, set: &ShardSet, name: &str) -> Result<Vec<String>, BenchError> {
    let control = format!("idempost-bench-{name}-control");
    let partitions = i32::try_from(set.dbs.len()).unwrap_or(i32::MAX);
    idempost_verify::create_topic(&plan.brokers, &control, partitions).await.map_err(BenchError::Stuck)?;
    Ok(vec![
        format!("--shard-map-file={}", set.map.display()),
        format!("--control-topic={control}"),
        format!("--fleet-group=idempost-bench-{name}"),
    ])
}

/// Waits until `target` events are PUBLISHED over the shards, `limit` passes (false) or the
/// relay dies (an error).
async fn wait_published(
    set: &ShardSet,
    target: u64,
    relay: &mut Service,
    limit: Duration,
) -> Result<bool, BenchError> {
    let deadline = Instant::now() + limit;
    loop {
        if set.published().await? >= target {
            return Ok(true);
        }
        if Instant::now() > deadline {
            return Ok(false);
        }
        relay.check_alive()?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Events published over every shard and their rate from the first `published_at` to the last
/// (one server, one clock).
async fn span_rate(set: &ShardSet) -> Result<(u64, f64), BenchError> {
    let sql =
        "SELECT COUNT(*), MIN(published_at), MAX(published_at) FROM outbox_event WHERE status = 'PUBLISHED'";
    let (mut count, mut first, mut last) = (0u64, None, None);
    for db in &set.dbs {
        let Some(row) = db.query_one_raw(Statement::from_string(db.get_database_backend(), sql)).await?
        else {
            continue;
        };
        let n = u64::try_from(row.try_get_by_index::<i64>(0)?).unwrap_or(0);
        if n == 0 {
            continue;
        }
        count += n;
        let (from, to) = (sql::time_at(&row, 1)?, sql::time_at(&row, 2)?);
        first = Some(first.map_or(from, |f: chrono::DateTime<chrono::Utc>| f.min(from)));
        last = Some(last.map_or(to, |l: chrono::DateTime<chrono::Utc>| l.max(to)));
    }
    let span = match (first, last) {
        (Some(first), Some(last)) if count >= 2 => (last - first).to_std().unwrap_or_default(),
        _ => return Ok((count, 0.0)),
    };
    Ok((count, crate::measure::rate(count - 1, span)))
}
