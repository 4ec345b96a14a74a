//! What the fleet's tests share: shard databases and their map, relay processes over it, and
//! what their `/metrics` say they own.

use idempost_testkit::db::migrate_shards;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sea_orm::DatabaseConnection;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::broker::{TestBroker, read_topic};
use crate::helpers::{Backend, OutboxProbe, TestOrder, TestService};
use idempost_testkit::db::TestDb;
use idempost_testkit::wait::WAIT;

/// Shards `s<n>` of a test, each a fresh database, and the map naming them.
pub struct Shards {
    pub dbs: Vec<TestDb>,
    pub conns: Vec<DatabaseConnection>,
    pub dir: tempfile::TempDir,
}

impl Shards {
    /// `count` fresh databases on PostgreSQL, migrated as shards `s0`.. (numbers 0..), with a map
    /// naming the first `in_map` of them; tenant `10 + n` is on `s<n>`.
    pub async fn new(count: usize, in_map: usize) -> Self {
        let mut dbs = Vec::new();
        for _ in 0..count {
            dbs.push(TestDb::empty(Backend::Postgres).await);
        }
        let shards = Self { dbs, conns: Vec::new(), dir: tempfile::tempdir().unwrap() };
        let everything = shards.write_map(&(0..count).collect::<Vec<_>>());
        migrate_shards(&everything);
        let conns = futures::future::join_all(shards.dbs.iter().map(TestDb::connect)).await;
        let shards = Self { conns, ..shards };
        shards.write_map(&(0..in_map).collect::<Vec<_>>());
        shards
    }

    /// The map's path.
    pub fn map(&self) -> PathBuf {
        self.dir.path().join("map.json")
    }

    /// Writes a map of the shards numbered `numbers` (the first is the default) to [`Shards::map`].
    pub fn write_map(&self, numbers: &[usize]) -> PathBuf {
        let shards: Vec<String> = numbers
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let tenants = if i == 0 { String::new() } else { format!(r#", "tenants": [{}]"#, 10 + n) };
                let url = &self.dbs[*n].url;
                format!(r#"{{"name": "s{n}", "number": {n}, "database_url": {url:?}{tenants}}}"#)
            })
            .collect();
        let text = format!(r#"{{"default": "s{}", "shards": [{}]}}"#, numbers[0], shards.join(", "));
        let path = self.map();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Seeds `count` PENDING events on shard `n`.
    pub async fn seed(&self, n: usize, count: usize) -> Vec<String> {
        OutboxProbe { conn: &self.conns[n] }.seed(count).await
    }

    /// PUBLISHED events on shard `n`.
    pub async fn published(&self, n: usize) -> i64 {
        OutboxProbe { conn: &self.conns[n] }.count_with_status("PUBLISHED").await
    }

    /// Events of any status on shard `n`.
    pub async fn events(&self, n: usize) -> i64 {
        idempost_testkit::sql::count(&self.conns[n], "SELECT COUNT(*) FROM outbox_event", vec![]).await
    }

    /// The order service over the map, routing each tenant to its shard.
    pub async fn order_service(&self) -> Arc<TestOrder> {
        let db = TestDb::migrated_at(self.dbs[0].url.clone()).await;
        let map = self.map();
        let app = TestOrder::spawn_on(db, |s| {
            s.shard_map_file = Some(map);
            // A pool per shard: the tests share one PostgreSQL server's connections.
            s.db_max_connections = 3;
        })
        .await;
        Arc::new(app)
    }
}

/// A fleet's topic, control topic (`partitions` partitions) and group, fresh for a test.
pub struct Fleet {
    pub broker: TestBroker,
    pub topic: String,
    pub control: String,
    pub group: String,
}

impl Fleet {
    pub async fn new(partitions: u32) -> Self {
        let broker = TestBroker::start().await;
        let topic = idempost_testkit::topic::unique("idempost-fleet");
        let control = format!("{topic}-control");
        broker.create_topic(&topic, 4).await;
        broker.create_topic(&control, partitions).await;
        Self { broker, group: format!("{topic}-fleet"), topic, control }
    }

    /// A relay process of the fleet over `map`, with its metrics listener, and `extra` flags.
    pub fn args(&self, map: &Path, extra: &[&str]) -> Vec<String> {
        let mut args = vec![
            format!("--shard-map-file={}", map.display()),
            format!("--control-topic={}", self.control),
            format!("--fleet-group={}", self.group),
            format!("--brokers={}", self.broker.address()),
            format!("--topic={}", self.topic),
            "--listen=127.0.0.1:0".to_owned(),
            "--metrics-listen=127.0.0.1:0".to_owned(),
            "--max-idle-poll=100ms".to_owned(),
            // A pool per shard; the tests share one PostgreSQL server's connections.
            "--db-max-connections=2".to_owned(),
        ];
        // A flag in `extra` replaces the default above.
        let flag = |arg: &str| arg.split('=').next().unwrap_or_default().to_owned();
        args.retain(|arg| !extra.iter().any(|e| flag(e) == flag(arg)));
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    }

    /// Starts a relay of the fleet; answers it and its metrics address.
    pub async fn relay(&self, map: &Path, extra: &[&str]) -> Relay {
        let (process, bound) =
            TestService::spawn_listening("idempost-relay", &self.args(map, extra), &[]).await;
        Self::reached(process, &bound)
    }

    /// [`Fleet::relay`] with its logs in `log` ([`TestService::log`]) and `env` set.
    pub async fn relay_logged(
        &self,
        map: &Path,
        extra: &[&str],
        env: &[(&str, String)],
        log: PathBuf,
    ) -> Relay {
        let args = self.args(map, extra);
        let (process, bound) = TestService::spawn_listening_logged("idempost-relay", &args, env, log).await;
        Self::reached(process, &bound)
    }

    fn reached(process: TestService, bound: &idempost_testkit::ports::Bound) -> Relay {
        let metrics = bound.addr("metrics-listen").unwrap();
        Relay { process, metrics, wake: bound.addr("wake-listen"), health: bound.port("listen") }
    }
}

/// A relay process of a fleet.
pub struct Relay {
    pub process: TestService,
    pub metrics: SocketAddr,
    pub wake: Option<SocketAddr>,
    /// Its health endpoint's port.
    pub health: u16,
}

impl Relay {
    /// The shards it says it owns (`idempost.relay.shard.owned` = 1).
    pub async fn owned(&self) -> BTreeSet<String> {
        gauge_of_shards(&scrape(self.metrics).await, "idempost_relay_shard_owned", 1.0)
    }

    /// The shards whose relay runs: their pools are open and their gauges reported
    /// (`idempost.outbox.claimable` under their name).
    pub async fn serving(&self) -> BTreeSet<String> {
        let text = scrape(self.metrics).await;
        gauges_of_shards(&text, "idempost_outbox_claimable").into_keys().collect()
    }

    /// Gauge `name`'s value per shard (`idempost_shard`) in a scrape.
    pub async fn gauges(&self, name: &str) -> BTreeMap<String, f64> {
        gauges_of_shards(&scrape(self.metrics).await, name)
    }

    /// Its FAILED backlog gauge (`idempost_outbox_backlog` with status FAILED) per shard.
    pub async fn failed_backlog(&self) -> BTreeMap<String, f64> {
        let text = scrape(self.metrics).await;
        let failed: String = text
            .lines()
            .filter(|line| line.contains("idempost_outbox_status=\"FAILED\""))
            .map(|line| format!("{line}\n"))
            .collect();
        gauges_of_shards(&failed, "idempost_outbox_backlog")
    }

    /// Whether its health endpoint reports SERVING (`Some(false)`: NOT_SERVING).
    pub async fn serving_health(&self) -> Option<bool> {
        // 1 is SERVING and 2 NOT_SERVING in grpc.health.v1.
        idempost_testkit::health::health(self.health, "").await.map(|status| status as i32 == 1)
    }

    /// The value of counter `name` (0 when absent).
    pub async fn counter(&self, name: &str) -> f64 {
        let text = scrape(self.metrics).await;
        let line = text.lines().find(|line| line.starts_with(name) && !line.starts_with('#'));
        line.and_then(|l| l.rsplit_once(' ')).and_then(|(_, v)| v.parse().ok()).unwrap_or(0.0)
    }

    /// SIGTERM, and a clean exit.
    pub async fn stop(mut self) {
        self.process.signal("TERM").await;
        assert!(self.process.wait(Duration::from_secs(60)).await.success());
    }
}

/// Every one of `total` events is on the fleet's topic at least once, and each order's versions
/// reached it in order.
pub async fn every_event_in_its_orders_order(fleet: &Fleet, total: usize) {
    let records =
        read_topic(&fleet.broker.address(), &fleet.topic, total, WAIT, Duration::from_secs(1)).await;
    let distinct: BTreeSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
    assert_eq!(distinct.len(), total, "every event reached the topic");
    let mut by_offset = records.clone();
    by_offset.sort_by_key(|r| (r.partition, r.offset));
    let mut versions: HashMap<Vec<u8>, Vec<i64>> = HashMap::new();
    for record in &by_offset {
        versions.entry(record.key.clone()).or_default().push(record.header("event_version").parse().unwrap());
    }
    for (key, seen) in &versions {
        assert!(seen.is_sorted(), "order {} out of order: {seen:?}", String::from_utf8_lossy(key));
    }
}

/// Names `s0`.. of `numbers`.
pub fn names(numbers: impl IntoIterator<Item = usize>) -> BTreeSet<String> {
    numbers.into_iter().map(|n| format!("s{n}")).collect()
}

/// The shards whose gauge `name` reads `value` in a scrape.
pub fn gauge_of_shards(text: &str, name: &str, value: f64) -> BTreeSet<String> {
    gauges_of_shards(text, name).into_iter().filter(|(_, v)| *v == value).map(|(shard, _)| shard).collect()
}

/// Gauge `name`'s value per shard in a scrape.
fn gauges_of_shards(text: &str, name: &str) -> BTreeMap<String, f64> {
    let mut shards = BTreeMap::new();
    for line in text.lines().filter(|line| line.starts_with(&format!("{name}{{"))) {
        let Some((series, sample)) = line.rsplit_once(' ') else { continue };
        let Some(shard) = series.split("idempost_shard=\"").nth(1).and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        shards.insert(shard.to_owned(), sample.parse::<f64>().unwrap_or(f64::NAN));
    }
    shards
}

/// `GET /metrics` on a fresh connection; "" when the relay does not answer.
pub async fn scrape(addr: SocketAddr) -> String {
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
