//! Fenced updates of a whole batch in one statement: every row joins its own values (event id,
//! claim token, outcome) from a derived table, and changes only while it is still PUBLISHING
//! under that token.
//!
//! The statement is the core's [`JoinedUpdate`], in each database's form. Where it cannot say
//! which rows it changed (MariaDB/MySQL, which has no `UPDATE … RETURNING`) and fewer rows
//! changed than were asked, either the statement is rolled back and run again on the rows found
//! still fenced under a row lock ([`FencedUpdate::run`]), or, run on its own
//! ([`FencedUpdate::run_alone`]), the caller reads back which rows show its change.

use std::collections::HashSet;

use sea_orm::sea_query::LockType;
use sea_orm::{
    ColumnTrait as _, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    EntityTrait as _, IsolationLevel, QueryFilter, QuerySelect, Statement, TransactionTrait, Value,
};

use idempost::db::{self, JoinedUpdate, ValueColumn};
use idempost::domain::OutboxStatus;
use idempost::entity::outbox_event::{self, Column};

/// Every row's first two values: the event id and the claim token that fences it.
pub(super) const FENCE_COLUMNS: [ValueColumn; 2] =
    [ValueColumn { name: "v_id", pg_type: "char(36)" }, ValueColumn { name: "v_token", pg_type: "text" }];

/// The array form binds the status a fenced row must still have (see
/// [`FencedUpdate::with_arrays`]).
const FENCED_STATUS: ValueColumn = ValueColumn { name: "v_fenced_status", pg_type: "text" };

/// One set-based update: `assignments` (SQL over `v.<column>`) applied to every row of `rows`
/// still fenced by its own token.
pub(super) struct FencedUpdate<'a> {
    /// The per-row columns, [`FENCE_COLUMNS`] first.
    pub(super) columns: &'a [ValueColumn],
    /// The rows' values, in `columns` order, event ids unique.
    pub(super) rows: Vec<Vec<Value>>,
    /// The `SET` list.
    pub(super) assignments: &'a str,
    /// Whether the claim fence applies (only a test failpoint turns it off).
    pub(super) fenced: bool,
}

impl FencedUpdate<'_> {
    /// Runs the update; says for each row (in order) whether it changed. Where the update cannot
    /// say which rows it changed, it runs in a transaction at `isolation` (`None`: the
    /// session's), so that it can be undone and redone when the answer is not exact.
    pub(super) async fn run(
        &self,
        db: &DatabaseConnection,
        isolation: Option<IsolationLevel>,
    ) -> Result<Vec<bool>, DbErr> {
        if db::has_update_returning(db) {
            return self.run_alone(db).await.map(|changed| changed.unwrap_or_default());
        }
        if self.rows.is_empty() {
            return Ok(Vec::new());
        }
        let backend = db.get_database_backend();
        let ids = self.ids();
        let txn = db.begin_with_config(isolation, None).await?;
        let changed = txn.execute_raw(self.statement(backend, &self.rows)).await?.rows_affected();
        if changed == self.rows.len() as u64 {
            txn.commit().await?;
            return Ok(vec![true; ids.len()]);
        }
        // Some row lost its fence, and the database cannot say which. Undo, lock the rows that
        // are still fenced, and update exactly those: nobody can change them before the commit.
        txn.rollback().await?;
        let txn = db.begin_with_config(isolation, None).await?;
        let still = self.still_fenced(&txn, &ids).await?;
        let rows: Vec<Vec<Value>> =
            self.rows.iter().zip(&still).filter(|(_, still)| **still).map(|(row, _)| row.clone()).collect();
        if !rows.is_empty() {
            txn.execute_raw(self.statement(backend, &rows)).await?;
        }
        txn.commit().await?;
        Ok(still)
    }

    /// Runs the update as one statement (on a connection, no transaction around it: one round
    /// trip) and says for each row (in order) whether it changed, or `None` when that is not known:
    /// where the update returns nothing (MariaDB/MySQL), when fewer rows changed than were asked.
    /// The changes are committed either way; the caller finds out which rows they were.
    pub(super) async fn run_alone(&self, db: &impl ConnectionTrait) -> Result<Option<Vec<bool>>, DbErr> {
        if self.rows.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let backend = db.get_database_backend();
        if !db::has_update_returning(db) {
            let changed = db.execute_raw(self.statement(backend, &self.rows)).await?.rows_affected();
            return Ok((changed == self.rows.len() as u64).then(|| vec![true; self.rows.len()]));
        }
        let statement = self.with_arrays(backend).unwrap_or_else(|| self.statement(backend, &self.rows));
        let changed: HashSet<String> = db
            .query_all_raw(statement)
            .await?
            .iter()
            .map(|row| row.try_get_by_index::<String>(0))
            .collect::<Result<_, _>>()?;
        Ok(Some(self.ids().iter().map(|id| changed.contains(id)).collect()))
    }

    /// The rows' event ids, in order.
    pub(super) fn ids(&self) -> Vec<String> {
        self.rows.iter().map(|row| text(&row[0])).collect()
    }

    /// Which rows are PUBLISHING under their own token, each locked until the transaction ends.
    async fn still_fenced(&self, txn: &DatabaseTransaction, ids: &[String]) -> Result<Vec<bool>, DbErr> {
        let mut query = outbox_event::Entity::find()
            .select_only()
            .column(Column::EventId)
            .column(Column::LeaseOwner)
            .filter(Column::EventId.is_in(ids.iter().cloned()));
        if self.fenced {
            query = query.filter(Column::Status.eq(OutboxStatus::Publishing.as_str()));
        }
        let held: Vec<(String, Option<String>)> = query.lock(LockType::Update).into_tuple().all(txn).await?;
        Ok(self
            .rows
            .iter()
            .map(|row| {
                let (id, token) = (text(&row[0]), text(&row[1]));
                held.iter().any(|(held_id, owner)| {
                    *held_id == id && (!self.fenced || owner.as_deref() == Some(token.as_str()))
                })
            })
            .collect())
    }

    /// The statement with one array parameter per column ([`JoinedUpdate::arrays`]), where the
    /// database has them and every value is present (a mark's are): its text and parameters are
    /// the same whatever the batch size, so planning it costs the same for any batch, while the
    /// relay's pool plans every run ([`idempost::db::Pool::Relay`]). `None` (use
    /// [`Self::statement`]) otherwise.
    ///
    /// The fence's status is bound as one more array rather than written as a constant: with
    /// `o.status = 'PUBLISHING'` the planner scans `idx_outbox_retention`'s PUBLISHING range and
    /// hash-joins, and between vacuums that range holds an entry for every row ever claimed
    /// (a bitmap scan never prunes dead entries), so the mark's cost grew with every row ever
    /// claimed; without a constant, the only path to a row is its event id, by primary key.
    fn with_arrays(&self, backend: DbBackend) -> Option<Statement> {
        if !self.fenced {
            return self.update(self.columns, "").arrays(backend, &self.rows);
        }
        let mut columns = self.columns.to_vec();
        columns.push(FENCED_STATUS);
        let status = Value::from(OutboxStatus::Publishing.as_str());
        let rows: Vec<Vec<Value>> =
            self.rows.iter().map(|row| row.iter().cloned().chain([status.clone()]).collect()).collect();
        let fence = self.fence(&format!("v.{}", FENCED_STATUS.name));
        self.update(&columns, &fence).arrays(backend, &rows)
    }

    /// The statement for `rows`, their values bound one by one.
    fn statement(&self, backend: DbBackend, rows: &[Vec<Value>]) -> Statement {
        let fence = self.fence(&format!("'{}'", OutboxStatus::Publishing.as_str()));
        self.update(self.columns, &fence).statement(backend, rows)
    }

    /// This update of the outbox with `columns` per row, under `condition`.
    fn update<'a>(&'a self, columns: &'a [ValueColumn], condition: &'a str) -> JoinedUpdate<'a> {
        JoinedUpdate {
            table: "outbox_event",
            key: "event_id",
            columns,
            assignments: self.assignments,
            condition,
        }
    }

    /// The condition that keeps every row to its own claim, the row's status being compared with
    /// `status` (SQL); empty if a failpoint broke the fence.
    fn fence(&self, status: &str) -> String {
        if self.fenced { format!("o.status = {status} AND o.lease_owner = v.v_token") } else { String::new() }
    }
}

/// Sorts `rows` (tagged with their call position) by event id, the order every set-based
/// update locks rows in, so two of them never wait on each other in a cycle; returns the values.
pub(super) fn in_lock_order(rows: &mut [(usize, Vec<Value>)]) -> Vec<Vec<Value>> {
    rows.sort_by(|(_, a), (_, b)| id_of(a).cmp(id_of(b)));
    rows.iter().map(|(_, row)| row.clone()).collect()
}

/// `changed` (in lock order) mapped back to the call's order.
pub(super) fn in_call_order<T: Copy>(
    rows: &[(usize, Vec<Value>)],
    changed: &[bool],
    f: impl Fn(bool) -> T,
) -> Vec<T> {
    let mut out: Vec<Option<T>> = vec![None; rows.len()];
    for ((i, _), changed) in rows.iter().zip(changed) {
        out[*i] = Some(f(*changed));
    }
    out.into_iter().map(|o| o.unwrap_or_else(|| f(false))).collect()
}

fn id_of(row: &[Value]) -> &str {
    match row.first() {
        Some(Value::String(Some(id))) => id,
        _ => "",
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::String(Some(s)) => s.clone(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COLUMNS: [ValueColumn; 3] =
        [FENCE_COLUMNS[0], FENCE_COLUMNS[1], ValueColumn { name: "v_offset", pg_type: "bigint" }];

    fn update(rows: Vec<Vec<Value>>) -> FencedUpdate<'static> {
        FencedUpdate { columns: &COLUMNS, rows, assignments: "published_offset = v.v_offset", fenced: true }
    }

    #[test]
    fn a_postgresql_update_with_every_value_present_binds_one_array_per_column_whatever_the_batch_size() {
        let row = |i: i64| vec![Value::from(format!("id-{i}")), Value::from("token"), Value::from(i)];
        let small = update(vec![row(1)])
            .with_arrays(DbBackend::Postgres)
            .map(|s| (s.sql, s.values.map(|v| v.0.len())));
        let large = update((0..500).map(row).collect())
            .with_arrays(DbBackend::Postgres)
            .map(|s| (s.sql, s.values.map(|v| v.0.len())));
        let (sql, parameters) = large.clone().unwrap_or_default();
        assert_eq!(parameters, Some(4));
        assert!(
            sql.contains(
                "unnest($1::char(36)[], $2::text[], $3::bigint[], $4::text[]) AS v(v_id, v_token, v_offset, v_fenced_status)"
            ),
            "{sql}"
        );
        assert!(sql.contains("o.status = v.v_fenced_status AND o.lease_owner = v.v_token"), "{sql}");
        assert!(
            !sql.contains("'PUBLISHING'"),
            "no status constant for the planner to scan an index by: {sql}"
        );
        assert_eq!(small, large, "one statement text for every batch size");
    }

    #[test]
    fn a_null_or_a_value_of_another_type_leaves_the_values_list() {
        let with_null = update(vec![vec![Value::from("a"), Value::from("t"), Value::BigInt(None)]]);
        assert!(with_null.with_arrays(DbBackend::Postgres).is_none());
        let mixed = update(vec![
            vec![Value::from("a"), Value::from("t"), Value::from(1i64)],
            vec![Value::from("b"), Value::from("t"), Value::from(1i32)],
        ]);
        assert!(mixed.with_arrays(DbBackend::Postgres).is_none());
    }
}
