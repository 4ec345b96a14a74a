//! Owner-fenced marks: PUBLISHED after the broker's confirm, only under the claim's own token.

use std::collections::{HashMap, HashSet};

use sea_orm::{
    ColumnTrait, ConnectionTrait as _, DatabaseTransaction, DbErr, EntityTrait, QueryFilter, QuerySelect,
    TransactionTrait as _, Value,
};

use super::event::{Delivery, Fenced};
use super::fenced_update::{FENCE_COLUMNS, FencedUpdate, in_call_order, in_lock_order};
use super::table::Outbox;
use crate::lease::LeaseToken;
use idempost::db::ValueColumn;
use idempost::domain::OutboxStatus;
use idempost::entity::outbox_event::{self, Column};
use idempost::{db, failpoint};

impl Outbox {
    /// Marks the event PUBLISHED, only if the claim that wrote `token` still holds its lease.
    ///
    /// Call it only after the broker confirmed the record. `LeaseLost` means another claim
    /// took the event over: it will publish again (a duplicate the consumer absorbs), and this
    /// worker must neither mark nor republish it.
    pub async fn mark_published(
        &self,
        event_id: &str,
        token: &LeaseToken,
        delivery: &Delivery,
    ) -> Result<Fenced<()>, DbErr> {
        let mut marked = self.mark_all_published(&[(event_id, token, delivery)]).await?;
        Ok(marked.pop().unwrap_or(Fenced::LeaseLost))
    }

    /// [`Outbox::mark_published`] for a batch, in one statement: each row gets its own topic,
    /// partition and offset, and changes only while it is still PUBLISHING under its own claim's
    /// token, so the answer says exactly which marks took. In the same transaction the next
    /// version of each marked event, if it was written held back, is released
    /// ([`release_next_versions`]). If the transaction fails none is known to have taken: their
    /// leases expire and the events are published again, duplicates the consumer absorbs.
    pub async fn mark_all_published(
        &self,
        marks: &[(&str, &LeaseToken, &Delivery)],
    ) -> Result<Vec<Fenced<()>>, DbErr> {
        if marks.is_empty() {
            return Ok(Vec::new());
        }
        const PUBLISHED_AT: ValueColumn = ValueColumn { name: "v_published_at", pg_type: "timestamptz" };
        const DELIVERY: [ValueColumn; 3] = [
            ValueColumn { name: "v_topic", pg_type: "text" },
            ValueColumn { name: "v_partition", pg_type: "integer" },
            ValueColumn { name: "v_offset", pg_type: "bigint" },
        ];
        // The server stamps `published_at` with its own clock in the mark statement itself: the
        // clock read before it was a round trip of its own. Only SQLite needs the time bound.
        let (published_at, now) = match db::statement_time(&self.db) {
            Some(clock) => (clock, None),
            None => ("v.v_published_at", Some(db::now(&self.db).await?)),
        };
        let columns: Vec<ValueColumn> =
            FENCE_COLUMNS.iter().copied().chain(now.map(|_| PUBLISHED_AT)).chain(DELIVERY).collect();
        let mut rows: Vec<(usize, Vec<Value>)> = marks
            .iter()
            .enumerate()
            .map(|(i, (event_id, token, delivery))| {
                let mut row: Vec<Value> = vec![(*event_id).into(), token.as_str().into()];
                row.extend(now.map(Value::from));
                row.extend([
                    delivery.topic.as_str().into(),
                    delivery.partition.into(),
                    delivery.offset.into(),
                ]);
                (i, row)
            })
            .collect();
        let assignments = format!(
            "status = '{}', published_at = {published_at}, published_topic = v.v_topic, \
             published_partition = v.v_partition, published_offset = v.v_offset, \
             lease_owner = NULL, lease_until = NULL",
            OutboxStatus::Published.as_str()
        );
        let update = FencedUpdate {
            columns: &columns,
            rows: in_lock_order(&mut rows),
            assignments: &assignments,
            fenced: !failpoint::broken(failpoint::BREAK_MARK_WITHOUT_OWNER_CONDITION),
        };
        // One statement for the whole batch; where it cannot say which rows it changed, they
        // are read back. The mark and the release of the next versions commit together: a mark
        // without its release would leave a held-back version unclaimable for good.
        let txn = self.db.begin_with_config(self.isolation, None).await?;
        let ids = update.ids();
        let changed = match update.run_alone(&txn).await? {
            Some(changed) => changed,
            None => published_as(&txn, &ids, marks).await?,
        };
        let marked: Vec<&str> =
            ids.iter().zip(&changed).filter(|(_, changed)| **changed).map(|(id, _)| id.as_str()).collect();
        release_next_versions(&txn, &marked).await?;
        txn.commit().await?;
        Ok(in_call_order(
            &rows,
            &changed,
            |changed| if changed { Fenced::Done(()) } else { Fenced::LeaseLost },
        ))
    }
}

/// For each of `ids` (in lock order), whether the row is PUBLISHED at the very record its mark
/// in `marks` names: only that mark can have written it, since every publish of an event is a
/// record of its own at an offset of its own, and nothing changes a PUBLISHED row afterwards
/// (redrive takes FAILED rows; retention deletes rows hours later, and a row already deleted
/// counts as not marked, so at worst a lost lease is reported).
async fn published_as(
    txn: &DatabaseTransaction,
    ids: &[String],
    marks: &[(&str, &LeaseToken, &Delivery)],
) -> Result<Vec<bool>, DbErr> {
    let found: Vec<PublishedRow> = outbox_event::Entity::find()
        .select_only()
        .column(Column::EventId)
        .column(Column::Status)
        .column(Column::PublishedTopic)
        .column(Column::PublishedPartition)
        .column(Column::PublishedOffset)
        .filter(Column::EventId.is_in(ids.iter().cloned()))
        .into_tuple()
        .all(txn)
        .await?;
    let asked: HashMap<&str, &Delivery> = marks.iter().map(|(id, _, delivery)| (*id, *delivery)).collect();
    let marked: HashSet<&str> = found
        .iter()
        .filter(|(id, status, topic, partition, offset)| {
            status == OutboxStatus::Published.as_str()
                && asked.get(id.as_str()).is_some_and(|d| {
                    topic.as_deref() == Some(d.topic.as_str())
                        && *partition == Some(d.partition)
                        && *offset == Some(d.offset)
                })
        })
        .map(|(id, ..)| id.as_str())
        .collect();
    Ok(ids.iter().map(|id| marked.contains(id.as_str())).collect())
}

/// A row's event id and status, and the record (topic, partition, offset) it was marked at.
type PublishedRow = (String, String, Option<String>, Option<i32>, Option<i64>);

/// Releases the next version of each event in `marked`, which `txn` has just marked PUBLISHED:
/// a version written held back (`outbox_event.held_back`, see the order service's change) waits
/// out of the claim's range until the version before it is published, and this is where that
/// happens.
///
/// A plain read (which locks nothing) finds the held-back next versions, one index probe of
/// `idx_outbox_aggregate` per marked event, and the update names them by event id, so it locks
/// only the rows it changes. Two earlier forms cost too much: a MariaDB `UPDATE … JOIN` of the
/// table with itself took a shared lock on every row its join read, other relays' marks among
/// them, and two marks deadlocked; an `UPDATE … FROM` join on PostgreSQL and an update naming
/// each next version by key on MariaDB read far more of the table than the next versions, and
/// made every mark several times slower (figures in `docs/design/per-order-order.md`).
///
/// The read misses no next version: one committed after this transaction's mark took its row
/// lock was written by a change that wrote this version's row only while it was unpublished
/// (`successor_version`), so it waited for this commit, found PUBLISHED and is not held back; one
/// committed before is seen by this read, a new statement at READ COMMITTED. On a Galera cluster,
/// where that lock holds only on its node, the change and this mark both wrote this version's
/// row, so the one that commits second is refused and runs again (the worker's `record` for a
/// mark): see `docs/design/per-order-order.md`, "On Galera".
async fn release_next_versions(txn: &DatabaseTransaction, marked: &[&str]) -> Result<(), DbErr> {
    if marked.is_empty() {
        return Ok(());
    }
    let backend = txn.get_database_backend();
    let held: Vec<String> = txn
        .query_all_raw(db::by_event_ids(
            backend,
            "SELECT (SELECT s.event_id FROM outbox_event AS s WHERE s.aggregate_type = p.aggregate_type \
             AND s.aggregate_id = p.aggregate_id AND s.event_version = p.event_version + 1 AND s.held_back) \
             FROM outbox_event AS p WHERE p.event_id",
            "",
            marked,
        ))
        .await?
        .iter()
        .map(|row| row.try_get_by_index::<Option<String>>(0))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect();
    if held.is_empty() {
        return Ok(());
    }
    let held: Vec<&str> = held.iter().map(String::as_str).collect();
    let update = "UPDATE outbox_event SET held_back = FALSE WHERE event_id";
    txn.execute_raw(db::by_event_ids(backend, update, " AND held_back", &held)).await?;
    Ok(())
}
