use idempost_proto::EventId;

use super::ids::{RequestId, TenantId};
use super::order::{CustomerId, LineItem, NewOrder, push_lines};
use super::text::sha256_hex;
use super::violation::{FieldViolation, InvalidInput};

/// Which operation used an idempotency key; every operation of a tenant shares one key space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// SubmitOrder: version 1 of a new order.
    Submit,
    /// AmendOrder.
    Amend,
    /// CancelOrder.
    Cancel,
}

impl Operation {
    /// The spelling stored in `order_version.operation`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Submit => "SUBMIT",
            Self::Amend => "AMEND",
            Self::Cancel => "CANCEL",
        }
    }

    /// Reads a stored operation; `None` for one this version does not know.
    pub fn from_stored(text: &str) -> Option<Self> {
        [Self::Submit, Self::Amend, Self::Cancel].into_iter().find(|o| o.as_str() == text)
    }
}

/// Why an order was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// The customer asked for it.
    CustomerRequest,
    /// The goods cannot be supplied.
    OutOfStock,
    /// Payment failed or was refused.
    PaymentFailed,
    /// Suspected fraud.
    FraudSuspected,
    /// Anything else (the note says what).
    Other,
}

impl CancelReason {
    /// A stable name, used in the content fingerprint.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CustomerRequest => "CUSTOMER_REQUEST",
            Self::OutOfStock => "OUT_OF_STOCK",
            Self::PaymentFailed => "PAYMENT_FAILED",
            Self::FraudSuspected => "FRAUD_SUSPECTED",
            Self::Other => "OTHER",
        }
    }
}

/// What a change does to an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Replaces the customer and/or all lines; at least one of the two is given.
    Amend {
        /// The new customer; `None` keeps it.
        customer_id: Option<CustomerId>,
        /// The new lines and their total; `None` keeps them.
        lines: Option<(Vec<LineItem>, i64)>,
    },
    /// Cancels the order.
    Cancel {
        /// Why.
        reason: CancelReason,
        /// Free text, at most [`ChangeOrder::MAX_NOTE_CHARS`] characters.
        note: String,
    },
}

/// A request to change an existing order, keyed by `(tenant_id, request_id)` like a submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeOrder {
    /// The owning tenant.
    pub tenant_id: TenantId,
    /// The caller's idempotency key of this change, in the tenant's one key space.
    pub request_id: RequestId,
    /// The caller's event id, if it made one; otherwise the server makes one before the
    /// transaction begins.
    pub event_id: Option<EventId>,
    /// The order to change (greater than zero).
    pub order_id: i64,
    /// The version the caller read (at least 1); the change commits only at it.
    pub expected_version: i64,
    /// What the change does.
    pub change: Change,
}

/// The fields every change request carries, as received.
#[derive(Debug, Clone, Default)]
pub struct ChangeKey {
    /// `tenant_id`.
    pub tenant_id: i64,
    /// `request_id`.
    pub request_id: String,
    /// `event_id`, empty when the server is to make one.
    pub event_id: String,
    /// `order_id`.
    pub order_id: i64,
    /// `expected_version`.
    pub expected_version: i64,
}

impl ChangeOrder {
    /// The longest cancellation note, in characters.
    pub const MAX_NOTE_CHARS: usize = 512;

    /// Validates an amendment: raw lines (empty keeps them) and customer (empty keeps it), at
    /// least one of the two given. Reports every violation at once.
    pub fn amend(
        key: ChangeKey,
        customer_id: String,
        lines: Vec<(String, u32, i64)>,
    ) -> Result<Self, InvalidInput> {
        let mut violations = Vec::new();
        if customer_id.is_empty() && lines.is_empty() {
            violations.push(FieldViolation::new(
                "line_items",
                "an amendment replaces the lines and/or the customer: give at least one",
            ));
        }
        let customer_id = (!customer_id.is_empty())
            .then(|| CustomerId::parse(customer_id))
            .transpose()
            .map_err(|e| violations.push(FieldViolation::new("customer_id", e)))
            .ok()
            .flatten();
        let lines = (!lines.is_empty()).then(|| NewOrder::parse_lines(lines, &mut violations)).flatten();
        Self::parse(key, Change::Amend { customer_id, lines }, violations)
    }

    /// Validates a cancellation; `reason` is `None` when the request named none this version
    /// knows.
    pub fn cancel(key: ChangeKey, reason: Option<CancelReason>, note: String) -> Result<Self, InvalidInput> {
        let mut violations = Vec::new();
        let reason = reason
            .ok_or_else(|| violations.push(FieldViolation::new("reason", "must name a cancel reason")))
            .ok();
        if note.chars().count() > Self::MAX_NOTE_CHARS {
            violations.push(FieldViolation::new("note", "must be at most 512 characters"));
        }
        let change = Change::Cancel { reason: reason.unwrap_or(CancelReason::Other), note };
        Self::parse(key, change, violations)
    }

    /// Checks the fields every change has; `violations` holds those of the change itself.
    fn parse(
        key: ChangeKey,
        change: Change,
        mut violations: Vec<FieldViolation>,
    ) -> Result<Self, InvalidInput> {
        let tenant_id = TenantId::new(key.tenant_id)
            .map_err(|e| violations.push(FieldViolation::new("tenant_id", e)))
            .ok();
        let request_id = RequestId::parse(key.request_id)
            .map_err(|e| violations.push(FieldViolation::new("request_id", e)))
            .ok();
        let event_id = if key.event_id.is_empty() {
            None
        } else {
            EventId::parse(&key.event_id)
                .map_err(|e| violations.push(FieldViolation::new("event_id", e)))
                .ok()
        };
        if key.order_id <= 0 {
            violations.push(FieldViolation::new("order_id", "must be greater than zero"));
        }
        if key.expected_version < 1 {
            violations.push(FieldViolation::new("expected_version", "must be at least 1"));
        }
        InvalidInput::check(violations)?;
        match (tenant_id, request_id) {
            (Some(tenant_id), Some(request_id)) => Ok(Self {
                tenant_id,
                request_id,
                event_id,
                order_id: key.order_id,
                expected_version: key.expected_version,
                change,
            }),
            // Unreachable: every `None` above pushed a violation.
            _ => Err(InvalidInput { violations: vec![FieldViolation::new("request", "invalid")] }),
        }
    }

    /// The operation this change is.
    pub fn operation(&self) -> Operation {
        match self.change {
            Change::Amend { .. } => Operation::Amend,
            Change::Cancel { .. } => Operation::Cancel,
        }
    }

    /// The version the change makes.
    pub fn new_version(&self) -> i64 {
        self.expected_version + 1
    }

    /// SHA-256 (lower-case hex) of everything the caller decided: the operation, the order, the
    /// expected version and the change, but not the key or the event id. Two requests under one
    /// key are the same change exactly when their fingerprints are equal.
    ///
    /// Hashed as text with one field per line: every field is a number or visible ASCII except
    /// the note, which comes last, so no two changes share a text.
    pub fn fingerprint(&self) -> String {
        let mut text =
            format!("{}\n{}\n{}\n", self.operation().as_str(), self.order_id, self.expected_version);
        match &self.change {
            Change::Amend { customer_id, lines } => {
                // "-" stands for "keep the customer". A customer id that is itself "-" is written
                // with a leading space, which no customer id can hold (visible ASCII only): the two
                // must differ, and every other fingerprint stays as it was before this rule, so
                // replays of changes committed before it still match.
                text.push_str(match customer_id.as_ref().map(CustomerId::as_str) {
                    None => "-",
                    Some("-") => " -",
                    Some(customer_id) => customer_id,
                });
                text.push('\n');
                match lines {
                    None => text.push_str("-\n"),
                    Some((lines, _)) => push_lines(&mut text, lines),
                }
            }
            Change::Cancel { reason, note } => {
                text.push_str(reason.as_str());
                text.push('\n');
                text.push_str(note);
            }
        }
        sha256_hex(&text)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key(request_id: &str) -> ChangeKey {
        ChangeKey {
            tenant_id: 7,
            request_id: request_id.into(),
            order_id: 3,
            expected_version: 1,
            ..Default::default()
        }
    }

    fn fields(result: Result<ChangeOrder, InvalidInput>) -> Vec<String> {
        result.err().map(|e| e.violations.into_iter().map(|v| v.field).collect()).unwrap_or_default()
    }

    #[test]
    fn an_amendment_needs_lines_or_a_customer_and_keeps_what_it_does_not_name() {
        assert_eq!(fields(ChangeOrder::amend(key("a"), String::new(), Vec::new())), ["line_items"]);
        let amend = ChangeOrder::amend(key("a"), "c-2".into(), Vec::new()).unwrap();
        assert_eq!(
            amend.change,
            Change::Amend { customer_id: Some(CustomerId::parse("c-2").unwrap()), lines: None }
        );
        let amend = ChangeOrder::amend(key("a"), String::new(), vec![("S".into(), 2, 5)]).unwrap();
        assert_eq!(amend.new_version(), 2);
        let Change::Amend { customer_id: None, lines: Some((lines, total)) } = amend.change else {
            panic!("{amend:?}");
        };
        assert_eq!((lines.len(), total), (1, 10));
    }

    #[test]
    fn every_bad_field_of_a_change_is_named() {
        let bad = ChangeKey {
            tenant_id: 0,
            request_id: String::new(),
            event_id: "x".into(),
            order_id: 0,
            expected_version: 0,
        };
        assert_eq!(
            fields(ChangeOrder::amend(bad.clone(), " ".into(), vec![("".into(), 0, 1)])),
            [
                "customer_id",
                "line_items[0].sku",
                "line_items[0].quantity",
                "tenant_id",
                "request_id",
                "event_id",
                "order_id",
                "expected_version"
            ]
        );
        assert_eq!(fields(ChangeOrder::cancel(key("c"), None, "n".repeat(513))), ["reason", "note"]);
        assert!(ChangeOrder::cancel(key("c"), Some(CancelReason::Other), "é".repeat(512)).is_ok());
    }

    #[test]
    fn the_fingerprint_covers_the_change_and_the_expected_version_but_not_the_ids() {
        let cancel = |request_id: &str, expected_version: i64, note: &str| {
            let key = ChangeKey { expected_version, event_id: EventId::new().to_string(), ..key(request_id) };
            ChangeOrder::cancel(key, Some(CancelReason::OutOfStock), note.into()).unwrap().fingerprint()
        };
        assert_eq!(cancel("a", 1, "n"), cancel("b", 1, "n"));
        assert_ne!(cancel("a", 1, "n"), cancel("a", 2, "n"));
        assert_ne!(cancel("a", 1, "n"), cancel("a", 1, "m"));
        assert_eq!(cancel("a", 1, "n").len(), 64);
        let amend = |customer: &str, lines: Vec<(String, u32, i64)>| {
            ChangeOrder::amend(key("a"), customer.into(), lines).unwrap().fingerprint()
        };
        assert_ne!(amend("c", Vec::new()), amend("", vec![("c".into(), 1, 1)]));
        assert_ne!(amend("", vec![("S".into(), 1, 2)]), amend("", vec![("S".into(), 2, 1)]));
        let line = || vec![("S".to_owned(), 1, 2)];
        assert_ne!(amend("-", line()), amend("", line()), "a customer named - is not keep-the-customer");
    }

    #[test]
    fn the_stored_operation_reads_back() {
        for op in [Operation::Submit, Operation::Amend, Operation::Cancel] {
            assert_eq!(Operation::from_stored(op.as_str()), Some(op));
        }
        assert_eq!(Operation::from_stored("submit"), None);
    }
}
