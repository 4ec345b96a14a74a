//! `idempost-verify`: injects a fault at every commit window of one event, with real service
//! processes, and writes the evidence report as YAML. Exits non-zero if any invariant fails.

use std::path::PathBuf;
use std::process::ExitCode;

use idempost::{startup, telemetry};
use idempost_verify::{self as verify, Break};

/// Proves repeatable delivery against your own database and broker.
#[derive(Debug, clap::Parser)]
#[command(name = "idempost-verify", version)]
struct Cli {
    /// A migrated database the services share (`idempost-migrate up` first). It reaches the
    /// services through their environment, never their command lines.
    #[arg(long, env = "IDEMPOST_DATABASE_URL", default_value = "", hide_default_value = true)]
    database_url: String,
    /// File holding the database URL (instead of `--database-url`).
    #[arg(long, env = "IDEMPOST_DATABASE_URL_FILE")]
    database_url_file: Option<PathBuf>,
    /// Kafka bootstrap servers.
    #[arg(long, env = "IDEMPOST_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    brokers: String,
    /// Where the service binaries (built with `--features failpoints`) are; default: beside this one.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Where the services' logs are kept as evidence.
    #[arg(long, default_value = "verify-logs")]
    work_dir: PathBuf,
    /// Write the report here instead of standard output.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Break a guarantee on purpose (classifier, mark-without-owner, offset-before-commit) to see
    /// the matching invariant fail.
    #[arg(long = "break", value_parser = Break::parse)]
    breaks: Vec<Break>,
    /// Chaos mode: submit this many orders while relays and consumers are SIGKILLed at random,
    /// then check every event id.
    #[arg(long)]
    chaos_orders: Option<usize>,
    /// How long chaos lasts.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    chaos_duration: std::time::Duration,
    /// A shell command that restarts the broker on durable storage; chaos runs it halfway.
    #[arg(long)]
    broker_restart_command: Option<String>,
    /// A shell command that restarts the database (stops it and starts it again on the same
    /// address and data); chaos runs it a quarter of the way in.
    #[arg(long)]
    db_restart_command: Option<String>,
}

/// Restarts the broker or the database by running the operator's command, if there is one.
struct Shell(Option<String>);

impl Shell {
    async fn run(&self) {
        if let Some(command) = &self.0 {
            let _ = tokio::process::Command::new("sh").arg("-c").arg(command).status().await;
        }
    }
}

impl verify::BrokerControl for Shell {
    fn restart(&mut self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(self.run())
    }
}

impl verify::DatabaseControl for Shell {
    fn restart(&mut self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(self.run())
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli: Cli = startup::settings();
    let telemetry = telemetry::init("idempost-verify");
    let bin_dir = cli.bin_dir.clone().or_else(|| {
        std::env::current_exe().ok().and_then(|exe| exe.parent().map(std::path::Path::to_path_buf))
    });
    let database_url =
        match idempost::secret::database_url(&cli.database_url, cli.database_url_file.as_deref()) {
            Ok(url) => url,
            Err(e) => return startup::fail("idempost-verify", e),
        };
    let settings = verify::Settings {
        database_url,
        brokers: cli.brokers,
        bin_dir: bin_dir.unwrap_or_default(),
        work_dir: cli.work_dir,
        breaks: cli.breaks,
    };
    if let Some(orders) = cli.chaos_orders {
        let chaos = verify::ChaosSettings { orders, duration: cli.chaos_duration };
        let mut database = cli.db_restart_command.map(|command| Shell(Some(command)));
        let database = database.as_mut().map(|shell| shell as &mut dyn verify::DatabaseControl);
        let outcome =
            verify::chaos(&settings, &chaos, &mut Shell(cli.broker_restart_command), database).await;
        telemetry.shutdown();
        return match outcome {
            Ok(report) => {
                print!("{}", report.summary());
                if report.violations.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    startup::fail("idempost-verify", "chaos found violations")
                }
            }
            Err(e) => startup::fail("idempost-verify", e),
        };
    }
    let outcome = verify::run(&settings).await;
    telemetry.shutdown();
    let report = match outcome {
        Ok(report) => report,
        Err(e) => return startup::fail("idempost-verify", e),
    };
    let yaml = report.to_yaml();
    match &cli.report {
        Some(path) => {
            if let Err(e) = std::fs::write(path, &yaml) {
                return startup::fail("idempost-verify", format!("cannot write {}: {e}", path.display()));
            }
        }
        None => print!("{yaml}"),
    }
    if report.passed() { ExitCode::SUCCESS } else { startup::fail("idempost-verify", "an invariant FAILED") }
}
