//! The backlog gauges: how many events wait in each status, and how long the oldest has waited.

use tokio::sync::watch;

use super::outbox::Outbox;
use idempost::telemetry::metrics;

/// How often the backlog gauges are refreshed.
const BACKLOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Records the backlog size per status and the oldest waiting event's age until `stop`.
pub(crate) async fn report_backlog(
    outbox: Outbox,
    attributes: Vec<opentelemetry::KeyValue>,
    mut stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        match outbox.backlog().await {
            Ok(backlog) => {
                for (status, count) in &backlog.by_status {
                    let mut labels = attributes.clone();
                    labels.push(opentelemetry::KeyValue::new("idempost.outbox.status", status.as_str()));
                    metrics().outbox_backlog.record(*count, &labels);
                }
                let age = backlog.oldest_pending.map_or(0.0, |oldest| {
                    (chrono::Utc::now() - oldest).to_std().unwrap_or_default().as_secs_f64()
                });
                metrics().outbox_oldest_pending_age.record(age, &attributes);
            }
            Err(e) => tracing::debug!(error = %e, "backlog query failed"),
        }
        tokio::select! {
            () = tokio::time::sleep(BACKLOG_INTERVAL) => {}
            changed = stop.changed() => if changed.is_err() { break },
        }
    }
}

/// Sets a shard's backlog and claimable gauges to 0 once this relay no longer serves it and its
/// samplers have ended: a gauge keeps its last value for as long as the process exports it, so
/// the FAILED count or the claimable age this relay last saw would otherwise stand beside the
/// new owner's readings, and alerts that take the maximum over the fleet would keep firing
/// after the new owner saw the backlog drain or the event redriven.
pub(crate) fn given_back(attributes: &[opentelemetry::KeyValue]) {
    for status in idempost::backlog::NEEDS_ATTENTION {
        let mut labels = attributes.to_vec();
        labels.push(opentelemetry::KeyValue::new("idempost.outbox.status", status.as_str()));
        metrics().outbox_backlog.record(0, &labels);
    }
    metrics().outbox_oldest_pending_age.record(0.0, attributes);
    metrics().outbox_claimable.record(0, attributes);
    metrics().outbox_oldest_claimable_age.record(0.0, attributes);
}
