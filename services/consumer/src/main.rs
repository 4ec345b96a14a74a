//! `outpost-consumer`: one notification job per OrderAccepted event. Loads settings, starts
//! telemetry, consumes until SIGTERM.

use std::process::ExitCode;

use outpost::consumer::{Application, Settings};
use outpost::{failpoint, shutdown, startup, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let settings: Settings = startup::settings();
    telemetry::init();
    failpoint::arm_from_env();
    let app = match Application::build(settings).await {
        Ok(app) => app,
        Err(e) => return startup::fail("outpost-consumer", e),
    };
    match app.run_until_stopped(shutdown::signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => startup::fail("outpost-consumer", e),
    }
}
