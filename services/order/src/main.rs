//! `outpost-order`: the order service. Loads settings, starts telemetry, serves until SIGTERM.

use std::process::ExitCode;

use outpost::order::{Application, Settings};
use outpost::{failpoint, shutdown, startup, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let settings: Settings = startup::settings();
    telemetry::init();
    failpoint::arm_from_env();
    let app = match Application::build(settings).await {
        Ok(app) => app,
        Err(e) => return startup::fail("outpost-order", e),
    };
    match app.run_until_stopped(shutdown::signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => startup::fail("outpost-order", e),
    }
}
