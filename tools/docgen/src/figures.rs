//! The current benchmark figures, rendered from the one committed results file
//! (`docs/benchmarks/current.json`) into the pages that show them, between two marker comments:
//! the README's table and the benchmarks page's are the same text, so they cannot disagree with
//! the file or with each other.
//!
//! The file names the run (commit, date, command) and holds one `bench.json` per database under
//! `runs[].bench`, with the keys `idempost-bench` writes (`tools/bench/src/report.rs`); only the
//! figures the table shows are read, so a run's whole `bench.json` can be pasted in as written.

mod shards;

use std::fmt::Write as _;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub use shards::ShardFigures;

/// The results file, relative to the workspace root.
pub const RESULTS: &str = "docs/benchmarks/current.json";

/// The pages that show the table, relative to the workspace root.
pub const PAGES: [&str; 2] = ["README.md", "docs/benchmarks/README.md"];

/// The line that opens the generated block.
pub const BEGIN: &str = "<!-- figures: generated from docs/benchmarks/current.json by \
                         `cargo run -p idempost-docgen`; do not edit -->";

/// The line that closes it.
pub const END: &str = "<!-- figures: end -->";

/// What the table shows of one run (one database).
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The column's heading: the database and its version.
    pub name: String,
    /// SubmitOrder at 16 and at 64 callers, orders/s.
    pub submit: [f64; 2],
    /// One, two and four relays draining a backlog, events/s.
    pub relay: [f64; 3],
    /// One consumer draining a topic, events/s.
    pub consumer: f64,
    /// The whole pipeline's sustained rate, orders/s: the 100 % of the end-to-end levels.
    pub sustained: f64,
    /// End to end p99 at 25, 50 and 75 % of that, ms.
    pub p99: [f64; 3],
    /// End to end p50 at 1 order/s, ms.
    pub trickle_p50: f64,
    /// The database's cleanup setting, when the run names it (PostgreSQL's autovacuum).
    pub cleanup: Option<String>,
    /// The soak's figures on this database, when the file holds a soak (`runs[].soak`, the
    /// `soak` object of that run's `bench.json`).
    pub soak: Option<SoakFigures>,
    /// The relay over shards on this database, when the file holds it (`runs[].shards`, the
    /// `shards` object of that run's `bench.json`).
    pub shards: Option<ShardFigures>,
}

/// What the table shows of one database's soak.
#[derive(Debug, Clone, PartialEq)]
pub struct SoakFigures {
    /// The offered rate, orders/s.
    pub rate: f64,
    /// Publish p99 of the baseline, while a snapshot was held, and after its release, ms.
    pub publish_p99: [f64; 3],
    /// The raw pipeline floor's publish p99 at the same rate in the same run, ms.
    pub floor_p99: f64,
}

/// The soak's own run: it is measured apart from the other rows (`soak` at the top of the file);
/// the shards phase's likewise (`shards`).
#[derive(Debug, Clone, PartialEq)]
pub struct SoakRun {
    pub commit: String,
    pub date: String,
    pub time: String,
    pub command: String,
    /// Where it ran, and what else the machine was doing.
    pub setting: String,
    /// Its dated report, relative to `docs/benchmarks/`.
    pub report: String,
}

/// The run the figures come from, and its figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Results {
    pub commit: String,
    pub date: String,
    pub time: String,
    pub command: String,
    pub build: String,
    pub setting: String,
    /// The dated report of the run, relative to `docs/benchmarks/`.
    pub report: String,
    pub runs: Vec<Run>,
    /// The soak's run, when the file holds one.
    pub soak: Option<SoakRun>,
    /// The shards phase's run, when the file holds one.
    pub shards: Option<SoakRun>,
}

/// Reads `text` as a results file; the error names the first key that is missing or not of
/// its type.
pub fn parse(text: &str) -> Result<Results, String> {
    let file: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let runs = file
        .get("runs")
        .and_then(Value::as_array)
        .filter(|runs| !runs.is_empty())
        .ok_or("`runs` is missing or empty")?
        .iter()
        .enumerate()
        .map(|(i, run)| parse_run(run).map_err(|e| format!("runs[{i}]: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Results {
        commit: text_at(&file, "commit")?,
        date: text_at(&file, "date")?,
        time: text_at(&file, "time")?,
        command: text_at(&file, "command")?,
        build: text_at(&file, "build")?,
        setting: text_at(&file, "setting")?,
        report: text_at(&file, "report")?,
        runs,
        soak: own_run(&file, "soak")?,
        shards: own_run(&file, "shards")?,
    })
}

/// The run at `key` at the top of the file, measured apart from the other rows.
fn own_run(file: &Value, key: &str) -> Result<Option<SoakRun>, String> {
    let Some(run) = file.get(key) else { return Ok(None) };
    let text = |field: &str| text_at(run, field).map_err(|e| format!("{key}: {e}"));
    Ok(Some(SoakRun {
        commit: text("commit")?,
        date: text("date")?,
        time: text("time")?,
        command: text("command")?,
        setting: text("setting")?,
        report: text("report")?,
    }))
}

/// A run's soak figures from the `soak` object `idempost-bench` writes.
fn parse_soak(soak: &Value) -> Result<SoakFigures, String> {
    let stage = |name: &str| {
        find(soak, "stages", "stage", &Value::from(name))
            .and_then(|stage| stage.get("publish").ok_or_else(|| "`publish` is missing".to_owned()))
            .and_then(|publish| number_at(publish, "p99Ms"))
            .map_err(|e| format!("soak, {name}: {e}"))
    };
    let floor = soak
        .get("floor")
        .and_then(|floor| floor.get("publish"))
        .ok_or_else(|| "soak: `floor.publish` is missing".to_owned())?;
    Ok(SoakFigures {
        rate: number_at(soak, "ratePerSecond").map_err(|e| format!("soak: {e}"))?,
        publish_p99: [stage("baseline")?, stage("snapshot held")?, stage("released")?],
        floor_p99: number_at(floor, "p99Ms").map_err(|e| format!("soak, floor: {e}"))?,
    })
}

fn parse_run(run: &Value) -> Result<Run, String> {
    let name = text_at(run, "name")?;
    let bench = run.get("bench").ok_or("`bench` is missing")?;
    let submit_at = |callers: u64| {
        find(bench, "submitOrder", "concurrency", &Value::from(callers))
            .and_then(|point| number_at(point, "perSecond"))
            .map_err(|e| format!("SubmitOrder at {callers} callers: {e}"))
    };
    let relay_of = |processes: u64| {
        find(bench, "relay", "processes", &Value::from(processes))
            .and_then(|drain| drain.get("drain").ok_or_else(|| "`drain` is missing".to_owned()))
            .and_then(|drain| number_at(drain, "perSecond"))
            .map_err(|e| format!("relay x{processes}: {e}"))
    };
    let level = |label: &str, key: &str| {
        find(bench, "endToEnd", "label", &Value::from(label))
            .and_then(|level| number_at(level, key))
            .map_err(|e| format!("end to end {label}: {e}"))
    };
    let consumer = bench.get("consumer").ok_or("`consumer` is missing")?;
    Ok(Run {
        name,
        submit: [submit_at(16)?, submit_at(64)?],
        relay: [relay_of(1)?, relay_of(2)?, relay_of(4)?],
        consumer: number_at(consumer, "perSecond").map_err(|e| format!("consumer: {e}"))?,
        sustained: number_at(bench, "maxOfferedPerSecond")?,
        p99: [level("25%", "p99Ms")?, level("50%", "p99Ms")?, level("75%", "p99Ms")?],
        trickle_p50: level("trickle", "p50Ms")?,
        cleanup: bench
            .get("machine")
            .and_then(|machine| machine.get("database cleanup"))
            .and_then(Value::as_str)
            .filter(|cleanup| !cleanup.is_empty())
            .map(str::to_owned),
        soak: run.get("soak").map(parse_soak).transpose()?,
        shards: run.get("shards").map(shards::parse).transpose()?,
    })
}

fn text_at(value: &Value, key: &str) -> Result<String, String> {
    value
        .get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| format!("`{key}` is missing or not a string"))
}

fn number_at(value: &Value, key: &str) -> Result<f64, String> {
    value.get(key).and_then(Value::as_f64).ok_or_else(|| format!("`{key}` is missing or not a number"))
}

/// The element of the array `array` whose `key` is `wanted`.
fn find<'a>(value: &'a Value, array: &str, key: &str, wanted: &Value) -> Result<&'a Value, String> {
    value
        .get(array)
        .and_then(Value::as_array)
        .ok_or_else(|| format!("`{array}` is missing or not an array"))?
        .iter()
        .find(|element| element.get(key) == Some(wanted))
        .ok_or_else(|| format!("`{array}` has no element with `{key}` {wanted}"))
}

/// The README's caption: its figures section is the table and where to read about it; the
/// runs' setting, cleanup and the soak's lab notes stay on the benchmarks page.
const README_CAPTION: &str = "Ratios within a column compare; rates across machines do not. Which \
                              builds, where and how: [the benchmarks page](docs/benchmarks/README.md#the-current-figures).";

/// The generated block for `page` (one of [`PAGES`]), both marker lines included: the README's
/// with its one-line caption, every other page's as [`block`] renders it.
pub fn block_for(page: &str, results: &Results) -> String {
    if page == "README.md" { framed(README_CAPTION, results) } else { block(results) }
}

/// The generated block, both marker lines included, with the whole caption.
pub fn block(results: &Results) -> String {
    let mut caption = format!(
        "{} builds of {}, measured {} {} with `{}`, one run per database on {}. Compare ratios \
         within a column, not rates across machines.",
        capitalised(&results.build),
        results.commit,
        results.date,
        results.time,
        results.command,
        results.setting
    );
    let cleanups: Vec<String> = results
        .runs
        .iter()
        .filter_map(|run| run.cleanup.as_ref().map(|cleanup| format!("{} with {cleanup}", run.name)))
        .collect();
    if !cleanups.is_empty() {
        let _ = write!(caption, " Database cleanup: {}.", cleanups.join("; "));
    }
    if let Some(soak) = &results.soak {
        let _ = write!(
            caption,
            " The soak row: {} builds of {}, {}, a snapshot held through the second of three stages \
             on private servers with stock settings; in brackets, p99 over the raw pipeline floor's \
             in the same run. How, where and the charts: `docs/benchmarks/{}`.",
            results.build, soak.commit, soak.date, soak.report
        );
    }
    if let Some(shards) = &results.shards {
        let _ = write!(
            caption,
            " The shards rows: {} builds of {}, {}, one relay over shard databases on the one server \
             against one database of the same backlog (in brackets, the ratio), and two fleet relays \
             over four shards, one SIGKILLed. How and where: `docs/benchmarks/{}`.",
            results.build, shards.commit, shards.date, shards.report
        );
    }
    framed(&caption, results)
}

/// `caption` and the table of `results` between the marker lines.
fn framed(caption: &str, results: &Results) -> String {
    let mut out = format!("{BEGIN}\n{}", wrapped(caption, WIDTH));
    out.push_str("\n\n| measure |");
    for run in &results.runs {
        let _ = write!(out, " {} |", run.name);
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(results.runs.len()));
    out.push('\n');
    let rows: [(&str, Cell); 6] = [
        ("SubmitOrder, 16 / 64 callers (orders/s)", |r| rates(&r.submit)),
        ("relay x1 / x2 / x4 draining a backlog (events/s)", |r| rates(&r.relay)),
        ("consumer draining a topic (events/s)", |r| rate(r.consumer)),
        ("whole pipeline sustained (orders/s)", |r| rate(r.sustained)),
        ("end to end at 25 / 50 / 75 % of that, p99 (ms)", |r| millis(&r.p99)),
        ("end to end at 1 order/s, p50 (ms)", |r| millis(&[r.trickle_p50])),
    ];
    for (measure, cell) in rows {
        let _ = write!(out, "| {measure} |");
        for run in &results.runs {
            let _ = write!(out, " {} |", cell(run));
        }
        out.push('\n');
    }
    if results.runs.iter().any(|run| run.soak.is_some()) {
        out.push_str("| soak: publish p99, baseline / snapshot held / released (ms) |");
        for run in &results.runs {
            let _ = write!(out, " {} |", run.soak.as_ref().map_or_else(|| "-".to_owned(), soak_cell));
        }
        out.push('\n');
    }
    if results.runs.iter().any(|run| run.shards.is_some()) {
        for (measure, cell) in shards::ROWS {
            let _ = write!(out, "| {measure} |");
            for run in &results.runs {
                let _ = write!(out, " {} |", run.shards.as_ref().map_or_else(|| "-".to_owned(), cell));
            }
            out.push('\n');
        }
    }
    out.push_str(END);
    out.push('\n');
    out
}

/// How one row shows a run's figures.
type Cell = fn(&Run) -> String;

/// The width the caption is wrapped to, as the pages' prose is.
const WIDTH: usize = 100;

/// `text` as lines of at most `width` characters (a longer word stands alone), broken between
/// words but never inside a code span; no line break after the last line.
fn wrapped(text: &str, width: usize) -> String {
    let mut words: Vec<String> = Vec::new();
    let mut in_code = false;
    for word in text.split_whitespace() {
        match words.last_mut() {
            Some(last) if in_code => {
                last.push(' ');
                last.push_str(word);
            }
            _ => words.push(word.to_owned()),
        }
        if word.matches('`').count() % 2 == 1 {
            in_code = !in_code;
        }
    }
    let mut out = String::new();
    let mut line = 0;
    for word in words {
        let length = word.chars().count();
        if line > 0 && line + 1 + length > width {
            out.push('\n');
            line = 0;
        } else if line > 0 {
            out.push(' ');
            line += 1;
        }
        out.push_str(&word);
        line += length;
    }
    out
}

fn capitalised(word: &str) -> String {
    let mut chars = word.chars();
    chars.next().map(|first| first.to_uppercase().chain(chars).collect()).unwrap_or_default()
}

/// A rate as a whole number with thousands separators: `4335.2` -> `4,335`.
pub fn rate(per_second: f64) -> String {
    let digits = format!("{:.0}", per_second.max(0.0));
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn rates(values: &[f64]) -> String {
    values.iter().map(|v| rate(*v)).collect::<Vec<_>>().join(" / ")
}

/// `71.0 / 282.0 / 75.0 (2.1x / 8.3x / 2.2x) at 300/s`.
fn soak_cell(soak: &SoakFigures) -> String {
    let over = soak
        .publish_p99
        .iter()
        .map(
            |p99| if soak.floor_p99 > 0.0 { format!("{:.1}x", p99 / soak.floor_p99) } else { "-".to_owned() },
        )
        .collect::<Vec<_>>()
        .join(" / ");
    let p99: Vec<String> = soak.publish_p99.iter().map(|v| format!("{v:.0}")).collect();
    format!("{} ({over}) at {}/s", p99.join(" / "), rate(soak.rate))
}

fn millis(values: &[f64]) -> String {
    values.iter().map(|v| format!("{v:.1}")).collect::<Vec<_>>().join(" / ")
}

/// The generated block `page` holds now, markers included; an error unless it holds exactly
/// one, whole.
pub fn current_block(page: &str) -> Result<&str, String> {
    block_range(page).map(|range| &page[range])
}

/// `page` with its generated block replaced by `block`.
pub fn splice(page: &str, block: &str) -> Result<String, String> {
    let range = block_range(page)?;
    Ok(format!("{}{block}{}", &page[..range.start], &page[range.end..]))
}

/// Where the block is in `page`: from its opening line to the end of its closing line.
fn block_range(page: &str) -> Result<Range<usize>, String> {
    let start = match page.match_indices(BEGIN).map(|(at, _)| at).collect::<Vec<_>>().as_slice() {
        [] => return Err(format!("no line `{BEGIN}`")),
        [one] => *one,
        _ => return Err("more than one figures block".to_owned()),
    };
    let end = page[start..].find(END).ok_or_else(|| format!("no `{END}` after the opening line"))?;
    let end = start + end + END.len();
    let end = if page[end..].starts_with('\n') { end + 1 } else { end };
    Ok(start..end)
}

/// The results file as committed under `root`.
pub fn committed(root: &Path) -> Result<Results, String> {
    let path = root.join(RESULTS);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Each page of [`PAGES`] under `root` as it should read: its text with the block rendered
/// from the results file; `(path, text)`.
pub fn pages(root: &Path) -> Result<Vec<(PathBuf, String)>, String> {
    let results = committed(root)?;
    PAGES
        .iter()
        .map(|page| {
            let rendered = block_for(page, &results);
            let path = root.join(page);
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let text = splice(&text, &rendered).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok((path, text))
        })
        .collect()
}
