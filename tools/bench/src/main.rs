//! `idempost-bench`: measures Idempost's services against the machine's own limits in one run and prints, charts and stores the figures.

mod chart;
mod child;
mod error;
mod figures;
mod floor;
mod group;
mod load;
mod machine;
mod measure;
mod observe;
mod ordered;
mod payload;
mod phases;
mod plan;
mod raw;
mod report;
mod run;
mod shards;
mod soak;
mod sql;
mod steady;
mod sustain;
mod timings;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use idempost::startup;

/// Measures Idempost on one database server and one broker.
#[derive(Debug, clap::Parser)]
#[command(name = "idempost-bench", version)]
struct Cli {
    /// The database server (mysql:// or postgres://). The bench creates its own database
    /// `idempost_bench_<uuid>` there, migrates it, and drops it at the end.
    #[arg(long, env = "IDEMPOST_BENCH_DATABASE_URL", default_value = "mysql://root@127.0.0.1:3306")]
    database_url: String,
    /// Kafka bootstrap servers; the bench creates its own topics.
    #[arg(long, env = "IDEMPOST_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    brokers: String,
    /// Where idempost-order, idempost-relay and idempost-consumer are (release builds); default:
    /// beside this binary.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Where the table, bench.json, bench.png and the services' logs go.
    #[arg(long, default_value = "bench-results")]
    out_dir: PathBuf,
    /// Events in the pre-filled outbox that the relays drain and the consumer reads.
    #[arg(long)]
    backlog: Option<u64>,
    /// A short run: a small backlog and short phases (a few minutes in all).
    #[arg(long)]
    quick: bool,
    /// Partitions of each topic the bench creates.
    #[arg(long, default_value_t = 3)]
    partitions: i32,
    /// Extra flag for every idempost-order the bench starts (repeat).
    #[arg(long = "order-arg", allow_hyphen_values = true)]
    order_args: Vec<String>,
    /// Extra flag for every idempost-relay, e.g. `--relay-arg=--max-idle-poll=50ms` (repeat).
    #[arg(long = "relay-arg", allow_hyphen_values = true)]
    relay_args: Vec<String>,
    /// Whether the relays write the project's own headers that a `ce_*` header repeats
    /// (`--legacy-headers` of idempost-relay); the raw producer's records follow.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    legacy_headers: bool,
    /// Extra flag for every idempost-consumer (repeat).
    #[arg(long = "consumer-arg", allow_hyphen_values = true)]
    consumer_args: Vec<String>,
    /// Runs only these phases (comma-separated, in the usual order), e.g. `--only group` while
    /// tuning one stage. Default: every phase. `consumer` needs `relay` (it reads what the
    /// relay published); `e2e` without `submit`, `relay` and `consumer` needs `--max-offered`.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<plan::Phase>,
    /// Versions per order in the ordered-relay phase's backlog (over 1,000 orders; 100 with
    /// `--quick`). The default, 10, is issue 25's shape, whose drains last 2-3 s; more versions
    /// make longer drains over the same 1,000 orders, so that a relay's start-up weighs less.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=1000))]
    ordered_versions: u64,
    /// The end-to-end phase's max offered load (orders/s) instead of the one the bench finds
    /// (the whole pipeline's sustained rate, never above the least of the measured stages): its
    /// levels are 25/50/75 % of this.
    #[arg(long)]
    max_offered: Option<f64>,
    /// Minutes of each of the soak's three stages (baseline, snapshot held, released); e.g. 0.5
    /// for a smoke test. The default shows a trend: the issue saw publish p99 rising linearly
    /// for as long as a snapshot was held.
    #[arg(long, default_value_t = 5.0)]
    soak_minutes: f64,
    /// Minutes the snapshot is held (the middle stage) instead of `--soak-minutes`: e.g. 60 for
    /// the hour a `pg_dump` or a report holds one, between a baseline and a release of
    /// `--soak-minutes` each.
    #[arg(long)]
    soak_hold_minutes: Option<f64>,
    /// The soak's offered rate, orders/s. Default: a tenth of the whole pipeline's sustained
    /// rate when the run measured it (or `--max-offered` gave it), else 300.
    #[arg(long)]
    soak_rate: Option<f64>,
    /// Runs one part of the raw-pipeline floor until SIGTERM, instead of a benchmark (the
    /// bench starts these itself).
    #[arg(long, value_enum, hide = true)]
    floor_role: Option<floor::Role>,
    /// The topic of `--floor-role`.
    #[arg(long, hide = true, default_value = "")]
    floor_topic: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli: Cli = startup::settings();
    if let Some(role) = cli.floor_role {
        return match floor::serve(role, &cli.database_url, &cli.brokers, &cli.floor_topic).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => startup::fail("idempost-bench", e),
        };
    }
    let (point, e2e, trickle, backlog, drain_limit, steady) = if cli.quick {
        (
            Duration::from_secs(3),
            Duration::from_secs(8),
            Duration::from_secs(5),
            5_000,
            Duration::from_secs(120),
            Duration::from_secs(10),
        )
    } else {
        (
            Duration::from_secs(10),
            Duration::from_secs(30),
            Duration::from_secs(20),
            50_000,
            Duration::from_secs(600),
            steady::RUN,
        )
    };
    let plan = plan::Plan {
        database_url: cli.database_url,
        brokers: cli.brokers,
        bin_dir: cli.bin_dir.unwrap_or_else(plan::default_bin_dir),
        out_dir: cli.out_dir,
        backlog: cli.backlog.unwrap_or(backlog).max(2),
        partitions: cli.partitions,
        point,
        e2e,
        trickle,
        steady,
        drain_limit,
        concurrencies: vec![1, 16, 64],
        order_args: cli.order_args,
        relay_args: cli
            .relay_args
            .into_iter()
            .chain(std::iter::once(format!("--legacy-headers={}", cli.legacy_headers)))
            .collect(),
        legacy_headers: cli.legacy_headers,
        consumer_args: cli.consumer_args,
        only: cli.only,
        max_offered: cli.max_offered,
        ordered: ordered::Shape {
            versions: cli.ordered_versions,
            ..if cli.quick { ordered::Shape::QUICK } else { ordered::Shape::FULL }
        },
        soak: plan::SoakShape {
            stage: soak_minutes(cli.soak_minutes),
            hold: soak_minutes(cli.soak_hold_minutes.unwrap_or(cli.soak_minutes)),
            rate: cli.soak_rate,
        },
    };
    let figures = match run::run(&plan).await {
        Ok(figures) => figures,
        Err(e) => return startup::fail("idempost-bench", e),
    };
    let table = figures.table();
    println!("\n{table}");
    let json = serde_json::to_string_pretty(&figures.json()).unwrap_or_default();
    let written = std::fs::write(plan.out_dir.join("bench.txt"), &table)
        .and_then(|()| std::fs::write(plan.out_dir.join("bench.json"), json));
    if let Err(e) = written {
        return startup::fail("idempost-bench", format!("cannot write the results: {e}"));
    }
    if let Err(e) = chart::draw(&figures, &plan.out_dir.join("bench.png")) {
        return startup::fail("idempost-bench", e);
    }
    if let Some(soak) = &figures.soak
        && let Err(e) = soak::draw(soak, &plan.out_dir.join("soak.png"))
    {
        return startup::fail("idempost-bench", e);
    }
    println!("written: {0}/bench.txt, {0}/bench.json, {0}/bench.png", plan.out_dir.display());
    ExitCode::SUCCESS
}

/// A soak stage of `minutes`, at least one sampling window long.
fn soak_minutes(minutes: f64) -> Duration {
    Duration::from_secs_f64((minutes * 60.0).max(soak::WINDOW.as_secs_f64()))
}
