//! `outpost-relay`: publishes outbox events to Kafka. Loads settings, starts telemetry, relays
//! until SIGTERM; `outpost-relay redrive EVENT_ID` is the operator's way out of FAILED.

use std::process::ExitCode;

use outpost::relay::{self, Application, Command, Redrive, Settings};
use outpost::{failpoint, shutdown, startup, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let settings: Settings = startup::settings();
    telemetry::init();
    failpoint::arm_from_env();
    if let Some(Command::Redrive { event_id }) = &settings.command {
        return match relay::redrive(&settings, event_id).await {
            Ok(Redrive::Redriven) => {
                println!("{event_id}: FAILED -> PENDING");
                ExitCode::SUCCESS
            }
            Ok(Redrive::NotFailed(status)) => {
                startup::fail("outpost-relay", format!("{event_id} is {}, not FAILED", status.as_str()))
            }
            Ok(Redrive::NotFound) => startup::fail("outpost-relay", format!("no outbox event {event_id}")),
            Err(e) => startup::fail("outpost-relay", e),
        };
    }
    let app = match Application::build(settings).await {
        Ok(app) => app,
        Err(e) => return startup::fail("outpost-relay", e),
    };
    match app.run_until_stopped(shutdown::signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => startup::fail("outpost-relay", e),
    }
}
