// A test that cannot parse its own fixed map is a broken test: unwrap says where.
#![allow(clippy::unwrap_used)]

use super::*;

const SHARDS: &str = r#"{
    "default": "eu-1",
    "shards": [
        { "name": "eu-1", "number": 0, "database_url": "sqlite::memory:" },
        { "name": "eu-2", "number": 1, "database_url": "sqlite::memory:" },
        { "name": "us-1", "number": 3, "database_url": "sqlite::memory:" }
    ]
}"#;

fn settings() -> Watch {
    Watch {
        brokers: String::new(),
        options: Vec::new(),
        topic: "control".to_owned(),
        tick: TICK,
        stranded_after: Duration::from_secs(20),
    }
}

fn ends(ends: &[(i32, i64)]) -> Vec<Look> {
    ends.iter().map(|&(partition, end)| Look { partition, progress: end, expected: true }).collect()
}

fn unowned(verdict: &Verdict) -> Vec<&str> {
    verdict.unowned.iter().filter(|(_, unowned)| *unowned).map(|(name, _)| name.as_str()).collect()
}

#[test]
fn a_shard_whose_partition_end_stands_still_for_three_ticks_is_unowned_on_every_relay() {
    let map = ShardMap::parse(SHARDS).unwrap();
    let mut verdicts = Verdicts::new(&settings());
    let start = Instant::now();
    let at = |seconds| start + Duration::from_secs(seconds);
    let mine = BTreeSet::from([0]);
    let first = verdicts.judge(start, &map, &mine, &ends(&[(0, 5), (1, 9), (3, 2)]));
    assert_eq!(first.unowned.len(), 3, "every shard of the map is reported");
    assert!(unowned(&first).is_empty());
    verdicts.judge(at(2), &map, &mine, &ends(&[(0, 6), (1, 10), (3, 2)]));
    verdicts.judge(at(4), &map, &mine, &ends(&[(0, 7), (1, 11), (3, 2)]));
    assert!(unowned(&verdicts.judge(at(5), &map, &mine, &ends(&[(0, 7), (1, 11), (3, 2)]))).is_empty());
    let later = verdicts.judge(at(6), &map, &mine, &ends(&[(0, 8), (1, 12), (3, 2)]));
    assert_eq!(unowned(&later), ["us-1"], "its end has not moved for 6 s, three ticks");
    let held_and_still = verdicts.judge(at(12), &map, &mine, &ends(&[(0, 8), (1, 13), (3, 2)]));
    assert_eq!(
        unowned(&held_and_still),
        ["eu-1", "us-1"],
        "a shard this relay holds and cannot tick is unowned too"
    );
    let moved = verdicts.judge(at(13), &map, &mine, &ends(&[(0, 9), (1, 14), (3, 3)]));
    assert!(unowned(&moved).is_empty(), "an owner ticked into each");
}

#[test]
fn a_shard_dropped_from_the_map_is_given_zero_once() {
    let map = ShardMap::parse(SHARDS).unwrap();
    let smaller = ShardMap::parse(
        r#"{ "default": "eu-1", "shards": [{ "name": "eu-1", "number": 0, "database_url": "sqlite::memory:" }] }"#,
    )
    .unwrap();
    let mut verdicts = Verdicts::new(&settings());
    let start = Instant::now();
    let none = BTreeSet::new();
    verdicts.judge(start, &map, &none, &ends(&[(0, 5), (1, 9), (3, 2)]));
    let dropped = verdicts.judge(start + Duration::from_secs(2), &smaller, &none, &ends(&[(0, 6)]));
    assert_eq!(
        dropped.unowned,
        [("eu-1".to_owned(), false), ("eu-2".to_owned(), false), ("us-1".to_owned(), false)]
    );
    let after = verdicts.judge(start + Duration::from_secs(4), &smaller, &none, &ends(&[(0, 7)]));
    assert_eq!(after.unowned, [("eu-1".to_owned(), false)]);
}

#[test]
fn a_partition_nobody_moves_for_the_stretch_and_this_relay_does_not_hold_asks_one_rejoin_per_stretch() {
    let map = ShardMap::parse(SHARDS).unwrap();
    let mut verdicts = Verdicts::new(&settings());
    let start = Instant::now();
    let at = |seconds: i64| start + Duration::from_secs(u64::try_from(seconds).unwrap());
    let mine = BTreeSet::from([0, 3]);
    // Partition 0 is this relay's and stands still (its ticks are late): no rejoin for it.
    // Partition 1 is another relay's, which died at once; partition 3 is this relay's.
    for second in (0..20_i64).step_by(2) {
        let verdict = verdicts.judge(at(second), &map, &mine, &ends(&[(0, 5), (1, 9), (3, second)]));
        assert!(verdict.stranded.is_empty(), "at {second} s");
    }
    assert_eq!(verdicts.judge(at(20), &map, &mine, &ends(&[(0, 5), (1, 9), (3, 20)])).stranded, [1]);
    for second in (22..40_i64).step_by(2) {
        let verdict = verdicts.judge(at(second), &map, &mine, &ends(&[(0, 5), (1, 9), (3, second)]));
        assert!(verdict.stranded.is_empty(), "asked at 20 s; at {second} s the stretch has not lasted again");
    }
    assert_eq!(
        verdicts.judge(at(42), &map, &mine, &ends(&[(0, 5), (1, 9), (3, 42)])).stranded,
        [1],
        "the rejoin did not move it: ask again"
    );
}
