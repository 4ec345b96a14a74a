//! One relay fleet over every shard of a shard map (`--shard-map-file`): relays join a group on
//! the control topic and each serves the shards whose partitions it is assigned. Real relay
//! processes and a real broker (Tansu 0.6), a fresh PostgreSQL database per shard, a fresh topic,
//! control topic and group per test.

mod cleanup;
mod dead_relay;
mod kit;
mod redrive;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::helpers::{TestOrder, TestService, assert_eventually, order};
use idempost_testkit::order::amend;
use idempost_testkit::wait::WAIT;
use kit::{Fleet, Relay, Shards, every_event_in_its_orders_order, names};

/// Whether `relays` own every shard of `all` between them, each shard once.
async fn each_owned_once(relays: &[&Relay], all: &BTreeSet<String>) -> bool {
    let owned = futures::future::join_all(relays.iter().map(|r| r.owned())).await;
    let total: usize = owned.iter().map(BTreeSet::len).sum();
    let union: BTreeSet<String> = owned.into_iter().flatten().collect();
    total == all.len() && union == *all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_over_four_shards_serve_each_shard_from_one_relay_and_publish_every_event_in_order() {
    let shards = Shards::new(4, 4).await;
    let fleet = Fleet::new(4).await;
    let map = shards.map();
    let log = |n: usize| shards.dir.path().join(format!("relay-{n}.log"));
    let (a, b) =
        tokio::join!(fleet.relay_logged(&map, &[], &[], log(0)), fleet.relay_logged(&map, &[], &[], log(1)));
    let all = names(0..4);
    assert_eventually("the two relays own two shards each, each shard once", WAIT, || async {
        each_owned_once(&[&a, &b], &all).await && a.owned().await.len() == 2
    })
    .await;
    let (on_a, on_b) = (a.owned().await, b.owned().await);

    let app = shards.order_service().await;
    let writers = (0..4).map(|n| write_orders(Arc::clone(&app), 10 + n, 10));
    futures::future::join_all(writers).await;
    let mut total = 0;
    for n in 0..4 {
        assert_eventually("every event of the shard is published", WAIT, || async {
            shards.published(n).await == 30
        })
        .await;
        total += 30;
    }
    // Writing moves nothing, but the broker may: a suite run saw one relay's share taken away
    // (it served nothing for a moment) while all 120 events were published. What is promised is
    // that the fleet comes back to every shard owned once, and every event delivered in order.
    assert_eventually("every shard is still owned by one relay", WAIT, || async {
        each_owned_once(&[&a, &b], &all).await
    })
    .await;
    let (now_a, now_b) = (a.owned().await, b.owned().await);
    if (&now_a, &now_b) != (&on_a, &on_b) {
        eprintln!(
            "ownership moved: {on_a:?} {on_b:?} became {now_a:?} {now_b:?}; logs:\n{}\n{}",
            a.process.log(),
            b.process.log()
        );
    }

    every_event_in_its_orders_order(&fleet, total).await;
    tokio::join!(a.stop(), b.stop());
    Arc::into_inner(app).unwrap().stop().await;
}

/// `count` orders of `tenant`, each amended twice (three versions each).
async fn write_orders(app: Arc<TestOrder>, tenant: i64, count: usize) {
    for n in 0..count {
        let placed = app.submit(order(tenant, &format!("t{tenant}-{n}"))).await.unwrap();
        for version in 1..3 {
            let mut change = amend(&format!("t{tenant}-{n}-v{version}"), placed.order_id, version, 3);
            change.tenant_id = tenant;
            app.amend(change).await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_stopped_with_sigterm_leaves_the_group_and_the_other_takes_its_shards() {
    let shards = Shards::new(4, 4).await;
    let fleet = Fleet::new(4).await;
    let map = shards.map();
    let (a, b) = tokio::join!(fleet.relay(&map, &[]), fleet.relay(&map, &[]));
    let all = names(0..4);
    assert_eventually("the two relays own two shards each, each shard once", WAIT, || async {
        each_owned_once(&[&a, &b], &all).await && a.owned().await.len() == 2
    })
    .await;

    // Orders keep coming while the first relay drains, leaves the group and its shards move.
    let app = shards.order_service().await;
    let writers = futures::future::join_all((0..4).map(|n| write_orders(Arc::clone(&app), 10 + n, 10)));
    tokio::join!(writers, a.stop());
    assert_eventually("the other relay owns every shard", WAIT, || async { b.owned().await == all }).await;
    for n in 0..4 {
        assert_eventually("the shard's events are all published", WAIT, || async {
            shards.published(n).await == 30
        })
        .await;
    }
    every_event_in_its_orders_order(&fleet, 120).await;
    b.stop().await;
    Arc::into_inner(app).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shard_added_to_the_map_on_sighup_is_served_and_a_removed_one_is_stopped() {
    let shards = Shards::new(3, 2).await;
    let fleet = Fleet::new(4).await;
    let relay = fleet.relay(&shards.map(), &[]).await;
    assert_eventually("the relay owns the map's two shards", WAIT, || async {
        relay.owned().await == names([0, 1])
    })
    .await;
    shards.seed(2, 10).await;

    shards.write_map(&[0, 1, 2]);
    relay.process.signal("HUP").await;
    assert_eventually("the added shard is owned", WAIT, || async { relay.owned().await == names([0, 1, 2]) })
        .await;
    assert_eventually("the added shard's events are published", WAIT, || async {
        shards.published(2).await == 10
    })
    .await;

    shards.write_map(&[0, 2]);
    relay.process.signal("HUP").await;
    assert_eventually("the removed shard is no longer owned", WAIT, || async {
        relay.owned().await == names([0, 2])
    })
    .await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_to_a_shard_number_the_control_topic_has_no_partition_for_keeps_the_running_map() {
    let shards = Shards::new(2, 1).await;
    let fleet = Fleet::new(4).await;
    let relay = fleet.relay_logged(&shards.map(), &[], &[], shards.dir.path().join("relay.log")).await;
    assert_eventually("the relay owns shard s0", WAIT, || async { relay.owned().await == names([0]) }).await;

    let text = format!(
        r#"{{"default": "s0", "shards": [{{"name": "s0", "number": 0, "database_url": {:?}}},
            {{"name": "s7", "number": 7, "database_url": {:?}}}]}}"#,
        shards.dbs[0].url, shards.dbs[1].url
    );
    std::fs::write(shards.map(), text).unwrap();
    relay.process.signal("HUP").await;
    assert_eventually("the reload is refused, naming the shard", WAIT, || async {
        let log = relay.process.log();
        log.contains("the shard map was not reloaded") && log.contains("has number 7")
    })
    .await;
    assert_eq!(relay.owned().await, names([0]), "the running map stays");
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_joining_relay_takes_one_shard_from_the_end_of_the_ranges_and_the_others_keep_theirs() {
    let shards = Shards::new(4, 4).await;
    let fleet = Fleet::new(4).await;
    let map = shards.map();
    let all = names(0..4);
    let a = fleet.relay(&map, &[]).await;
    assert_eventually("the first relay owns every shard", WAIT, || async { a.owned().await == all }).await;
    let b = fleet.relay(&map, &[]).await;
    assert_eventually("the second relay takes half", WAIT, || async {
        each_owned_once(&[&a, &b], &all).await && b.owned().await.len() == 2
    })
    .await;
    let (on_a, on_b) = (a.owned().await, b.owned().await);

    let c = fleet.relay(&map, &[]).await;
    // The first settled split after the join is judged, as it was read.
    let settled = std::sync::Mutex::new(None);
    assert_eventually("the third relay takes one shard", WAIT, || async {
        let (now_a, now_b, now_c) = (a.owned().await, b.owned().await, c.owned().await);
        let union: BTreeSet<String> = now_a.union(&now_b).chain(&now_c).cloned().collect();
        let done = now_a.len() + now_b.len() + now_c.len() == 4 && now_c.len() == 1 && union == all;
        if done {
            *settled.lock().unwrap() = Some((now_a, now_b, now_c));
        }
        done
    })
    .await;
    let (now_a, now_b, now_c) = settled.into_inner().unwrap().unwrap();
    // The range assignor orders the members by when they joined, so the newcomer takes from the
    // end of the ranges and the two others keep the rest of theirs (docs/design/tansu.md, "The
    // relay fleet's assignor").
    let moved = all
        .iter()
        .filter(|s| on_a.contains(*s) != now_a.contains(*s) || on_b.contains(*s) != now_b.contains(*s));
    let moved = moved.count();
    assert!(
        moved == 1 && now_a.is_subset(&on_a) && now_b.is_subset(&on_b),
        "{moved} shards moved: {on_a:?} {on_b:?} became {now_a:?} {now_b:?} {now_c:?}"
    );
    tokio::join!(a.stop(), b.stop(), c.stop());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wake_up_wakes_the_relay_of_every_owned_shard() {
    let shards = Shards::new(2, 2).await;
    let fleet = Fleet::new(2).await;
    let extra = ["--workers=1", "--max-idle-poll=10min", "--wake-listen=127.0.0.1:0"];
    let relay = fleet.relay(&shards.map(), &extra).await;
    // A wake-up reaches the relays of the shards running when it arrives (a shard still
    // opening its pool polls once it has): wait until both run.
    assert_eventually("the relay serves both shards", WAIT, || async {
        relay.serving().await == names([0, 1])
    })
    .await;
    assert!(relay.counter("idempost_relay_wakeups_total").await < 1.0);
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.send_to(idempost::contract::WAKE_DATAGRAM, relay.wake.unwrap()).unwrap();
    // One wake-up, one loop per shard: each shard's loop ends its idle wait once.
    assert_eventually("both shards' relays were woken", WAIT, || async {
        relay.counter("idempost_relay_wakeups_total").await >= 2.0
    })
    .await;
    relay.stop().await;
}

#[tokio::test]
async fn a_shard_number_without_a_control_partition_is_refused_at_start() {
    let shards = Shards::new(3, 3).await;
    let fleet = Fleet::new(2).await;
    let log = shards.dir.path().join("relay.log");
    let mut relay = TestService::spawn_logged("idempost-relay", &fleet.args(&shards.map(), &[]), &[], log);
    assert_eq!(relay.wait(Duration::from_secs(60)).await.code(), Some(1));
    let said = relay.log();
    assert!(
        said.contains(r#"shard \"s2\" has number 2 but the control topic"#)
            || said.contains(r#"shard "s2" has number 2 but the control topic"#),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_fails_while_a_served_shards_database_refuses_connections_and_recovers_after() {
    let shards = Shards::new(2, 2).await;
    let fleet = Fleet::new(2).await;
    let relay = fleet.relay(&shards.map(), &[]).await;
    assert_eventually("the relay serves both shards", WAIT, || async {
        relay.serving().await == names([0, 1])
    })
    .await;
    assert_eventually("health is SERVING", WAIT, || async { relay.serving_health().await == Some(true) })
        .await;

    let database = shards.dbs[1].url.rsplit('/').next().unwrap().to_owned();
    let server = idempost::db::connect("postgres://postgres@127.0.0.1:5432/postgres", 1).await.unwrap();
    let run = |sql: String| {
        let server = server.clone();
        async move { sea_orm::ConnectionTrait::execute_unprepared(&server, &sql).await.unwrap() }
    };
    run(format!("ALTER DATABASE {database} ALLOW_CONNECTIONS false")).await;
    run(format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{database}'")).await;
    assert_eventually("health is NOT_SERVING while shard s1 cannot claim", WAIT, || async {
        relay.serving_health().await == Some(false)
    })
    .await;
    run(format!("ALTER DATABASE {database} ALLOW_CONNECTIONS true")).await;
    assert_eventually("health is SERVING again", WAIT, || async {
        relay.serving_health().await == Some(true)
    })
    .await;
    relay.stop().await;
}

/// A shard with a deep backlog cannot starve another: the shards' batches take turns at the
/// relay's one producer, so an event written to a quiet shard is published while the busy
/// shard's backlog still waits, not after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quiet_shards_event_is_published_while_a_busy_shards_backlog_still_waits() {
    const BACKLOG: i64 = 20_000;
    let shards = Shards::new(2, 2).await;
    let fleet = Fleet::new(2).await;
    shards.seed(0, BACKLOG as usize).await;
    let relay = fleet.relay(&shards.map(), &[]).await;
    assert_eventually("the relay serves both shards", WAIT, || async {
        relay.serving().await == names([0, 1])
    })
    .await;
    assert_eventually("the busy shard's backlog is being published", WAIT, || async {
        shards.published(0).await > 0
    })
    .await;
    shards.seed(1, 1).await;
    assert_eventually("the quiet shard's event is published", WAIT, || async {
        shards.published(1).await == 1
    })
    .await;
    let waiting = BACKLOG - shards.published(0).await;
    eprintln!(
        "the quiet shard's event was published with {waiting} of the busy shard's {BACKLOG} still waiting"
    );
    assert!(waiting > 0, "the quiet shard's event waited for the busy shard's whole backlog");
    relay.stop().await;
}
