//! A fleet relay's cleanup gauges (`idempost_db_oldest_transaction_age_seconds`,
//! `idempost_db_unremoved_versions`): sampled on every shard it serves, under the shard's name,
//! so that the alert on a held transaction names the shard's database; and 0 for a shard it no
//! longer serves, so that a reading taken before it gave the shard back does not stay. The same
//! holds for the shard's backlog gauges (a FAILED event it saw).

use std::collections::{BTreeMap, BTreeSet};

use sea_orm::{ConnectionTrait as _, TransactionTrait as _};

use super::kit::{Fleet, Shards, names};
use crate::helpers::assert_eventually;
use idempost_testkit::wait::WAIT;

const AGE: &str = "idempost_db_oldest_transaction_age_seconds";
const VERSIONS: &str = "idempost_db_unremoved_versions";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_served_shards_oldest_transaction_is_reported_under_its_name_and_zero_once_no_longer_served() {
    let shards = Shards::new(2, 2).await;
    let fleet = Fleet::new(2).await;
    // A transaction with a transaction id, held open on s1's database only.
    let held = shards.conns[1].begin().await.unwrap();
    held.execute_unprepared("SELECT txid_current()").await.unwrap();
    // And a FAILED event on s1, which its backlog gauge counts for as long as s1 is served.
    let failed = shards.seed(1, 1).await;
    let sql = format!("UPDATE outbox_event SET status = 'FAILED' WHERE event_id = '{}'", failed[0]);
    shards.conns[1].execute_unprepared(&sql).await.unwrap();
    let relay = fleet.relay(&shards.map(), &[]).await;

    // Samples come every 15 s, the first as the shard is served.
    assert_eventually("s1 reports its held transaction, s0 none that old", WAIT, || async {
        let (ages, versions) = (relay.gauges(AGE).await, relay.gauges(VERSIONS).await);
        let of = |gauge: &BTreeMap<String, f64>| gauge.keys().cloned().collect::<BTreeSet<_>>();
        let exported = of(&ages) == names([0, 1]) && of(&versions) == names([0, 1]);
        exported && ages["s1"] >= 2.0 && ages["s0"] < 2.0
    })
    .await;
    assert_eventually("s1's backlog gauge counts its FAILED event", WAIT, || async {
        relay.failed_backlog().await.get("s1") == Some(&1.0)
    })
    .await;

    // The map drops s1: the relay stops serving it and its gauges read 0 from then on, while
    // the transaction is still open.
    shards.write_map(&[0]);
    relay.process.signal("HUP").await;
    assert_eventually("the removed shard's cleanup gauges read 0", WAIT, || async {
        let (ages, versions) = (relay.gauges(AGE).await, relay.gauges(VERSIONS).await);
        ages.get("s1") == Some(&0.0) && versions.get("s1") == Some(&0.0) && ages.contains_key("s0")
    })
    .await;
    assert_eq!(
        relay.failed_backlog().await.get("s1"),
        Some(&0.0),
        "the removed shard's FAILED count reads 0"
    );
    held.rollback().await.unwrap();
    relay.stop().await;
}
