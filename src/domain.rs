//! Order facts as Outpost accepts them: checked once at the edge, trusted everywhere after.
//!
//! Every constructor here validates; a value of one of these types is valid by construction.

mod change;
mod ids;
mod order;
mod outbox_status;
mod violation;

pub(crate) use change::{CancelReason, Change, ChangeKey, ChangeOrder, Operation};
pub(crate) use ids::{RequestId, TenantId};
pub(crate) use order::{CustomerId, LineItem, NewOrder, OrderStatus, Sku, SubmitOrder};
pub use outbox_status::OutboxStatus;
pub(crate) use violation::{FieldViolation, InvalidInput};

/// `true` when `text` is 1 to `max` visible ASCII characters (0x21 to 0x7E).
fn is_visible_ascii(text: &str, max: usize) -> bool {
    !text.is_empty() && text.len() <= max && text.bytes().all(|b| b.is_ascii_graphic())
}

/// SHA-256 of `text` in lower-case hex: the fingerprint of a request's content.
fn sha256_hex(text: &str) -> String {
    use sha2::{Digest as _, Sha256};
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// Appends one `sku quantity unit_price_minor` line per item: an unambiguous text, since a SKU is
/// visible ASCII without spaces.
fn push_lines(text: &mut String, lines: &[LineItem]) {
    for line in lines {
        text.push_str(&format!("{} {} {}\n", line.sku.as_str(), line.quantity, line.unit_price_minor));
    }
}
