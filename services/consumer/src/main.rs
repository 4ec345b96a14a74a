//! `idempost-consumer`: one notification job per OrderAccepted event. Loads settings, starts
//! telemetry, consumes until SIGTERM.

use std::process::ExitCode;

use idempost::{failpoint, shutdown, startup, telemetry};
use idempost_consumer::{Application, Settings};

#[tokio::main]
async fn main() -> ExitCode {
    let mut signals = shutdown::Signals::install();
    let settings: Settings = startup::settings();
    let telemetry = telemetry::init_scraped("idempost-consumer", settings.metrics_listen.is_some());
    if let Err(refused) = failpoint::arm_from_env() {
        telemetry.shutdown();
        return startup::fail("idempost-consumer", refused);
    }
    let outcome = match signals.unless_stopped(Application::build(settings)).await {
        // Stopped while starting: nothing was taken, so there is nothing to drain.
        None => Ok(()),
        Some(built) => async { built?.run_until_stopped(signals.recv()).await }.await,
    };
    telemetry.shutdown();
    startup::exit("idempost-consumer", outcome)
}
