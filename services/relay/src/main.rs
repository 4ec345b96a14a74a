//! `idempost-relay`: publishes outbox events to Kafka. Loads settings, starts telemetry, relays
//! until SIGTERM; `idempost-relay redrive EVENT_ID` is the operator's way out of FAILED.

use std::process::ExitCode;

use idempost::backlog::{Redrive, RedriveAudit};
use idempost::{failpoint, shutdown, startup, telemetry};
use idempost_relay::{self as relay, Application, Command, Settings};

#[tokio::main]
async fn main() -> ExitCode {
    let mut signals = shutdown::Signals::install();
    let settings: Settings = startup::settings();
    let telemetry = telemetry::init_scraped("idempost-relay", settings.metrics_listen.is_some());
    if let Err(refused) = failpoint::arm_from_env() {
        telemetry.shutdown();
        return startup::fail("idempost-relay", refused);
    }
    // Every future main awaits is boxed: nested inline, their state machines (a fleet's shards,
    // the samplers, the control topic's consumer, a redrive over every shard) are deeper than a
    // release build computes a layout through (`queries overflow the depth limit`).
    let outcome = match &settings.command {
        Some(Command::Redrive { event_id, reason, requested_by }) => {
            let audit = RedriveAudit { requested_by: requested_by.clone(), reason: reason.clone() };
            match signals.unless_stopped(Box::pin(redrive(&settings, event_id, &audit))).await {
                Some(outcome) => outcome,
                None => Err(format!("interrupted: {event_id} may or may not have been redriven")),
            }
        }
        Some(Command::Run) | None => Box::pin(run(settings, signals)).await.map_err(|e| e.to_string()),
    };
    telemetry.shutdown();
    startup::exit("idempost-relay", outcome)
}

async fn run(settings: Settings, mut signals: shutdown::Signals) -> Result<(), relay::StartupError> {
    match signals.unless_stopped(Box::pin(Application::build(settings))).await {
        // Stopped while starting: nothing was taken, so there is nothing to drain.
        None => Ok(()),
        Some(built) => Box::pin(built?.run_until_stopped(signals.recv())).await,
    }
}

async fn redrive(settings: &Settings, event_id: &str, audit: &RedriveAudit) -> Result<(), String> {
    let found = relay::redrive(settings, event_id, audit).await.map_err(|e| e.to_string())?;
    let on = found.shard.map(|shard| format!(" (shard {shard})")).unwrap_or_default();
    match found.outcome {
        Redrive::Redriven => {
            println!("{event_id}: FAILED -> PENDING{on}");
            Ok(())
        }
        Redrive::NotFailed(status) => Err(format!("{event_id} is {}, not FAILED{on}", status.as_str())),
        Redrive::NotFound if settings.shard_map_file.is_some() => {
            Err(format!("no outbox event {event_id} on any shard of the map"))
        }
        Redrive::NotFound => Err(format!("no outbox event {event_id}")),
    }
}
