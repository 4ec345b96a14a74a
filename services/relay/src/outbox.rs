//! The relay's side of the outbox table: leased claims ([`claim`], one file per database, read
//! from where this process's claims left off: [`position`]), owner-fenced
//! marks ([`mark`]) and releases ([`release`]), the last two set-based ([`fenced_update`]).

mod claim;
mod event;
mod fenced_update;
mod mark;
mod open;
mod position;
mod release;
mod table;

pub use claim::Swept;
pub use event::{ClaimedEvent, Delivery, Fenced};
pub use open::open_outbox;
pub use position::ClaimWindow;
pub use release::{Blame, Released, RetryPolicy};
pub use table::Outbox;
