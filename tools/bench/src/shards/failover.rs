//! Two relays of one fleet over [`FAILOVER_SHARDS`] shards, one SIGKILLed: how long until the
//! survivor owns every shard, and until the killed relay's shards publish again. Every shard
//! receives a trickle of events meanwhile, so that "publish again" has something to publish.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait as _, DatabaseConnection};
use tokio::sync::watch;

use super::drain::fleet_args;
use super::owned::{self, Owned};
use super::set::{self, ShardSet};
use super::{FAILOVER_SHARDS, FLEET_LOG, Failover, step};
use crate::child::Service;
use crate::error::BenchError;
use crate::plan::Plan;
use crate::sql;

/// How long the two relays may take to split the shards between them.
const SPLIT_LIMIT: Duration = Duration::from_secs(60);

/// How long the survivor may take to own every shard and to publish the killed one's events:
/// several of the fleet's 10 s session timeouts.
const LIMIT: Duration = Duration::from_secs(120);

/// Every shard gets one event each this often.
const TRICKLE_EVERY: Duration = Duration::from_millis(100);

/// Runs the failover on fresh shards.
pub(super) async fn run(plan: &Plan) -> Result<Failover, BenchError> {
    step(&format!("failover: two relays over {FAILOVER_SHARDS} shards, one SIGKILLed"));
    let set = ShardSet::create(plan, FAILOVER_SHARDS, "shards-failover").await?;
    let outcome = failover(plan, &set).await;
    set.remove().await;
    outcome
}

async fn failover(plan: &Plan, set: &ShardSet) -> Result<Failover, BenchError> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("idempost-bench-shards-failover-{id}");
    idempost_verify::create_topic(&plan.brokers, &topic, plan.partitions).await.map_err(BenchError::Stuck)?;
    let mut args = vec![
        format!("--brokers={}", plan.brokers),
        format!("--topic={topic}"),
        "--listen=127.0.0.1:0".to_owned(),
    ];
    args.extend(fleet_args(plan, set, &format!("failover-{id}")).await?);
    args.extend(plan.relay_args.iter().cloned());
    let (stop, stopped) = watch::channel(false);
    let trickle = tokio::spawn(trickle(set.dbs.clone(), stopped));
    let mut relays = Vec::new();
    for n in 1..=2 {
        let label = format!("shards-failover-{n}");
        relays.push(Service::start_with_env(
            &plan.bin_dir,
            "idempost-relay",
            &label,
            &args,
            &plan.out_dir,
            &FLEET_LOG,
        )?);
    }
    let logs = [1, 2].map(|n| plan.out_dir.join(format!("shards-failover-{n}.log")));
    let outcome = measure(set, relays, &logs).await;
    let _ = stop.send(true);
    let _ = trickle.await;
    outcome
}

/// Waits for the split, kills the second relay, and times the survivor.
async fn measure(
    set: &ShardSet,
    mut relays: Vec<Service>,
    logs: &[std::path::PathBuf; 2],
) -> Result<Failover, BenchError> {
    let before = split(&mut relays, logs).await?;
    let (survivor, victim) = (relays.remove(0), relays.remove(0));
    step(&format!("failover: relay 1 owns {:?}, relay 2 owns {:?}; SIGKILL relay 2", before.0, before.1));
    victim.kill().await;
    // Taken once the process is reaped: nothing it publishes counts as after.
    let (killed_at, killed) = (Utc::now(), Instant::now());
    let mut survivor = survivor;
    let (mut assigned_after, mut flowing_after) = (None, None);
    while killed.elapsed() < LIMIT && (assigned_after.is_none() || flowing_after.is_none()) {
        survivor.check_alive()?;
        if assigned_after.is_none()
            && let Some(Owned { at, shards }) = owned::latest(&logs[0])
            && at > killed_at
            && shards.len() == FAILOVER_SHARDS
        {
            assigned_after = Some((at - killed_at).num_microseconds().unwrap_or(0) as f64 / 1e6);
        }
        if flowing_after.is_none() && published_since(set, &before.1, killed_at).await? {
            flowing_after = Some(killed.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    survivor.stop().await;
    Ok(Failover { before, assigned_after, flowing_after, limit_seconds: LIMIT.as_secs_f64() })
}

/// Waits until each relay owns some shards and together they own all; their shards then.
async fn split(
    relays: &mut [Service],
    logs: &[std::path::PathBuf; 2],
) -> Result<(Vec<String>, Vec<String>), BenchError> {
    let deadline = Instant::now() + SPLIT_LIMIT;
    loop {
        let [first, second] =
            logs.each_ref().map(|log| owned::latest(log).map(|o| o.shards).unwrap_or_default());
        if !first.is_empty() && !second.is_empty() && first.len() + second.len() == FAILOVER_SHARDS {
            return Ok((first, second));
        }
        if Instant::now() > deadline {
            return Err(BenchError::Stuck(format!(
                "the two fleet relays did not split the {FAILOVER_SHARDS} shards within {SPLIT_LIMIT:?}: \
                 they own {first:?} and {second:?} (see shards-failover-*.log)"
            )));
        }
        for relay in relays.iter_mut() {
            relay.check_alive()?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether every shard of `names` has published an event after `since`.
async fn published_since(set: &ShardSet, names: &[String], since: DateTime<Utc>) -> Result<bool, BenchError> {
    for (n, db) in set.dbs.iter().enumerate() {
        if !names.contains(&set::name(n)) {
            continue;
        }
        let statement = sql::statement(
            db.get_database_backend(),
            "SELECT COUNT(*) FROM outbox_event WHERE status = 'PUBLISHED' AND published_at > ?",
            vec![since.into()],
        );
        let row = db.query_one_raw(statement).await?;
        if row.and_then(|r| r.try_get_by_index::<i64>(0).ok()).unwrap_or(0) == 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// One event per shard every [`TRICKLE_EVERY`], each shard's in its block, until `stopped`.
async fn trickle(dbs: Vec<DatabaseConnection>, mut stopped: watch::Receiver<bool>) {
    let mut ticks = tokio::time::interval(TRICKLE_EVERY);
    for k in 0i64.. {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        for (n, db) in dbs.iter().enumerate() {
            if let Err(e) = crate::raw::prefill_orders(db, 1, ShardSet::first_order_id(n) + k).await {
                println!("   failover trickle on shard {n}: {e}");
            }
        }
    }
}
