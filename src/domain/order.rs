use std::str::FromStr;

use idempost_proto::EventId;
use iso_currency::Currency;

use super::ids::{RequestId, TenantId};
use super::text::{is_visible_ascii, sha256_hex};
use super::violation::{FieldViolation, InvalidInput};

/// Where an order is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderStatus {
    /// The order and its acceptance event committed together; amendments keep it here.
    Accepted,
    /// Cancelled: final, no change is accepted after it.
    Cancelled,
}

impl OrderStatus {
    /// The spelling stored in `orders.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "ACCEPTED",
            Self::Cancelled => "CANCELLED",
        }
    }

    /// Reads a stored status; `None` for one this version does not know.
    pub fn from_stored(text: &str) -> Option<Self> {
        [Self::Accepted, Self::Cancelled].into_iter().find(|s| s.as_str() == text)
    }
}

/// The ordering customer: 1 to 128 visible ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomerId(String);

impl CustomerId {
    /// Accepts 1 to 128 visible ASCII characters.
    pub fn parse(value: impl Into<String>) -> Result<Self, &'static str> {
        let value = value.into();
        if is_visible_ascii(&value, 128) {
            Ok(Self(value))
        } else {
            Err("must be 1 to 128 visible ASCII characters")
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A stock keeping unit: 1 to 64 visible ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sku(String);

impl Sku {
    /// Accepts 1 to 64 visible ASCII characters.
    pub fn parse(value: impl Into<String>) -> Result<Self, &'static str> {
        let value = value.into();
        if is_visible_ascii(&value, 64) {
            Ok(Self(value))
        } else {
            Err("must be 1 to 64 visible ASCII characters")
        }
    }

    /// The SKU as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One priced line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineItem {
    /// What is ordered.
    pub sku: Sku,
    /// How many units: 1 to [`LineItem::MAX_QUANTITY`].
    pub quantity: u32,
    /// Price of one unit in minor units: 1 to [`LineItem::MAX_UNIT_PRICE_MINOR`].
    pub unit_price_minor: i64,
}

impl LineItem {
    /// The most units one line may order.
    pub const MAX_QUANTITY: u32 = 10_000;
    /// The highest unit price, in minor units.
    pub const MAX_UNIT_PRICE_MINOR: i64 = 1_000_000_000_000;
}

/// Appends one `sku quantity unit_price_minor` line per item: an unambiguous text, since a SKU is
/// visible ASCII without spaces.
pub(super) fn push_lines(text: &mut String, lines: &[LineItem]) {
    for line in lines {
        text.push_str(&format!("{} {} {}\n", line.sku.as_str(), line.quantity, line.unit_price_minor));
    }
}

/// An order's facts as submitted, validated and totalled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOrder {
    customer_id: CustomerId,
    currency: String,
    lines: Vec<LineItem>,
    total_minor: i64,
}

impl NewOrder {
    /// The most lines one order may have.
    pub const MAX_LINES: usize = 100;

    /// Validates raw facts, collecting every violation under the caller's field names.
    ///
    /// `lines` holds raw `(sku, quantity, unit_price_minor)` triples.
    pub fn parse(
        customer_id: String,
        currency: String,
        lines: Vec<(String, u32, i64)>,
        violations: &mut Vec<FieldViolation>,
    ) -> Option<Self> {
        let customer_id = CustomerId::parse(customer_id)
            .map_err(|e| violations.push(FieldViolation::new("customer_id", e)))
            .ok();
        let currency_ok = currency.len() == 3
            && currency.bytes().all(|b| b.is_ascii_uppercase())
            && Currency::from_str(&currency).is_ok();
        if !currency_ok {
            violations.push(FieldViolation::new(
                "currency",
                "must be an ISO 4217 alphabetic code in upper case, such as EUR",
            ));
        }
        let lines = Self::parse_lines(lines, violations);
        if !violations.is_empty() {
            return None;
        }
        let (lines, total_minor) = lines?;
        Some(Self { customer_id: customer_id?, currency, lines, total_minor })
    }

    /// Validates 1 to [`Self::MAX_LINES`] raw `(sku, quantity, unit_price_minor)` lines under the
    /// field `line_items`, and totals them. `None` when any violation was recorded.
    pub fn parse_lines(
        lines: Vec<(String, u32, i64)>,
        violations: &mut Vec<FieldViolation>,
    ) -> Option<(Vec<LineItem>, i64)> {
        let before_all = violations.len();
        if lines.is_empty() || lines.len() > Self::MAX_LINES {
            violations.push(FieldViolation::new("line_items", "must hold 1 to 100 items"));
        }
        let mut items = Vec::with_capacity(lines.len().min(Self::MAX_LINES));
        // 100 lines x 10^4 units x 10^12 minor units stays below 10^18 < 2^63: no overflow.
        let mut total: i64 = 0;
        for (i, (sku, quantity, unit_price_minor)) in lines.into_iter().enumerate().take(Self::MAX_LINES) {
            let before = violations.len();
            let sku = Sku::parse(sku)
                .map_err(|e| violations.push(FieldViolation::new(format!("line_items[{i}].sku"), e)))
                .ok();
            if !(1..=LineItem::MAX_QUANTITY).contains(&quantity) {
                violations
                    .push(FieldViolation::new(format!("line_items[{i}].quantity"), "must be 1 to 10000"));
            }
            if !(1..=LineItem::MAX_UNIT_PRICE_MINOR).contains(&unit_price_minor) {
                violations.push(FieldViolation::new(
                    format!("line_items[{i}].unit_price_minor"),
                    "must be 1 to 1000000000000",
                ));
            }
            if let (Some(sku), true) = (sku, violations.len() == before) {
                total += unit_price_minor * i64::from(quantity);
                items.push(LineItem { sku, quantity, unit_price_minor });
            }
        }
        (violations.len() == before_all).then_some((items, total))
    }

    /// Rebuilds an order from stored facts, which were validated when they were accepted.
    pub fn from_stored(
        customer_id: CustomerId,
        currency: String,
        lines: Vec<LineItem>,
        total_minor: i64,
    ) -> Self {
        Self { customer_id, currency, lines, total_minor }
    }

    /// The ordering customer.
    pub fn customer_id(&self) -> &CustomerId {
        &self.customer_id
    }

    /// The ISO 4217 currency code.
    pub fn currency(&self) -> &str {
        &self.currency
    }

    /// The lines in the order submitted.
    pub fn lines(&self) -> &[LineItem] {
        &self.lines
    }

    /// Sum of quantity times unit price over all lines, in minor units.
    pub fn total_minor(&self) -> i64 {
        self.total_minor
    }

    /// SHA-256 (lower-case hex) of the facts as submitted: kept with the order's first version,
    /// so that a resubmission is still told from a reused key once amendments changed the
    /// order.
    pub fn fingerprint(&self) -> String {
        let mut text = format!("SUBMIT\n{}\n{}\n", self.customer_id.as_str(), self.currency);
        push_lines(&mut text, &self.lines);
        sha256_hex(&text)
    }
}

/// A request to accept an order, keyed by `(tenant_id, request_id)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitOrder {
    /// The owning tenant.
    pub tenant_id: TenantId,
    /// The caller's idempotency key within the tenant.
    pub request_id: RequestId,
    /// The caller's event id, if it made one; otherwise the server makes one before the
    /// transaction begins.
    pub event_id: Option<EventId>,
    /// The order's facts.
    pub order: NewOrder,
}

impl SubmitOrder {
    /// Validates every field, reporting all violations at once.
    pub fn parse(
        tenant_id: i64,
        request_id: String,
        event_id: &str,
        customer_id: String,
        currency: String,
        lines: Vec<(String, u32, i64)>,
    ) -> Result<Self, InvalidInput> {
        let mut violations = Vec::new();
        let tenant_id =
            TenantId::new(tenant_id).map_err(|e| violations.push(FieldViolation::new("tenant_id", e))).ok();
        let request_id = RequestId::parse(request_id)
            .map_err(|e| violations.push(FieldViolation::new("request_id", e)))
            .ok();
        let event_id = if event_id.is_empty() {
            None
        } else {
            EventId::parse(event_id).map_err(|e| violations.push(FieldViolation::new("event_id", e))).ok()
        };
        let order = NewOrder::parse(customer_id, currency, lines, &mut violations);
        InvalidInput::check(violations)?;
        match (tenant_id, request_id, order) {
            (Some(tenant_id), Some(request_id), Some(order)) => {
                Ok(Self { tenant_id, request_id, event_id, order })
            }
            // Unreachable: every `None` above pushed a violation.
            _ => Err(InvalidInput { violations: vec![FieldViolation::new("request", "invalid")] }),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn line(sku: &str, quantity: u32, unit_price_minor: i64) -> (String, u32, i64) {
        (sku.to_owned(), quantity, unit_price_minor)
    }

    fn submit(currency: &str, lines: Vec<(String, u32, i64)>) -> Result<SubmitOrder, InvalidInput> {
        let event_id = EventId::new().to_string();
        SubmitOrder::parse(7, "req-1".into(), &event_id, "customer-42".into(), currency.into(), lines)
    }

    fn fields(result: Result<SubmitOrder, InvalidInput>) -> Vec<String> {
        result.err().map(|e| e.violations.into_iter().map(|v| v.field).collect()).unwrap_or_default()
    }

    #[test]
    fn a_valid_order_keeps_its_lines_and_totals_them() {
        let order = submit("EUR", vec![line("SKU-RED-MUG", 2, 1_250), line("SKU-TEA", 1, 799)]).unwrap();
        assert_eq!(order.tenant_id.get(), 7);
        assert_eq!(order.order.total_minor(), 3_299);
        assert_eq!(order.order.lines().len(), 2);
        assert_eq!(order.order.currency(), "EUR");
        assert!(order.event_id.is_some());
    }

    #[test]
    fn an_empty_event_id_means_the_server_makes_one() {
        let order =
            SubmitOrder::parse(7, "req-1".into(), "", "c".into(), "EUR".into(), vec![line("S", 1, 1)])
                .unwrap();
        assert_eq!(order.event_id, None);
    }

    #[test]
    fn the_currency_is_an_upper_case_iso_4217_code() {
        assert!(submit("USD", vec![line("S", 1, 1)]).is_ok());
        for bad in ["eur", "EURO", "XYZ", "", "E1R"] {
            assert_eq!(fields(submit(bad, vec![line("S", 1, 1)])), ["currency"], "{bad:?}");
        }
    }

    #[test]
    fn line_limits_are_inclusive() {
        let max = line("S", LineItem::MAX_QUANTITY, LineItem::MAX_UNIT_PRICE_MINOR);
        let order = submit("EUR", vec![max; NewOrder::MAX_LINES]).unwrap();
        // 100 × 10^4 × 10^12 fits in an i64: the documented bound holds without overflow.
        assert_eq!(order.order.total_minor(), 1_000_000_000_000_000_000);
        assert_eq!(fields(submit("EUR", vec![line("S", 1, 1); NewOrder::MAX_LINES + 1])), ["line_items"]);
        assert_eq!(fields(submit("EUR", Vec::new())), ["line_items"]);
    }

    #[test]
    fn every_bad_field_is_named_with_its_line() {
        let lines = vec![
            line("OK", 1, 1),
            line("", 0, 0),
            line("S", LineItem::MAX_QUANTITY + 1, LineItem::MAX_UNIT_PRICE_MINOR + 1),
        ];
        let result = SubmitOrder::parse(0, String::new(), "NOT-A-UUID", " ".into(), "eur".into(), lines);
        assert_eq!(
            fields(result),
            [
                "tenant_id",
                "request_id",
                "event_id",
                "customer_id",
                "currency",
                "line_items[1].sku",
                "line_items[1].quantity",
                "line_items[1].unit_price_minor",
                "line_items[2].quantity",
                "line_items[2].unit_price_minor",
            ]
        );
    }

    #[test]
    fn a_negative_price_is_refused() {
        assert_eq!(fields(submit("EUR", vec![line("S", 1, -5)])), ["line_items[0].unit_price_minor"]);
    }

    #[test]
    fn the_stored_status_reads_back() {
        assert_eq!(OrderStatus::from_stored(OrderStatus::Accepted.as_str()), Some(OrderStatus::Accepted));
        assert_eq!(OrderStatus::from_stored(OrderStatus::Cancelled.as_str()), Some(OrderStatus::Cancelled));
        assert_eq!(OrderStatus::from_stored("accepted"), None);
    }
}
