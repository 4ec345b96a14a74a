// A test that cannot parse its own fixed map is a broken test: unwrap says where.
#![allow(clippy::unwrap_used)]

use super::*;

fn map(shards: &[(&str, u32)]) -> ShardMap {
    let list: Vec<String> = shards
        .iter()
        .map(|(name, number)| {
            format!(r#"{{"name": "{name}", "number": {number}, "database_url": "sqlite::memory:"}}"#)
        })
        .collect();
    ShardMap::parse(&format!(r#"{{"default": "{}", "shards": [{}]}}"#, shards[0].0, list.join(","))).unwrap()
}

fn owned(partitions: &[i32]) -> BTreeSet<i32> {
    partitions.iter().copied().collect()
}

fn running(shards: &[(&str, u32)]) -> BTreeMap<String, u32> {
    shards.iter().map(|(name, number)| ((*name).to_owned(), *number)).collect()
}

fn names(plan: &Plan) -> (Vec<&str>, Vec<&str>) {
    (plan.stop.iter().map(String::as_str).collect(), plan.start.iter().map(Shard::name).collect())
}

#[test]
fn owned_partitions_start_the_shards_with_those_numbers_and_nothing_else() {
    let map = map(&[("a", 0), ("b", 1), ("c", 2), ("d", 3)]);
    let plan = plan(&owned(&[1, 3]), &map, &running(&[]));
    assert_eq!(names(&plan), (vec![], vec!["b", "d"]));
}

#[test]
fn a_revoked_partition_stops_its_shard_and_a_kept_one_is_left_running() {
    let map = map(&[("a", 0), ("b", 1), ("c", 2)]);
    let plan = plan(&owned(&[0, 2]), &map, &running(&[("a", 0), ("b", 1)]));
    assert_eq!(names(&plan), (vec!["b"], vec!["c"]));
}

#[test]
fn a_shard_removed_from_the_map_stops_though_its_partition_is_still_owned() {
    let map = map(&[("a", 0)]);
    let plan = plan(&owned(&[0, 1]), &map, &running(&[("a", 0), ("b", 1)]));
    assert_eq!(names(&plan), (vec!["b"], vec![]));
}

#[test]
fn a_shard_added_to_the_map_starts_when_its_partition_is_already_owned() {
    let map = map(&[("a", 0), ("b", 1)]);
    let plan = plan(&owned(&[0, 1]), &map, &running(&[("a", 0)]));
    assert_eq!(names(&plan), (vec![], vec!["b"]));
}

#[test]
fn an_owned_partition_with_no_shard_in_the_map_starts_nothing() {
    let map = map(&[("a", 0)]);
    assert_eq!(plan(&owned(&[5]), &map, &running(&[])), Plan::default());
}

#[test]
fn a_shard_running_under_another_number_is_stopped_and_started_again() {
    let map = map(&[("a", 1)]);
    let plan = plan(&owned(&[1]), &map, &running(&[("a", 0)]));
    assert_eq!(names(&plan), (vec!["a"], vec!["a"]));
}

#[test]
fn nothing_changes_while_ownership_and_the_map_agree_with_what_runs() {
    let map = map(&[("a", 0), ("b", 1)]);
    assert_eq!(plan(&owned(&[0, 1]), &map, &running(&[("a", 0), ("b", 1)])), Plan::default());
}
