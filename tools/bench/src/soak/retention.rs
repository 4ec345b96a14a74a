//! Retention's cost per run in the soak. The order service (outbox) and the consumer (dedup
//! history) each log one `retention purge` line per run with the table, the rows it removed and
//! its time (`idempost::service::purge_periodically`); the soak keeps both logs as JSON and reads
//! every run back, so that issue 42's "retention's cost per period does not grow with the number
//! of rows it removes" is a figure: the time per 1,000 rows removed of the early runs against
//! the late ones, when the rows already removed (dead versions, a held snapshot's) have piled up.

use std::path::Path;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::measure::Latencies;

/// The environment that makes a service log its retention runs, one JSON line each, and its
/// warnings.
pub(crate) const PURGE_LOG: [(&str, &str); 2] =
    [("RUST_LOG", "warn,idempost::service=info"), ("IDEMPOST_LOG_FORMAT", "json")];

/// The message of a purge's line.
const MESSAGE: &str = "retention purge";

/// One retention run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Purge {
    /// Seconds from the start of the load to the line (the run's end).
    pub(crate) at: f64,
    pub(crate) table: String,
    pub(crate) rows: u64,
    pub(crate) elapsed_ms: f64,
}

/// The run one log line reports, with its time counted from `start`; none for any other line.
pub(crate) fn parse(line: &str, start: DateTime<Utc>) -> Option<Purge> {
    let entry = serde_json::from_str::<Value>(line).ok()?;
    let fields = entry.get("fields").unwrap_or(&entry);
    if fields.get("message").and_then(Value::as_str) != Some(MESSAGE) {
        return None;
    }
    let stamp = DateTime::parse_from_rfc3339(entry.get("timestamp")?.as_str()?).ok()?;
    let at = (stamp.with_timezone(&Utc) - start).num_microseconds()? as f64 / 1e6;
    Some(Purge {
        at,
        table: fields.get("table")?.as_str()?.to_owned(),
        rows: fields.get("rows")?.as_u64()?,
        elapsed_ms: fields.get("elapsed_ms")?.as_f64()?,
    })
}

/// Every run the logs at `paths` report from `start` until `end` seconds after it, in time order.
pub(crate) fn read(paths: &[&Path], start: DateTime<Utc>, end: f64) -> Vec<Purge> {
    let mut purges: Vec<Purge> = paths
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|text| text.lines().filter_map(|line| parse(line, start)).collect::<Vec<_>>())
        .filter(|purge| (0.0..=end).contains(&purge.at))
        .collect();
    purges.sort_by(|a, b| a.at.total_cmp(&b.at));
    purges
}

/// What some runs of one table cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Cost {
    pub(crate) runs: usize,
    pub(crate) rows: u64,
    /// Their time per 1,000 rows removed, all runs' time over all their rows.
    pub(crate) ms_per_1000: f64,
    pub(crate) p50_ms: f64,
}

impl Cost {
    fn of<'a>(purges: impl IntoIterator<Item = &'a Purge>) -> Self {
        let (mut cost, mut ms, mut times) = (Self::default(), 0.0, Latencies::default());
        for purge in purges {
            cost.runs += 1;
            cost.rows += purge.rows;
            ms += purge.elapsed_ms;
            times.push_ms(purge.elapsed_ms);
        }
        cost.ms_per_1000 = if cost.rows == 0 { 0.0 } else { ms * 1000.0 / cost.rows as f64 };
        cost.p50_ms = times.percentile(50.0);
        cost
    }
}

/// Whether one table's retention costs more per row as the soak goes on.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Growth {
    pub(crate) table: String,
    /// Every run, those that found nothing to remove included.
    pub(crate) all: Cost,
    /// The first and the last third of the runs that removed rows (none: fewer than three).
    pub(crate) early: Option<Cost>,
    pub(crate) late: Option<Cost>,
}

impl Growth {
    /// Late over early time per 1,000 rows (none without both).
    pub(crate) fn ratio(&self) -> Option<f64> {
        let (early, late) = (self.early?, self.late?);
        (early.ms_per_1000 > 0.0).then(|| late.ms_per_1000 / early.ms_per_1000)
    }
}

/// Each table's [`Growth`], in the order the tables first appear. Runs that removed nothing are
/// left out of early and late: before the first rows age past the horizon a run costs its
/// statement and no row, which says nothing of the cost per row.
pub(crate) fn growth(purges: &[Purge]) -> Vec<Growth> {
    let mut tables: Vec<&str> = Vec::new();
    for purge in purges {
        if !tables.contains(&purge.table.as_str()) {
            tables.push(&purge.table);
        }
    }
    tables
        .into_iter()
        .map(|table| {
            let of_table = || purges.iter().filter(move |p| p.table == table);
            let removing: Vec<&Purge> = of_table().filter(|p| p.rows > 0).collect();
            let third = removing.len() / 3;
            let (early, late) = if third == 0 {
                (None, None)
            } else {
                (
                    Some(Cost::of(removing[..third].iter().copied())),
                    Some(Cost::of(removing[removing.len() - third..].iter().copied())),
                )
            };
            Growth { table: table.to_owned(), all: Cost::of(of_table()), early, late }
        })
        .collect()
}

/// Rows and milliseconds of the runs of `table` that ended in `(from, to]`.
pub(crate) fn within(purges: &[Purge], table: &str, from: f64, to: f64) -> (u64, f64) {
    purges
        .iter()
        .filter(|p| p.table == table && p.at > from && p.at <= to)
        .fold((0, 0.0), |(rows, ms), p| (rows + p.rows, ms + p.elapsed_ms))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn start() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-06T18:00:00Z").unwrap().with_timezone(&Utc)
    }

    fn purge(at: f64, table: &str, rows: u64, elapsed_ms: f64) -> Purge {
        Purge { at, table: table.into(), rows, elapsed_ms }
    }

    #[test]
    fn a_purge_line_of_the_json_log_is_read_with_its_time_from_the_start() {
        let line = r#"{"timestamp":"2026-12-06T18:00:12.500000Z","level":"INFO","fields":{"message":"retention purge","table":"outbox_event","rows":3012,"elapsed_ms":41},"target":"idempost::service"}"#;
        assert_eq!(parse(line, start()), Some(purge(12.5, "outbox_event", 3012, 41.0)));
    }

    #[test]
    fn other_lines_and_text_logs_are_not_purges() {
        let step = r#"{"timestamp":"2026-12-06T18:00:12Z","level":"DEBUG","fields":{"message":"step","claimed":500},"target":"idempost_relay::step"}"#;
        let failed = r#"{"timestamp":"2026-12-06T18:00:12Z","level":"WARN","fields":{"message":"retention purge failed; trying again next period","table":"outbox_event","error":"x"},"target":"idempost::service"}"#;
        let text = "2026-12-06T18:00:12Z  INFO idempost::service: retention purge table=\"outbox_event\" rows=1 elapsed_ms=2";
        for line in [step, failed, text, ""] {
            assert_eq!(parse(line, start()), None, "{line}");
        }
    }

    #[test]
    fn the_logs_runs_are_merged_in_time_order_within_the_soak() {
        let dir = std::env::temp_dir().join(format!("idempost-bench-retention-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let line = |at: &str, table: &str| {
            format!(
                r#"{{"timestamp":"2026-12-06T18:{at}Z","fields":{{"message":"retention purge","table":"{table}","rows":5,"elapsed_ms":2}}}}"#
            )
        };
        let (order, consumer) = (dir.join("order.log"), dir.join("consumer.log"));
        let before = line("00:00.000000", "outbox_event").replace("18:00:00", "17:59:59");
        std::fs::write(&order, [before, line("00:20.000000", "outbox_event")].join("\n")).unwrap();
        std::fs::write(
            &consumer,
            [line("00:10.000000", "consumed_event"), line("09:00.000000", "consumed_event")].join("\n"),
        )
        .unwrap();
        let read = read(&[&order, &consumer], start(), 300.0);
        let _ = std::fs::remove_dir_all(&dir);
        let got: Vec<(f64, &str)> = read.iter().map(|p| (p.at, p.table.as_str())).collect();
        assert_eq!(got, vec![(10.0, "consumed_event"), (20.0, "outbox_event")]);
    }

    #[test]
    fn growth_compares_the_first_and_last_third_of_the_runs_that_removed_rows() {
        let mut purges = vec![purge(5.0, "outbox_event", 0, 1.0)];
        for (i, (rows, ms)) in
            [(1000, 10.0), (2000, 20.0), (1000, 10.0), (1000, 15.0), (2000, 40.0), (2000, 40.0)]
                .into_iter()
                .enumerate()
        {
            purges.push(purge(10.0 * (i + 1) as f64, "outbox_event", rows, ms));
        }
        purges.push(purge(12.0, "consumed_event", 100, 3.0));
        let growth = growth(&purges);
        assert_eq!(growth.len(), 2);
        let outbox = &growth[0];
        assert_eq!((outbox.table.as_str(), outbox.all.runs, outbox.all.rows), ("outbox_event", 7, 9000));
        assert_eq!(outbox.early.map(|c| (c.runs, c.rows, c.ms_per_1000)), Some((2, 3000, 10.0)));
        assert_eq!(outbox.late.map(|c| (c.runs, c.rows, c.ms_per_1000)), Some((2, 4000, 20.0)));
        assert_eq!(outbox.ratio(), Some(2.0));
        assert_eq!((growth[1].early, growth[1].ratio()), (None, None), "one run has no thirds");
    }

    #[test]
    fn a_window_sums_the_runs_that_ended_in_it() {
        let purges = [
            purge(10.0, "outbox_event", 1, 1.0),
            purge(15.0, "outbox_event", 2, 2.0),
            purge(15.0, "consumed_event", 4, 4.0),
        ];
        assert_eq!(within(&purges, "outbox_event", 10.0, 20.0), (2, 2.0));
        assert_eq!(within(&purges, "outbox_event", 0.0, 20.0), (3, 3.0));
        assert_eq!(within(&purges, "consumed_event", 20.0, 30.0), (0, 0.0));
    }
}
