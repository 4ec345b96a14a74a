//! The figure table in README.md and docs/benchmarks/README.md is the rendering of the committed
//! results file, docs/benchmarks/current.json, and that file names the run it holds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use idempost_docgen::figures::{self, BEGIN, END, PAGES, RESULTS};
use idempost_docgen::{REGENERATE, workspace_root};

#[test]
fn the_readme_and_the_benchmarks_page_show_the_table_rendered_from_the_results_file() {
    let root = workspace_root();
    let results = figures::committed(&root).unwrap();
    for page in PAGES {
        let rendered = figures::block_for(page, &results);
        let text = std::fs::read_to_string(root.join(page)).unwrap();
        let shown = figures::current_block(&text).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(
            shown == rendered,
            "{page}'s figure table differs from {RESULTS}: regenerate it with `{REGENERATE}` and commit \
             both\n--- {page}\n{shown}\n--- rendered from {RESULTS}\n{rendered}"
        );
    }
}

#[test]
fn the_results_file_names_its_commit_and_date_and_its_report_names_that_commit() {
    let root = workspace_root();
    let results = figures::committed(&root).unwrap();
    assert!(
        results.commit.len() >= 7 && results.commit.chars().all(|c| c.is_ascii_hexdigit()),
        "{RESULTS}: `commit` must be the measured commit's hash, not {:?}",
        results.commit
    );
    let date = results.date.as_bytes();
    assert!(
        date.len() == 10 && date[4] == b'-' && date[7] == b'-',
        "{RESULTS}: `date` must be YYYY-MM-DD, not {:?}",
        results.date
    );
    let report = root.join("docs/benchmarks").join(&results.report);
    let text = std::fs::read_to_string(&report)
        .unwrap_or_else(|e| panic!("{RESULTS} names the report {}: {e}", report.display()));
    assert!(
        text.contains(&results.commit),
        "{} does not name the commit {}",
        report.display(),
        results.commit
    );
    assert!(
        report.file_name().unwrap().to_string_lossy().starts_with(&results.date),
        "{} is not the report of {}",
        report.display(),
        results.date
    );
}

/// A `bench.json` as `idempost-bench` writes it: unrounded rates and keys the table does not use.
const BENCH_JSON: &str = r#"{
  "machine": {"cpus": "2 x AMD EPYC", "database": "15.20 (Postgres)", "database cleanup": "autovacuum on, autovacuum_naptime 1min"},
  "raw": {"confirmedProducePerSecond": 8804.1},
  "submitOrder": [
    {"concurrency": 1, "perSecond": 1021.7, "errors": 0, "p50Ms": 0.9, "p95Ms": 1.2, "p99Ms": 1.5, "samples": 10217},
    {"concurrency": 16, "perSecond": 6921.4, "errors": 0, "p50Ms": 2.1, "p95Ms": 3.0, "p99Ms": 4.2, "samples": 69214},
    {"concurrency": 64, "perSecond": 11083.49, "errors": 0, "p50Ms": 5.5, "p95Ms": 9.0, "p99Ms": 12.0, "samples": 110834}
  ],
  "relay": [
    {"processes": 1, "drain": {"events": 50000, "perSecond": 8503.2, "wallSeconds": 5.88, "complete": true}},
    {"processes": 2, "drain": {"events": 50000, "perSecond": 9807.0, "wallSeconds": 5.1, "complete": true}},
    {"processes": 4, "drain": {"events": 50000, "perSecond": 9358.9, "wallSeconds": 5.34, "complete": true}}
  ],
  "consumer": {"events": 50000, "perSecond": 17226.3, "wallSeconds": 2.9, "complete": true},
  "maxOfferedPerSecond": 4363.0,
  "endToEnd": [
    {"label": "25%", "p50Ms": 30.01, "p95Ms": 45.0, "p99Ms": 56.24},
    {"label": "50%", "p50Ms": 50.0, "p95Ms": 70.0, "p99Ms": 84.95},
    {"label": "75%", "p50Ms": 90.4, "p95Ms": 150.0, "p99Ms": 194.6},
    {"label": "trickle", "p50Ms": 26.2, "p95Ms": 30.0, "p99Ms": 35.0}
  ],
  "targets": [],
  "notes": []
}"#;

fn results_file(bench: &str) -> String {
    format!(
        r#"{{"commit": "26fcc78", "date": "2026-12-05", "time": "19:50-20:55 UTC", "command": "scripts/bench",
            "build": "release", "setting": "a 2-vCPU VM", "report": "history/2026-12-05-late.md",
            "runs": [{{"name": "PostgreSQL 15", "bench": {bench}}}]}}"#
    )
}

#[test]
fn a_bench_json_as_the_bench_writes_it_renders_rounded() {
    let results = figures::parse(&results_file(BENCH_JSON)).unwrap();
    let block = figures::block(&results);
    assert!(block.starts_with(BEGIN) && block.ends_with(&format!("{END}\n")), "{block}");
    let caption = block.lines().skip(1).take_while(|line| !line.is_empty()).collect::<Vec<_>>();
    assert!(caption.iter().all(|line| line.chars().count() <= 100), "{block}");
    let caption = caption.join(" ");
    assert!(
        caption.starts_with(
            "Release builds of 26fcc78, measured 2026-12-05 19:50-20:55 UTC with `scripts/bench`, one run \
             per database on a 2-vCPU VM."
        ),
        "{caption}"
    );
    assert!(
        caption.ends_with("Database cleanup: PostgreSQL 15 with autovacuum on, autovacuum_naptime 1min."),
        "{caption}"
    );
    assert!(block.contains("| measure | PostgreSQL 15 |\n|---|---|\n"), "{block}");
    for row in [
        "| SubmitOrder, 16 / 64 callers (orders/s) | 6,921 / 11,083 |",
        "| relay x1 / x2 / x4 draining a backlog (events/s) | 8,503 / 9,807 / 9,359 |",
        "| consumer draining a topic (events/s) | 17,226 |",
        "| whole pipeline sustained (orders/s) | 4,363 |",
        "| end to end at 25 / 50 / 75 % of that, p99 (ms) | 56.2 / 85.0 / 194.6 |",
        "| end to end at 1 order/s, p50 (ms) | 26.2 |",
    ] {
        assert!(block.contains(row), "{row} not in\n{block}");
    }
}

#[test]
fn a_figure_missing_from_a_run_is_an_error_that_names_it() {
    let without_x4 = BENCH_JSON.replace(r#""processes": 4"#, r#""processes": 8"#);
    let error = figures::parse(&results_file(&without_x4)).unwrap_err();
    assert!(error.contains("runs[0]") && error.contains("relay x4"), "{error}");
    let without_commit = results_file(BENCH_JSON).replace(r#""commit": "26fcc78", "#, "");
    assert!(figures::parse(&without_commit).unwrap_err().contains("`commit`"));
}

#[test]
fn rates_are_whole_with_thousands_separators() {
    assert_eq!(figures::rate(0.4), "0");
    assert_eq!(figures::rate(999.6), "1,000");
    assert_eq!(figures::rate(4335.2), "4,335");
    assert_eq!(figures::rate(12403.0), "12,403");
    assert_eq!(figures::rate(1_234_567.0), "1,234,567");
}

#[test]
fn only_the_block_is_replaced_and_a_page_must_hold_exactly_one() {
    let page = format!("# Title\n\nbefore\n\n{BEGIN}\nold table\n{END}\n\nafter\n");
    let new = format!("{BEGIN}\nnew table\n{END}\n");
    assert_eq!(figures::splice(&page, &new).unwrap(), format!("# Title\n\nbefore\n\n{new}\nafter\n"));
    assert!(figures::splice("# Title\n", &new).unwrap_err().contains("no line"));
    let twice = format!("{page}{page}");
    assert!(figures::splice(&twice, &new).unwrap_err().contains("more than one"));
    let open = format!("{BEGIN}\nno end\n");
    assert!(figures::splice(&open, &new).unwrap_err().contains(END));
}

/// The `soak` object of a `bench.json` as `idempost-bench --only soak` writes it, cut to what the
/// table reads and a little more.
const SOAK_JSON: &str = r#"{
  "ratePerSecond": 300.0, "stageSeconds": 120.0,
  "floor": {"publish": {"p50Ms": 20.0, "p99Ms": 40.0}, "consume": {"p50Ms": 30.0, "p99Ms": 50.0}},
  "stages": [
    {"stage": "baseline", "publish": {"p50Ms": 34.0, "p99Ms": 71.04}},
    {"stage": "snapshot held", "publish": {"p50Ms": 173.0, "p99Ms": 381.96}},
    {"stage": "released", "publish": {"p50Ms": 35.0, "p99Ms": 80.0}}
  ]
}"#;

#[test]
fn a_soak_adds_its_row_and_names_its_own_run_in_the_caption() {
    let without = figures::block(&figures::parse(&results_file(BENCH_JSON)).unwrap());
    assert!(!without.contains("soak"), "no soak, no row: {without}");
    let with = results_file(BENCH_JSON)
        .replace(r#""bench": "#, &format!(r#""soak": {SOAK_JSON}, "bench": "#))
        .replacen(
            r#""runs": "#,
            r#""soak": {"commit": "abcdef1", "date": "2026-12-06", "time": "13:10-13:40 UTC",
                        "command": "scripts/bench --only soak", "setting": "a busy 2-vCPU VM", "report": "history/2026-12-06-soak.md"}, "runs": "#,
            1,
        );
    let block = figures::block(&figures::parse(&with).unwrap());
    assert!(
        block.contains(
            "| soak: publish p99, baseline / snapshot held / released (ms) | 71 / 382 / 80 \
             (1.8x / 9.5x / 2.0x) at 300/s |"
        ),
        "{block}"
    );
    let caption = block.lines().take_while(|line| !line.is_empty()).collect::<Vec<_>>().join(" ");
    assert!(
        caption.contains(
            "The soak row: release builds of abcdef1, 2026-12-06, a snapshot held through the second \
             of three stages"
        ),
        "{caption}"
    );
    assert!(caption.contains("`docs/benchmarks/history/2026-12-06-soak.md`"), "{caption}");
    let broken = with.replace(r#""stage": "released""#, r#""stage": "later""#);
    assert!(figures::parse(&broken).unwrap_err().contains("soak, released"));
}

/// The `shards` object of a `bench.json` as `idempost-bench --only shards` writes it, cut to what
/// the table reads and a little more.
const SHARDS_JSON: &str = r#"{
  "backlog": 10000,
  "oneDatabase": {"perSecond": 3947.7, "rateOverOneDatabase": 1.0},
  "sharded": [
    {"shards": 1, "perSecond": 4451.4, "rateOverOneDatabase": 1.1276},
    {"shards": 2, "perSecond": 4161.2, "rateOverOneDatabase": 1.0541},
    {"shards": 4, "perSecond": 3795.6, "rateOverOneDatabase": 0.9615}
  ],
  "failover": {"shards": 4, "allOwnedAfterSeconds": 11.94, "killedShardsPublishingAfterSeconds": 12.02, "limitSeconds": 120.0}
}"#;

#[test]
fn a_shards_phase_adds_its_rows_and_names_its_own_run_in_the_caption() {
    let without = figures::block(&figures::parse(&results_file(BENCH_JSON)).unwrap());
    assert!(!without.contains("shards"), "no shards phase, no row: {without}");
    let with = results_file(BENCH_JSON)
        .replace(r#""bench": "#, &format!(r#""shards": {SHARDS_JSON}, "bench": "#))
        .replacen(
            r#""runs": "#,
            r#""shards": {"commit": "469468b", "date": "2026-12-06", "time": "19:47 UTC",
                          "command": "scripts/bench --only shards", "setting": "a busy 2-vCPU VM", "report": "history/2026-12-06-shards.md"}, "runs": "#,
            1,
        );
    let block = figures::block(&figures::parse(&with).unwrap());
    assert!(
        block.contains("| relay over 1 / 2 / 4 shards, one relay (events/s) | 4,451 / 4,161 / 3,796 (1.13x / 1.05x / 0.96x) |"),
        "{block}"
    );
    assert!(
        block.contains("| a fleet relay SIGKILLed: every shard owned again after (s) | 11.9 |"),
        "{block}"
    );
    let caption = block.lines().take_while(|line| !line.is_empty()).collect::<Vec<_>>().join(" ");
    assert!(caption.contains("The shards rows: release builds of 469468b, 2026-12-06"), "{caption}");
    let never = with.replace(r#""allOwnedAfterSeconds": 11.94"#, r#""allOwnedAfterSeconds": null"#);
    let block = figures::block(&figures::parse(&never).unwrap());
    assert!(block.contains("every shard owned again after (s) | not within 120 |"), "{block}");
    let broken = with.replace(r#""shards": 4, "perSecond""#, r#""shards": 8, "perSecond""#);
    assert!(figures::parse(&broken).unwrap_err().contains("shards, 4 shard(s)"));
}
