//! Order facts as Idempost accepts them: checked once at the edge, trusted everywhere after.
//!
//! Every constructor here validates; a value of one of these types is valid by construction.

mod change;
mod ids;
mod order;
mod outbox_status;
mod text;
mod violation;

pub use change::{CancelReason, Change, ChangeKey, ChangeOrder, Operation};
pub use ids::{RequestId, TenantId};
pub use order::{CustomerId, LineItem, NewOrder, OrderStatus, Sku, SubmitOrder};
pub use outbox_status::OutboxStatus;
pub use violation::{FieldViolation, InvalidInput};
