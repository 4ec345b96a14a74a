use std::path::PathBuf;

use super::{Database, ShardMap, ShardMapError};

const TWO_SHARDS: &str = r#"{
  "default": "eu-1",
  "shards": [
    { "name": "eu-1", "number": 0, "database_url": "mysql://root@127.0.0.1:3306/eu1" },
    { "name": "eu-2", "number": 1, "database_url_file": "/run/secrets/eu-2", "tenants": [42, 43] }
  ]
}"#;

fn error_of(text: &str) -> ShardMapError {
    ShardMap::parse(text).expect_err("the map should be refused")
}

#[test]
fn a_listed_tenant_goes_to_its_shard_and_every_other_to_the_default() {
    let map = ShardMap::parse(TWO_SHARDS).unwrap();

    assert_eq!(map.shard_for(42).name(), "eu-2");
    assert_eq!(map.shard_for(43).name(), "eu-2");
    assert_eq!(map.shard_for(7).name(), "eu-1");
    assert_eq!(map.default_shard().name(), "eu-1");
    assert_eq!(map.get("eu-2").unwrap().database(), &Database::UrlFile(PathBuf::from("/run/secrets/eu-2")));
}

#[test]
fn the_single_database_is_shard_zero_holding_every_tenant() {
    let map = ShardMap::single(Database::Url("sqlite::memory:".to_owned()));

    assert_eq!(map.shards().len(), 1);
    assert_eq!(map.shard_for(1).name(), super::SINGLE_SHARD);
    assert_eq!(map.shard_for(1).order_ids(), 1..1 << 40);
}

#[test]
fn shards_have_disjoint_blocks_of_order_ids() {
    let map = ShardMap::parse(TWO_SHARDS).unwrap();
    let (first, second) = (map.shards()[0].order_ids(), map.shards()[1].order_ids());

    assert_eq!(first, 1..1 << 40);
    assert_eq!(second, 1 << 40..2 << 40);
    let last = ShardMap::parse(
        r#"{"default": "z", "shards": [{"name": "z", "number": 8191, "database_url": "sqlite::memory:"}]}"#,
    )
    .unwrap();
    assert_eq!(last.shards()[0].order_ids().end, 1 << 53);
    assert_eq!(map.shard_of_order(7).unwrap().name(), "eu-1");
    assert_eq!(map.shard_of_order((1 << 40) + 7).unwrap().name(), "eu-2");
    assert!(map.shard_of_order(2 << 40).is_none());
}

#[test]
fn a_tenant_on_two_shards_is_refused() {
    let text = TWO_SHARDS.replace(r#""number": 0,"#, r#""number": 0, "tenants": [43],"#);

    let error = error_of(&text);

    assert!(
        matches!(&error, ShardMapError::TenantOnTwoShards { tenant: 43, first, second } if first == "eu-1" && second == "eu-2"),
        "{error}"
    );
}

#[test]
fn a_default_that_names_no_shard_is_refused() {
    let error = error_of(&TWO_SHARDS.replace(r#""default": "eu-1""#, r#""default": "eu-9""#));

    assert!(matches!(&error, ShardMapError::UnknownDefault(name) if name == "eu-9"), "{error}");
}

#[test]
fn a_map_without_a_default_is_refused() {
    let error = error_of(&TWO_SHARDS.replace(r#""default": "eu-1","#, ""));

    assert!(matches!(&error, ShardMapError::Syntax(why) if why.contains("default")), "{error}");
}

#[test]
fn duplicate_names_and_numbers_are_refused() {
    let error = error_of(&TWO_SHARDS.replace(r#""name": "eu-2""#, r#""name": "eu-1""#));
    assert!(matches!(&error, ShardMapError::DuplicateName(name) if name == "eu-1"), "{error}");

    let error = error_of(&TWO_SHARDS.replace(r#""number": 1"#, r#""number": 0"#));
    assert!(matches!(&error, ShardMapError::DuplicateNumber { number: 0, .. }), "{error}");
}

#[test]
fn a_password_in_the_map_itself_is_refused_without_repeating_it() {
    let error = error_of(&TWO_SHARDS.replace("root@", "root:hunter2@"));

    assert!(matches!(&error, ShardMapError::PasswordInline(name) if name == "eu-1"), "{error}");
    assert!(!error.to_string().contains("hunter2"));
}

#[test]
fn a_shard_needs_exactly_one_form_of_its_database() {
    let both = TWO_SHARDS.replace(
        r#""database_url_file": "/run/secrets/eu-2","#,
        r#""database_url_file": "/run/secrets/eu-2", "database_url": "sqlite::memory:","#,
    );
    assert!(matches!(error_of(&both), ShardMapError::DatabaseForms(name) if name == "eu-2"));

    let neither = TWO_SHARDS.replace(r#""database_url_file": "/run/secrets/eu-2","#, "");
    assert!(matches!(error_of(&neither), ShardMapError::DatabaseForms(name) if name == "eu-2"));
}

#[test]
fn unknown_fields_empty_maps_and_bad_numbers_are_refused() {
    let typo = TWO_SHARDS.replace(r#""tenants""#, r#""tenant""#);
    assert!(matches!(error_of(&typo), ShardMapError::Syntax(_)));
    assert!(matches!(error_of(r#"{"default": "a", "shards": []}"#), ShardMapError::NoShards));
    let negative = TWO_SHARDS.replace("[42, 43]", "[42, -1]");
    assert!(matches!(error_of(&negative), ShardMapError::InvalidTenant { tenant: -1, .. }));
    let large = TWO_SHARDS.replace(r#""number": 1"#, r#""number": 8192"#);
    assert!(matches!(error_of(&large), ShardMapError::NumberTooLarge { number: 8192, .. }));
}

#[test]
fn a_url_file_is_read_trimmed_and_an_empty_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("url");
    std::fs::write(&path, "mysql://app:secret@db/orders\n").unwrap();
    let text = format!(
        r#"{{"default": "a", "shards": [{{"name": "a", "number": 0, "database_url_file": {path:?}}}]}}"#
    );
    let map = ShardMap::parse(&text).unwrap();

    assert_eq!(map.default_shard().url().unwrap(), "mysql://app:secret@db/orders");
    std::fs::write(&path, "  \n").unwrap();
    let error = map.default_shard().url().unwrap_err();
    assert!(matches!(error, ShardMapError::UrlFile { .. }), "{error}");
}

#[test]
fn a_shard_whose_database_changed_is_named_as_redefined() {
    let map = ShardMap::parse(TWO_SHARDS).unwrap();
    let moved = ShardMap::parse(&TWO_SHARDS.replace("/eu1", "/eu1-new")).unwrap();
    let grown = ShardMap::parse(&TWO_SHARDS.replace("[42, 43]", "[42, 43, 44]")).unwrap();

    assert_eq!(map.redefined_in(&moved), ["eu-1"]);
    assert!(map.redefined_in(&grown).is_empty());
}

#[test]
fn a_relative_url_file_is_found_beside_the_map() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("eu-2"), "postgres://db/eu2\n").unwrap();
    let text = TWO_SHARDS.replace("/run/secrets/eu-2", "eu-2");
    std::fs::write(dir.path().join("map.json"), text).unwrap();

    let map = ShardMap::load(&dir.path().join("map.json")).unwrap();

    assert_eq!(map.get("eu-2").unwrap().url().unwrap(), "postgres://db/eu2");
}
