//! The evidence report, written as YAML in the shape of the design article's section 5.

use serde::{Serialize, Serializer};

/// Versions of everything the experiment ran against.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Versions {
    /// Idempost's version.
    pub application: String,
    /// Database server version and driver.
    #[serde(rename = "mysqlAndDriver")]
    pub database_and_driver: String,
    /// Broker address and client library version.
    pub broker_and_client: String,
}

/// The event the experiment followed through every window.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
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
#[derive(Debug, Clone, Default, Serialize)]
pub struct Injection {
    /// The failpoint's name.
    pub point: &'static str,
    /// What the guarantee says must happen.
    pub expected: &'static str,
    /// Evidence: outcomes, rows, statuses, owners, offsets.
    #[serde(serialize_with = "in_order")]
    pub observed: Vec<(String, String)>,
}

/// Counts for the followed event.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// Orders holding the request's key.
    pub committed_orders: u64,
    /// Outbox rows of the event by status.
    #[serde(serialize_with = "in_order")]
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

    /// The report as YAML: the invariants' verdicts under `invariants`, and the evidence
    /// behind each under `reasons`.
    pub fn to_yaml(&self) -> String {
        let document = Document { repeatable_delivery_verification: Body::from(self) };
        // Only strings, numbers, sequences and maps with string keys: nothing YAML cannot hold.
        serde_norway::to_string(&document)
            .unwrap_or_else(|e| format!("# the report cannot be written: {e}\n"))
    }
}

/// The YAML document: one key around the report.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Document<'a> {
    repeatable_delivery_verification: Body<'a>,
}

/// The report in the document's order and names.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    experiment_id: &'a str,
    versions: &'a Versions,
    event: &'a EventFacts,
    injections: &'a [Injection],
    counts: &'a Counts,
    #[serde(serialize_with = "in_order")]
    invariants: Vec<(&'static str, &'static str)>,
    #[serde(serialize_with = "in_order")]
    reasons: Vec<(&'static str, &'a str)>,
}

impl<'a> From<&'a Report> for Body<'a> {
    fn from(report: &'a Report) -> Self {
        let verdict = |i: &Invariant| match i.pass {
            _ if report.not_taken.contains(&i.name) => "NOT_TAKEN",
            true => "PASS",
            false => "FAIL",
        };
        Self {
            experiment_id: &report.experiment_id,
            versions: &report.versions,
            event: &report.event,
            injections: &report.injections,
            counts: &report.counts,
            invariants: report.invariants.iter().map(|i| (i.name, verdict(i))).collect(),
            reasons: report.invariants.iter().map(|i| (i.name, i.because.as_str())).collect(),
        }
    }
}

/// Pairs as a YAML map, in the order they were recorded.
fn in_order<S, K, V>(pairs: &[(K, V)], serializer: S) -> Result<S::Ok, S::Error>
where
    S: Serializer,
    K: Serialize,
    V: Serialize,
{
    serializer.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_yaml_report_keeps_the_shape_and_every_value_reads_back_as_written() {
        let report = Report {
            experiment_id: "e1".to_owned(),
            event: EventFacts { order_id: 2, request_id: "1/r: #x".to_owned(), ..EventFacts::default() },
            injections: vec![Injection {
                point: "AFTER_COMMIT_BEFORE_RELAY_CLAIM",
                expected: "PENDING",
                observed: vec![
                    ("zeroRows".to_owned(), "0".to_owned()),
                    ("aText".to_owned(), "line\nbreak".to_owned()),
                ],
            }],
            counts: Counts {
                outbox_events_by_status: vec![("PUBLISHED".to_owned(), 1)],
                ..Counts::default()
            },
            invariants: vec![Invariant {
                name: "staleLeaseOwnerChangesNothing",
                pass: false,
                because: "x: y".to_owned(),
            }],
            ..Report::default()
        };
        let yaml = report.to_yaml();
        assert!(yaml.starts_with("repeatableDeliveryVerification:\n"), "{yaml}");
        assert!(yaml.contains("staleLeaseOwnerChangesNothing: FAIL"), "{yaml}");
        let read: serde_norway::Value = serde_norway::from_str(&yaml).unwrap();
        let body = &read["repeatableDeliveryVerification"];
        assert_eq!(body["event"]["orderId"].as_u64(), Some(2));
        assert_eq!(body["event"]["requestId"].as_str(), Some("1/r: #x"));
        assert_eq!(body["versions"]["mysqlAndDriver"].as_str(), Some(""));
        let observed = &body["injections"][0]["observed"];
        assert_eq!(observed["zeroRows"].as_str(), Some("0"));
        assert_eq!(observed["aText"].as_str(), Some("line\nbreak"));
        assert_eq!(body["counts"]["outboxEventsByStatus"]["PUBLISHED"].as_u64(), Some(1));
        assert_eq!(body["reasons"]["staleLeaseOwnerChangesNothing"].as_str(), Some("x: y"));
        // Recorded order, not sorted: the windows read in the order they happen.
        assert!(yaml.find("zeroRows:").unwrap() < yaml.find("aText:").unwrap(), "{yaml}");
    }

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
        assert!(report.to_yaml().contains("  b: NOT_TAKEN\n"), "{}", report.to_yaml());
    }
}
