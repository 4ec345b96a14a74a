//! `outpost-order`: the order service. Loads settings, starts telemetry, serves until SIGTERM.

use std::process::ExitCode;

use outpost::order::{Application, Settings};
use outpost::{failpoint, shutdown, startup, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let settings: Settings = startup::settings();
    let telemetry = telemetry::init("outpost-order");
    failpoint::arm_from_env();
    let outcome =
        async { Application::build(settings).await?.run_until_stopped(shutdown::signal()).await }.await;
    telemetry.shutdown();
    startup::exit("outpost-order", outcome)
}
