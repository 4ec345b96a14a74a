//! The evidence report, written as YAML in the shape of the design article's section 5.

use std::fmt::Write as _;

/// Versions of everything the experiment ran against.
#[derive(Debug, Clone, Default)]
pub struct Versions {
    /// Outpost's version.
    pub application: String,
    /// Database server version and driver.
    pub database_and_driver: String,
    /// Broker address and client library version.
    pub broker_and_client: String,
}

/// The event the experiment followed through every window.
#[derive(Debug, Clone, Default)]
pub struct EventFacts {
    /// `(tenant_id, request_id)` as `tenant/request`.
    pub request_id: String,
    /// The stable event id.
    pub event_id: String,
    /// The order id, once known.
    pub order_id: i64,
    /// The event's type and version.
    pub event_type_and_version: String,
}

/// One injected fault: where, what should happen, and what was seen.
#[derive(Debug, Clone, Default)]
pub struct Injection {
    /// The failpoint's name.
    pub point: &'static str,
    /// What the guarantee says must happen.
    pub expected: &'static str,
    /// Evidence: outcomes, rows, statuses, owners, offsets.
    pub observed: Vec<(String, String)>,
}

/// Counts for the followed event.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    /// Orders holding the request's key.
    pub committed_orders: u64,
    /// Outbox rows of the event by status.
    pub outbox_events_by_status: Vec<(String, u64)>,
    /// Records of the event on the topic, counted by consuming it.
    pub broker_deliveries_for_event: u64,
    /// Times a consumer handled a delivery of the event (commits, dedup hits, failures).
    pub consumer_handle_attempts: u64,
    /// consumed_event rows of the event.
    pub consumed_event_rows: u64,
    /// notification_job rows of the event.
    pub notification_jobs: u64,
}

/// One invariant's verdict, with the reason behind it.
#[derive(Debug, Clone)]
pub struct Invariant {
    /// The invariant's name.
    pub name: &'static str,
    /// Whether it held.
    pub pass: bool,
    /// The evidence the verdict rests on.
    pub because: String,
}

/// The whole report.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Unique per run.
    pub experiment_id: String,
    /// What ran.
    pub versions: Versions,
    /// The followed event.
    pub event: EventFacts,
    /// One entry per commit window.
    pub injections: Vec<Injection>,
    /// Counts for the event.
    pub counts: Counts,
    /// The verdicts.
    pub invariants: Vec<Invariant>,
    /// Invariants whose path the run did not take (say, a late mark that never ran because the
    /// late publish before it timed out): their verdict proves nothing, so the run does not pass.
    pub not_taken: Vec<&'static str>,
}

impl Report {
    /// True when every invariant held.
    /// True when every invariant held and every one had its path taken.
    pub fn passed(&self) -> bool {
        !self.invariants.is_empty() && self.invariants.iter().all(|i| i.pass) && self.not_taken.is_empty()
    }

    /// The verdict of the invariant called `name`, if it was checked: `None` too when the run
    /// did not take its path.
    pub fn invariant(&self, name: &str) -> Option<bool> {
        if self.not_taken.contains(&name) {
            return None;
        }
        self.invariants.iter().find(|i| i.name == name).map(|i| i.pass)
    }

    /// The report as YAML. Every string is written as a double-quoted scalar (JSON string
    /// syntax, which YAML accepts), so no value can break the document.
    pub fn to_yaml(&self) -> String {
        let q = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
        let mut y = String::new();
        let _ = writeln!(y, "repeatableDeliveryVerification:");
        let _ = writeln!(y, "  experimentId: {}", q(&self.experiment_id));
        let _ = writeln!(y, "  versions:");
        let _ = writeln!(y, "    application: {}", q(&self.versions.application));
        let _ = writeln!(y, "    mysqlAndDriver: {}", q(&self.versions.database_and_driver));
        let _ = writeln!(y, "    brokerAndClient: {}", q(&self.versions.broker_and_client));
        let _ = writeln!(y, "  event:");
        let _ = writeln!(y, "    requestId: {}", q(&self.event.request_id));
        let _ = writeln!(y, "    eventId: {}", q(&self.event.event_id));
        let _ = writeln!(y, "    orderId: {}", self.event.order_id);
        let _ = writeln!(y, "    eventTypeAndVersion: {}", q(&self.event.event_type_and_version));
        let _ = writeln!(y, "  injections:");
        for injection in &self.injections {
            let _ = writeln!(y, "    - point: {}", injection.point);
            let _ = writeln!(y, "      expected: {}", q(injection.expected));
            let _ = writeln!(y, "      observed:");
            for (key, value) in &injection.observed {
                let _ = writeln!(y, "        {key}: {}", q(value));
            }
        }
        let c = &self.counts;
        let _ = writeln!(y, "  counts:");
        let _ = writeln!(y, "    committedOrders: {}", c.committed_orders);
        let _ = writeln!(y, "    outboxEventsByStatus:");
        for (status, n) in &c.outbox_events_by_status {
            let _ = writeln!(y, "      {status}: {n}");
        }
        let _ = writeln!(y, "    brokerDeliveriesForEvent: {}", c.broker_deliveries_for_event);
        let _ = writeln!(y, "    consumerHandleAttempts: {}", c.consumer_handle_attempts);
        let _ = writeln!(y, "    consumedEventRows: {}", c.consumed_event_rows);
        let _ = writeln!(y, "    notificationJobs: {}", c.notification_jobs);
        let _ = writeln!(y, "  invariants:");
        for invariant in &self.invariants {
            let verdict = match invariant.pass {
                _ if self.not_taken.contains(&invariant.name) => "NOT_TAKEN",
                true => "PASS",
                false => "FAIL",
            };
            let _ =
                writeln!(y, "    {}: {verdict}  # {}", invariant.name, invariant.because.replace('\n', " "));
        }
        y
    }
}

#[cfg(test)]
mod tests {
    use super::{Invariant, Report};

    fn held(name: &'static str) -> Invariant {
        Invariant { name, pass: true, because: String::new() }
    }

    #[test]
    fn an_invariant_whose_path_was_not_taken_is_not_a_pass() {
        let mut report = Report { invariants: vec![held("a"), held("b")], ..Report::default() };
        assert!(report.passed());
        report.not_taken.push("b");
        assert!(!report.passed(), "a run that did not take a path proves nothing about it");
        assert_eq!((report.invariant("a"), report.invariant("b")), (Some(true), None));
        assert!(report.to_yaml().contains("    b: NOT_TAKEN  #"), "{}", report.to_yaml());
    }
}
