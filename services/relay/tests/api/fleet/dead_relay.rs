//! A relay fleet that loses relays to SIGKILL: every relay reports the dead one's shards unowned
//! (their control partitions get no ticks), a live relay takes them within the session timeout,
//! the margin of a stranded partition and a bound (by the group's own rebalance, or by its rejoin
//! when Tansu 0.6 keeps the group formed with a dead member's shards: docs/design/tansu.md, "Dead
//! group members"), and every shard's events keep reaching the topic in each order's order.
//! Relay processes over four shards, four databases on one PostgreSQL server (the liveness watch
//! does not depend on the database).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::kit::{self, Fleet, Relay, Shards, every_event_in_its_orders_order};
use crate::helpers::{TestOrder, assert_eventually, order};
use idempost_testkit::order::amend;
use idempost_testkit::wait::WAIT;

/// Shards `s0` .. `s3`, numbers 0 .. 3; tenant `10 + n` is on shard `sn`.
const SHARDS: usize = 4;

/// The fleet's session timeout (`services/relay/src/fleet/ownership.rs`) and the margin of a
/// stranded partition (`idempost::kafka::STRANDED_MARGIN`): the survivor rejoins once a dead
/// relay's partitions stood still this long.
const STRANDED_AFTER: Duration = Duration::from_secs(20);

/// What the survivor may take beyond that: its last look (every 2 s), the rejoin, the group's
/// new assignment and the shards' start, on two shared cores.
const TAKEOVER_BOUND: Duration = Duration::from_secs(20);

/// Four shard databases, the order service over them, and a fleet's topics and group.
struct Run {
    shards: Shards,
    fleet: Fleet,
    app: Arc<TestOrder>,
}

impl Run {
    async fn start() -> Self {
        let shards = Shards::new(SHARDS, SHARDS).await;
        let fleet = Fleet::new(SHARDS as u32).await;
        let app = shards.order_service().await;
        Self { shards, fleet, app }
    }

    /// Relay number `n`, its log kept.
    async fn relay(&self, n: usize) -> Relay {
        self.relay_with(n, &[], &[]).await
    }

    /// [`Run::relay`] with more flags and environment.
    async fn relay_with(&self, n: usize, more: &[&str], env: &[(&str, String)]) -> Relay {
        let log = self.shards.dir.path().join(format!("relay-{n}.log"));
        self.fleet.relay_logged(&self.shards.map(), more, env, log).await
    }

    /// A writer per shard's tenant, until the flag they share turns false.
    fn write(&self) -> (Arc<AtomicBool>, Vec<tokio::task::JoinHandle<()>>) {
        let writing = Arc::new(AtomicBool::new(true));
        let writers = (0..SHARDS)
            .map(|n| tokio::spawn(write_orders(Arc::clone(&self.app), 10 + n as i64, Arc::clone(&writing))))
            .collect();
        (writing, writers)
    }

    async fn published(&self) -> Vec<i64> {
        futures::future::join_all((0..SHARDS).map(|n| self.shards.published(n))).await
    }

    /// Waits until every shard publishes events written from now on, stops the writers, and
    /// checks that every event of every shard ends PUBLISHED and on the topic, each order's
    /// versions in order.
    async fn every_event_published_in_order(
        &self,
        writing: &AtomicBool,
        writers: Vec<tokio::task::JoinHandle<()>>,
    ) {
        let before = self.published().await;
        assert_eventually("every shard publishes events written after the takeover", WAIT, || async {
            self.published().await.iter().zip(&before).all(|(now, before)| now > before)
        })
        .await;
        writing.store(false, Ordering::Relaxed);
        for writer in writers {
            writer.await.unwrap();
        }
        let mut total = 0;
        for n in 0..SHARDS {
            let rows = self.shards.events(n).await;
            assert_eventually("every event of the shard ends PUBLISHED", WAIT, || async {
                self.shards.published(n).await == rows
            })
            .await;
            total += rows;
        }
        every_event_in_its_orders_order(&self.fleet, usize::try_from(total).unwrap()).await;
    }
}

/// Scrapes `relay` until it owns every shard, within `bound` of `since`; answers how long it
/// took and the shards it reported unowned meanwhile.
async fn takes_every_shard(relay: &Relay, since: Instant, bound: Duration) -> (Duration, BTreeSet<String>) {
    let mut seen_unowned = BTreeSet::new();
    loop {
        let text = kit::scrape(relay.metrics).await;
        seen_unowned.extend(kit::gauge_of_shards(&text, "idempost_relay_shard_unowned", 1.0));
        let owned = kit::gauge_of_shards(&text, "idempost_relay_shard_owned", 1.0);
        if owned.len() == SHARDS {
            return (since.elapsed(), seen_unowned);
        }
        assert!(
            since.elapsed() < bound,
            "the relay did not own all four shards within {bound:?}; it owns {owned:?}; its log:\n{}",
            relay.process.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_killed_relays_shards_are_reported_unowned_then_taken_by_the_survivor_and_keep_flowing() {
    let run = Run::start().await;
    let (mut a, b) = tokio::join!(run.relay(0), run.relay(1));
    let shared = |split: &[BTreeSet<String>; 2]| {
        split[0].len() + split[1].len() == SHARDS
            && split[0].is_disjoint(&split[1])
            && split.iter().all(|shards| !shards.is_empty())
    };
    assert_eventually("the two relays own the four shards between them, each some", WAIT, || async {
        shared(&[a.owned().await, b.owned().await])
    })
    .await;
    let split = [a.owned().await, b.owned().await];
    assert!(shared(&split), "{split:?}");
    let (writing, writers) = run.write();
    assert_eventually("every shard's events are published", WAIT, || async {
        run.published().await.iter().all(|p| *p > 0)
    })
    .await;

    a.process.kill().await;
    let (taken, seen_unowned) = takes_every_shard(&b, Instant::now(), STRANDED_AFTER + TAKEOVER_BOUND).await;
    let rejoined = b.process.log().contains("stranded on a member that is gone");
    eprintln!(
        "the survivor owned every shard {taken:?} after the kill (rejoined: {rejoined}); seen unowned: {seen_unowned:?}"
    );
    assert!(
        split[0].is_subset(&seen_unowned),
        "the dead relay's shards {:?} were reported unowned meanwhile (seen: {seen_unowned:?})",
        split[0]
    );
    run.every_event_published_in_order(&writing, writers).await;
    b.stop().await;
}

/// The sequence that strands a consumer's partitions on Tansu 0.6 (docs/design/tansu.md, "Dead
/// group members", a crash while rejoining): the only relay dies, a second joins and dies while
/// the group waits for the first to expire, and a third starts. Should the third be handed a
/// group still assigning shards to the dead second, its rejoin moves them after the session
/// timeout and the margin; every shard is reported unowned meanwhile, and all keep flowing.
#[tokio::test]
async fn a_relay_killed_while_joining_a_group_that_waits_on_a_dead_one_leaves_every_shard_to_the_next() {
    let run = Run::start().await;
    let mut first = run.relay(0).await;
    assert_eventually("the first relay owns every shard", WAIT, || async {
        first.owned().await.len() == SHARDS
    })
    .await;
    let (writing, writers) = run.write();
    assert_eventually("every shard's events are published", WAIT, || async {
        run.published().await.iter().all(|p| *p > 0)
    })
    .await;
    first.process.kill().await;
    // librdkafka's group debug log says when the coordinator answered the second's JoinGroup:
    // the broker's own group listing is not served by Tansu 0.6.
    let debug = [("RUST_LOG", "info,librdkafka=debug".to_owned())];
    let mut second = run.relay_with(1, &["--kafka-option=debug=cgrp"], &debug).await;
    assert_eventually("the second relay is a member of the group beside the dead first", WAIT, || async {
        second.process.log().contains("JoinGroup response")
    })
    .await;
    second.process.kill().await;
    let third = run.relay(2).await;
    let started = Instant::now();
    // The first expires within the session timeout; the second, once listed in the group the
    // third leads, within another; then the stretch before a rejoin.
    let bound = STRANDED_AFTER + Duration::from_secs(20) + TAKEOVER_BOUND;
    let (taken, seen_unowned) = takes_every_shard(&third, started, bound).await;
    let rejoined = third.process.log().contains("stranded on a member that is gone");
    eprintln!(
        "the third relay owned every shard {taken:?} after its start (rejoined: {rejoined}); seen unowned: {seen_unowned:?}"
    );
    assert_eq!(seen_unowned.len(), SHARDS, "every shard was reported unowned meanwhile");
    run.every_event_published_in_order(&writing, writers).await;
    third.stop().await;
}

/// Orders of `tenant`, each amended twice (three versions), until `writing` turns false.
async fn write_orders(app: Arc<TestOrder>, tenant: i64, writing: Arc<AtomicBool>) {
    let mut n = 0;
    while writing.load(Ordering::Relaxed) {
        n += 1;
        let placed = app.submit(order(tenant, &format!("t{tenant}-{n}"))).await.unwrap();
        for version in 1..3 {
            let mut change = amend(&format!("t{tenant}-{n}-v{version}"), placed.order_id, version, 3);
            change.tenant_id = tenant;
            app.amend(change).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
