//! Opening the outbox as the relay uses it.

use idempost::db;
use idempost::service::{self, ReadyError};

use super::Outbox;

/// The outbox at `url` (which must be migrated) as the relay uses it, on a pool set up for it
/// ([`db::Pool::Relay`]): on PostgreSQL each claim and mark is planned for the outbox as it is
/// now, so a plan made while the table was nearly empty never scans the grown table; on
/// MariaDB/MySQL the sessions run at READ COMMITTED from the start.
pub async fn open_outbox(url: &str, max_connections: u32) -> Result<Outbox, ReadyError> {
    Ok(Outbox::on_relay_pool(service::open_database_for(url, max_connections, db::Pool::Relay).await?))
}
