//! Order facts as Idempost accepts them: checked once at the edge, trusted everywhere after.
//!
//! Every constructor here validates; a value of one of these types is valid by construction.

mod change;
mod ids;
mod order;
mod outbox_status;
mod text;
mod violation;

pub(crate) use change::{CancelReason, Change, ChangeKey, ChangeOrder, Operation};
pub(crate) use ids::{RequestId, TenantId};
pub(crate) use order::{CustomerId, LineItem, NewOrder, OrderStatus, Sku, SubmitOrder};
pub use outbox_status::OutboxStatus;
pub(crate) use violation::{FieldViolation, InvalidInput};
