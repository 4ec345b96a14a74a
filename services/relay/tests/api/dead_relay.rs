//! A relay fleet that loses relays to SIGKILL: every relay reports the dead one's shards unowned
//! (their control partitions get no ticks), a live relay takes them within the session timeout,
//! the margin of a stranded partition and a bound (by the group's own rebalance, or by its rejoin
//! when Tansu 0.6 keeps the group formed with a dead member's shards: docs/design/tansu.md, "Dead
//! group members"), and every shard's events keep reaching the topic in each order's order.
//! Relay processes over four shards, four databases on one PostgreSQL server (the liveness watch
//! does not depend on the database).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sea_orm::DatabaseConnection;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::broker::{TestBroker, read_topic};
use crate::helpers::{Backend, TestOrder, TestService, assert_eventually, order, service_binary};
use idempost_testkit::db::TestDb;
use idempost_testkit::order::amend;
use idempost_testkit::wait::WAIT;

/// Shards `s0` .. `s3`, numbers 0 .. 3; tenant `10 + n` is on shard `sn`.
const SHARDS: i32 = 4;

/// The fleet's session timeout (`services/relay/src/fleet/ownership.rs`) and the margin of a
/// stranded partition (`idempost::kafka::STRANDED_MARGIN`): the survivor rejoins once a dead
/// relay's partitions stood still this long.
const STRANDED_AFTER: Duration = Duration::from_secs(20);

/// What the survivor may take beyond that: its last look (every 2 s), the rejoin, the group's
/// new assignment and the shards' start, on two shared cores.
const TAKEOVER_BOUND: Duration = Duration::from_secs(20);

/// Four shard databases, the order service over them, a broker with the events' topic and the
/// control topic, and the flags of a fleet relay.
struct Fleet {
    app: Arc<TestOrder>,
    conns: Vec<DatabaseConnection>,
    broker: TestBroker,
    topic: String,
    args: Vec<String>,
    dir: tempfile::TempDir,
}

impl Fleet {
    async fn start() -> Self {
        let mut dbs = Vec::new();
        for _ in 0..SHARDS {
            dbs.push(TestDb::empty(Backend::Postgres).await);
        }
        let dir = tempfile::tempdir().unwrap();
        let map = write_map(dir.path(), &dbs);
        migrate(&map);
        let conns = futures::future::join_all(dbs.iter().map(TestDb::connect)).await;
        let first = dbs.remove(0);
        let app = Arc::new(TestOrder::spawn_on(first, |s| s.shard_map_file = Some(map.clone())).await);
        let broker = TestBroker::start().await;
        let topic = idempost_testkit::topic::unique("idempost-fleet");
        let control = format!("{topic}-control");
        broker.create_topic(&topic, 4).await;
        broker.create_topic(&control, SHARDS as u32).await;
        let args = vec![
            format!("--shard-map-file={}", map.display()),
            format!("--control-topic={control}"),
            format!("--fleet-group={topic}-fleet"),
            format!("--brokers={}", broker.address()),
            format!("--topic={topic}"),
            "--listen=127.0.0.1:0".to_owned(),
            "--metrics-listen=127.0.0.1:0".to_owned(),
            "--max-idle-poll=100ms".to_owned(),
        ];
        Self { app, conns, broker, topic, args, dir }
    }

    /// Relay number `n`, listening, its log kept; and its metrics address.
    async fn relay(&self, n: usize) -> (TestService, SocketAddr) {
        self.relay_with(n, &[], &[]).await
    }

    /// [`Fleet::relay`] with more flags and environment.
    async fn relay_with(&self, n: usize, more: &[&str], env: &[(&str, String)]) -> (TestService, SocketAddr) {
        let log = self.dir.path().join(format!("relay-{n}.log"));
        let args: Vec<String> =
            self.args.iter().cloned().chain(more.iter().map(|a| (*a).to_owned())).collect();
        let (relay, bound) = TestService::spawn_listening_logged("idempost-relay", &args, env, log).await;
        (relay, bound.addr("metrics-listen").unwrap())
    }

    /// A writer per shard's tenant, until the flag they share turns false.
    fn write(&self) -> (Arc<AtomicBool>, Vec<tokio::task::JoinHandle<()>>) {
        let writing = Arc::new(AtomicBool::new(true));
        let writers = (0..SHARDS)
            .map(|n| {
                tokio::spawn(write_orders(Arc::clone(&self.app), 10 + i64::from(n), Arc::clone(&writing)))
            })
            .collect();
        (writing, writers)
    }

    async fn published(&self) -> Vec<i64> {
        futures::future::join_all(self.conns.iter().map(published)).await
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
        for conn in &self.conns {
            let rows = idempost_testkit::sql::count(conn, "SELECT COUNT(*) FROM outbox_event", vec![]).await;
            assert_eventually("every event of the shard ends PUBLISHED", WAIT, || async {
                published(conn).await == rows
            })
            .await;
            total += rows;
        }
        let total = usize::try_from(total).unwrap();
        let records =
            read_topic(&self.broker.address(), &self.topic, total, WAIT, Duration::from_secs(1)).await;
        let distinct: BTreeSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
        assert_eq!(distinct.len(), total, "every event reached the topic");
        let mut by_offset = records.clone();
        by_offset.sort_by_key(|r| (r.partition, r.offset));
        let mut versions: HashMap<Vec<u8>, Vec<i64>> = HashMap::new();
        for record in &by_offset {
            versions
                .entry(record.key.clone())
                .or_default()
                .push(record.header("event_version").parse().unwrap());
        }
        for (key, seen) in &versions {
            assert!(
                seen.is_sorted(),
                "order {} reached the topic out of order: {seen:?}",
                String::from_utf8_lossy(key)
            );
        }
    }
}

/// Scrapes `relay` until it owns every shard, within `bound` of `since`; answers how long it
/// took and the shards it reported unowned meanwhile.
async fn takes_every_shard(
    relay: &TestService,
    metrics: SocketAddr,
    since: Instant,
    bound: Duration,
) -> (Duration, BTreeSet<String>) {
    let mut seen_unowned = BTreeSet::new();
    loop {
        let text = scrape(metrics).await;
        seen_unowned.extend(shards_at(&text, "idempost_relay_shard_unowned", 1.0));
        if shards_at(&text, "idempost_relay_shard_owned", 1.0).len() == SHARDS as usize {
            return (since.elapsed(), seen_unowned);
        }
        assert!(
            since.elapsed() < bound,
            "the relay did not own all four shards within {bound:?}; it owns {:?}; its log:\n{}",
            shards_at(&text, "idempost_relay_shard_owned", 1.0),
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_killed_relays_shards_are_reported_unowned_then_taken_by_the_survivor_and_keep_flowing() {
    let fleet = Fleet::start().await;
    let (mut a, mut b) = tokio::join!(fleet.relay(0), fleet.relay(1));
    let shared = |split: &[BTreeSet<String>; 2]| {
        split[0].len() + split[1].len() == SHARDS as usize
            && split[0].is_disjoint(&split[1])
            && split.iter().all(|shards| !shards.is_empty())
    };
    assert_eventually("the two relays own the four shards between them, each some", WAIT, || async {
        shared(&[owned(a.1).await, owned(b.1).await])
    })
    .await;
    let split = [owned(a.1).await, owned(b.1).await];
    assert!(shared(&split), "{split:?}");
    let (writing, writers) = fleet.write();
    assert_eventually("every shard's events are published", WAIT, || async {
        fleet.published().await.iter().all(|p| *p > 0)
    })
    .await;

    a.0.kill().await;
    let (taken, seen_unowned) =
        takes_every_shard(&b.0, b.1, Instant::now(), STRANDED_AFTER + TAKEOVER_BOUND).await;
    let rejoined = b.0.log().contains("stranded on a member that is gone");
    eprintln!(
        "the survivor owned every shard {taken:?} after the kill (rejoined: {rejoined}); seen unowned: {seen_unowned:?}"
    );
    assert!(
        split[0].is_subset(&seen_unowned),
        "the dead relay's shards {:?} were reported unowned meanwhile (seen: {seen_unowned:?})",
        split[0]
    );
    fleet.every_event_published_in_order(&writing, writers).await;
    b.0.signal("TERM").await;
    b.0.wait(Duration::from_secs(30)).await;
}

/// The sequence that strands a consumer's partitions on Tansu 0.6 (docs/design/tansu.md, "Dead
/// group members", a crash while rejoining): the only relay dies, a second joins and dies while
/// the group waits for the first to expire, and a third starts. Should the third be handed a
/// group still assigning shards to the dead second, its rejoin moves them after the session
/// timeout and the margin; every shard is reported unowned meanwhile, and all keep flowing.
#[tokio::test]
async fn a_relay_killed_while_joining_a_group_that_waits_on_a_dead_one_leaves_every_shard_to_the_next() {
    let fleet = Fleet::start().await;
    let mut first = fleet.relay(0).await;
    assert_eventually("the first relay owns every shard", WAIT, || async {
        owned(first.1).await.len() == SHARDS as usize
    })
    .await;
    let (writing, writers) = fleet.write();
    assert_eventually("every shard's events are published", WAIT, || async {
        fleet.published().await.iter().all(|p| *p > 0)
    })
    .await;
    first.0.kill().await;
    // librdkafka's group debug log says when the coordinator answered the second's JoinGroup:
    // the broker's own group listing is not served by Tansu 0.6.
    let debug = [("RUST_LOG", "info,librdkafka=debug".to_owned())];
    let mut second = fleet.relay_with(1, &["--kafka-option=debug=cgrp"], &debug).await;
    assert_eventually("the second relay is a member of the group beside the dead first", WAIT, || async {
        second.0.log().contains("JoinGroup response")
    })
    .await;
    second.0.kill().await;
    let third = fleet.relay(2).await;
    let started = Instant::now();
    // The first expires within the session timeout; the second, once listed in the group the
    // third leads, within another; then the stretch before a rejoin.
    let bound = STRANDED_AFTER + Duration::from_secs(20) + TAKEOVER_BOUND;
    let (taken, seen_unowned) = takes_every_shard(&third.0, third.1, started, bound).await;
    let rejoined = third.0.log().contains("stranded on a member that is gone");
    eprintln!(
        "the third relay owned every shard {taken:?} after its start (rejoined: {rejoined}); seen unowned: {seen_unowned:?}"
    );
    assert_eq!(seen_unowned.len(), SHARDS as usize, "every shard was reported unowned meanwhile");
    fleet.every_event_published_in_order(&writing, writers).await;
    drop(third);
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

fn write_map(dir: &Path, dbs: &[TestDb]) -> PathBuf {
    let shards: Vec<String> = dbs
        .iter()
        .enumerate()
        .map(|(n, db)| {
            let tenants = if n == 0 { String::new() } else { format!(r#", "tenants": [{}]"#, 10 + n) };
            format!(r#"{{"name": "s{n}", "number": {n}, "database_url": {:?}{tenants}}}"#, db.url)
        })
        .collect();
    let path = dir.join("map.json");
    std::fs::write(&path, format!(r#"{{"default": "s0", "shards": [{}]}}"#, shards.join(", "))).unwrap();
    path
}

/// `idempost-migrate --shard-map-file <map> up`, which must succeed.
fn migrate(map: &Path) {
    let output = std::process::Command::new(service_binary("idempost-migrate"))
        .arg("--shard-map-file")
        .arg(map)
        .arg("up")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

async fn published(conn: &DatabaseConnection) -> i64 {
    idempost_testkit::sql::count(conn, "SELECT COUNT(*) FROM outbox_event WHERE status = 'PUBLISHED'", vec![])
        .await
}

/// The shards whose `name` gauge reads `value` in a scrape.
fn shards_at(text: &str, name: &str, value: f64) -> BTreeSet<String> {
    let mut shards = BTreeMap::new();
    for line in text.lines().filter(|line| line.starts_with(&format!("{name}{{"))) {
        let Some((series, sample)) = line.rsplit_once(' ') else { continue };
        let Some(shard) = series.split("idempost_shard=\"").nth(1).and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        shards.insert(shard.to_owned(), sample.parse::<f64>().unwrap_or(f64::NAN));
    }
    shards.into_iter().filter(|(_, v)| *v == value).map(|(shard, _)| shard).collect()
}

async fn owned(metrics: SocketAddr) -> BTreeSet<String> {
    shards_at(&scrape(metrics).await, "idempost_relay_shard_owned", 1.0)
}

/// `GET /metrics` on a fresh connection (the listener answers one request, then closes); "" when
/// the relay does not answer.
async fn scrape(addr: SocketAddr) -> String {
    let Ok(mut stream) = TcpStream::connect(addr).await else { return String::new() };
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
}
