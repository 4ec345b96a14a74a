//! What a fleet relay says it owns: the `shards owned` line it logs on every change of
//! ownership (JSON, `shards` its shards' names as a debug list, e.g. `["shard-0", "shard-2"]`).

use std::path::Path;

use chrono::{DateTime, Utc};
use serde_json::Value;

/// The message of an ownership line.
const MESSAGE: &str = "shards owned";

/// One change of ownership: when, and the shards owned from then on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owned {
    pub(crate) at: DateTime<Utc>,
    pub(crate) shards: Vec<String>,
}

/// The change one log line reports; none for any other line.
pub(crate) fn parse(line: &str) -> Option<Owned> {
    let entry = serde_json::from_str::<Value>(line).ok()?;
    let fields = entry.get("fields").unwrap_or(&entry);
    if fields.get("message").and_then(Value::as_str) != Some(MESSAGE) {
        return None;
    }
    let at = DateTime::parse_from_rfc3339(entry.get("timestamp")?.as_str()?).ok()?.with_timezone(&Utc);
    let shards = match fields.get("shards")? {
        Value::Array(names) => names.iter().filter_map(|n| n.as_str().map(str::to_owned)).collect(),
        Value::String(debug) => quoted(debug),
        _ => return None,
    };
    Some(Owned { at, shards })
}

/// The quoted strings of a debug list (shard names hold no quotes: the map's names are plain).
fn quoted(debug: &str) -> Vec<String> {
    debug.split('"').skip(1).step_by(2).map(str::to_owned).collect()
}

/// Every change the log at `path` reports so far, in order.
pub(crate) fn read(path: &Path) -> Vec<Owned> {
    std::fs::read_to_string(path).map_or_else(|_| Vec::new(), |text| text.lines().filter_map(parse).collect())
}

/// What the log at `path` says the relay owns now (none: it has not said).
pub(crate) fn latest(path: &Path) -> Option<Owned> {
    read(path).pop()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn an_ownership_line_gives_its_time_and_the_shards_names() {
        let line = r#"{"timestamp":"2026-12-06T19:00:01.250000Z","level":"INFO","fields":{"message":"shards owned","shards":"[\"shard-0\", \"shard-3\"]"},"target":"idempost_relay::fleet"}"#;
        let owned = parse(line).expect("an ownership line");
        assert_eq!(owned.shards, vec!["shard-0".to_owned(), "shard-3".to_owned()]);
        assert_eq!(owned.at.to_rfc3339(), "2026-12-06T19:00:01.250+00:00");
    }

    #[test]
    fn owning_nothing_is_an_empty_list_and_other_lines_are_no_change() {
        let none =
            r#"{"timestamp":"2026-12-06T19:00:01Z","fields":{"message":"shards owned","shards":"[]"}}"#;
        assert_eq!(parse(none).map(|o| o.shards), Some(Vec::new()));
        let array = r#"{"timestamp":"2026-12-06T19:00:01Z","fields":{"message":"shards owned","shards":["shard-1"]}}"#;
        assert_eq!(parse(array).map(|o| o.shards), Some(vec!["shard-1".to_owned()]));
        let other = r#"{"timestamp":"2026-12-06T19:00:01Z","fields":{"message":"step","shards":"[]"}}"#;
        for line in [other, "not json", r#"{"fields":{"message":"shards owned","shards":"[]"}}"#] {
            assert_eq!(parse(line), None, "{line}");
        }
    }

    #[test]
    fn the_latest_line_of_a_log_is_what_the_relay_owns_now() {
        let path = std::env::temp_dir().join(format!("idempost-bench-owned-{}.log", uuid::Uuid::new_v4()));
        let lines = [
            r#"{"timestamp":"2026-12-06T19:00:01Z","fields":{"message":"shards owned","shards":"[\"shard-0\", \"shard-1\"]"}}"#,
            r#"{"timestamp":"2026-12-06T19:00:02Z","level":"WARN","fields":{"message":"something else"}}"#,
            r#"{"timestamp":"2026-12-06T19:00:09Z","fields":{"message":"shards owned","shards":"[\"shard-0\", \"shard-1\", \"shard-2\", \"shard-3\"]"}}"#,
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let (all, latest) = (read(&path), latest(&path));
        let _ = std::fs::remove_file(&path);
        assert_eq!(all.len(), 2);
        assert_eq!(latest.map(|o| o.shards.len()), Some(4));
        assert_eq!(super::latest(Path::new("/nonexistent/relay.log")), None);
    }
}
