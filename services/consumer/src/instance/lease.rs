//! The instance lock on a MariaDB Galera cluster: a row of `consumer_instance_lease` per locked
//! name, held under a lease read from the database's clock and renewed at every check.
//!
//! `GET_LOCK` is local to the node that grants it, so on Galera two consumers under one name
//! attached to two nodes would both hold it. A row is the cluster's: a take writes the row in a
//! transaction, and two nodes' takes of one row are certified against each other, so only one
//! commits (the other's COMMIT is refused as a deadlock, and it reads the winner next time). What
//! a row cannot do is end with the process: a SIGKILLed holder keeps the name until its lease
//! runs out, so [`LEASE`] is shorter than the wait of an instance starting under that name.

use std::time::Duration;

use sea_orm::sqlx::{self, Acquire as _, Executor as _, MySqlConnection};

/// How long a take or renewal holds the name: within the starting wait (10 s), so an instance
/// restarted right after its predecessor was killed still gets its name, and well above the
/// check interval (5 s), so a live holder renews long before it runs out.
const LEASE: Duration = Duration::from_secs(9);

/// Reads, updates and inserts of this session wait for causality: a take sees every take the
/// cluster committed before it.
const SYNC_WAIT: &str = "SET SESSION wsrep_sync_wait = 7";

/// Takes the name or extends this holder's lease: the row goes to `holder` when it is free (no
/// row), expired, or already `holder`'s. Assignments run left to right, so `lease_until` moves
/// only when `holder` is (now) this one.
const TAKE: &str = "INSERT INTO consumer_instance_lease (name, holder, lease_until) \
     VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND) \
     ON DUPLICATE KEY UPDATE \
     holder = IF(lease_until < NOW(6) OR holder = VALUES(holder), VALUES(holder), holder), \
     lease_until = IF(holder = VALUES(holder), VALUES(lease_until), lease_until)";

/// A name held under a lease, by this process's `holder` id.
pub(super) struct Lease {
    name: String,
    holder: String,
}

impl Lease {
    /// Sets `conn` up for leases and makes this process's holder id (the server's `UUID()`).
    pub(super) async fn new(conn: &mut MySqlConnection, name: String) -> Result<Self, sqlx::Error> {
        conn.execute(SYNC_WAIT).await?;
        let holder: String = sqlx::query_scalar("SELECT UUID()").fetch_one(&mut *conn).await?;
        Ok(Self { name, holder })
    }

    /// Sets a new connection (after the old one broke) up for leases.
    pub(super) async fn set_up(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
        conn.execute(SYNC_WAIT).await.map(drop)
    }

    /// Takes (or renews) the lease once: whether this holder has the name now. Losing to
    /// another node's take of the same row (a deadlock at any statement or at commit) answers
    /// `false`, as a live holder does.
    pub(super) async fn take(&self, conn: &mut MySqlConnection) -> Result<bool, sqlx::Error> {
        match self.take_once(conn).await {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("40001") => Ok(false),
            taken => taken,
        }
    }

    async fn take_once(&self, conn: &mut MySqlConnection) -> Result<bool, sqlx::Error> {
        let mut txn = conn.begin().await?;
        sqlx::query(TAKE)
            .bind(&self.name)
            .bind(&self.holder)
            .bind(i64::try_from(LEASE.as_micros()).unwrap_or(i64::MAX))
            .execute(&mut *txn)
            .await?;
        let holder: String = sqlx::query_scalar("SELECT holder FROM consumer_instance_lease WHERE name = ?")
            .bind(&self.name)
            .fetch_one(&mut *txn)
            .await?;
        txn.commit().await?;
        Ok(holder == self.holder)
    }
}
