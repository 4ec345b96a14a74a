//! One locking claim at a time per database on MariaDB/MySQL.
//!
//! Why: every claim moves its rows out of the PENDING range of `idx_outbox_ready` (and every mark
//! out of PUBLISHING), which leaves delete-marked entries at the very front of the range the next
//! claim reads, until InnoDB's purge removes them. With several relays claiming at once on a
//! two-core machine, purge fell behind, every claim's locking read walked the same tens of
//! thousands of dead entries, and the walking took the CPU purge needed: more relays drained
//! slower than one. Claims taken one at a time keep purge caught up, and more relays drain
//! nearly as fast as one (figures in `docs/design/relay-lease.md`).
//!
//! The gate is a named lock (`GET_LOCK`, named after the database, so that databases on one
//! server do not share it), taken by the claim's first statement and released before its commit.
//! It only throttles and never decides anything: a claim that waited [`WAIT`] without getting it
//! claims anyway, so a relay paused inside its claim (or a lock left on a pooled connection by a
//! claim dropped half-way) costs the others that wait per claim and nothing else, and `FOR UPDATE
//! SKIP LOCKED` keeps overlapping claims disjoint exactly as without the gate. Releasing before
//! the commit lets the next claim start while this one commits; it skips this claim's rows.
//! Releasing earlier, once the locking read was done, was slower: the next claim's read then
//! overlapped this one's lease update. Each wait that runs out counts
//! in `idempost.relay.claim_gate_timeouts`.

use std::time::Duration;

use sea_orm::{ConnectionTrait as _, DatabaseTransaction, DbBackend, DbErr, Statement};

use idempost::telemetry::metrics;

/// Longest a claim waits for the gate before it claims without it. Claims queue at the gate in
/// normal running, so this is well above a normal wait (see `docs/design/relay-lease.md`), and
/// well inside the relay's publishing budget (`--delivery-timeout`, 10 s by default), which the
/// wait is part of.
pub(super) const WAIT: Duration = Duration::from_secs(2);

/// The lock's name: one per database on the server.
const NAME: &str = "CONCAT('idempost.relay.claim.', MD5(COALESCE(DATABASE(), '')))";

/// Whether this claim holds the gate; [`Gate::leave`] releases it.
#[must_use = "a gate held must be left"]
pub(super) struct Gate {
    held: bool,
}

/// Takes the gate inside `txn`, waiting at most [`WAIT`]; a claim that did not get it goes on
/// without it.
pub(super) async fn enter(txn: &DatabaseTransaction) -> Result<Gate, DbErr> {
    // 1: taken; 0: another claim held it for the whole wait; NULL (-1 here): an error.
    let sql = format!("SELECT CAST(COALESCE(GET_LOCK({NAME}, ?), -1) AS SIGNED)");
    let answer = txn
        .query_one_raw(Statement::from_sql_and_values(DbBackend::MySql, sql, [WAIT.as_secs_f64().into()]))
        .await?;
    let taken = match answer {
        Some(row) => row.try_get_by_index::<i64>(0)?,
        None => -1,
    };
    if taken != 1 {
        metrics().claim_gate_timeouts.add(1, &[]);
        tracing::debug!(taken, "claim gate not taken within {WAIT:?}; claiming without it");
    }
    Ok(Gate { held: taken == 1 })
}

impl Gate {
    /// Releases the gate if this claim took it. A release that fails is only logged: the
    /// connection is then most likely gone, which releases it too, and otherwise the other claims
    /// wait [`WAIT`] for it and go on without it.
    pub(super) async fn leave(self, txn: &DatabaseTransaction) {
        if !self.held {
            return;
        }
        let release = format!("DO RELEASE_LOCK({NAME})");
        if let Err(error) = txn.execute_unprepared(&release).await {
            tracing::warn!(%error, "could not release the claim gate; other claims go on without it after {WAIT:?}");
        }
    }
}
