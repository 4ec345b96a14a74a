//! Idempost on a three-node MariaDB Galera cluster of the test's own (the test kit's
//! `GaleraCluster`): the cluster forms, the schema migrated through one node is on every node,
//! and what Galera changes (locks and reads local to a node, certification at commit) is handled.
//! These tests start three database servers each: they run in their own nextest group.

use idempost_testkit::galera::{GaleraCluster, NODES};
use sea_orm::{ConnectionTrait as _, DbBackend, Statement};

use crate::helpers::service_binary;

/// The tables a database has, by name.
async fn tables(url: &str) -> Vec<String> {
    let conn = idempost::db::connect(url, 1).await.unwrap();
    let rows = conn
        .query_all_raw(Statement::from_string(
            DbBackend::MySql,
            "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() ORDER BY 1",
        ))
        .await
        .unwrap();
    conn.close().await.unwrap();
    rows.iter().map(|row| row.try_get_by_index::<String>(0).unwrap()).collect()
}

#[tokio::test]
async fn three_nodes_form_one_synced_cluster_and_a_migration_through_one_reaches_all() {
    let cluster = GaleraCluster::start().await;
    for node in 0..NODES {
        assert_eq!(cluster.status(node, "wsrep_cluster_size").await.as_deref(), Some("3"));
        assert_eq!(cluster.status(node, "wsrep_local_state_comment").await.as_deref(), Some("Synced"));
    }

    let database = cluster.create_database().await;
    let status = std::process::Command::new(service_binary("idempost-migrate"))
        .args(["-u", &cluster.url(0, &database), "up"])
        .status()
        .unwrap();
    assert!(status.success(), "idempost-migrate up through node 0 failed: {status}");

    let migrated = tables(&cluster.url(0, &database)).await;
    assert!(
        ["orders", "outbox_event", "consumed_event", "seaql_migrations"]
            .iter()
            .all(|t| migrated.contains(&t.to_string())),
        "node 0 lacks the schema: {migrated:?}"
    );
    for node in 1..NODES {
        assert_eq!(tables(&cluster.url(node, &database)).await, migrated, "node {node} differs from node 0");
    }
}

/// One value a fresh pool of the services' own (`idempost::db::connect`) reads.
async fn scalar(url: &str, sql: &str) -> String {
    let conn = idempost::db::connect(url, 1).await.unwrap();
    let row = conn.query_one_raw(Statement::from_string(DbBackend::MySql, sql)).await.unwrap().unwrap();
    conn.close().await.unwrap();
    row.try_get_by_index::<String>(0)
        .or_else(|_| row.try_get_by_index::<i64>(0).map(|n| n.to_string()))
        .or_else(|_| row.try_get_by_index::<u64>(0).map(|n| n.to_string()))
        .unwrap()
}

/// Every session the services open on a Galera node reads causally, and a node Idempost cannot
/// be correct on is refused with what to change: here a node cut off from the primary component
/// (what a starting service would meet behind a partition), accepted again once it rejoined.
#[tokio::test]
async fn a_galera_session_reads_causally_and_a_node_outside_the_primary_component_is_refused() {
    let cluster = GaleraCluster::start().await;
    let database = cluster.create_database().await;
    for node in 0..NODES {
        assert_eq!(scalar(&cluster.url(node, &database), "SELECT @@SESSION.wsrep_sync_wait").await, "1");
    }

    cluster.isolate(2).await;
    let refused = idempost::db::connect(&cluster.url(2, &database), 1).await.map(drop).unwrap_err();
    assert!(
        refused.to_string().contains("not ready in the primary component"),
        "the refusal says what is wrong: {refused}"
    );
    let other = idempost::db::connect(&cluster.url(1, &database), 1).await;
    assert!(other.is_ok(), "a node of the primary component is accepted: {:?}", other.map(drop));

    cluster.rejoin(2).await;
    let again = idempost::db::connect(&cluster.url(2, &database), 1).await;
    assert!(again.is_ok(), "the node is accepted once it rejoined: {:?}", again.map(drop));
}

/// Row locks are local to a node: the same order submitted through order services on two nodes
/// is written on both, and certification refuses the COMMIT of the one that comes second (the
/// first node's transaction, held before its commit while the second node's committed). That
/// refusal is the server's exact answer that nothing was written, so the order runs again and is
/// answered as the replay it now is: COMMITTED, the other node's order, never UNKNOWN.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_refused_by_certification_runs_again_and_is_answered_exactly() {
    use idempost_testkit::db::TestDb;
    use idempost_testkit::failpoint::hold;
    use idempost_testkit::order::{TestOrder, order};
    use idempost_testkit::wait::WAIT;

    let cluster = GaleraCluster::start().await;
    let database = cluster.create_database().await;
    let first = TestOrder::spawn_on(TestDb::migrated_at(cluster.url(0, &database)).await, |_| {}).await;
    let second = TestOrder::spawn_on(TestDb::migrated_at(cluster.url(1, &database)).await, |_| {}).await;

    let mut held = hold(idempost::failpoint::BEFORE_ORDER_TRANSACTION_COMMIT);
    let request = order(7, "galera-twice");
    let on_first = tokio::spawn({
        let client = first.client.clone();
        let request = request.clone();
        async move { client.clone().submit_order(request).await.map(tonic::Response::into_inner) }
    });
    held.reached("the first node's transaction holds its rows, uncommitted", WAIT).await;

    let committed = second.submit(request).await.unwrap();
    assert!(!committed.replayed, "the second node wrote the order: {committed:?}");
    // The first node applied it (its reads wait for causality), which aborted the held
    // transaction there: its COMMIT can only be refused.
    let applied = scalar(
        &cluster.url(0, &database),
        "SELECT COUNT(*) FROM orders WHERE tenant_id = 7 AND request_id = 'galera-twice'",
    )
    .await;
    assert_eq!(applied, "1");
    held.release();

    let answer = on_first.await.unwrap().expect("an exact answer, not UNKNOWN");
    assert_eq!(
        (answer.replayed, answer.order_id),
        (true, committed.order_id),
        "the refused order ran again and found the other node's: {answer:?}"
    );
    assert_eq!(first.count("orders").await, 1);
    first.stop().await;
    second.stop().await;
}

/// `GET_LOCK` holds only on the node that granted it, so on Galera the consumer's instance lock
/// is a leased row: a second consumer under a name in use, attached to another node, is refused
/// at start-up naming it; once the first is gone, its lease runs out within the starting wait and
/// the name can be taken through a third node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_instance_name_is_held_across_the_nodes_of_a_galera_cluster() {
    use idempost_consumer::Application;
    use idempost_testkit::consumer::{TestConsumer, consumer_settings};
    use idempost_testkit::db::TestDb;
    use idempost_testkit::ports::free_port;

    let cluster = GaleraCluster::start().await;
    let database = cluster.create_database().await;
    TestDb::migrated_at(cluster.url(0, &database)).await;
    let brokers = format!("127.0.0.1:{}", free_port());
    let settings = |node: usize| {
        let mut settings = consumer_settings(&cluster.url(node, &database), &brokers, "t", "g1");
        settings.instance_name = Some("pod-0".to_owned());
        settings
    };

    // Running, so it renews its lease (the broker is nowhere: this consumer only holds its name).
    let first = TestConsumer::spawn(settings(0)).await;
    let refused = Application::build(settings(1)).await.map(drop).unwrap_err();
    assert!(
        refused.to_string().contains("another consumer instance") && refused.to_string().contains("`pod-0`"),
        "the second instance, on another node, is refused naming it: {refused}"
    );

    first.stop().await;
    let third = Application::build(settings(2)).await;
    assert!(third.is_ok(), "the name is free again once its holder is gone: {:?}", third.map(drop));
}

/// How long the journeys below wait for every event to be published and consumed: three
/// database servers on a loaded two-core machine are slow to confirm.
const SLOW_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// One order's journey through `app`: accepted, amended, and (even `n`) cancelled, three
/// versions in order; every answer exact. Answers the order's id.
async fn journey(app: &idempost_testkit::order::TestOrder, prefix: &str, n: i64) -> i64 {
    use idempost_testkit::order::{amend, cancel, order};

    let submitted = app.submit(order(7, &format!("{prefix}-{n}"))).await.expect("an exact answer");
    let id = submitted.order_id;
    let amended = app.amend(amend(&format!("{prefix}-{n}-2"), id, 1, 3)).await.expect("an exact answer");
    assert_eq!(amended.version, 2);
    if n % 2 == 0 {
        app.cancel(cancel(&format!("{prefix}-{n}-3"), id, 2)).await.expect("an exact answer");
    }
    id
}

/// Every event of the journeys of `ids` (numbered 0..ids.len()) is published, each order's
/// versions are on `topic` in order, and the read model of the consumer (reading through
/// `consumer_url`) equals the orders.
async fn assert_delivered_in_order(
    app: &idempost_testkit::order::TestOrder,
    broker: &str,
    topic: &str,
    consumer_url: &str,
    ids: &[i64],
) {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use idempost_testkit::ordering::read_model;
    use idempost_testkit::outbox::OutboxProbe;
    use idempost_testkit::wait::assert_eventually;

    use crate::broker::read_topic;

    let orders = i64::try_from(ids.len()).unwrap();
    let events = orders * 2 + orders / 2;
    let probe = OutboxProbe { conn: &app.conn };
    let published = crate::helpers::eventually(SLOW_WAIT, || async {
        probe.count_with_status("PUBLISHED").await == events
    })
    .await;
    if !published {
        let sql = "SELECT CONCAT(status, ' held_back=', held_back, ' v', event_version, ' leased=', \
                   lease_until IS NOT NULL) AS s, COUNT(*) FROM outbox_event \
                   WHERE status <> 'PUBLISHED' GROUP BY 1";
        let rows = app.conn.query_all_raw(Statement::from_string(DbBackend::MySql, sql)).await.unwrap();
        let left: Vec<(String, i64)> =
            rows.iter().map(|r| (r.try_get_by_index(0).unwrap(), r.try_get_by_index(1).unwrap())).collect();
        panic!("not every event was published within {SLOW_WAIT:?}; unpublished: {left:?}");
    }
    let records = read_topic(broker, topic, events as usize, SLOW_WAIT, Duration::from_millis(1500)).await;
    // (partition, offset, version, event id, timestamp) of each record, by order.
    type Seen<'r> = Vec<(i32, i64, i64, &'r str, Option<i64>)>;
    let mut by_order: BTreeMap<i64, Seen<'_>> = BTreeMap::new();
    for record in &records {
        let order_id: i64 = record.header("aggregate_id").parse().unwrap();
        let version: i64 = record.header("event_version").parse().unwrap();
        by_order.entry(order_id).or_default().push((
            record.partition,
            record.offset,
            version,
            record.header("event_id"),
            record.timestamp_ms,
        ));
    }
    assert_eq!(by_order.len(), ids.len(), "every order reached the topic");
    for (order_id, seen) in &mut by_order {
        seen.sort();
        let versions: Vec<i64> = seen.iter().map(|s| s.2).collect();
        // Every record of the order (partition, offset, version, event id, when librdkafka got
        // it) and the outbox's rows, so that a failure says which copy came late and from where.
        assert!(
            versions.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1) && versions.first() == Some(&1),
            "order {order_id}'s versions on the topic are out of order: {versions:?}\nrecords: {seen:#?}\n\
             outbox: {:#?}",
            outbox_rows(&app.conn, *order_id).await
        );
    }

    let mut want = BTreeMap::new();
    for &id in ids {
        want.insert(id, app.order_state(id).await);
    }
    let name = idempost_consumer::Settings::new(&app.db.url, broker.to_owned()).consumer_name;
    let consumer_conn = idempost::db::connect(consumer_url, 2).await.unwrap();
    assert_eventually("the read model equals the orders", SLOW_WAIT, || async {
        let model: BTreeMap<i64, (i64, String)> = read_model(&consumer_conn, &name)
            .await
            .into_iter()
            .map(|(id, e)| (id, (e.version, e.status)))
            .collect();
        model == want
    })
    .await;
}

/// The outbox rows of order `order_id`: version, event id, status, lease owner, attempts,
/// partition and offset.
async fn outbox_rows(conn: &sea_orm::DatabaseConnection, order_id: i64) -> Vec<String> {
    let sql = format!(
        "SELECT CONCAT_WS(' ', event_version, event_id, status, IFNULL(lease_owner, '-'), attempts, \
         IFNULL(published_partition, '-'), IFNULL(published_offset, '-'), IFNULL(last_error, '')) \
         FROM outbox_event WHERE aggregate_id = '{order_id}' ORDER BY event_version"
    );
    let rows = conn.query_all_raw(Statement::from_string(DbBackend::MySql, sql)).await.unwrap();
    rows.iter().map(|r| r.try_get_by_index(0).unwrap()).collect()
}

/// The journey across the cluster: the order service on node 0, relays on nodes 1 and 2, the
/// consumer on node 2. Node 1 is SIGKILLed while orders, amendments and cancellations flow, and
/// rejoins by state transfer while they still flow: every call is answered exactly (no UNKNOWN
/// reaches the caller: the order service's node stayed up), every event is published once its
/// relay is back or the other relay took its leases over, each order's versions reach the topic
/// in order, and the consumer's read model equals the orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_journey_across_three_nodes_keeps_every_order_through_a_node_killed_and_rejoined_under_load() {
    use idempost_testkit::consumer::{TestConsumer, consumer_settings};
    use idempost_testkit::db::TestDb;
    use idempost_testkit::order::TestOrder;
    use idempost_testkit::relay::{TestRelay, relay_defaults};

    use crate::broker::TestBroker;

    const ORDERS: i64 = 30;
    let mut cluster = GaleraCluster::start().await;
    let database = cluster.create_database().await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-test-galera");
    broker.create_topic(&topic, 3).await;
    let app = TestOrder::spawn_on(TestDb::migrated_at(cluster.url(0, &database)).await, |_| {}).await;
    // The relays' default delivery timeout (10 s): no send may time out against Tansu 0.6 (see
    // docs/testing.md), and a loaded machine with three database servers is slow to confirm.
    let mut relays = Vec::new();
    for node in [1, 2] {
        relays.push(
            TestRelay::spawn(relay_defaults(&cluster.url(node, &database), &broker.address(), &topic)).await,
        );
    }
    let group = format!("galera-{}", uuid::Uuid::new_v4().simple());
    let consumer =
        TestConsumer::spawn(consumer_settings(&cluster.url(2, &database), &broker.address(), &topic, &group))
            .await;

    let mut ids = Vec::new();
    for n in 0..ORDERS / 2 {
        ids.push(journey(&app, "galera", n).await);
    }
    cluster.kill(1);
    for n in ORDERS / 2..ORDERS * 3 / 4 {
        ids.push(journey(&app, "galera", n).await);
    }
    cluster.restart(1).await;
    for n in ORDERS * 3 / 4..ORDERS {
        ids.push(journey(&app, "galera", n).await);
    }

    assert_delivered_in_order(&app, &broker.address(), &topic, &cluster.url(2, &database), &ids).await;
    consumer.stop().await;
    for relay in relays {
        relay.stop().await;
    }
    app.stop().await;
}

/// A node cut off from the others (a partition, `gmcast.isolate`): the order service, a relay and
/// the consumer reach node 2 through a proxy (as behind a load balancer; a service takes one
/// database URL), a second relay is on node 1. Node 2 leaves the primary component while orders
/// flow, the proxy moves to node 0 and cuts the sessions to node 2, and the services reconnect
/// through it; node 2 rejoins later. Every call is answered exactly, every event is published,
/// each order's versions reach the topic in order, and the read model equals the orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn services_on_a_node_cut_off_from_the_others_reconnect_to_another_node_and_lose_nothing() {
    use idempost_testkit::consumer::{TestConsumer, consumer_settings};
    use idempost_testkit::db::TestDb;
    use idempost_testkit::order::TestOrder;
    use idempost_testkit::proxy::TcpProxy;
    use idempost_testkit::relay::{TestRelay, relay_defaults};

    use crate::broker::TestBroker;

    const ORDERS: i64 = 20;
    let cluster = GaleraCluster::start().await;
    let database = cluster.create_database().await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-test-galera-cut");
    broker.create_topic(&topic, 3).await;
    let proxy = TcpProxy::start(cluster.address(2)).await;
    let behind_proxy = format!("mysql://root@127.0.0.1:{}/{database}", proxy.port());
    let app = TestOrder::spawn_on(TestDb::migrated_at(behind_proxy.clone()).await, |_| {}).await;
    let mut relays = Vec::new();
    for url in [behind_proxy.clone(), cluster.url(1, &database)] {
        relays.push(TestRelay::spawn(relay_defaults(&url, &broker.address(), &topic)).await);
    }
    let group = format!("galera-{}", uuid::Uuid::new_v4().simple());
    let consumer =
        TestConsumer::spawn(consumer_settings(&behind_proxy, &broker.address(), &topic, &group)).await;

    let mut ids = Vec::new();
    for n in 0..ORDERS / 2 {
        ids.push(journey(&app, "galera-cut", n).await);
    }
    cluster.isolate(2).await;
    proxy.repoint(cluster.address(0)).await;
    for n in ORDERS / 2..ORDERS * 3 / 4 {
        ids.push(journey(&app, "galera-cut", n).await);
    }
    cluster.rejoin(2).await;
    for n in ORDERS * 3 / 4..ORDERS {
        ids.push(journey(&app, "galera-cut", n).await);
    }

    assert_delivered_in_order(&app, &broker.address(), &topic, &cluster.url(2, &database), &ids).await;
    consumer.stop().await;
    for relay in relays {
        relay.stop().await;
    }
    app.stop().await;
}

/// The order service reaching node 2 through a proxy (as in the test above), over a fresh
/// database: the proxy, so that the test can cut the node's sessions, and the service.
#[cfg(feature = "failpoints")]
async fn order_service_behind_a_proxy_on_node_two(
    cluster: &GaleraCluster,
    database: &str,
) -> (idempost_testkit::proxy::TcpProxy, idempost_testkit::order::TestOrder) {
    use idempost_testkit::db::TestDb;
    use idempost_testkit::order::TestOrder;
    use idempost_testkit::proxy::TcpProxy;

    let proxy = TcpProxy::start(cluster.address(2)).await;
    let behind_proxy = format!("mysql://root@127.0.0.1:{}/{database}", proxy.port());
    let app = TestOrder::spawn_on(TestDb::migrated_at(behind_proxy).await, |_| {}).await;
    (proxy, app)
}

/// How many operations node `node` holds under `(tenant 7, request_id)` (an order's every
/// version names the key of the operation that made it), read directly and causally there.
#[cfg(feature = "failpoints")]
async fn operations_under(cluster: &GaleraCluster, node: usize, database: &str, request_id: &str) -> String {
    let sql =
        format!("SELECT COUNT(*) FROM order_version WHERE tenant_id = 7 AND request_id = '{request_id}'");
    scalar(&cluster.url(node, database), &sql).await
}

/// An order whose COMMIT reaches its node after the node was cut off from the others: the node
/// refuses the COMMIT (error 1047, like every statement outside the primary component) without
/// running it, and the service cannot tell that from a commit whose answer was lost, so it
/// answers UNKNOWN, never ROLLED_BACK. Reconciled through the service moved to another node, the
/// order is not found, as on the primary component; the retry with the same ids commits it once,
/// and the cut-off node, back in the cluster, holds exactly that order.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_order_whose_commit_reaches_its_node_after_the_cut_is_unknown_and_reconciled_as_never_written() {
    use idempost_proto::v1 as pb;
    use idempost_testkit::failpoint::hold;
    use idempost_testkit::order::order;
    use idempost_testkit::wait::WAIT;
    use tonic::Code;

    use crate::helpers::{metadata, reason};

    let cluster = GaleraCluster::start().await;
    let database = cluster.create_database().await;
    let (proxy, app) = order_service_behind_a_proxy_on_node_two(&cluster, &database).await;

    let mut held = hold(idempost::failpoint::BEFORE_ORDER_TRANSACTION_COMMIT);
    let event_id = uuid::Uuid::now_v7().to_string();
    let request = pb::SubmitOrderRequest { event_id: event_id.clone(), ..order(7, "cut-before-commit") };
    let call = tokio::spawn({
        let client = app.client.clone();
        let request = request.clone();
        async move { client.clone().submit_order(request).await.map(tonic::Response::into_inner) }
    });
    held.reached("the order's rows are written on node 2, uncommitted", WAIT).await;
    cluster.isolate(2).await;
    held.release();

    let status = call.await.unwrap().expect_err("a COMMIT on a node cut off cannot be acknowledged");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::Unknown, "OUTCOME_UNKNOWN"), "{status:?}");
    assert_eq!(metadata(&status, "event_id").as_deref(), Some(event_id.as_str()));

    proxy.repoint(cluster.address(0)).await;
    assert_eq!(operations_under(&cluster, 0, &database, "cut-before-commit").await, "0");
    let reconciled = app.reconcile(7, "cut-before-commit").await.expect_err("nothing was committed");
    assert_eq!(reconciled.code(), Code::NotFound, "{reconciled:?}");

    let retried = app.submit(request).await.expect("the retry commits the order");
    assert!(!retried.replayed, "{retried:?}");
    assert_eq!(retried.event_id, event_id);
    cluster.rejoin(2).await;
    for node in 0..NODES {
        assert_eq!(
            operations_under(&cluster, node, &database, "cut-before-commit").await,
            "1",
            "node {node}"
        );
    }
    app.stop().await;
}

/// An amendment whose COMMIT its node ran, the node then cut off before the acknowledgement
/// reached the service (the proxy holds the node's replies, then cuts its sessions): the commit
/// fails on a lost connection, so the answer is UNKNOWN. Reconciled through the service moved to
/// another node, which reads causally, the amendment is found under its event id; the retry with
/// the same ids is answered as its replay, and the order has exactly its two versions.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_its_node_committed_before_the_cut_is_unknown_and_reconciled_as_committed() {
    use idempost_proto::v1 as pb;
    use idempost_testkit::failpoint::hold;
    use idempost_testkit::order::{amend, order};
    use idempost_testkit::wait::WAIT;
    use tonic::Code;

    use crate::helpers::{eventually, metadata, reason};

    let cluster = GaleraCluster::start().await;
    let database = cluster.create_database().await;
    let (proxy, app) = order_service_behind_a_proxy_on_node_two(&cluster, &database).await;
    let submitted = app.submit(order(7, "cut-after-commit")).await.expect("an exact answer");

    let mut held = hold(idempost::failpoint::BEFORE_ORDER_TRANSACTION_COMMIT);
    let event_id = uuid::Uuid::now_v7().to_string();
    let request = pb::AmendOrderRequest {
        event_id: event_id.clone(),
        ..amend("cut-after-commit-2", submitted.order_id, 1, 3)
    };
    let call = tokio::spawn({
        let client = app.client.clone();
        let request = request.clone();
        async move { client.clone().amend_order(request).await.map(tonic::Response::into_inner) }
    });
    held.reached("the amendment's rows are written on node 2, uncommitted", WAIT).await;
    proxy.hold_replies();
    held.release();
    let version = format!("SELECT version FROM orders WHERE id = {}", submitted.order_id);
    let committed =
        eventually(WAIT, || async { scalar(&cluster.url(0, &database), &version).await == "2" }).await;
    assert!(committed, "node 2 committed the amendment and the cluster has it");
    cluster.isolate(2).await;
    proxy.repoint(cluster.address(0)).await;
    // The held acknowledgement went with node 2's sessions; node 0's answers flow.
    proxy.release_replies();

    let status = call.await.unwrap().expect_err("the acknowledgement was lost with the node");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::Unknown, "OUTCOME_UNKNOWN"), "{status:?}");
    assert_eq!(metadata(&status, "event_id").as_deref(), Some(event_id.as_str()));

    let reconciled = app.reconcile(7, "cut-after-commit-2").await.expect("the amendment committed");
    assert_eq!(
        (reconciled.operation(), reconciled.event_id.as_str(), reconciled.version),
        (pb::OrderOperation::Amend, event_id.as_str(), 2)
    );
    let retried = app.amend(request).await.expect("the retry is answered exactly");
    assert_eq!((retried.replayed, retried.event_id.as_str(), retried.version), (true, event_id.as_str(), 2));
    cluster.rejoin(2).await;
    let events = format!("SELECT COUNT(*) FROM outbox_event WHERE aggregate_id = {}", submitted.order_id);
    for node in 0..NODES {
        assert_eq!(scalar(&cluster.url(node, &database), &version).await, "2", "node {node}");
        assert_eq!(scalar(&cluster.url(node, &database), &events).await, "2", "node {node}");
    }
    app.stop().await;
}
