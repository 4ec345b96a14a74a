//! Order facts as Outpost accepts them: checked once at the edge, trusted everywhere after.
//!
//! Every constructor here validates; a value of one of these types is valid by construction.

mod ids;
mod order;
mod outbox;
mod violation;

pub use ids::{EventId, RequestId, TenantId};
pub use order::{CustomerId, LineItem, NewOrder, OrderStatus, Sku, SubmitOrder};
pub use outbox::OutboxStatus;
pub use violation::{FieldViolation, InvalidInput};

/// `true` when `text` is 1 to `max` visible ASCII characters (0x21 to 0x7E).
fn is_visible_ascii(text: &str, max: usize) -> bool {
    !text.is_empty() && text.len() <= max && text.bytes().all(|b| b.is_ascii_graphic())
}
