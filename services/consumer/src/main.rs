//! `outpost-consumer`: one notification job per OrderAccepted event. Loads settings, starts
//! telemetry, consumes until SIGTERM.

use std::process::ExitCode;

use outpost::consumer::{Application, Settings};
use outpost::{failpoint, shutdown, startup, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let settings: Settings = startup::settings();
    let telemetry = telemetry::init("outpost-consumer");
    failpoint::arm_from_env();
    let outcome =
        async { Application::build(settings).await?.run_until_stopped(shutdown::signal()).await }.await;
    telemetry.shutdown();
    startup::exit("outpost-consumer", outcome)
}
