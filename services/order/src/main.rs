//! `idempost-order`: the order service. Loads settings, starts telemetry, serves until SIGTERM.

use std::process::ExitCode;

use idempost::{failpoint, shutdown, startup, telemetry};
use idempost_order::{Application, Settings};

#[tokio::main]
async fn main() -> ExitCode {
    let mut signals = shutdown::Signals::install();
    let settings: Settings = startup::settings();
    let telemetry = telemetry::init_scraped("idempost-order", settings.metrics_listen.is_some());
    if let Err(refused) = failpoint::arm_from_env() {
        telemetry.shutdown();
        return startup::fail("idempost-order", refused);
    }
    // Both futures are boxed: nested inline, their state machines (every shard's pools, the
    // listeners, the reload task) are deeper than a release build computes a layout through.
    let outcome = match signals.unless_stopped(Box::pin(Application::build(settings))).await {
        // Stopped while starting: nothing was taken, so there is nothing to drain.
        None => Ok(()),
        Some(built) => async { Box::pin(built?.run_until_stopped(signals.recv())).await }.await,
    };
    telemetry.shutdown();
    startup::exit("idempost-order", outcome)
}
